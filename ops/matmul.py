"""PackedMatMul: x @ W on the CPU through our register-blocked kernel, W stored in column panels."""
import numpy as np
import mindspore as ms
from mindspore import nn

from ms_atb.ops import build

PANEL = 16  # columns per panel of a packed weight


def packed_shape(in_features: int, out_features: int) -> tuple[int, int, int]:
    """Shape [P, K, 16] of a packed [K, N] weight, P = ceil(N / 16)."""
    return (-(-out_features // PANEL), in_features, PANEL)


def pack_weight(w: np.ndarray) -> np.ndarray:
    """[K, N] -> [P, K, 16] float32: panel p holds columns 16p..16p+15, zero past N."""
    k, n = w.shape
    p = -(-n // PANEL)
    out = np.zeros((p, k, PANEL), np.float32)
    full = n // PANEL
    out[:full] = np.asarray(w[:, :full * PANEL], np.float32).reshape(k, full, PANEL).transpose(1, 0, 2)
    if full < p:
        out[full, :, :n - full * PANEL] = w[:, full * PANEL:]
    return out


def unpack_weight(packed: np.ndarray, out_features: int) -> np.ndarray:
    """Inverse of pack_weight: [P, K, 16] -> [K, N]."""
    p, k, _ = packed.shape
    return packed.transpose(1, 0, 2).reshape(k, p * PANEL)[:, :out_features]


class PanelMatMul(nn.Cell):
    """mm(x [M, K] float32, w [P, ...], rows=None) -> [M, out_features] through a kernel whose output has the
    16 P columns of the weight's panels; columns past out_features (the last panel's padding) are cut off.
    rows (int32 [1], optional): only x's first `rows` rows are multiplied, the others give zero rows (a
    static-shape graph padded to its bucket passes its real token count). A subclass names the kernel."""

    def __init__(self, kernel: str, out_features: int):
        super().__init__()
        if out_features < 1:
            raise ValueError(f"out_features must be >= 1, got {out_features}")
        self.out_features = out_features
        self.padded = -(-out_features // PANEL) * PANEL != out_features
        self.op = build.aot_op(kernel, ("x", "w_packed"), ms.float32)
        self.op_rows = build.aot_op(kernel + "Rows", ("x", "w_packed", "rows"), ms.float32)

    def construct(self, x, w_packed, rows=None):
        if rows is None:
            y = self.op(x, w_packed)  # [M, 16 P]
        else:
            y = self.op_rows(x, w_packed, rows)  # [M, 16 P], rows past `rows` zero
        if self.padded:
            y = y[:, :self.out_features]
        return y


class PackedMatMul(PanelMatMul):
    """mm(x [M, K] float32, w_packed [P, K, 16] float32, rows=None) -> [M, out_features] on the CPU.

    Faster than MindSpore's CPU MatMul on the shapes of LLM inference (small M: decode batches):
    register tiles (AVX2: 6 rows x 16 columns; AVX-512: 12 rows x a pair of 16-column panels) over
    unit-stride panels, split over the kernels' thread pool.
    """

    def __init__(self, out_features: int):
        super().__init__("PackedMatMul", out_features)
