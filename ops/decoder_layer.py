"""DecoderLayer: a Llama decoder layer on the CPU in float32 as one aot op (ops/decoder_layer.cc).

A MindSpore CPU op costs ~30-45 us of dispatch whatever its size; a layer is 8 of our kernels (AddRmsNorm, qkv
linear, CachedAttention, o linear, AddRmsNorm, gate_up linear, SwiGlu, down linear). One op calling the same
kernels in the same order gives their results bit for bit for one dispatch.
"""
import mindspore as ms
from mindspore import Tensor, nn

from ms_atb.ops import build
from ms_atb.ops.quant_matmul import check_activations

# The linear kernels a layer can call, by kind (the int32 the op's plan holds; ops/decoder_layer.cc's order).
LINEAR_KERNELS = ("PackedMatMulRows", "QuantMatMulQ8_0Rows", "QuantMatMulQ4_0Rows", "QuantMatMulQ4_1Rows",
                  "QuantMatMulInt8Rows", "QuantDotQ8_0Rows", "QuantDotQ4_0Rows", "QuantDotQ4_1Rows",
                  "QuantDotInt8Rows")
WEIGHT_FORMATS = ("float32", "q8_0", "q4_0", "q4_1", "int8")

_INPUTS = ("input_norm", "post_norm", "eps", "w_qkv", "w_o", "w_gate_up", "w_down", "plan", "cos", "sin", "perm",
           "key_cache", "value_cache", "slot_mapping", "block_tables", "context_lens", "query_start_loc", "scale",
           "rows")
_SCALE_CACHES = ("key_scale_cache", "value_scale_cache")
# LoRA: each token's adapter slot, the slots' ranks [L, 7] (q, k, v, o, gate, up, down), each linear's stacked A, B
_LORA = ("lora_slots", "lora_ranks", "qkv_a", "qkv_b", "o_a", "o_b", "gate_up_a", "gate_up_b", "down_a", "down_b")


def linear_kind(fmt: str, activations: str) -> int:
    """The kind (index in LINEAR_KERNELS) of the kernel of a linear with weight format `fmt` whose quantized
    inputs are `activations`: a float weight keeps float32 activations (PackedMatMul)."""
    if fmt not in WEIGHT_FORMATS:
        raise ValueError(f"weight format {fmt!r} has no DecoderLayer linear kernel; allowed: {WEIGHT_FORMATS}")
    check_activations(activations)
    if fmt == "float32":
        return 0
    return WEIGHT_FORMATS.index(fmt) + (4 if activations == "int8" else 0)


# Output shapes as a function of the input shapes (module level: build.aot_op keys its primitive on it).
def _layer_shapes(h, *_):
    return h, h                                      # mlp_out, residual_out: [T, E] each


def _op(first: bool, quantized: bool, lora: bool):
    name = "DecoderLayer" + ("First" if first else "") + ("Quant" if quantized else "") + ("Lora" if lora else "")
    inputs = ("h",) + (() if first else ("residual",)) + _INPUTS + (_SCALE_CACHES if quantized else ()) + \
        (_LORA if lora else ())
    op = build.aot_op(name, inputs, (ms.float32, ms.float32), _layer_shapes)
    op.add_prim_attr("side_effect_mem", True)        # writes the KV caches in place
    return op


class DecoderLayer(nn.Cell):
    """layer(h [T, E], residual [T, E] or None, input_norm [E], post_norm [E], w_qkv, w_o, w_gate_up, w_down,
    cos [T, D], sin [T, D], perm [D] int32, key_cache, value_cache [NB, BS, KVH, D] Parameters,
    slot_mapping [T] int32, block_tables [B, MAXB] int32, context_lens [B] int32, query_start_loc [B + 1] int32,
    rows [1] int32) -> (mlp_out [T, E], residual_out [T, E]) float32: a Llama decoder layer without bias or
    qk-norm, on one rank (tp_size 1), with our CPU kernels.

    residual None: the first layer (x = norm(h), residual h). formats: the weight formats of (qkv, o, gate_up,
    down), each weight packed for its kernel (models/parallel.py's linears); widths: their output widths;
    activations: the quantized linears' input dtype. quantized=True: int8 caches; construct also takes
    key_scale_cache and value_scale_cache [NB, BS, KVH] float32 Parameters. lora=True: LoRA adapters
    (ops/lora.py); construct also takes `lora`: (lora_slots [T] int32, lora_ranks [L, 7] int32 (columns q, k, v,
    o, gate, up, down), then the stacked A and B of qkv, o, gate_up and down), and each linear's output gets its
    rows' deltas as LoraAdd adds them.
    """

    def __init__(self, eps: float, scale: float, formats, widths, activations: str = "float32",
                 quantized: bool = False, lora: bool = False):
        super().__init__()
        formats, widths = tuple(formats), tuple(int(w) for w in widths)
        if len(formats) != 4 or len(widths) != 4 or min(widths) < 1:
            raise ValueError(f"formats and widths name the 4 linears (qkv, o, gate_up, down), widths >= 1; "
                             f"got {formats}, {widths}")
        self.quantized, self.lora = quantized, lora
        self.eps_t = Tensor([eps], ms.float32)  # [1]
        self.scale_t = Tensor([scale], ms.float32)  # [1]
        self.plan = Tensor([linear_kind(f, activations) for f in formats] + list(widths), ms.int32)  # [8]
        self.op, self.op_first = _op(False, quantized, lora), _op(True, quantized, lora)

    def construct(self, h, residual, input_norm, post_norm, w_qkv, w_o, w_gate_up, w_down, cos, sin, perm,
                  key_cache, value_cache, slot_mapping, block_tables, context_lens, query_start_loc, rows,
                  key_scale_cache=None, value_scale_cache=None, lora=None):
        args = (input_norm, post_norm, self.eps_t, w_qkv, w_o, w_gate_up, w_down, self.plan, cos, sin, perm,
                key_cache, value_cache, slot_mapping, block_tables, context_lens, query_start_loc, self.scale_t,
                rows)
        if self.quantized:
            args = args + (key_scale_cache, value_scale_cache)
        if self.lora:
            args = args + lora
        if residual is None:
            return self.op_first(h, *args)
        return self.op(h, residual, *args)
