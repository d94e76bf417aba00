"""An independent numpy Llama: full causal attention over a whole sequence, no paging, HF weight names/layouts."""
import math

import numpy as np


def inv_freq(head_dim, theta, rope_scaling, max_pos):
    """RoPE inverse frequencies per HF's formulas (float64), and the attention scale of cos/sin."""
    freqs = theta ** (-np.arange(0, head_dim, 2) / head_dim)
    rs = rope_scaling or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "linear":
        return freqs / rs["factor"], 1.0
    if kind == "llama3":
        factor, old = rs["factor"], rs["original_max_position_embeddings"]
        lo, hi = rs["low_freq_factor"], rs["high_freq_factor"]
        out = []
        for f in freqs:
            wavelen = 2 * math.pi / f
            if wavelen < old / hi:
                out.append(f)
            elif wavelen > old / lo:
                out.append(f / factor)
            else:
                s = (old / wavelen - lo) / (hi - lo)
                out.append((1 - s) * f / factor + s * f)
        return np.array(out), 1.0
    if kind == "yarn":
        factor, old = rs["factor"], rs.get("original_max_position_embeddings", max_pos)
        fast, slow = rs.get("beta_fast", 32), rs.get("beta_slow", 1)
        dim_for = [head_dim * math.log(old / (r * 2 * math.pi)) / (2 * math.log(theta)) for r in (fast, slow)]
        low, high = max(math.floor(dim_for[0]), 0), min(math.ceil(dim_for[1]), head_dim - 1)
        if low == high:
            high += 0.001
        out = []
        for i, f in enumerate(freqs):
            ramp = min(max((i - low) / (high - low), 0.0), 1.0)
            out.append(f * (1 - ramp) + f / factor * ramp)
        return np.array(out), rs.get("attention_factor") or 0.1 * math.log(factor) + 1.0
    return freqs, 1.0


def apply_rope(x, positions, freqs, scale, interleaved):
    """x [T, N, D] rotated by angle positions * freqs."""
    ang = positions[:, None].astype(np.float64) * freqs[None, :]  # [T, D/2]
    c, s = (np.cos(ang) * scale)[:, None, :], (np.sin(ang) * scale)[:, None, :]
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = a * c - b * s, b * c + a * s
        return out
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)


def rms_norm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def forward(weights: dict, config, token_ids) -> np.ndarray:
    """Logits [T, vocab] (float64) of every position of one sequence."""
    w = {k: np.asarray(v, np.float64) for k, v in weights.items()}
    c = config
    h_n, kv_n, d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    freqs, scale = inv_freq(d, c.rope_theta, c.rope_scaling, c.max_position_embeddings)
    ids = np.asarray(token_ids)
    t = len(ids)
    pos = np.arange(t)
    x = w["model.embed_tokens.weight"][ids]  # [T, hidden]
    causal = np.tril(np.ones((t, t), bool))
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        a = rms_norm(x, w[p + "input_layernorm.weight"], c.rms_norm_eps)
        q = (a @ w[p + "self_attn.q_proj.weight"].T).reshape(t, h_n, d)
        k = (a @ w[p + "self_attn.k_proj.weight"].T).reshape(t, kv_n, d)
        v = (a @ w[p + "self_attn.v_proj.weight"].T).reshape(t, kv_n, d)
        q = apply_rope(q, pos, freqs, scale, c.rope_interleaved)
        k = apply_rope(k, pos, freqs, scale, c.rope_interleaved)
        group = h_n // kv_n
        out = np.empty_like(q)
        for hd in range(h_n):
            scores = q[:, hd] @ k[:, hd // group].T / math.sqrt(d)  # [T, T]
            scores = np.where(causal, scores, -np.inf)
            prob = np.exp(scores - scores.max(-1, keepdims=True))
            out[:, hd] = (prob / prob.sum(-1, keepdims=True)) @ v[:, hd // group]
        x = x + out.reshape(t, h_n * d) @ w[p + "self_attn.o_proj.weight"].T
        m = rms_norm(x, w[p + "post_attention_layernorm.weight"], c.rms_norm_eps)
        gate = m @ w[p + "mlp.gate_proj.weight"].T
        up = m @ w[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"], c.rms_norm_eps)
    head = w["model.embed_tokens.weight"] if c.tie_word_embeddings else w["lm_head.weight"]
    return x @ head.T


def random_weights(config, seed=0, scale=0.08) -> dict:
    """HF-named float32 weights of a random Llama of `config`'s shape."""
    rng = np.random.default_rng(seed)
    c = config
    hid, d = c.hidden_size, c.head_dim
    w = {"model.embed_tokens.weight": rng.standard_normal((c.vocab_size, hid)),
         "model.norm.weight": 1 + 0.1 * rng.standard_normal(hid)}
    if not c.tie_word_embeddings:
        w["lm_head.weight"] = rng.standard_normal((c.vocab_size, hid)) * scale * 4
    shapes = {"self_attn.q_proj.weight": (c.num_attention_heads * d, hid),
              "self_attn.k_proj.weight": (c.num_key_value_heads * d, hid),
              "self_attn.v_proj.weight": (c.num_key_value_heads * d, hid),
              "self_attn.o_proj.weight": (hid, c.num_attention_heads * d),
              "mlp.gate_proj.weight": (c.intermediate_size, hid),
              "mlp.up_proj.weight": (c.intermediate_size, hid),
              "mlp.down_proj.weight": (hid, c.intermediate_size)}
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        for name, shape in shapes.items():
            w[p + name] = rng.standard_normal(shape) * scale * (2 if "q_proj" in name or "k_proj" in name else 1)
        w[p + "input_layernorm.weight"] = 1 + 0.1 * rng.standard_normal(hid)
        w[p + "post_attention_layernorm.weight"] = 1 + 0.1 * rng.standard_normal(hid)
    return {k: v.astype(np.float32) for k, v in w.items()}
