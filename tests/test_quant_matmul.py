"""The quantized-weight GEMM of ops/quant_matmul.cc against numpy: GGUF Q8_0 / Q4_0 / Q4_1 blocks (made and
dequantised by the `gguf` package, an independent reference) and per-channel int8, awkward shapes, the
rows variant, refusals, and one call inside a graph-mode Cell."""
import ctypes

import mindspore as ms
import numpy as np
import pytest

from graph_helpers import Apply, run
from ms_atb.ops import build
from ms_atb.ops.quant_matmul import FORMATS, QuantMatMul, dequantize, pack_gguf, packed_shape
from ops_reference import QUANT_KERNELS as KERNELS, packed_and_reference


@pytest.fixture(scope="module")
def lib():
    return ctypes.CDLL(build.kernel_library())


def call(lib, fmt, x, packed, rows=None):
    n_out = packed.shape[0] * 16
    y = np.full((x.shape[0], n_out), np.nan, np.float32)
    if rows is None:
        assert build.call_kernel(getattr(lib, KERNELS[fmt]), [x, packed, y]) == 0
    else:
        r = np.array([rows], np.int32)
        assert build.call_kernel(getattr(lib, KERNELS[fmt] + "Rows"), [x, packed, r, y]) == 0
    return y


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m,k,n", [(1, 64, 16), (13, 96, 40), (1, 576, 100), (33, 160, 7), (100, 288, 48)])
def test_kernel_matches_numpy(lib, fmt, m, k, n):
    """N not a multiple of 16 (padded panels), M = 1, M = 13 (a partial register tile), M past a row block;
    K over several dequantisation chunks (576 = 4.5 chunks of 128)."""
    packed, w = packed_and_reference(fmt, k, n, m * 7 + n)
    assert packed.shape == packed_shape(fmt, k, n)
    np.testing.assert_allclose(dequantize(packed, fmt, k, n), w, rtol=1e-6, atol=1e-7)
    x = np.random.default_rng(k).standard_normal((m, k)).astype(np.float32)
    y = call(lib, fmt, x, packed)
    np.testing.assert_allclose(y[:, :n], x.astype(np.float64) @ w, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(y[:, n:], 0.0)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("k,n", [(96, 40), (160, 1195)])
def test_small_batch_path_matches_numpy(lib, fmt, m, k, n):
    """The register GEMV of M <= 8 rows (5 and 8: a group of 4 rows, then the rest): K of 3 and 5 blocks
    (not a whole dequantisation chunk of 128), N padded; 75 panels make several thread items and an odd last
    panel group."""
    packed, w = packed_and_reference(fmt, k, n, m + k + n)
    x = np.random.default_rng(m).standard_normal((m, k)).astype(np.float32)
    y = call(lib, fmt, x, packed)
    np.testing.assert_allclose(y[:, :n], x.astype(np.float64) @ w, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(y[:, n:], 0.0)


@pytest.mark.parametrize("m", [1, 5, 13])
def test_int8_partial_block(lib, m):
    """int8 takes any K: the last block holds K % 32 rows (the small-batch path and the tile path)."""
    packed, w = packed_and_reference("int8", 70, 33, 1)
    x = np.random.default_rng(2).standard_normal((m, 70)).astype(np.float32)
    np.testing.assert_allclose(call(lib, "int8", x, packed)[:, :33], x.astype(np.float64) @ w, rtol=1e-4,
                               atol=1e-4)


@pytest.mark.parametrize("fmt", ["q4_1", "int8"])
@pytest.mark.parametrize("rows", [0, 1, 3, 8, 9, 13, 20])
def test_rows_variant(lib, fmt, rows):
    """Only x's first `rows` rows are multiplied (clamped to M = 13); the others are zero."""
    packed, w = packed_and_reference(fmt, 64, 40, 3)
    x = np.random.default_rng(4).standard_normal((13, 64)).astype(np.float32)
    y = call(lib, fmt, x, packed, rows)
    r = min(rows, 13)
    np.testing.assert_allclose(y[:r, :40], x[:r].astype(np.float64) @ w, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(y[r:], 0.0)


def test_kernel_refuses_bad_shapes(lib):
    packed, _ = packed_and_reference("q4_1", 64, 16, 5)
    x = np.zeros((2, 96), np.float32)                       # K = 96 but the panels hold 64 rows
    y = np.zeros((2, 16), np.float32)
    assert build.call_kernel(lib.QuantMatMulQ4_1, [x, packed, y]) != 0
    x = np.zeros((2, 70), np.float32)                       # K not a multiple of 32 for a GGUF format
    assert build.call_kernel(lib.QuantMatMulQ4_1, [x, np.zeros((1, 3 * 320), np.int8), y]) != 0


def test_pack_refuses_bad_input():
    with pytest.raises(ValueError, match="multiple of 32"):
        pack_gguf(np.zeros((4, 40), np.uint8), "q4_1", 70)
    with pytest.raises(ValueError, match=r"\[N, 40\]"):
        pack_gguf(np.zeros((4, 41), np.uint8), "q4_1", 64)
    with pytest.raises(ValueError, match="allowed"):
        pack_gguf(np.zeros((4, 40), np.uint8), "q5_k", 64)
    with pytest.raises(ValueError, match="quantize_int8"):
        pack_gguf(np.zeros((4, 40), np.uint8), "int8", 64)


def test_quant_matmul_cell_in_graph():
    """The Cell inside a graph-mode Cell, with rows, N padded."""
    ms.set_context(mode=ms.GRAPH_MODE)

    packed, w = packed_and_reference("q4_1", 64, 40, 6)
    x = np.random.default_rng(7).standard_normal((6, 64)).astype(np.float32)
    y = run(Apply(QuantMatMul("q4_1", 40)), x, packed, np.array([4], np.int32))
    assert y.shape == (6, 40)
    np.testing.assert_allclose(y[:4], x[:4].astype(np.float64) @ w, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(y[4:], 0.0)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m", [1, 3, 8, 13])
def test_bit_equal_to_float_gemm_over_the_dequantised_weight(lib, fmt, m):
    """The dequantised values are those of the `gguf` package (float32 d * q + m, no fused rounding) and both
    paths (the register GEMV up to 8 rows, the float tile past them) sum in the tile's k order: the product
    equals PackedMatMul's over the float32 dequantisation bit for bit, so a GGUF as stored gives the tokens
    of its float32 dequantisation at every batch size."""
    from ms_atb.ops.matmul import pack_weight
    packed, w = packed_and_reference(fmt, 576, 100, 11)
    x = np.random.default_rng(12).standard_normal((m, 576)).astype(np.float32)
    y_float = np.zeros((m, 112), np.float32)
    assert build.call_kernel(lib.PackedMatMul, [x, pack_weight(w), y_float]) == 0
    np.testing.assert_array_equal(call(lib, fmt, x, packed), y_float)
