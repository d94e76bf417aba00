"""Llama for causal LM as MindSpore graph-mode Cells, attending over a paged KV cache."""
import math
from dataclasses import dataclass, field, fields

import mindspore as ms
from mindspore.common.initializer import initializer
import numpy as np
from mindspore import nn, ops

from ms_atb.models.gguf_reader import GGUFBlocks
from ms_atb.models.parallel import (ColumnParallelLinear, RowParallelLinear, num_heads_per_rank,
                                    num_kv_heads_per_rank)
from ms_atb.ops import PagedAttention, ReshapeAndCache, RmsNorm, RotaryEmbedding, SwiGlu

# freq_factors: llama.cpp's rope_freqs tensor (GGUF), one divisor per frequency ({"factors": [D/2]}).
_ROPE_KINDS = ("default", "linear", "dynamic", "llama3", "yarn", "freq_factors")


@dataclass
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    rope_interleaved: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | list | None = None
    attention_bias: bool = False        # a bias on each of q/k/v_proj (Qwen2)
    qk_norm: bool = False               # RMSNorm over each head of q and of k before RoPE (Qwen3)
    sliding_window: int | None = None   # attention span (Mistral); the engine refuses longer contexts
    extra: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"LlamaConfig.{name} must be a positive int, got {value!r}")
        for name in ("rms_norm_eps", "rope_theta"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < math.inf:
                raise ValueError(f"LlamaConfig.{name} must be a finite number > 0, got {value!r}")
        for name in ("tie_word_embeddings", "rope_interleaved", "attention_bias", "qk_norm"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"LlamaConfig.{name} must be true or false, got {getattr(self, name)!r}")
        if self.sliding_window is not None and (not isinstance(self.sliding_window, int)
                                                or isinstance(self.sliding_window, bool)
                                                or self.sliding_window < 1):
            raise ValueError(f"LlamaConfig.sliding_window must be null or a positive int, "
                             f"got {self.sliding_window!r}")
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, dict):
            raise ValueError(f"LlamaConfig.rope_scaling must be null or a mapping, got {self.rope_scaling!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads {self.num_attention_heads} must be a multiple of "
                             f"num_key_value_heads {self.num_key_value_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.rope_scaling is not None:
            kind = self.rope_scaling.get("rope_type", self.rope_scaling.get("type"))
            if kind not in _ROPE_KINDS:
                raise ValueError(f"rope_scaling type {kind!r} not supported; allowed: {_ROPE_KINDS}")

    @classmethod
    def from_hf_dict(cls, d: dict) -> "LlamaConfig":
        """From an HF config.json dict; unknown keys are kept in `extra`."""
        names = {f.name for f in fields(cls)} - {"extra"}
        for key in ("hidden_size", "num_attention_heads"):     # head_dim may be derived from them
            if not isinstance(d[key], int) or isinstance(d[key], bool) or d[key] < 1:
                raise ValueError(f"LlamaConfig.{key} must be a positive int, got {d[key]!r}")
        kwargs = {k: d[k] for k in names if k in d}
        kwargs.setdefault("num_key_value_heads", d["num_attention_heads"])
        if kwargs.get("head_dim") is None:
            kwargs["head_dim"] = d["hidden_size"] // d["num_attention_heads"]
        return cls(**kwargs, extra={k: v for k, v in d.items() if k not in names})


def rope_inv_freq(config: LlamaConfig) -> tuple[np.ndarray, float]:
    """Inverse frequencies [head_dim/2] (float64) and the cos/sin scale, per config.rope_scaling."""
    dim, base = config.head_dim, config.rope_theta
    inv_freq = 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    rs = config.rope_scaling or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    factor = float(rs.get("factor", 1.0))
    if kind == "linear":
        return inv_freq / factor, 1.0
    if kind == "freq_factors":
        factors = np.asarray(rs.get("factors", ()), np.float64)
        if factors.shape != inv_freq.shape or not np.all(factors > 0):
            raise ValueError(f"rope_scaling freq_factors must be {len(inv_freq)} numbers > 0 "
                             f"(head_dim / 2), got shape {factors.shape}")
        return inv_freq / factors, 1.0
    if kind == "llama3":
        old = rs.get("original_max_position_embeddings", 8192)
        low, high = rs.get("low_freq_factor", 1.0), rs.get("high_freq_factor", 4.0)
        wavelen = 2 * math.pi / inv_freq
        smooth = np.clip((old / wavelen - low) / (high - low), 0.0, 1.0)
        scaled = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        return np.where(wavelen > old / low, inv_freq / factor,
                        np.where(wavelen < old / high, inv_freq, scaled)), 1.0
    if kind == "yarn":
        old = rs.get("original_max_position_embeddings", config.max_position_embeddings)
        fast, slow = rs.get("beta_fast", 32), rs.get("beta_slow", 1)
        mscale = rs.get("attention_factor") or 0.1 * math.log(factor) + 1.0

        def corr(rot):
            return dim * math.log(old / (rot * 2 * math.pi)) / (2 * math.log(base))
        lo, hi = max(math.floor(corr(fast)), 0), min(math.ceil(corr(slow)), dim - 1)
        ramp = np.clip((np.arange(dim // 2) - lo) / ((hi - lo) or 0.001), 0.0, 1.0)
        extrapolation = 1.0 - ramp
        return inv_freq / factor * ramp + inv_freq * extrapolation, mscale
    # "dynamic" (NTK) changes nothing below max_position_embeddings, the table's length.
    return inv_freq, 1.0


def rope_tables(config: LlamaConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """cos [P, D], signed sin [P, D], perm [D]: rope(x) = x * cos + x[..., perm] * sin."""
    inv_freq, scale = rope_inv_freq(config)
    d = config.head_dim
    angles = np.outer(np.arange(config.max_position_embeddings, dtype=np.float64), inv_freq)  # [P, D/2]
    cos, sin = np.cos(angles) * scale, np.sin(angles) * scale
    if config.rope_interleaved:  # pairs (2i, 2i+1)
        perm = np.arange(d).reshape(-1, 2)[:, ::-1].reshape(-1)
        cos_full = np.repeat(cos, 2, axis=1)
        sin_full = np.stack([-sin, sin], axis=-1).reshape(len(sin), d)
    else:  # halves (i, i + D/2)
        perm = np.concatenate([np.arange(d // 2, d), np.arange(d // 2)])
        cos_full = np.concatenate([cos, cos], axis=1)
        sin_full = np.concatenate([-sin, sin], axis=1)
    return cos_full.astype(np.float32), sin_full.astype(np.float32), perm.astype(np.int32)


class RMSNorm(nn.Cell):
    def __init__(self, size: int, eps: float, dtype, device):
        super().__init__()
        self.weight = ms.Parameter(ms.Tensor(np.ones(size), dtype), name="weight")  # [size]
        self.norm = RmsNorm(eps, dtype, device)

    def construct(self, x):  # [T, size]
        return self.norm(x, self.weight)


class LlamaAttention(nn.Cell):
    """attention_backend: the KV-cache ops' backend, a plain string (ms_atb/ops/backends.py); quantized: int8 caches."""

    def __init__(self, config: LlamaConfig, dtype, device, tp_size, tp_rank, attention_backend=None, quantized=False,
                 formats=("float32", "float32")):
        """formats: the weight formats of (qkv_proj, o_proj)."""
        super().__init__()
        d = config.head_dim
        self.num_heads = num_heads_per_rank(config, tp_size)
        self.num_kv_heads = num_kv_heads_per_rank(config, tp_size)
        self.head_dim = d
        self.q_size, self.kv_size = self.num_heads * d, self.num_kv_heads * d
        self.qkv_proj = ColumnParallelLinear(config.hidden_size, (self.q_size, self.kv_size, self.kv_size),
                                             tp_size, tp_rank, dtype, device, formats[0])
        self.o_proj = RowParallelLinear(self.q_size, config.hidden_size, tp_size, tp_rank, dtype, device, formats[1])
        self.has_bias, self.has_qk_norm = config.attention_bias, config.qk_norm
        if self.has_bias:  # [q + 2 kv] of this rank, in qkv_proj's column order
            self.qkv_bias = ms.Parameter(initializer("zeros", (self.q_size + 2 * self.kv_size,), dtype),
                                         name="qkv_bias")
        if self.has_qk_norm:  # weights [D], the same on every rank
            self.q_norm = RMSNorm(d, config.rms_norm_eps, dtype, device)
            self.k_norm = RMSNorm(d, config.rms_norm_eps, dtype, device)
        self.rope = RotaryEmbedding(self.num_heads + self.num_kv_heads, d, dtype, device)
        self.reshape_and_cache = ReshapeAndCache(device=device, backend=attention_backend, quantized=quantized)
        self.attn = PagedAttention(self.num_heads, self.num_kv_heads, d, d ** -0.5, device=device,
                                   backend=attention_backend, quantized=quantized)

    def construct(self, x, cos, sin, perm, key_cache, value_cache, slot_mapping, block_tables,
                  context_lens, query_start_loc, rows, key_scale_cache=None, value_scale_cache=None):
        t = x.shape[0]
        qkv = self.qkv_proj(x, rows)  # [T, q + 2 kv]
        if self.has_bias:
            qkv = qkv + self.qkv_bias
        if self.has_qk_norm:
            q, k, v = ops.split(qkv, (self.q_size, self.kv_size, self.kv_size), -1)
            q = self.q_norm(q.reshape(t * self.num_heads, self.head_dim)).reshape(t, self.q_size)  # [T, q]
            k = self.k_norm(k.reshape(t * self.num_kv_heads, self.head_dim)).reshape(t, self.kv_size)
            qkv = ops.concat((q, k, v), -1)  # [T, q + 2 kv]
        qkv = self.rope(qkv, cos, sin, perm)  # [T, q + 2 kv], q and k rotated
        q, k, v = ops.split(qkv, (self.q_size, self.kv_size, self.kv_size), -1)
        q = q.reshape(t, self.num_heads, self.head_dim)  # [T, H, D]
        k = k.reshape(t, self.num_kv_heads, self.head_dim)  # [T, KVH, D]
        v = v.reshape(t, self.num_kv_heads, self.head_dim)  # [T, KVH, D]
        written = self.reshape_and_cache(k, v, key_cache, value_cache, slot_mapping, key_scale_cache,
                                         value_scale_cache)
        q = ops.depend(q, written)
        o = self.attn(q, key_cache, value_cache, block_tables, context_lens, query_start_loc, key_scale_cache,
                      value_scale_cache)  # [T, H, D]
        return self.o_proj(o.reshape(t, self.q_size), rows)


class LlamaMLP(nn.Cell):
    def __init__(self, config: LlamaConfig, dtype, device, tp_size, tp_rank, formats=("float32", "float32")):
        """formats: the weight formats of (gate_up_proj, down_proj)."""
        super().__init__()
        self.inter = config.intermediate_size // tp_size
        self.gate_up_proj = ColumnParallelLinear(config.hidden_size, (self.inter, self.inter),
                                                 tp_size, tp_rank, dtype, device, formats[0])
        self.down_proj = RowParallelLinear(self.inter, config.hidden_size, tp_size, tp_rank, dtype, device,
                                           formats[1])
        self.swiglu = SwiGlu(dtype, device)

    def construct(self, x, rows):  # [T, hidden]; rows int32 [1]: real (unpadded) tokens
        gate_up = self.gate_up_proj(x, rows)  # [T, 2 I/tp]
        return self.down_proj(self.swiglu(gate_up), rows)  # swiglu: [T, I/tp]


class LlamaDecoderLayer(nn.Cell):
    def __init__(self, config: LlamaConfig, dtype, device, tp_size, tp_rank, attention_backend=None,
                 quantized=False, formats=("float32",) * 4):
        """formats: the weight formats of (qkv_proj, o_proj, gate_up_proj, down_proj)."""
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, device)
        self.self_attn = LlamaAttention(config, dtype, device, tp_size, tp_rank, attention_backend, quantized,
                                        formats[:2])
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, device)
        self.mlp = LlamaMLP(config, dtype, device, tp_size, tp_rank, formats[2:])

    def construct(self, h, cos, sin, perm, key_cache, value_cache, slot_mapping, block_tables,
                  context_lens, query_start_loc, rows, key_scale_cache=None, value_scale_cache=None):
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, perm, key_cache, value_cache,
                               slot_mapping, block_tables, context_lens, query_start_loc, rows,
                               key_scale_cache, value_scale_cache)
        return h + self.mlp(self.post_attention_layernorm(h), rows)


class LlamaForCausalLM(nn.Cell):
    """construct(input_ids [T], positions [T], slot_mapping [T], block_tables [B, MAXB], context_lens [B],
    query_start_loc [B+1]) -> logits [B, vocab] of each sequence's last scheduled token.
    attention_backend: the KV-cache ops' backend for the device (ms_atb/ops/backends.py); None: its default."""

    def __init__(self, config: LlamaConfig, num_blocks: int, block_size: int, dtype=ms.float32,
                 device: str = "cpu", tp_size: int = 1, tp_rank: int = 0, attention_backend: str | None = None,
                 cache_dtype=None, weight_formats: dict | None = None):
        """cache_dtype: the KV cache's storage dtype (ms.float32, float16, bfloat16 or int8); None: dtype.
        weight_formats: {HF weight name: quantized format} of the linears kept quantized (CPU, float32 only;
        models/weight_formats.py), the others float; lm_head's under "lm_head.weight"."""
        super().__init__()
        formats = weight_formats or {}

        def fmt(name):
            return formats.get(name, "float32")
        cache_dtype = dtype if cache_dtype is None else cache_dtype
        self.quantized = cache_dtype == ms.int8
        assert config.num_attention_heads % tp_size == 0, "the engine checks tensor_parallel_size (validate_tp)"
        self.config, self.dtype = config, dtype
        self.tp_size, self.tp_rank = tp_size, tp_rank
        h, v = config.hidden_size, config.vocab_size
        self.embed_tokens = ms.Parameter(initializer("zeros", (v, h), dtype),
                                         name="embed_tokens")  # [V, hidden]
        self.layers = nn.CellList([LlamaDecoderLayer(
            config, dtype, device, tp_size, tp_rank, attention_backend, self.quantized,
            tuple(fmt(f"model.layers.{i}.{n}.weight") for n in ("self_attn.q_proj", "self_attn.o_proj",
                                                                  "mlp.gate_proj", "mlp.down_proj")))
            for i in range(config.num_hidden_layers)])
        self.norm = RMSNorm(h, config.rms_norm_eps, dtype, device)
        # Tied or not, lm_head is its own [hidden, V] copy (in the linears' fast layout), replicated.
        self.lm_head = ColumnParallelLinear(h, v, 1, 0, dtype, device, fmt("lm_head.weight"))
        cos, sin, perm = rope_tables(config)
        self.cos = ms.Parameter(ms.Tensor(cos, dtype), name="rope_cos", requires_grad=False)  # [P, D]
        self.sin = ms.Parameter(ms.Tensor(sin, dtype), name="rope_sin", requires_grad=False)  # [P, D]
        self.perm = ms.Tensor(perm)  # [D]
        kvh = num_kv_heads_per_rank(config, tp_size)
        shape = (num_blocks, block_size, kvh, config.head_dim)

        def caches(name, shape, dtype):
            zeros = np.zeros(shape, np.int8 if dtype == ms.int8 else np.float32)
            return ms.ParameterTuple(ms.Parameter(ms.Tensor(zeros, dtype), name=f"{name}.{i}", requires_grad=False)
                                     for i in range(config.num_hidden_layers))
        self.key_caches = caches("key_cache", shape, cache_dtype)  # per layer [NB, BS, KVH, D]
        self.value_caches = caches("value_cache", shape, cache_dtype)
        # int8: one scale per slot and KV head, indexed by the values' slot, so it moves with its block.
        self.key_scale_caches = caches("key_scale_cache", shape[:3], ms.float32) if self.quantized else None
        self.value_scale_caches = caches("value_scale_cache", shape[:3], ms.float32) if self.quantized else None

    def hidden_states(self, input_ids, positions, slot_mapping, block_tables, context_lens, query_start_loc):
        """The last decoder layer's output [T, hidden] (before the final norm); writes the KV cache."""
        h = ops.gather(self.embed_tokens, input_ids, 0)  # [T, hidden]
        cos = ops.gather(self.cos, positions, 0)  # [T, D]
        sin = ops.gather(self.sin, positions, 0)  # [T, D]
        # Tokens past query_start_loc[-1] are bucket padding: the linears skip them (zero rows).
        rows = query_start_loc[-1:]  # int32 [1]
        for i, layer in enumerate(self.layers):
            if self.quantized:  # [NB, BS, KVH] float32 each
                h = layer(h, cos, sin, self.perm, self.key_caches[i], self.value_caches[i], slot_mapping,
                          block_tables, context_lens, query_start_loc, rows, self.key_scale_caches[i],
                          self.value_scale_caches[i])
            else:
                h = layer(h, cos, sin, self.perm, self.key_caches[i], self.value_caches[i], slot_mapping,
                          block_tables, context_lens, query_start_loc, rows)
        return h

    def construct(self, input_ids, positions, slot_mapping, block_tables, context_lens, query_start_loc):
        h = self.hidden_states(input_ids, positions, slot_mapping, block_tables, context_lens,
                               query_start_loc)  # [T, hidden]
        last = ops.maximum(query_start_loc[1:] - 1, 0)  # [B]
        h = self.norm(ops.gather(h, last, 0))  # [B, hidden]
        # Real sequences come first and own >= 1 token; padded ones own none: lm_head skips them.
        seqs = (query_start_loc[1:] > query_start_loc[:-1]).astype(ms.int32).sum(0, keepdims=True)
        seqs = seqs.astype(ms.int32)  # [1]: the sum may widen to int64
        return self.lm_head(h, seqs).astype(ms.float32)  # [B, V], padded sequences' rows zero

    def _weight_targets(self) -> dict:
        """HF name -> (Parameter, or the linear it is a slice of; column offset in that linear or None for
        a whole Parameter; HF-layout shape [out, in])."""
        c, h = self.config, self.config.hidden_size
        targets = {"model.embed_tokens.weight": (self.embed_tokens, None, (c.vocab_size, h)),
                   "model.norm.weight": (self.norm.weight, None, (h,))}
        if not c.tie_word_embeddings:
            targets["lm_head.weight"] = (self.lm_head, 0, (c.vocab_size, h))
        for i, layer in enumerate(self.layers):
            p, attn, mlp = f"model.layers.{i}.", layer.self_attn, layer.mlp
            q, kv, inter = attn.q_size, attn.kv_size, mlp.inter
            targets.update({
                p + "input_layernorm.weight": (layer.input_layernorm.weight, None, (h,)),
                p + "post_attention_layernorm.weight": (layer.post_attention_layernorm.weight, None, (h,)),
                p + "self_attn.q_proj.weight": (attn.qkv_proj, 0, (q, h)),
                p + "self_attn.k_proj.weight": (attn.qkv_proj, q, (kv, h)),
                p + "self_attn.v_proj.weight": (attn.qkv_proj, q + kv, (kv, h)),
                p + "self_attn.o_proj.weight": (attn.o_proj, 0, (h, q)),
                p + "mlp.gate_proj.weight": (mlp.gate_up_proj, 0, (inter, h)),
                p + "mlp.up_proj.weight": (mlp.gate_up_proj, inter, (inter, h)),
                p + "mlp.down_proj.weight": (mlp.down_proj, 0, (h, inter))})
            if c.attention_bias:
                targets.update({p + "self_attn.q_proj.bias": (attn.qkv_bias, 0, (q,)),
                                p + "self_attn.k_proj.bias": (attn.qkv_bias, q, (kv,)),
                                p + "self_attn.v_proj.bias": (attn.qkv_bias, q + kv, (kv,))})
            if c.qk_norm:
                targets.update({p + "self_attn.q_norm.weight": (attn.q_norm.weight, None, (attn.head_dim,)),
                                p + "self_attn.k_norm.weight": (attn.k_norm.weight, None, (attn.head_dim,))})
        return targets

    def load_weights(self, weights) -> None:
        """Fill the Parameters from (HF name, HF-layout array already sliced for this rank) pairs, one by one.
        Linear weights [out, in] are stored transposed, [in, out]; q/k/v biases fill one [q + 2 kv]
        Parameter; a tied embedding also fills lm_head. A linear kept in a GGUF block format takes its parts as
        GGUFBlocks (rows of blocks, stacked in output order); a GGUFBlocks for a float target is dequantised."""
        targets = self._weight_targets()
        pending = {}  # id(linear) -> (buffer [in, out], parts left)
        parts = {}
        for name, (param, offset, _) in targets.items():
            if offset is not None:
                parts[id(param)] = parts.get(id(param), 0) + 1
        seen = set()
        for name, array in weights:
            if name not in targets:
                if name == "lm_head.weight" and self.config.tie_word_embeddings:
                    continue  # some tied checkpoints store the copy too
                raise ValueError(f"unexpected tensor {name!r} with shape {tuple(np.shape(array))}")
            if name in seen:
                raise ValueError(f"tensor {name!r} given twice")
            param, offset, shape = targets[name]
            if tuple(array.shape) != shape:
                raise ValueError(f"tensor {name!r}: expected shape {shape}, found {tuple(array.shape)}")
            seen.add(name)
            blocks = array if isinstance(array, GGUFBlocks) else None
            if blocks is not None and offset is None:      # the embedding: its gather reads float32
                array = blocks.dequantize()
            elif blocks is not None and getattr(param, "fmt", None) != blocks.fmt:   # a float target
                array, blocks = blocks.dequantize(), None
            if offset is None:
                param.set_data(ms.Tensor(np.ascontiguousarray(array, np.float32), self.dtype))
                if name == "model.embed_tokens.weight" and self.config.tie_word_embeddings:
                    if blocks is not None and self.lm_head.fmt == blocks.fmt:
                        self.lm_head.set_blocks(blocks.rows)
                    else:
                        self.lm_head.set_weight(array.T)
                continue
            if blocks is not None:               # rows of blocks, joined in output order when all have come
                got, left = pending.get(id(param)) or ([], parts[id(param)])
                got.append((offset, blocks.rows))
                if left == 1:
                    param.set_blocks(np.concatenate([r for _, r in sorted(got, key=lambda g: g[0])]))
                    pending.pop(id(param), None)
                else:
                    pending[id(param)] = (got, left - 1)
                continue
            if isinstance(param, ms.Parameter):  # a slice of a fused 1-D Parameter (the q/k/v bias)
                buf, left = pending.get(id(param)) or (np.empty(param.shape, np.float32), parts[id(param)])
                buf[offset:offset + shape[0]] = array
            else:
                buf, left = pending.get(id(param)) or (
                    np.empty((param.in_features, param.out_features), np.float32), parts[id(param)])
                buf[:, offset:offset + shape[0]] = array.T
            if left == 1:
                if isinstance(param, ms.Parameter):
                    param.set_data(ms.Tensor(buf, self.dtype))
                else:
                    param.set_weight(buf)
                pending.pop(id(param), None)
            else:
                pending[id(param)] = (buf, left - 1)
        missing = [n for n in targets if n not in seen]
        if missing:
            raise ValueError(f"missing tensor {missing[0]!r} (expected shape {targets[missing[0]][2]})"
                             + (f" and {len(missing) - 1} more" if len(missing) > 1 else ""))


class LlamaTokenLogits(nn.Cell):
    """The same model, returning the logits of EVERY scheduled token: construct(...same inputs...) ->
    [T, vocab], rows past query_start_loc[-1] zero. For prompt log-probabilities; it shares the
    model's Parameters (no prefix added to their names) and compiles its own graphs."""

    def __init__(self, model: LlamaForCausalLM):
        super().__init__(auto_prefix=False)
        self.model = model

    def construct(self, input_ids, positions, slot_mapping, block_tables, context_lens, query_start_loc):
        m = self.model
        h = m.norm(m.hidden_states(input_ids, positions, slot_mapping, block_tables, context_lens,
                                   query_start_loc))  # [T, hidden]
        return m.lm_head(h, query_start_loc[-1:]).astype(ms.float32)  # [T, V]
