"""Tensor-parallel sharding rules for HF-layout weights: which axis of each tensor is split and which part a
rank holds. The loaders slice with them; models/parallel.py builds the linears that hold the parts.

Rules (stable):
  q/k/v/gate/up projections are column-parallel: their HF weight [out, in] is split on axis 0;
  o/down projections are row-parallel: their HF weight [out, in] is split on axis 1, and the
  partial outputs are summed with an AllReduce; norms, embedding and lm_head are replicated.
  A q/k/v bias [out] is split on axis 0 like its weight's rows; the per-head q/k norms [head_dim]
  are replicated.
  Heads are split contiguously by rank. When tp_size > num_kv_heads the KV heads are replicated:
  rank r holds KV head r * num_kv_heads // tp_size (the one its query heads attend with).
"""
import re

_COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
_ROW = ("o_proj", "down_proj")
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.(weight|bias)$")
_BIASED = ("q_proj", "k_proj", "v_proj")
_REPLICATED_RE = re.compile(
    r"^(model\.embed_tokens\.weight|model\.norm\.weight|lm_head\.weight"
    r"|model\.layers\.\d+\.(input_layernorm|post_attention_layernorm)\.weight"
    r"|model\.layers\.\d+\.self_attn\.(q_norm|k_norm)\.weight)$")


def validate_tp(config, tp_size: int) -> None:
    """ValueError when the model cannot be split over tp_size ranks."""
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    if not isinstance(tp_size, int) or tp_size < 1:
        raise ValueError(f"tensor_parallel_size must be an int >= 1, got {tp_size!r}")
    if heads % tp_size:
        raise ValueError(f"tensor_parallel_size {tp_size} must divide num_attention_heads {heads}")
    if tp_size <= kv_heads and kv_heads % tp_size:
        raise ValueError(f"tensor_parallel_size {tp_size} must divide num_key_value_heads {kv_heads} "
                         f"(or be a multiple of it)")
    if tp_size > kv_heads and tp_size % kv_heads:
        raise ValueError(f"tensor_parallel_size {tp_size} above num_key_value_heads {kv_heads} must be "
                         f"a multiple of it")
    if config.intermediate_size % tp_size:
        raise ValueError(f"tensor_parallel_size {tp_size} must divide intermediate_size "
                         f"{config.intermediate_size}")


def num_heads_per_rank(config, tp_size: int) -> int:
    return config.num_attention_heads // tp_size


def num_kv_heads_per_rank(config, tp_size: int) -> int:
    return max(1, config.num_key_value_heads // tp_size)


def _kind(name: str) -> str | None:
    m = _LAYER_RE.match(name)
    if m and m.group(3) in (_COLUMN + _ROW if m.group(4) == "weight" else _BIASED):
        return m.group(3)
    if _REPLICATED_RE.match(name):
        return None
    raise ValueError(f"unknown tensor name {name!r}: not a Llama weight in HF naming")


def shard_spec(name: str, config, tp_size: int) -> int | None:
    """Axis of the HF-layout tensor `name` split across ranks; None when replicated (or tp_size 1)."""
    kind = _kind(name)
    if kind is None or tp_size == 1:
        return None
    return 0 if kind in _COLUMN else 1


def shard_slice(name: str, full_shape, config, tp_size: int, tp_rank: int) -> tuple:
    """Slices (one per axis) selecting rank tp_rank's part of the full HF-layout tensor `name`; tp_size
    already checked against the model (validate_tp, once, where the engine validates its config)."""
    if not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_rank {tp_rank} outside [0, {tp_size})")
    full = tuple(slice(None) for _ in full_shape)
    axis = shard_spec(name, config, tp_size)
    if axis is None:
        return full
    if len(full_shape) != (1 if name.endswith(".bias") else 2):
        raise ValueError(f"{name}: expected a {'1-D bias' if name.endswith('.bias') else '2-D weight'}, "
                         f"found shape {tuple(full_shape)}")
    kind, d = _kind(name), config.head_dim
    if kind in ("k_proj", "v_proj"):
        kv_heads = config.num_key_value_heads
        expected = kv_heads * d
        per = num_kv_heads_per_rank(config, tp_size)
        first = tp_rank * kv_heads // tp_size if tp_size > kv_heads else tp_rank * per
        start, stop = first * d, (first + per) * d
    else:
        expected = (config.num_attention_heads * d if kind in ("q_proj", "o_proj")
                    else config.intermediate_size)
        per = expected // tp_size
        start, stop = tp_rank * per, (tp_rank + 1) * per
    if full_shape[axis] != expected:
        raise ValueError(f"{name}: expected size {expected} on axis {axis}, found shape {tuple(full_shape)}")
    return full[:axis] + (slice(start, stop),) + full[axis + 1:]
