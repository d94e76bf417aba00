"""The elementwise parts of a decoder layer: RMSNorm (alone or after the residual add), rotary embedding,
SwiGLU.

On the CPU in float32 each is one aot kernel (ops/elementwise.cc): a MindSpore CPU op costs ~25 us of
dispatch whatever its size, and these replace 8, 9, 10 and 3 ops per layer. Elsewhere (Ascend, or another
dtype) each is the same formula in MindSpore ops.
"""
import mindspore as ms
from mindspore import Tensor, nn, ops

from ms_atb.ops import build


def _fused(device: str, dtype) -> bool:
    if device not in ("cpu", "npu"):
        raise ValueError(f"device must be 'cpu' or 'npu', got {device!r}")
    return device == "cpu" and dtype == ms.float32


# Output shapes of the aot ops with two outputs, as functions of the input shapes. Module functions, not
# lambdas: build.aot_op keys its one primitive per kernel on them, and every layer's norm shares it.
def _add_rms_norm_shapes(x, *_):
    return x, x                                      # h, norm(h): [T, H] each


def _last_token_norm_shapes(x, residual, query_start_loc, *_):
    return [query_start_loc[0] - 1, x[1]], [1]       # y [B, H], seqs [1]


class RmsNorm(nn.Cell):
    """norm(x [T, H], weight [H]) -> [T, H]: x * rsqrt(mean(x^2) + eps) * weight (statistics in float32)."""

    def __init__(self, eps: float, dtype=ms.float32, device: str = "cpu"):
        super().__init__()
        self.fused = _fused(device, dtype)
        self.eps = eps
        self.eps_t = Tensor([eps], ms.float32)  # [1]
        if self.fused:
            self.op = build.aot_op("RmsNorm", ("x", "weight", "eps"), ms.float32)

    def construct(self, x, weight):
        if self.fused:
            return self.op(x, weight, self.eps_t)
        x32 = x.astype(ms.float32)
        var = ops.mean(x32 * x32, -1, keep_dims=True)
        return (x32 * ops.rsqrt(var + self.eps)).astype(x.dtype) * weight


class AddRmsNorm(nn.Cell):
    """add_norm(x [T, H], residual [T, H], weight [H]) -> (h [T, H], norm(h) [T, H]), h = x + residual: a
    decoder layer's residual add and the RMSNorm after it (RmsNorm's formula)."""

    def __init__(self, eps: float, dtype=ms.float32, device: str = "cpu"):
        super().__init__()
        self.fused = _fused(device, dtype)
        self.norm = RmsNorm(eps, dtype, device)
        if self.fused:
            self.op = build.aot_op("AddRmsNorm", ("x", "residual", "weight", "eps"), (ms.float32, ms.float32),
                                   _add_rms_norm_shapes)

    def construct(self, x, residual, weight):
        if self.fused:
            return self.op(x, residual, weight, self.norm.eps_t)
        h = x + residual
        return h, self.norm(h, weight)


class LastTokenNorm(nn.Cell):
    """last(x [T, H], residual [T, H], query_start_loc [B + 1] int32, weight [H]) -> (y [B, H], seqs [1] int32):
    y[b] = norm(x + residual) at row max(query_start_loc[b + 1] - 1, 0), sequence b's last token; seqs counts
    the sequences that own a token (query_start_loc rises). The top of a causal LM before its lm_head."""

    def __init__(self, eps: float, dtype=ms.float32, device: str = "cpu"):
        super().__init__()
        self.fused = _fused(device, dtype)
        self.norm = RmsNorm(eps, dtype, device)
        if self.fused:
            self.op = build.aot_op("LastTokenNorm", ("x", "residual", "query_start_loc", "weight", "eps"),
                                   (ms.float32, ms.int32), _last_token_norm_shapes)

    def construct(self, x, residual, query_start_loc, weight):
        if self.fused:
            return self.op(x, residual, query_start_loc, weight, self.norm.eps_t)
        last = ops.maximum(query_start_loc[1:] - 1, 0)  # [B]
        y = self.norm(ops.gather(x + residual, last, 0), weight)  # [B, H]
        seqs = (query_start_loc[1:] > query_start_loc[:-1]).astype(ms.int32).sum(0, keepdims=True)
        return y, seqs.astype(ms.int32)  # [1]: the sum may widen to int64


class RotaryEmbedding(nn.Cell):
    """rope(qkv [T, W], cos [T, D], sin [T, D], perm [D] int32) -> [T, W]: the first `rotated_heads` heads
    (q's, then k's) become x * cos + x[perm] * sin; the rest (v) is unchanged. The tables carry the signs,
    so one formula serves rotate-half and interleaved pairs."""

    def __init__(self, rotated_heads: int, head_dim: int, dtype=ms.float32, device: str = "cpu"):
        super().__init__()
        if rotated_heads < 0 or head_dim < 1:
            raise ValueError(f"rotated_heads must be >= 0 and head_dim >= 1, got {rotated_heads}, {head_dim}")
        self.fused = _fused(device, dtype)
        self.rotated_heads, self.head_dim = rotated_heads, head_dim
        self.rotated_t = Tensor([rotated_heads], ms.int32)  # [1]
        if self.fused:
            self.op = build.aot_op("RotaryEmbedding", ("qkv", "cos", "sin", "perm", "rotated_heads"),
                                   ms.float32)

    def construct(self, qkv, cos, sin, perm):
        if self.fused:
            return self.op(qkv, cos, sin, perm, self.rotated_t)
        t, width = qkv.shape[0], self.rotated_heads * self.head_dim
        x, rest = qkv[:, :width], qkv[:, width:]
        x = x.reshape(t, self.rotated_heads, self.head_dim)  # [T, heads, D]
        c, s = cos.reshape(t, 1, -1), sin.reshape(t, 1, -1)  # [T, 1, D]
        x = x * c + ops.gather(x, perm, 2) * s
        return ops.concat((x.reshape(t, width), rest), -1)


class SwiGlu(nn.Cell):
    """swiglu(gate_up [T, 2I]) -> [T, I]: silu(gate) * up, gate the first I columns."""

    def __init__(self, dtype=ms.float32, device: str = "cpu"):
        super().__init__()
        self.fused = _fused(device, dtype)
        if self.fused:
            self.op = build.aot_op("SwiGlu", ("gate_up",), ms.float32)

    def construct(self, gate_up):
        if self.fused:
            return self.op(gate_up)
        gate, up = ops.split(gate_up, gate_up.shape[-1] // 2, -1)
        return ops.silu(gate) * up
