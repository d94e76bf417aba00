"""LoRA adapters from PEFT directories: `adapter_config.json` + `adapter_model.safetensors` (or `.bin`, refused).

Rules:
  1. Supported: LoRA (peft_type "LORA") on the decoder layers' q, k, v, o, gate, up and down projections, any rank
     up to the engine's max_lora_rank, lora_alpha, use_rslora (scaling alpha / sqrt(r), else alpha / r), no bias,
     float16 / bfloat16 / float32 tensors (kept as float32).
  2. Anything else in the directory is a ValueError naming the directory and what is not supported: other target
     modules (embeddings, lm_head, ...), DoRA, modules_to_save, a bias, rank_pattern / alpha_pattern, a rank above
     the limit, a layer the model does not have, or a shape that does not fit the base model.
  3. Tensor names are PEFT's: `base_model.model.model.layers.{i}.{self_attn|mlp}.{x}_proj.lora_A.weight` [r, in] and
     `...lora_B.weight` [out, r] (an adapter name before `.weight`, as `lora_A.default.weight`, is accepted).
     Every targeted projection of every layer present must have both, and only targeted ones may appear.
  4. An adapter is made against HF's layout. A model whose RoPE is interleaved (a GGUF of the llama architecture)
     holds its q and k rows permuted within each head as llama.cpp's converter permutes them, so the adapter's
     q_proj and k_proj lora_B rows are permuted the same way as they are read.
  5. `digest` (sha256 of adapter_config.json and adapter_model.safetensors, as read) names the adapter's content:
     two directories holding the same files are one adapter.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, field

import numpy as np

from ms_atb.formats.llama_config import LlamaConfig

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_MODULE = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
           "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
_NAME = re.compile(r"^base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+_proj)\.lora_([AB])"
                   r"(?:\.[A-Za-z0-9_-]+)?\.weight$")
# Settings that must be off (false, null or empty) in adapter_config.json
_REFUSED_SETTINGS = ("use_dora", "modules_to_save", "layers_to_transform", "rank_pattern", "alpha_pattern")


@dataclass
class LoraAdapter:
    """One adapter's weights, float32: lora_a[(layer, target)] [r, in], lora_b[(layer, target)] [out, r]."""
    path: str
    rank: int
    scaling: float
    targets: tuple[str, ...]
    digest: bytes = b""                                 # rule 5
    lora_a: dict = field(default_factory=dict, repr=False)
    lora_b: dict = field(default_factory=dict, repr=False)

    @property
    def key(self) -> str:
        """The adapter's identity (rule 5): the extra key of its requests' prefix-cache chains and of the KV disk
        tier's files, and the slots' key."""
        return "lora:" + self.digest.hex()

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.lora_a.values()) + sum(b.nbytes for b in self.lora_b.values())


def target_shape(config: LlamaConfig, target: str) -> tuple[int, int]:
    """(out, in) of a targeted projection of the base model (whole, before tensor parallelism)."""
    q, kv = config.num_attention_heads * config.head_dim, config.num_key_value_heads * config.head_dim
    h, f = config.hidden_size, config.intermediate_size
    return {"q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q),
            "gate_proj": (f, h), "up_proj": (f, h), "down_proj": (h, f)}[target]


def read_adapter_config(path: str) -> dict:
    """The adapter's settings (rule 1), checked (rule 2): {"rank", "alpha", "rslora", "targets"}."""
    return _settings(path, _config_object(path, _config_bytes(path)))


def _config_bytes(path: str) -> bytes:
    if not os.path.isdir(path):
        raise ValueError(f"LoRA adapter {path!r}: not a directory (a PEFT adapter is a directory holding "
                         f"adapter_config.json and adapter_model.safetensors)")
    try:
        with open(os.path.join(path, "adapter_config.json"), "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise ValueError(f"LoRA adapter {path!r}: adapter_config.json is missing") from None
    except OSError as e:
        raise ValueError(f"LoRA adapter {path!r}: adapter_config.json cannot be read ({e.strerror})") from None


def _config_object(path: str, raw: bytes) -> dict:
    try:
        config = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"LoRA adapter {path!r}: adapter_config.json is not valid JSON ({e})") from None
    if not isinstance(config, dict):
        raise ValueError(f"LoRA adapter {path!r}: adapter_config.json must hold an object")
    return config


def _settings(path: str, config: dict) -> dict:
    def bad(what: str):
        return ValueError(f"LoRA adapter {path!r}: {what} is not supported (supported: LoRA on {list(TARGETS)}, "
                          f"no DoRA, no bias, no modules_to_save, one rank and alpha for every module)")
    if config.get("peft_type", "LORA") != "LORA":
        raise bad(f"peft_type {config.get('peft_type')!r}")
    for key in _REFUSED_SETTINGS:
        if config.get(key):
            raise bad(f"{key} {config[key]!r}")
    if config.get("bias", "none") != "none":
        raise bad(f"bias {config['bias']!r}")
    rank, alpha = config.get("r"), config.get("lora_alpha", config.get("r"))
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise ValueError(f"LoRA adapter {path!r}: r must be an int >= 1, got {rank!r}")
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not math.isfinite(alpha):
        raise ValueError(f"LoRA adapter {path!r}: lora_alpha must be a number, got {alpha!r}")
    targets = config.get("target_modules")
    if isinstance(targets, str):
        targets = [t for t in TARGETS if re.fullmatch(targets, t) or t == targets]
    if not isinstance(targets, list) or not targets:
        raise ValueError(f"LoRA adapter {path!r}: target_modules must name some of {list(TARGETS)}, got {targets!r}")
    unknown = sorted(set(targets) - set(TARGETS))
    if unknown:
        raise bad(f"target_modules {unknown}")
    return {"rank": rank, "alpha": float(alpha), "rslora": bool(config.get("use_rslora", False)),
            "targets": tuple(t for t in TARGETS if t in targets)}


def load_adapter(path: str, base: LlamaConfig, max_rank: int) -> LoraAdapter:
    """The adapter of a PEFT directory, checked against the base model and max_rank (rules 1-5)."""
    from safetensors.numpy import load as load_bytes
    raw_config = _config_bytes(path)
    settings = _settings(path, _config_object(path, raw_config))
    if settings["rank"] > max_rank:
        raise ValueError(f"LoRA adapter {path!r}: rank {settings['rank']} is above max_lora_rank {max_rank}")
    file = os.path.join(path, "adapter_model.safetensors")
    if not os.path.isfile(file):
        extra = " (adapter_model.bin, a pickle, is not read: save the adapter with safe_serialization)" \
            if os.path.isfile(os.path.join(path, "adapter_model.bin")) else ""
        raise ValueError(f"LoRA adapter {path!r}: adapter_model.safetensors is missing{extra}")
    try:
        with open(file, "rb") as f:
            raw = f.read()
        tensors = load_bytes(raw)
    except Exception as e:          # safetensors raises its own errors for a damaged file
        raise ValueError(f"LoRA adapter {path!r}: adapter_model.safetensors cannot be read ({e})") from None
    rank, alpha = settings["rank"], settings["alpha"]
    scaling = alpha / math.sqrt(rank) if settings["rslora"] else alpha / rank
    digest = hashlib.sha256(hashlib.sha256(raw_config).digest() + hashlib.sha256(raw).digest()).digest()
    adapter = LoraAdapter(os.path.abspath(path), rank, scaling, settings["targets"], digest)
    for name, tensor in tensors.items():
        layer, target, which = _parse_name(path, name, base, settings["targets"])
        out, inp = target_shape(base, target)
        want = (rank, inp) if which == "A" else (out, rank)
        if tuple(tensor.shape) != want:
            raise ValueError(f"LoRA adapter {path!r}: {name} has shape {tuple(tensor.shape)}; the base model needs "
                             f"{want}")
        (adapter.lora_a if which == "A" else adapter.lora_b)[(layer, target)] = np.ascontiguousarray(
            tensor, dtype=np.float32)
    missing = sorted(set(adapter.lora_a) ^ set(adapter.lora_b))
    if missing:
        layer, target = missing[0]
        raise ValueError(f"LoRA adapter {path!r}: layer {layer} {target} has only one of lora_A and lora_B")
    if not adapter.lora_a:
        raise ValueError(f"LoRA adapter {path!r}: adapter_model.safetensors holds no LoRA weights")
    if base.rope_interleaved:
        _permute_qk(adapter, base)
    return adapter


def _permute_qk(adapter: LoraAdapter, base: LlamaConfig) -> None:
    """Rule 4: q_proj's and k_proj's lora_B rows [out, r] in llama.cpp's order: within each head of D rows, row
    2 i + j takes HF's row j D / 2 + i (the halves of rotate-half RoPE interleaved in pairs)."""
    heads = {"q_proj": base.num_attention_heads, "k_proj": base.num_key_value_heads}
    for (layer, target), b in adapter.lora_b.items():
        if target in heads:
            n = heads[target]
            adapter.lora_b[(layer, target)] = np.ascontiguousarray(
                b.reshape(n, 2, b.shape[0] // n // 2, b.shape[1]).swapaxes(1, 2).reshape(b.shape))


def _parse_name(path: str, name: str, base: LlamaConfig, targets: tuple) -> tuple[int, str, str]:
    m = _NAME.match(name)
    if m is None:
        raise ValueError(f"LoRA adapter {path!r}: tensor {name!r} is not supported (only lora_A / lora_B of the "
                         f"decoder layers' {list(TARGETS)}; no embeddings, lm_head, bias or DoRA magnitudes)")
    layer, module, target, which = int(m.group(1)), m.group(2), m.group(3), m.group(4)
    if target not in targets or _MODULE.get(target) != module:
        raise ValueError(f"LoRA adapter {path!r}: tensor {name!r} is for {module}.{target}, which target_modules "
                         f"{list(targets)} does not name")
    if layer >= base.num_hidden_layers:
        raise ValueError(f"LoRA adapter {path!r}: tensor {name!r} is for layer {layer}; the base model has "
                         f"{base.num_hidden_layers} layers")
    return layer, target, which
