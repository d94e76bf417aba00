"""QuantMatMul: x @ W on the CPU for a weight kept quantized, in the panel layout of ops/quant_matmul.cc.

Formats: "q8_0", "q4_0", "q4_1" (GGUF's blocks of 32, re-laid as column panels of 16, bits unchanged)
and "int8" (per-output-channel symmetric int8, float32 scales). A packed weight is [P, panel_bytes]
int8 (raw bytes), P = ceil(N / 16); columns past N are zero.

Activations: "float32" (QuantMatMul<F>: x as given, W dequantised in registers) or "int8" (QuantDot<F> of
ops/quant_dot.h: x quantized per row and block of 32, integer dot products with W as stored). The int8 path
takes its weight in the dot layout (each block's quants re-ordered, 4 k of a column in a 32-bit lane), packed
at load: `activations` of pack_gguf / quantize_int8 / dequantize / QuantMatMul must agree.
"""
import functools

import numpy as np

from ms_atb.formats.gguf_reader import GGUF_BLOCK_BYTES
from ms_atb.ops import build
from ms_atb.ops.matmul import PanelMatMul

PANEL = 16   # columns per panel
BLOCK = 32   # rows of k per block
FORMATS = ("q8_0", "q4_0", "q4_1", "int8")
_BLOCK_BYTES = {"q8_0": 32 + 512, "q4_0": 32 + 256, "q4_1": 64 + 256, "int8": 512}   # per panel block
_HEADER_BYTES = {"q8_0": 0, "q4_0": 0, "q4_1": 0, "int8": 64}
_KERNELS = {"q8_0": "QuantMatMulQ8_0", "q4_0": "QuantMatMulQ4_0", "q4_1": "QuantMatMulQ4_1",
            "int8": "QuantMatMulInt8"}
_DOT_KERNELS = {"q8_0": "QuantDotQ8_0", "q4_0": "QuantDotQ4_0", "q4_1": "QuantDotQ4_1", "int8": "QuantDotInt8"}
ACTIVATIONS = ("float32", "int8")
_QUANTS_AT = {"q8_0": 32, "q4_0": 32, "q4_1": 64, "int8": 0}   # offset of the quants in a panel block


def check_activations(activations: str) -> None:
    if activations not in ACTIVATIONS:
        raise ValueError(f"activations {activations!r} not supported; allowed: {ACTIVATIONS}")


def _dot_layout(packed: np.ndarray, fmt: str, in_features: int, inverse: bool = False) -> np.ndarray:
    """[P, panel_bytes] in quant_matmul.cc's layout -> the dot layout of ops/quant_dot.h (inverse: back):
    each block's quants [rows][16 columns] become [rows / 4][16 columns][4 rows]."""
    u = np.ascontiguousarray(packed).view(np.uint8)
    p, nb, head, at = u.shape[0], -(-in_features // BLOCK), _HEADER_BYTES[fmt], _QUANTS_AT[fmt]
    body = u[:, head:].reshape(p, nb, _BLOCK_BYTES[fmt])
    rows = (_BLOCK_BYTES[fmt] - at) // PANEL                          # 32 (8-bit quants) or 16 (nibble pairs)
    q = body[..., at:]
    if inverse:
        q = q.reshape(p, nb, rows // 4, PANEL, 4).transpose(0, 1, 2, 4, 3)
    else:
        q = q.reshape(p, nb, rows // 4, 4, PANEL).transpose(0, 1, 2, 4, 3)
    body = np.concatenate([body[..., :at], q.reshape(p, nb, -1)], axis=2)
    return np.concatenate([u[:, :head], body.reshape(p, -1)], axis=1).view(np.int8)


def _check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"quantized weight format {fmt!r} not supported; allowed: {FORMATS}")


def panel_bytes(fmt: str, in_features: int) -> int:
    """Bytes of one panel (16 columns) of a weight with in_features rows of k."""
    _check_format(fmt)
    return _HEADER_BYTES[fmt] + -(-in_features // BLOCK) * _BLOCK_BYTES[fmt]


def packed_shape(fmt: str, in_features: int, out_features: int) -> tuple[int, int]:
    """Shape [P, panel_bytes] of a packed [K, N] weight."""
    return (-(-out_features // PANEL), panel_bytes(fmt, in_features))


def pack_gguf(raw: np.ndarray, fmt: str, in_features: int, activations: str = "float32",
              out: np.ndarray | None = None, first_panel: int = 0) -> np.ndarray:
    """GGUF rows [N, K / 32 * block bytes] uint8 (one row per output column of W [K, N]) -> [P, panel_bytes]
    int8, in the layout of `activations`' kernel. The values are the stored bits, re-ordered: nothing is
    re-quantized. Packed by the kernel library (QuantPack, ops/quant_pack.cc: panels in parallel). out: a buffer
    [P', panel_bytes] to pack into, its panels first_panel .. first_panel + ceil(N / 16) - 1 (the part of a fused
    linear); None: a new one of ceil(N / 16) panels."""
    _check_format(fmt)
    check_activations(activations)
    if fmt == "int8":
        raise ValueError("int8 weights are quantized from floats (quantize_int8), not read from GGUF")
    if in_features % BLOCK:
        raise ValueError(f"a {fmt} weight needs in_features a multiple of {BLOCK} (GGUF's block), "
                         f"got {in_features}")
    raw = np.asarray(raw, np.uint8)
    n, nb = raw.shape[0], in_features // BLOCK
    if raw.shape != (n, nb * GGUF_BLOCK_BYTES[fmt]):
        raise ValueError(f"{fmt} rows must be [N, {nb * GGUF_BLOCK_BYTES[fmt]}] bytes for in_features "
                         f"{in_features}, got {raw.shape}")
    if out is None:
        out = np.empty(packed_shape(fmt, in_features, n), np.int8)
    assert out.shape[1] == panel_bytes(fmt, in_features) and out.flags.c_contiguous and out.itemsize == 1
    spec = np.array([FORMATS.index(fmt), activations == "int8", first_panel], np.int32)
    status = build.call_kernel(_library().QuantPack, [np.ascontiguousarray(raw), spec, out])
    assert status == 0, "QuantPack refused its arguments (its message is on stderr)"
    return out


@functools.lru_cache(maxsize=1)
def _library():
    import ctypes
    return ctypes.CDLL(build.kernel_library())


def quantize_int8(w: np.ndarray, activations: str = "float32") -> np.ndarray:
    """[K, N] float -> [P, panel_bytes] int8: per output column, scale = max |w| / 127, q = round(w / scale);
    in the layout of `activations`' kernel."""
    check_activations(activations)
    w = np.asarray(w, np.float32)
    k, n = w.shape
    p, nb = -(-n // PANEL), -(-k // BLOCK)
    full = np.zeros((nb * BLOCK, p * PANEL), np.float32)
    full[:k, :n] = w
    scale = np.abs(full).max(axis=0) / 127.0                      # [16 P]
    q = np.round(full / np.where(scale > 0, scale, 1.0)).astype(np.int8)   # [nb 32, 16 P]
    q = q.reshape(nb * BLOCK, p, PANEL).transpose(1, 0, 2).reshape(p, -1)  # [P, nb 32 16]
    header = scale.astype(np.float32).reshape(p, PANEL).view(np.int8)      # [P, 64]
    out = np.concatenate([header, q], axis=1)
    return _dot_layout(out, "int8", k) if activations == "int8" else out


def dequantize(packed: np.ndarray, fmt: str, in_features: int, out_features: int,
               activations: str = "float32") -> np.ndarray:
    """[P, panel_bytes] (in the layout of `activations`' kernel) -> [K, N] float32, the weight's values."""
    _check_format(fmt)
    check_activations(activations)
    k, nb = in_features, -(-in_features // BLOCK)
    packed = np.asarray(packed)
    p = packed.shape[0]
    if packed.shape != packed_shape(fmt, k, out_features):
        raise ValueError(f"packed {fmt} weight must be {packed_shape(fmt, k, out_features)}, got {packed.shape}")
    if activations == "int8":
        packed = _dot_layout(packed, fmt, k, inverse=True)
    u = packed.view(np.uint8)
    body = u[:, _HEADER_BYTES[fmt]:].reshape(p, nb, _BLOCK_BYTES[fmt])
    if fmt == "int8":
        s = u[:, :64].copy().view(np.float32)                                     # [P, 16]
        w = body.view(np.int8).reshape(p, nb * BLOCK, PANEL).astype(np.float32) * s[:, None, :]
    else:
        d = body[..., :32].copy().view(np.float16).astype(np.float32)[:, :, None, :]   # [P, nb, 1, 16]
        if fmt == "q8_0":
            w = body[..., 32:].view(np.int8).reshape(p, nb, BLOCK, PANEL).astype(np.float32) * d
        else:
            q = body[..., -256:].reshape(p, nb, BLOCK // 2, PANEL)
            nib = np.concatenate([q & 15, q >> 4], axis=2).astype(np.float32)      # [P, nb, 32, 16]
            m = (body[..., 32:64].copy().view(np.float16).astype(np.float32)[:, :, None, :]
                 if fmt == "q4_1" else -8.0 * d)
            w = nib * d + m
        w = w.reshape(p, nb * BLOCK, PANEL)
    return w.transpose(1, 0, 2).reshape(nb * BLOCK, p * PANEL)[:k, :out_features]


class QuantMatMul(PanelMatMul):
    """mm(x [M, K] float32, w_packed [P, panel_bytes] int8, rows=None) -> [M, out_features] on the CPU;
    rows as PackedMatMul's. activations "float32": W dequantised inside the kernel's tiles
    (ops/quant_matmul.cc); "int8": x quantized per row and block of 32, integer dot products with W in the dot
    layout (ops/quant_dot.h)."""

    def __init__(self, fmt: str, out_features: int, activations: str = "float32"):
        _check_format(fmt)
        check_activations(activations)
        super().__init__((_DOT_KERNELS if activations == "int8" else _KERNELS)[fmt], out_features)
        self.activations = activations
