"""GGUF rows into panels (QuantPack, ops/quant_pack.cc) against the numpy packer, parts of a fused linear packed in
place, and the quantized embedding's gather (QuantEmbedding, ops/quant_embedding.cc) against the gguf package's
dequantisation, bit for bit, in both layouts, alone and inside a graph-mode Cell."""
import ctypes

import mindspore as ms
import numpy as np
import pytest

from graph_helpers import Apply, run
from ms_atb.ops import build
from ms_atb.ops.quant_embedding import QuantEmbedding
from ms_atb.ops.quant_matmul import ACTIVATIONS, pack_gguf, packed_shape
from ops_reference import gguf_weight, pack_gguf_ref

GGUF = ("q8_0", "q4_0", "q4_1")


@pytest.fixture(scope="module")
def lib():
    return ctypes.CDLL(build.kernel_library())


@pytest.mark.parametrize("fmt", GGUF)
@pytest.mark.parametrize("activations", ACTIVATIONS)
@pytest.mark.parametrize("k,n", [(32, 16), (96, 7), (64, 40), (160, 100)])
def test_pack_equals_numpy(fmt, activations, k, n):
    raw, _ = gguf_weight(fmt, k, n, k + n)
    got = pack_gguf(raw, fmt, k, activations)
    assert got.shape == packed_shape(fmt, k, n) and got.dtype == np.int8
    np.testing.assert_array_equal(got, pack_gguf_ref(raw, fmt, k, activations))


@pytest.mark.parametrize("activations", ACTIVATIONS)
def test_parts_pack_into_their_panels_of_one_buffer(activations):
    """q, k and v rows packed one after another at their first panels equal the packed concatenation."""
    parts = [gguf_weight("q4_1", 64, n, n)[0] for n in (48, 16, 20)]
    whole = np.concatenate(parts)
    out = np.full(packed_shape("q4_1", 64, 84), 7, np.int8)
    pack_gguf(parts[0], "q4_1", 64, activations, out, 0)
    pack_gguf(parts[1], "q4_1", 64, activations, out, 3)
    pack_gguf(parts[2], "q4_1", 64, activations, out, 4)
    np.testing.assert_array_equal(out, pack_gguf(whole, "q4_1", 64, activations))


def test_pack_refuses_panels_outside_the_buffer(lib):
    raw = gguf_weight("q8_0", 32, 20, 0)[0]
    out = np.zeros(packed_shape("q8_0", 32, 20), np.int8)
    spec = np.array([0, 0, 1], np.int32)                     # 2 panels from panel 1 of 2
    assert build.call_kernel(lib.QuantPack, [raw, spec, out]) != 0
    assert build.call_kernel(lib.QuantPack, [raw, np.array([3, 0, 0], np.int32), out]) != 0   # no format 3


def gather(lib, fmt, activations, packed, ids):
    k = packed.shape[1] // {"q8_0": 544, "q4_0": 288, "q4_1": 320}[fmt] * 32
    y = np.full((len(ids), k), np.nan, np.float32)
    name = "QuantEmbedding" + fmt.upper() + ("Dot" if activations == "int8" else "")
    assert build.call_kernel(getattr(lib, name), [np.asarray(ids, np.int32), packed, y]) == 0
    return y


@pytest.mark.parametrize("fmt", GGUF)
@pytest.mark.parametrize("activations", ACTIVATIONS)
def test_gathered_rows_are_the_gguf_dequantisation(lib, fmt, activations):
    vocab, hidden = 70, 96                                  # 5 panels, the last one partial
    raw, w = gguf_weight(fmt, hidden, vocab, vocab)         # w [hidden, vocab]: the embedding transposed
    packed = pack_gguf(raw, fmt, hidden, activations)
    ids = [0, 69, 17, 17, 31, 5]
    np.testing.assert_array_equal(gather(lib, fmt, activations, packed, ids), w.T[ids])
    out_of_range = gather(lib, fmt, activations, packed, [-1, 80, 3])
    assert np.all(out_of_range[:2] == 0) and np.array_equal(out_of_range[2], w.T[3])


def test_gather_in_a_graph():
    ms.set_context(mode=ms.GRAPH_MODE)
    raw, w = gguf_weight("q4_0", 64, 40, 3)
    packed = pack_gguf(raw, "q4_0", 64, "int8").view(np.uint8)
    ids = np.array([39, 0, 12], np.int32)
    np.testing.assert_array_equal(run(Apply(QuantEmbedding("q4_0", "int8")), ids, packed), w.T[ids])
    with pytest.raises(ValueError, match="one of"):
        QuantEmbedding("int8")
