"""LoraAdd: a linear's output plus each row's LoRA delta on the CPU (ops/lora.cc), rows of different adapters in
one call.

The adapters resident at once sit in slots: their A and B stacked in [L, ...] tensors, one row's slot an int32 of
the step's inputs, so changing which adapter a row uses changes data, never the graph. A fused linear (q/k/v or
gate/up) is several segments of one output, each with its own A and its own columns of B.
"""
import numpy as np
import mindspore as ms
from mindspore import Tensor, nn

from ms_atb.ops import build

_INPUTS = ("y", "x", "slots", "lora_a", "lora_b", "ranks", "segments")


def lora_shapes(max_loras: int, max_rank: int, in_features: int, widths) -> tuple[tuple, tuple]:
    """The shapes of a linear's stacked A [L, S R, in] and B [L, R, out] for output segments of these widths."""
    return (max_loras, len(widths) * max_rank, in_features), (max_loras, max_rank, int(sum(widths)))


class LoraAdd(nn.Cell):
    """lora(y [T, W] float32, x [T, K] float32, slots [T] int32, lora_a [L, S R, K], lora_b [L, R, W],
    ranks [L, NT] int32) -> [T, W] float32: row t is y[t] + sum over segments g of
    (x[t] @ lora_a[l, g R:g R + r].T) @ lora_b[l, :r, columns of g], l = slots[t] (-1: y[t] as it is), r = ranks[l,
    target of g] (0: none). Scalings are folded into lora_b.

    segments: (target, width) per output segment, in column order: target is the column of `ranks` that holds a
    slot's rank there (the caller's numbering of the adapted projections), widths add up to W.
    """

    def __init__(self, segments):
        super().__init__()
        segments = [(int(t), int(w)) for t, w in segments]
        if not segments or any(t < 0 or w < 1 for t, w in segments):
            raise ValueError(f"segments must be (target >= 0, width >= 1) pairs, got {segments}")
        self.width = sum(w for _, w in segments)
        self.segments = Tensor(np.array(segments, np.int32))  # [S, 2]
        self.op = build.aot_op("LoraAdd", _INPUTS, ms.float32)

    def construct(self, y, x, slots, lora_a, lora_b, ranks):
        return self.op(y, x, slots, lora_a, lora_b, ranks, self.segments)
