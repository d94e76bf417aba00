"""Plain numpy references of the ops in ms_atb.ops (float64 compute)."""
import numpy as np

from ms_atb.ops import quant_matmul


def reshape_and_cache_ref(key, value, key_cache, value_cache, slot_mapping):
    """key, value [T, KVH, D]; caches [NB, BS, KVH, D]; slot_mapping [T] -> updated copies of the caches."""
    key_cache, value_cache = key_cache.copy(), value_cache.copy()
    block_size = key_cache.shape[1]
    for t, slot in enumerate(slot_mapping):
        if slot < 0:
            continue
        key_cache[slot // block_size, slot % block_size] = key[t]
        value_cache[slot // block_size, slot % block_size] = value[t]
    return key_cache, value_cache


def paged_attention_ref(query, key_cache, value_cache, block_tables, context_lens, query_start_loc, scale):
    """query [T, H, D] -> [T, H, D]: sequence b's queries are the last tokens of its context, causal, GQA."""
    num_tokens, num_heads, head_dim = query.shape
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    group = num_heads // num_kv_heads
    out = np.zeros(query.shape, np.float64)
    for b in range(len(context_lens)):
        start, end, ctx = int(query_start_loc[b]), int(query_start_loc[b + 1]), int(context_lens[b])
        if end == start:
            continue
        blocks = block_tables[b][: (ctx + block_size - 1) // block_size]
        keys = key_cache[blocks].reshape(-1, num_kv_heads, key_cache.shape[3])[:ctx].astype(np.float64)
        values = value_cache[blocks].reshape(-1, num_kv_heads, value_cache.shape[3])[:ctx].astype(np.float64)
        n = end - start
        q = query[start:end].astype(np.float64).reshape(n, num_kv_heads, group, head_dim)  # [n, KVH, G, D]
        scores = np.einsum("nkgd,ckd->nkgc", q, keys) * scale                             # [n, KVH, G, ctx]
        positions = ctx - n + np.arange(n)                                                 # [n]
        after = np.arange(ctx)[None, :] > positions[:, None]                               # [n, ctx] causal mask
        scores = np.where(after[:, None, None, :], -np.inf, scores)
        p = np.exp(scores - scores.max(-1, keepdims=True))
        out[start:end] = np.einsum("nkgc,ckd->nkgd", p / p.sum(-1, keepdims=True), values).reshape(n, num_heads,
                                                                                                     head_dim)
    return out


def rms_norm_ref(x, weight, eps):
    """x [T, H], weight [H] -> [T, H] (float64)."""
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight.astype(np.float64)


def rope_ref(x, positions, theta, interleaved):
    """x [T, heads, D] rotated by angle position * theta^(-2i/D) per pair i (float64).

    Pairs are (2i, 2i+1) when interleaved, else (i, i + D/2) (rotate-half)."""
    x = x.astype(np.float64)
    d = x.shape[-1]
    angles = np.outer(positions, theta ** (-np.arange(0, d, 2) / d))[:, None, :]  # [T, 1, D/2]
    cos, sin = np.cos(angles), np.sin(angles)
    a, b = (x[..., 0::2], x[..., 1::2]) if interleaved else (x[..., :d // 2], x[..., d // 2:])
    ra, rb = a * cos - b * sin, b * cos + a * sin
    out = np.empty_like(x)
    if interleaved:
        out[..., 0::2], out[..., 1::2] = ra, rb
    else:
        out[..., :d // 2], out[..., d // 2:] = ra, rb
    return out


def swiglu_ref(gate_up):
    """gate_up [T, 2I] -> silu(gate) * up [T, I] (float64, no overflow for any finite gate)."""
    g, u = np.split(gate_up.astype(np.float64), 2, axis=-1)
    e = np.exp(-np.abs(g))
    return g * np.where(g >= 0, 1.0, e) / (1.0 + e) * u


def quantize_int8_ref(x):
    """x [..., D] -> (q [..., D] int8, scale [...] float32): symmetric per row, in the kernel's float32 steps
    (scale = max|x| / 127, q = round_half_even(x * (127 / max|x|)); an all-zero row: q 0, scale 0)."""
    x = np.asarray(x, np.float32)
    amax = np.abs(x).max(-1)                                                    # [...]
    inv = np.divide(np.float32(127), amax, out=np.zeros_like(amax), where=amax > 0)
    q = np.clip(np.rint(x * inv[..., None]), -127, 127).astype(np.int8)
    return q, (amax / np.float32(127)).astype(np.float32)


def reshape_and_cache_int8_ref(key, value, key_cache, value_cache, key_scales, value_scales, slot_mapping):
    """The int8 form: caches [NB, BS, KVH, D] int8 and scales [NB, BS, KVH] float32 -> updated copies of all four."""
    kq, ks = quantize_int8_ref(key)
    vq, vs = quantize_int8_ref(value)
    key_cache, value_cache = reshape_and_cache_ref(kq, vq, key_cache, value_cache, slot_mapping)
    key_scales, value_scales = reshape_and_cache_ref(ks, vs, key_scales, value_scales, slot_mapping)
    return key_cache, value_cache, key_scales, value_scales


def dequantize_ref(cache, scales):
    """int8 cache [NB, BS, KVH, D] and scales [NB, BS, KVH] -> the float64 values attention reads."""
    return cache.astype(np.float64) * scales[..., None].astype(np.float64)


# ---------------------------------------------------------------- quantized weights (ops/quant_matmul.cc)

QUANT_KERNELS = {"q8_0": "QuantMatMulQ8_0", "q4_0": "QuantMatMulQ4_0", "q4_1": "QuantMatMulQ4_1",
                 "int8": "QuantMatMulInt8"}


def gguf_weight(fmt: str, k: int, n: int, seed: int):
    """(GGUF rows [N, bytes] uint8, its dequantisation W [K, N] float32 by the gguf package)."""
    import gguf
    from gguf import quants
    qtype = gguf.GGMLQuantizationType[fmt.upper()]
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((n, k)) * rng.uniform(0.01, 2.0, (n, 1))).astype(np.float32)  # HF [out, in]
    raw = quants.quantize(w, qtype)
    return raw, quants.dequantize(raw, qtype).astype(np.float32).T


def packed_and_reference(fmt: str, k: int, n: int, seed: int):
    """(packed [P, panel_bytes] int8, W [K, N] float32 the kernel must multiply by)."""
    if fmt == "int8":
        w = np.random.default_rng(seed).standard_normal((k, n)).astype(np.float32)
        packed = quant_matmul.quantize_int8(w)
        # The reference rebuilds int8's values from the rule (per column: max |w| / 127, round).
        scale = np.abs(w).max(axis=0) / np.float32(127)
        ref = np.round(w / np.where(scale > 0, scale, 1)).astype(np.float32) * scale
        assert np.abs(ref - w).max() <= scale.max() / 2 + 1e-6
        return packed, ref
    raw, ref = gguf_weight(fmt, k, n, seed)
    return quant_matmul.pack_gguf(raw, fmt, k), ref


def pack_gguf_ref(raw: np.ndarray, fmt: str, in_features: int, activations: str = "float32") -> np.ndarray:
    """numpy's QuantPack (ops/quant_pack.cc): GGUF rows [N, K / 32 * block bytes] uint8 -> [P, panel_bytes] int8
    in the layout of `activations`' kernel, by transposes."""
    qm = quant_matmul
    raw = np.asarray(raw, np.uint8)
    n, nb = raw.shape[0], in_features // qm.BLOCK
    p = -(-n // qm.PANEL)
    blocks = np.zeros((p * qm.PANEL, nb, qm.GGUF_BLOCK_BYTES[fmt]), np.uint8)
    blocks[:n] = raw.reshape(n, nb, -1)
    blocks = blocks.reshape(p, qm.PANEL, nb, -1).transpose(0, 2, 1, 3)   # [P, nb, 16 columns, GGUF block]
    # Per field: [P, nb, 16, bytes] -> [P, nb, bytes of the field for the 16 columns], column-minor.
    if fmt in ("q8_0", "q4_0"):
        parts = [blocks[..., :2], blocks[..., 2:].transpose(0, 1, 3, 2)]             # d; q[32][16] or q[16][16]
    else:
        parts = [blocks[..., :2], blocks[..., 2:4], blocks[..., 4:].transpose(0, 1, 3, 2)]  # d; m; q[16][16]
    out = np.concatenate([np.ascontiguousarray(x).reshape(p, nb, -1) for x in parts], axis=2)
    out = out.reshape(p, nb * qm._BLOCK_BYTES[fmt]).view(np.int8)
    return qm._dot_layout(out, fmt, in_features) if activations == "int8" else out


def lora_add_ref(y, x, slots, lora_a, lora_b, ranks, segments):
    """ops/lora.py's LoraAdd: y [T, W] plus, for each row with a slot, each segment's (x A_g^T) B_g of the slot's
    rank there (float64)."""
    out = y.astype(np.float64).copy()
    max_rank, column = lora_b.shape[1], 0
    for g, (target, width) in enumerate(segments):
        for t, slot in enumerate(slots):
            if slot < 0:
                continue
            r = ranks[slot, target]
            a = lora_a[slot, g * max_rank:g * max_rank + r].astype(np.float64)      # [r, K]
            b = lora_b[slot, :r, column:column + width].astype(np.float64)         # [r, width]
            out[t, column:column + width] += (x[t].astype(np.float64) @ a.T) @ b
        column += width
    return out
