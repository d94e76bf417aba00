"""Memory accounting before a model is loaded: what its weights and KV cache will hold on one rank, and
how much memory this process may still take. No MindSpore import: it runs before any weight is read.

Rules:
  1. weight_bytes counts what LlamaForCausalLM holds (models/llama.py): the embedding (float, or kept in a
     GGUF block format when `formats` names it: its own panels, or none when tied to lm_head's), every layer's
     norms, fused q/k/v, o, fused gate/up and down, the final norm, an lm_head of its own even when the
     embeddings are tied (a transposed copy), and the RoPE tables. Projections are split over the tensor-
     parallel ranks (KV heads replicated past num_key_value_heads); the rest is replicated. On the CPU
     (`packed`) the linears are stored in float32 panels of 16 output columns (ops/matmul.py), padded, whatever
     the model's dtype (`itemsize`: the bytes of the other parameters); a linear kept
     quantized (`formats`, ms_atb/formats/weight_formats.py) holds its panels of blocks (ops/quant_matmul.py:
     per 32 rows of k and 16 columns, QUANT_BLOCK_BYTES; int8 adds 16 float32 scales a panel).
  2. available_bytes is the least of /proc/meminfo's MemAvailable and the headroom of every memory cgroup
     limit between the process's cgroup and the root (v2: memory.max - memory.current; v1:
     memory.limit_in_bytes - memory.usage_in_bytes), page cache that can be dropped (inactive_file) counted
     as free. None when nothing is known.
  3. The check is a floor, not a promise: activations, compiled graphs and load-time copies come on top.
  4. kv_cache.num_blocks "auto" is kv_cache.memory_budget / bytes per block: a configured size, never the free
     memory, so two engines in one process size alike.
"""
from __future__ import annotations

import os

from ms_atb.config import parse_size

PANEL = 16                # output columns per packed panel of a CPU float32 linear
V1_UNLIMITED = 1 << 60    # cgroup v1 reports "no limit" as a number near 2**63
# Bytes of a block of 32 rows x 16 columns and of a panel's header, per quantized format (ops/quant_matmul.cc);
# tests/test_weight_dtype.py checks them against the packed weights the model holds.
QUANT_BLOCK_BYTES = {"q8_0": 544, "q4_0": 288, "q4_1": 320, "int8": 512}
QUANT_HEADER_BYTES = {"q8_0": 0, "q4_0": 0, "q4_1": 0, "int8": 64}


def weight_bytes(config, tp_size: int, itemsize: int, packed: bool, formats: dict | None = None) -> int:
    """Bytes of the model's parameters on one rank; config is a LlamaConfig; formats: {HF weight name:
    quantized format} of the linears kept quantized (the first part of a fused linear names it)."""
    c = config
    h, d = c.hidden_size, c.head_dim
    heads = c.num_attention_heads // tp_size
    kv_heads = max(1, c.num_key_value_heads // tp_size)
    inter = c.intermediate_size // tp_size

    formats = formats or {}

    def linear(n_in: int, n_out: int, name: str) -> int:      # bytes
        fmt = formats.get(name)
        if fmt is not None:
            panels = -(-n_out // PANEL)
            return panels * (QUANT_HEADER_BYTES[fmt] + -(-n_in // 32) * QUANT_BLOCK_BYTES[fmt])
        return n_in * (-(-n_out // PANEL) * PANEL * 4 if packed else n_out * itemsize)

    layers = 0
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        layers += (2 * h * itemsize                                                   # the two norms
                   + linear(h, (heads + 2 * kv_heads) * d, p + "self_attn.q_proj.weight")  # q, k, v
                   + linear(heads * d, h, p + "self_attn.o_proj.weight")                   # o
                   + linear(h, 2 * inter, p + "mlp.gate_proj.weight")                      # gate, up
                   + linear(inter, h, p + "mlp.down_proj.weight"))                         # down
    # embedding (kept quantized: packed as the lm_head is, none of its own when tied), layers, final norm, lm_head,
    # RoPE tables
    embed = "model.embed_tokens.weight"
    embedding = (c.vocab_size * h * itemsize if embed not in formats
                 else 0 if c.tie_word_embeddings else linear(h, c.vocab_size, embed))
    return (embedding + (h + 2 * c.max_position_embeddings * d) * itemsize + layers
            + linear(h, c.vocab_size, "lm_head.weight"))


def lora_bytes(config, tp_size: int, max_loras: int, max_rank: int) -> int:
    """Bytes of the LoRA slots on one rank (models/parallel.py's enable_lora, ops/lora.py's shapes): per layer and
    slot, each linear's A [S R, in] and B [R, out] in float32, split as the linear is (q/k/v and gate/up: the whole
    in, this rank's out; o and down: this rank's in, the whole out), and the ranks [slots, 7] int32."""
    c = config
    h, d = c.hidden_size, c.head_dim
    q, kv = c.num_attention_heads // tp_size * d, max(1, c.num_key_value_heads // tp_size) * d
    inter = c.intermediate_size // tp_size
    floats = max_rank * ((3 * h + q + 2 * kv)          # q/k/v: A [3 R, h], B [R, q + 2 kv]
                         + (q + h)                     # o: A [R, q], B [R, h]
                         + (2 * h + 2 * inter)         # gate/up: A [2 R, h], B [R, 2 inter]
                         + (inter + h))                # down: A [R, inter], B [R, h]
    return max_loras * (c.num_hidden_layers * floats * 4 + 7 * 4)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def _number(path: str) -> int | None:
    text = _read(path)
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:
        return None      # "max": no limit


def _stat(path: str, *keys: str) -> int:
    """The first of keys in a memory.stat file, or 0."""
    fields = dict(line.split()[:2] for line in (_read(path) or "").splitlines() if len(line.split()) >= 2)
    for key in keys:
        if fields.get(key, "").isdigit():
            return int(fields[key])
    return 0


def mem_available(proc: str = "/proc") -> int | None:
    for line in (_read(os.path.join(proc, "meminfo")) or "").splitlines():
        if line.startswith("MemAvailable:"):
            try:
                return int(line.split()[1]) * 1024
            except (IndexError, ValueError):
                return None
    return None


def _cgroup_paths(proc: str) -> tuple[str | None, str | None]:
    """This process's (v2 path, v1 memory path), each relative to its hierarchy's root."""
    v2 = v1 = None
    for line in (_read(os.path.join(proc, "self", "cgroup")) or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        elif len(parts) == 3 and "memory" in parts[1].split(","):
            v1 = parts[2]
    return v2, v1


def _levels(root: str, rel: str | None) -> list[str]:
    """root/rel and each folder above it up to root (a container sees its own cgroup as the root)."""
    parts = [p for p in (rel or "").split("/") if p]
    return [os.path.join(root, *parts[:n]) for n in range(len(parts), -1, -1)]


def cgroup_headroom(proc: str = "/proc", cgroup: str = "/sys/fs/cgroup") -> int | None:
    """Bytes the tightest memory cgroup limit above this process still allows, or None if unlimited."""
    v2, v1 = _cgroup_paths(proc)
    room = []
    for level in _levels(cgroup, v2):
        limit, used = _number(os.path.join(level, "memory.max")), _number(os.path.join(level, "memory.current"))
        if limit is not None and used is not None:
            room.append(limit - used + _stat(os.path.join(level, "memory.stat"), "inactive_file"))
    for level in _levels(os.path.join(cgroup, "memory"), v1):
        limit = _number(os.path.join(level, "memory.limit_in_bytes"))
        used = _number(os.path.join(level, "memory.usage_in_bytes"))
        if limit is not None and used is not None and limit < V1_UNLIMITED:
            room.append(limit - used + _stat(os.path.join(level, "memory.stat"), "total_inactive_file",
                                             "inactive_file"))
    return max(0, min(room)) if room else None


def available_bytes(proc: str = "/proc", cgroup: str = "/sys/fs/cgroup") -> int | None:
    """Rule 2: the memory this process may still take, or None where unknown."""
    known = [b for b in (mem_available(proc), cgroup_headroom(proc, cgroup)) if b is not None]
    return min(known) if known else None


def check_fits(weights: int, kv: int, available: int | None, what: str) -> None:
    """ValueError when weights + kv exceed the available memory; what names the model and its KV cache."""
    if available is None or weights + kv <= available:
        return
    gib = 2 ** 30
    raise ValueError(f"{what} needs {(weights + kv) / gib:.2f} GiB of memory (weights {weights / gib:.2f} GiB, KV "
                     f"cache {kv / gib:.2f} GiB) but this process has {available / gib:.2f} GiB available "
                     f"(the least of MemAvailable and its cgroup's limit); use a smaller model, more "
                     f"tensor_parallel_size, float16, or fewer kv_cache.num_blocks")


def pool_blocks(budget: int, bytes_per_block: int, configured_budget) -> int:
    """Rule 4: the blocks a budget of `budget` bytes holds; ValueError when it holds none."""
    num_blocks = budget // bytes_per_block
    if num_blocks < 1:
        raise ValueError(f"kv_cache.memory_budget {configured_budget} holds no block of {bytes_per_block} bytes")
    return num_blocks


def kv_pool_blocks(kv, bytes_per_block: int, cache_dtype: str) -> tuple[int, str | None]:
    """Rule 4 for an engine's kv_cache section: (its blocks, a line saying how memory_budget sized them, or None
    when num_blocks was given)."""
    if kv.num_blocks != "auto":
        return kv.num_blocks, None
    budget = parse_size(kv.memory_budget, "kv_cache.memory_budget")
    num_blocks = pool_blocks(budget, bytes_per_block, kv.memory_budget)
    return num_blocks, (f"KV cache ({cache_dtype}{' + float32 scales' if cache_dtype == 'int8' else ''}): "
                        f"memory_budget {budget} bytes / {bytes_per_block} bytes per block of {kv.block_size} "
                        f"tokens = {num_blocks} blocks ({num_blocks * kv.block_size} tokens)")


def check_engine_fits(config, model_config, num_blocks: int, kv_bytes_per_block: int, formats: dict) -> None:
    """ValueError, before any weight is read, when an engine's weights (its LoRA slots included) and KV cache
    cannot fit in the memory this process may take. config: the EngineConfig; formats: its weight formats."""
    kv, free = num_blocks * kv_bytes_per_block, available_bytes()
    if free is not None and kv > free:
        raise ValueError(f"the KV cache ({num_blocks} blocks, {kv / 2**30:.1f} GiB) does not fit in the "
                         f"{free / 2**30:.1f} GiB of memory available; lower kv_cache.num_blocks or "
                         f"kv_cache.memory_budget")
    half = config.model.dtype in ("float16", "bfloat16")     # the CPU's linears are float32 panels either way
    tp, lora = config.parallel.tensor_parallel_size, config.lora
    weights = weight_bytes(model_config, tp, 2 if half else 4, packed=True, formats=formats)
    what = f"the model {config.model.path!r} with {num_blocks} KV blocks"
    if lora.enable_lora:      # the resident adapters' slots, held from the build on
        weights += lora_bytes(model_config, tp, lora.max_loras, lora.max_lora_rank)
        what += f" and {lora.max_loras} LoRA slots of rank {lora.max_lora_rank}"
    check_fits(weights, kv, free, what)
