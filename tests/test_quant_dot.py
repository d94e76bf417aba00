"""QuantDot (int8 activations, ops/quant_dot.h) against a numpy model of the same integer arithmetic and against
the float32-activation product, the dot layout's round trip, the rows variant and the Cell."""
import ctypes

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor

from ms_atb.ops import build
from ms_atb.ops.quant_matmul import FORMATS, QuantMatMul, dequantize
from ops_reference import packed_and_reference
from quant_dot_reference import DOT_KERNELS, activation_bound, quant_dot_ref, weight_fields


@pytest.fixture(scope="module")
def lib():
    return ctypes.CDLL(build.kernel_library())


def call_dot(lib, fmt, x, packed, rows=None):
    y = np.full((x.shape[0], packed.shape[0] * 16), np.nan, np.float32)
    if rows is None:
        assert build.call_kernel(getattr(lib, DOT_KERNELS[fmt]), [x, packed, y]) == 0
    else:
        assert build.call_kernel(getattr(lib, DOT_KERNELS[fmt] + "Rows"), [x, packed, np.array([rows], np.int32),
                                                                            y]) == 0
    return y


def check_dot(y, x, fmt, fields, n):
    """y equals the integer model within float32 rounding of its terms, and is within the activation
    quantisation's bound of the float32-activation product x @ W."""
    want, terms = quant_dot_ref(x, fmt, fields)
    assert np.all(np.abs(y[:, :n] - want) <= 1e-5 * terms + 1e-30)
    exact = x.astype(np.float64) @ fields[4].astype(np.float64)
    assert np.all(np.abs(y[:, :n] - exact) <= activation_bound(x, fields[4]) * 1.0001 + 1e-5 * terms + 1e-30)
    np.testing.assert_array_equal(y[:, n:], 0.0)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m", [1, 3, 8, 33])
@pytest.mark.parametrize("k,n", [(96, 40), (576, 100)])
def test_dot_matches_integer_model(lib, fmt, m, k, n):
    """M = 1, 3, 8 (groups of up to 4 rows, x quantized in the calling thread), 33 (x quantized by the pool);
    N padded; K of 3 and 18 blocks. x has outliers and an all-zero block (d_x = 0)."""
    packed, fields = weight_fields(fmt, k, n, m * 31 + k + n)
    rng = np.random.default_rng(m + k)
    x = (rng.standard_normal((m, k)) * rng.uniform(0.1, 3.0, (m, 1))).astype(np.float32)
    x[0, 5] = 40.0
    x[-1, 32:64] = 0.0
    check_dot(call_dot(lib, fmt, x, packed), x, fmt, fields, n)


@pytest.mark.parametrize("m", [1, 5, 13])
def test_dot_int8_partial_block(lib, m):
    """int8 weights take any K: x's last block holds K % 32 values, zero past K."""
    packed, fields = weight_fields("int8", 70, 33, 4)
    x = np.random.default_rng(m).standard_normal((m, 70)).astype(np.float32)
    check_dot(call_dot(lib, "int8", x, packed), x, "int8", fields, 33)


def test_dot_close_to_float_activations(lib):
    """On a SmolLM2-sized row (K = 576, Q4_1) int8 activations move y by under 1% of |y|'s scale."""
    packed, fields = weight_fields("q4_1", 576, 256, 7)
    x = np.random.default_rng(3).standard_normal((4, 576)).astype(np.float32)
    y = call_dot(lib, "q4_1", x, packed)[:, :256]
    exact = x.astype(np.float64) @ fields[4]
    assert np.abs(y - exact).max() < 0.01 * np.abs(exact).max()


@pytest.mark.parametrize("rows", [0, 1, 3, 9, 13, 20])
def test_dot_rows_variant(lib, rows):
    packed, fields = weight_fields("q8_0", 64, 40, 3)
    x = np.random.default_rng(4).standard_normal((13, 64)).astype(np.float32)
    y = call_dot(lib, "q8_0", x, packed, rows)
    r = min(rows, 13)
    want, terms = quant_dot_ref(x[:r], "q8_0", fields)
    assert np.all(np.abs(y[:r, :40] - want) <= 1e-5 * terms + 1e-30)
    np.testing.assert_array_equal(y[r:], 0.0)


@pytest.mark.parametrize("fmt", FORMATS)
def test_dot_layout_round_trip(fmt):
    """The dot layout holds the same bits re-ordered: dequantising it gives the float path's values."""
    packed, fields = weight_fields(fmt, 96, 40, 11)
    plain, w = packed_and_reference(fmt, 96, 40, 11)
    assert packed.shape == plain.shape and not np.array_equal(packed, plain)
    np.testing.assert_array_equal(dequantize(packed, fmt, 96, 40, activations="int8"),
                                  dequantize(plain, fmt, 96, 40))
    np.testing.assert_allclose(dequantize(packed, fmt, 96, 40, activations="int8"), fields[4], rtol=1e-6,
                               atol=1e-7)


def test_dot_refusals(lib, capfd):
    with pytest.raises(ValueError, match="activations 'int4'"):
        QuantMatMul("q8_0", 16, activations="int4")
    packed, _ = weight_fields("q4_1", 64, 16, 1)
    x, y = np.zeros((2, 96), np.float32), np.zeros((2, 16), np.float32)     # x's K does not match the panels
    assert build.call_kernel(lib.QuantDotQ4_1, [x, packed, y]) == 1
    assert "ms_atb QuantDotQ4_1: w's panels do not hold" in capfd.readouterr().err


def test_dot_cell_in_graph_mode(lib):
    """QuantMatMul(activations="int8") inside a graph-mode Cell gives the kernel's result."""
    packed, fields = weight_fields("q4_0", 64, 20, 5)
    x = np.random.default_rng(6).standard_normal((3, 64)).astype(np.float32)
    mm = QuantMatMul("q4_0", 20, activations="int8")
    mm.set_train(False)
    ms.set_context(mode=ms.GRAPH_MODE)
    y = mm(Tensor(x), Tensor(packed)).asnumpy()
    np.testing.assert_array_equal(y, call_dot(lib, "q4_0", x, packed)[:, :20])


@pytest.mark.parametrize("m", [1, 33])
def test_dot_quantizes_x_as_the_model_does(lib, m):
    """An identity int8 weight returns x's dequantised quants: each equals d_x q_x of the numpy model (a quant
    off by one would move it by d_x, at least 1/127 of the block's largest value)."""
    from quant_dot_reference import quantize_rows
    from ms_atb.ops.quant_matmul import quantize_int8
    k = 64
    rng = np.random.default_rng(m)
    x = (rng.standard_normal((m, k)) * rng.uniform(0.01, 100, (m, 1))).astype(np.float32)
    x[0, :32] = 0.0                                                   # d_x = 0
    y = call_dot(lib, "int8", x, quantize_int8(np.eye(k, dtype=np.float32), activations="int8"))
    q, d, _ = quantize_rows(x)
    np.testing.assert_allclose(y, (q * d[..., None]).reshape(m, k), rtol=1e-6, atol=0)


def test_dot_quantizes_ties_to_even_and_partial_blocks(lib):
    """Quotients exactly halfway round to the even integer (d_x = 1 and 0.5 make x / d_x exact), a block past K
    is zero-padded, and an all-zero block quantizes to zero: the kernel's quants equal the numpy model's."""
    from quant_dot_reference import quantize_rows
    from ms_atb.ops.quant_matmul import quantize_int8
    k = 48                                                            # one whole block and 16 of the next
    x = np.zeros((2, k), np.float32)
    x[0, :8] = [127.0, 2.5, -2.5, 3.5, -0.5, 0.5, 1.5, 126.5]          # d_x = 1
    x[0, 32:37] = [63.5, 0.25, 0.75, -0.25, -1.25]                     # d_x = 0.5: 0.5, 1.5, -0.5, -2.5
    x[1, 32:34] = [-127.0, 8.5]                                       # row 1: a zero block, then d_x = 1
    q, d, _ = quantize_rows(x)
    assert q[0, 0, :8].tolist() == [127, 2, -2, 4, 0, 0, 2, 126] and q[0, 1, :5].tolist() == [127, 0, 2, 0, -2]
    y = call_dot(lib, "int8", x, quantize_int8(np.eye(k, dtype=np.float32), activations="int8"))
    np.testing.assert_allclose(y, (q * d[..., None]).reshape(2, -1)[:, :k], rtol=1e-6, atol=0)
