"""A numpy model of QuantDot's integer arithmetic (ops/quant_dot.h), built from the GGUF bytes (or, for int8,
from the rule) rather than from the packed panels, and the bound on its distance from float32 activations."""
import numpy as np

from ms_atb.ops import quant_matmul
from ops_reference import gguf_weight

DOT_KERNELS = {"q8_0": "QuantDotQ8_0", "q4_0": "QuantDotQ4_0", "q4_1": "QuantDotQ4_1", "int8": "QuantDotInt8"}


def quantize_rows(x: np.ndarray):
    """x [M, K] float32 -> (q [M, nb, 32] int64, d [M, nb] float32, s [M, nb] int64): per block of 32,
    d = max |x| / 127, q = round(x / d) in float32 (nearest even), zero past K and where d = 0."""
    m, k = x.shape
    nb = -(-k // 32)
    xp = np.zeros((m, nb * 32), np.float32)
    xp[:, :k] = x
    xb = xp.reshape(m, nb, 32)
    d = (np.abs(xb).max(axis=2) / np.float32(127)).astype(np.float32)
    q = np.round(xb / np.where(d > 0, d, np.float32(1))[..., None]).astype(np.float32)
    q = np.clip(np.where(d[..., None] > 0, q, 0), -127, 127).astype(np.int64)
    return q, d, q.sum(axis=2)


def weight_fields(fmt: str, k: int, n: int, seed: int):
    """(packed [P, panel_bytes] int8 in the dot layout, fields): fields = (q [nb, 32, N] int64, d [nb, N],
    m [nb, N] float32, scale [N] float32 or None, W [K, N] float32 the values). For GGUF formats q, d, m are read
    from the GGUF block bytes (q: the signed int8, or the nibble 0..15); for int8 they follow the rule."""
    nb = -(-k // 32)
    if fmt == "int8":
        w = np.random.default_rng(seed).standard_normal((k, n)).astype(np.float32)
        scale = (np.abs(w).max(axis=0) / np.float32(127)).astype(np.float32)
        qw = np.zeros((nb * 32, n), np.int64)
        qw[:k] = np.round(w / np.where(scale > 0, scale, 1)).astype(np.int64)
        ones = np.ones((nb, n), np.float32)
        values = (qw[:k] * scale).astype(np.float32)
        return (quant_matmul.quantize_int8(w, activations="int8"),
                (qw.reshape(nb, 32, n), ones, 0 * ones, scale, values))
    raw, values = gguf_weight(fmt, k, n, seed)
    blocks = raw.reshape(n, nb, -1)                                    # [N, nb, GGUF block bytes]
    d = blocks[..., :2].copy().view(np.float16)[..., 0].astype(np.float32).T      # [nb, N]
    if fmt == "q8_0":
        q = blocks[..., 2:].view(np.int8).astype(np.int64)              # [N, nb, 32]
        m = 0 * d
    else:
        nib = blocks[..., 4 if fmt == "q4_1" else 2:].astype(np.int64)   # [N, nb, 16]
        q = np.concatenate([nib & 15, nib >> 4], axis=2)                 # element j: low, j + 16: high
        m = (blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32).T if fmt == "q4_1"
             else -8 * d)
    return (quant_matmul.pack_gguf(raw, fmt, k, activations="int8"),
            (q.transpose(1, 2, 0), d, m, None, values))


def quant_dot_ref(x: np.ndarray, fmt: str, fields):
    """(y [M, N] float64 of the integer model, terms [M, N]: the sum of |each block's contribution|, the scale
    of float32's rounding of the kernel's sum; Q4_1: both terms of a block)."""
    qw, dw, mw, scale, _ = fields
    qx, dx, sx = quantize_rows(x)
    i = np.einsum("mbk,bkn->mbn", qx, qw)                                  # exact integer dots
    if fmt == "q4_0":
        i = i - 8 * sx[..., None]
    if fmt == "int8":
        contrib = dx[..., None].astype(np.float64) * i
    else:
        sc = (dw[None] * dx[..., None]).astype(np.float32).astype(np.float64)     # d_w * d_x, float32
        contrib = sc * i
    mins = 0 * contrib
    if fmt == "q4_1":     # a second term a block, which may nearly cancel the first: each rounds on its own scale
        mins = mw[None].astype(np.float64) * (dx * sx.astype(np.float32)).astype(np.float32)[..., None]
    y, terms = (contrib + mins).sum(axis=1), (np.abs(contrib) + np.abs(mins)).sum(axis=1)
    if scale is not None:
        y, terms = y * scale, terms * np.abs(scale)
    return y, terms


def activation_bound(x: np.ndarray, values: np.ndarray) -> np.ndarray:
    """[M, N]: the most int8 activations can move y = x @ W: |x - d_x q_x| <= d_x / 2 per element, so
    |dy| <= sum over blocks of d_x / 2 * sum over the block's k of |W|."""
    _, dx, _ = quantize_rows(x)
    k = values.shape[0]
    nb = dx.shape[1]
    wa = np.zeros((nb * 32, values.shape[1]))
    wa[:k] = np.abs(values)
    return np.einsum("mb,bn->mn", dx.astype(np.float64) / 2, wa.reshape(nb, 32, -1).sum(axis=1))
