"""QuantEmbedding: rows of an embedding kept quantized, dequantised as they are gathered (ops/quant_embedding.cc).

The embedding [V, K] is held as the weight of a linear [K, V] in the panel layout of ops/quant_matmul.py (a tied
model's lm_head itself, or an untied embedding packed the same way), so a GGUF's embedding costs its stored
bytes once: no float32 copy, no second copy for a tied lm_head.
"""
import mindspore as ms
from mindspore import nn

from ms_atb.ops import build
from ms_atb.ops.quant_matmul import check_activations

FORMATS = ("q8_0", "q4_0", "q4_1")     # GGUF block formats


class QuantEmbedding(nn.Cell):
    """embed(ids [T] int32, w [P, panel_bytes]) -> [T, K] float32 (zero rows for ids outside [0, 16 P)); w in the
    layout of `activations` ("float32" or "int8": the dot layout), as its linear holds it."""

    def __init__(self, fmt: str, activations: str = "float32"):
        super().__init__()
        if fmt not in FORMATS:
            raise ValueError(f"an embedding kept quantized is one of {FORMATS}, got {fmt!r}")
        check_activations(activations)
        kernel = "QuantEmbedding" + fmt.upper() + ("Dot" if activations == "int8" else "")
        self.op = build.aot_op(kernel, ("ids", "w"), ms.float32)

    def construct(self, ids, w):
        return self.op(ids, w)
