"""LlamaConfig (an HF config.json, validated) and the rotary embedding's tables it implies."""
import math
from dataclasses import dataclass, field, fields

import numpy as np

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
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim} (hidden_size {self.hidden_size} / "
                             f"num_attention_heads {self.num_attention_heads} unless head_dim is given)")
        for name in ("bos_token_id", "eos_token_id"):
            value = getattr(self, name)
            for token in (value if isinstance(value, list) else [] if value is None else [value]):
                if not isinstance(token, int) or isinstance(token, bool) or not 0 <= token < self.vocab_size:
                    raise ValueError(f"{name} {token!r} is outside the vocabulary [0, vocab_size "
                                     f"{self.vocab_size})")
        if self.rope_scaling is not None:
            kind = self.rope_scaling.get("rope_type", self.rope_scaling.get("type"))
            if kind not in _ROPE_KINDS:
                raise ValueError(f"rope_scaling type {kind!r} not supported; allowed: {_ROPE_KINDS}")

    def resolve_max_model_len(self, configured: int | None, default: int) -> int:
        """`configured` (model.max_model_len) once checked, or when None the model's own limit (its positions,
        its sliding window), at most `default`."""
        if configured is None:
            return min(default, self.max_position_embeddings, self.sliding_window or default)
        self.check_max_model_len(configured)     # checked here once; the model runner takes it as checked
        return configured

    def check_max_model_len(self, max_model_len: int) -> None:
        """ValueError when max_model_len exceeds the positions the model has or its sliding window: attention
        runs over the whole context, so a request must never outgrow the window."""
        if max_model_len > self.max_position_embeddings:
            raise ValueError(f"max_model_len {max_model_len} exceeds the model's max_position_embeddings "
                             f"{self.max_position_embeddings}")
        if self.sliding_window is not None and max_model_len > self.sliding_window:
            raise ValueError(f"max_model_len {max_model_len} exceeds the model's sliding_window "
                             f"{self.sliding_window}; set max_model_len <= {self.sliding_window}")

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
