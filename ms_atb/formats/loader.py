"""Llama configs and weights from HF safetensors directories, GGUF files, MindSpore checkpoints
and seeded random presets.

`path` is one of:
  - an HF directory: config.json + model.safetensors, or shards listed in model.safetensors.index.json
    (or several *.safetensors without an index); MindFormers parameter names are accepted there too;
  - a .gguf file (llama, qwen2 or qwen3 architecture; F32/F16/BF16 and every quantized type the `gguf` package
    dequantises); q/k rows stay permuted for interleaved RoPE (config.rope_interleaved=True);
  - a directory holding exactly one .gguf file (or one .ckpt, below) and no *.safetensors;
  - a MindSpore .ckpt with MindFormers names (Llama; Qwen2 biases), or a directory holding exactly one, with its
    config beside it: `<stem>.yaml` (MindFormers YAML, `model.model_config`), else config.json (HF
    keys), else the directory's only *.yaml;
  - `random:<preset>[?seed=N&<LlamaConfig field>=value...]`: seeded random weights, nothing read.
`iter_tensors` yields HF-named tensors in HF layout ([out, in] for linears), one at a time, already
sliced for the tensor-parallel rank; every name and shape is checked against the config first. A .ckpt's
tensors are read by MindSpore (models/weights.py, whose iter_weights serves every format).
weight_formats.py says which linears the model keeps quantized (model.weight_dtype).
"""
import dataclasses
import glob
import json
import os
import zlib
from typing import Iterator
from urllib.parse import parse_qsl

import numpy as np

from ms_atb.formats import families, gguf_reader, mindformers_ckpt
from ms_atb.formats.llama_config import LlamaConfig

FORMATS = ("an HF directory (config.json + *.safetensors), a .gguf file, a MindSpore .ckpt "
           "(MindFormers names) with its config beside it, or random:<preset>[?seed=N] with preset "
           "tiny-llama or smollm2-shape")

PRESETS = {
    "tiny-llama": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5,
                       rope_theta=10000.0, max_position_embeddings=1024, tie_word_embeddings=False,
                       bos_token_id=510, eos_token_id=511),
    "smollm2-shape": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                          num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                          head_dim=64, rms_norm_eps=1e-5, rope_theta=100000.0,
                          max_position_embeddings=8192, tie_word_embeddings=True,
                          rope_interleaved=True, bos_token_id=1, eos_token_id=2),
}
# Logit standard deviation of the random presets: large, so the top-1 margin is wide.
_RANDOM_LOGIT_STD = 8.0


# ---------------------------------------------------------------- path kinds

def model_kind(path: str) -> tuple[str, str]:
    """('random'|'hf'|'gguf'|'ckpt', resolved path)."""
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"model path must be a string, got {path!r}; accepted: {FORMATS}")
    path = os.fspath(path)
    if path.startswith("random:"):
        return "random", path
    if os.path.isdir(path):
        if glob.glob(os.path.join(path, "*.safetensors")):
            return "hf", path
        found = {ext: sorted(glob.glob(os.path.join(path, "*" + ext))) for ext in (".gguf", ".ckpt")}
        for ext, kind in ((".gguf", "gguf"), (".ckpt", "ckpt")):
            if len(found[ext]) == 1:
                return kind, found[ext][0]
        raise ValueError(f"model directory {path!r} holds no *.safetensors and not exactly one .gguf "
                         f"or .ckpt file; accepted: {FORMATS}")
    if os.path.isfile(path):
        if path.endswith(".gguf"):
            return "gguf", path
        if path.endswith(".ckpt"):
            return "ckpt", path
        raise ValueError(f"model file {path!r} is neither .gguf nor .ckpt; accepted: {FORMATS}")
    raise ValueError(f"model path {path!r} does not exist; accepted: {FORMATS}")


def _parse_random(path: str) -> tuple[dict, int]:
    spec, _, query = path[len("random:"):].partition("?")
    if spec not in PRESETS:
        raise ValueError(f"unknown random preset {spec!r}; allowed: {sorted(PRESETS)}")
    kwargs, seed = dict(PRESETS[spec]), 0
    fields = LlamaConfig.__dataclass_fields__
    for key, value in parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)):
        if key == "seed":
            seed = _parse_scalar(key, value, int)
        elif key in fields and key not in ("rope_scaling", "extra"):
            default = kwargs.get(key, fields[key].default)
            kind = int if default is None or default is dataclasses.MISSING else type(default)
            kwargs[key] = _parse_scalar(key, value, kind)
        else:
            raise ValueError(f"unknown option {key!r} in {path!r}; allowed: seed and the LlamaConfig "
                             f"fields {sorted(set(fields) - {'rope_scaling', 'extra'})}")
    for offset, name in ((2, "bos_token_id"), (1, "eos_token_id")):     # the preset's ids follow a smaller vocabulary
        if name not in query and kwargs.get(name) is not None and kwargs[name] >= kwargs["vocab_size"]:
            kwargs[name] = max(kwargs["vocab_size"] - offset, 0)
    return kwargs, seed


def _parse_scalar(key: str, value: str, kind):
    try:
        if kind is bool:
            if value.lower() not in ("0", "1", "true", "false"):
                raise ValueError(value)
            return value.lower() in ("1", "true")
        return kind(value)
    except ValueError:
        raise ValueError(f"option {key}={value!r}: expected {kind.__name__}") from None


# ---------------------------------------------------------------- configs

def load_config(path) -> LlamaConfig:
    """The model's LlamaConfig; reads metadata only, never weights."""
    kind, path = model_kind(path)
    if kind == "random":
        return LlamaConfig(**_parse_random(path)[0])
    file = path if kind != "hf" else os.path.join(path, "config.json")
    try:
        if kind == "gguf":
            return LlamaConfig(**gguf_reader.config_dict(path))
        if kind == "hf":
            return _hf_config(read_json_object(file, "an HF model directory"))
        return _ckpt_config(path)
    except ValueError as e:                     # LlamaConfig's own checks do not know the file
        if file in str(e) or (kind == "ckpt" and os.path.dirname(os.path.abspath(path)) in str(e)):
            raise
        raise ValueError(f"{file}: {e}") from None


def read_json_object(path: str, what: str) -> dict:
    """The JSON object in path; ValueError naming the file if it is missing, not JSON, or not an object."""
    if not os.path.isfile(path):
        raise ValueError(f"{path} is missing: {what} needs it")
    with open(path, encoding="utf-8") as f:
        try:
            data = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path}: invalid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the top level must be a JSON object, got {type(data).__name__}")
    return data


def _hf_config(d: dict) -> LlamaConfig:
    return LlamaConfig.from_hf_dict(families.hf_config_dict(d))


def generation_eos_ids(path) -> list[int]:
    """eos_token_id (an int or a list) of generation_config.json beside an HF model; [] without one."""
    kind, path = model_kind(path)
    if kind != "hf":
        return []
    file = os.path.join(path, "generation_config.json")
    if not os.path.isfile(file):
        return []
    eos = read_json_object(file, "the generation config").get("eos_token_id")
    ids = [] if eos is None else eos if isinstance(eos, list) else [eos]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise ValueError(f"{file}: eos_token_id must be an int >= 0 or a list of them, got {eos!r}")
    return ids


def _ckpt_config(ckpt: str) -> LlamaConfig:
    folder = os.path.dirname(os.path.abspath(ckpt))
    stem_yaml = os.path.splitext(ckpt)[0] + ".yaml"
    if os.path.isfile(stem_yaml):
        return LlamaConfig(**mindformers_ckpt.yaml_config(stem_yaml))
    if os.path.isfile(os.path.join(folder, "config.json")):
        return _hf_config(read_json_object(os.path.join(folder, "config.json"), "a .ckpt model"))
    yamls = sorted(glob.glob(os.path.join(folder, "*.yaml")) + glob.glob(os.path.join(folder, "*.yml")))
    if len(yamls) == 1:
        return LlamaConfig(**mindformers_ckpt.yaml_config(yamls[0]))
    raise ValueError(f"{ckpt}: no config found beside it; put {os.path.basename(stem_yaml)} "
                     f"(MindFormers YAML) or config.json (HF keys) in {folder}")


# ---------------------------------------------------------------- weights

def expected_shapes(config: LlamaConfig) -> dict:
    """{hf_name: full HF-layout shape} of every weight the model needs, in load order."""
    c = config
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    shapes = {"model.embed_tokens.weight": (c.vocab_size, c.hidden_size)}
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (c.hidden_size,),
            p + "self_attn.q_proj.weight": (q, c.hidden_size),
            p + "self_attn.k_proj.weight": (kv, c.hidden_size),
            p + "self_attn.v_proj.weight": (kv, c.hidden_size),
            p + "self_attn.o_proj.weight": (c.hidden_size, q),
            **({p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                p + "self_attn.v_proj.bias": (kv,)} if c.attention_bias else {}),
            **({p + "self_attn.q_norm.weight": (c.head_dim,),
                p + "self_attn.k_norm.weight": (c.head_dim,)} if c.qk_norm else {}),
            p + "post_attention_layernorm.weight": (c.hidden_size,),
            p + "mlp.gate_proj.weight": (c.intermediate_size, c.hidden_size),
            p + "mlp.up_proj.weight": (c.intermediate_size, c.hidden_size),
            p + "mlp.down_proj.weight": (c.hidden_size, c.intermediate_size),
        })
    shapes["model.norm.weight"] = (c.hidden_size,)
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, c.hidden_size)
    return shapes


def check_shapes(found: dict, config: LlamaConfig, source: str, optional=("lm_head.weight",)) -> None:
    """ValueError naming the first missing, unexpected or mis-shaped tensor of `found` {name: shape}.

    Names in `optional` may be present although the config does not need them (a tied model's
    checkpoint that also stores lm_head); they are then skipped, not loaded.
    """
    want = expected_shapes(config)
    for name, shape in want.items():
        if name not in found:
            raise ValueError(f"{source}: tensor {name} is missing (expected shape {shape})")
        if tuple(found[name]) != shape:
            raise ValueError(f"{source}: tensor {name} has shape {tuple(found[name])}, expected {shape}")
    extra = sorted(set(found) - set(want) - set(optional))
    if extra:
        raise ValueError(f"{source}: unexpected tensor {extra[0]} (shape {tuple(found[extra[0]])}); "
                         f"a checkpoint of this config holds only {len(want)} tensors")


def iter_tensors(kind: str, path: str, config: LlamaConfig, slices: dict,
                 formats: dict | None = None) -> Iterator[tuple[str, object]]:
    """(hf_name, float32 array) for every weight the model needs from a random preset, a GGUF file or an HF
    directory (model_kind's kind and path), HF layout, each cut by slices[hf_name], one at a time; the names
    and shapes are checked against the config first. A MindSpore .ckpt is MindSpore's to read
    (models/weights.py). formats: weight_formats.py's map; the GGUF weights it keeps in a GGUF block format
    come as gguf_reader.GGUFBlocks (a tied lm_head's too: the embedding then comes as blocks)."""
    shapes = expected_shapes(config)
    if kind == "random":
        return _random_weights(config, _parse_random(path)[1], slices)
    if kind == "gguf":
        check_shapes(gguf_reader.tensor_shapes(path), config, path)
        keep = {n: f for n, f in (formats or {}).items() if n in shapes and f in gguf_reader.KEPT_TYPES}
        head = (formats or {}).get("lm_head.weight")
        if config.tie_word_embeddings and head in gguf_reader.KEPT_TYPES:
            keep["model.embed_tokens.weight"] = head
        return gguf_reader.iter_tensors(path, list(shapes), slices, keep)
    assert kind == "hf", f"{kind} files are read by models/weights.py"
    index = _safetensors_index(path)
    check_shapes({n: s for n, (_, _, s) in index.items()}, config, path)
    return _iter_safetensors(index, list(shapes), slices)


# ---------------------------------------------------------------- safetensors

def _safetensors_index(folder: str) -> dict:
    """{hf_name: (file, stored_name, shape)} from the index file, or from every *.safetensors."""
    index_path = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index_path):
        weight_map = read_json_object(index_path, "a sharded checkpoint").get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index_path}: no 'weight_map' object")
        files = sorted({_shard_name(index_path, folder, f) for f in weight_map.values()})
    else:
        weight_map, files = None, sorted(os.path.basename(f)
                                         for f in glob.glob(os.path.join(folder, "*.safetensors")))
    index = {}
    for fname in files:
        fpath = os.path.join(folder, fname)
        if not os.path.isfile(fpath):
            raise ValueError(f"{index_path} names {fname}, which is missing")
        with _open_safetensors(fpath) as f:
            for stored in f.keys():
                if weight_map is not None and weight_map.get(stored) != fname:
                    continue
                name = mindformers_ckpt.hf_name(stored) or stored
                if name in index:
                    raise ValueError(f"{folder}: tensor {name} is stored twice "
                                     f"({index[name][0]} and {fpath})")
                index[name] = (fpath, stored, tuple(f.get_slice(stored).get_shape()))
    if weight_map is not None:
        lost = sorted(set(weight_map) - {stored for _, stored, _ in index.values()})
        if lost:
            raise ValueError(f"{index_path} maps tensor {lost[0]} to {weight_map[lost[0]]}, which lacks it")
    for ignored in [n for n in index if n.endswith("rotary_emb.inv_freq")]:
        del index[ignored]  # a buffer older HF checkpoints saved; recomputed from the config
    return index


def _shard_name(index_path: str, folder: str, fname) -> str:
    """A weight_map file name, accepted only when it names a file inside the model directory.

    The name is judged as written (no '..' out, not absolute); a symlink the directory itself holds
    is followed, as the HF hub cache links snapshot files to its blob store."""
    if not isinstance(fname, str) or not fname:
        raise ValueError(f"{index_path}: weight_map values must be file names, got {fname!r}")
    root = os.path.abspath(folder)
    full = os.path.normpath(os.path.join(root, fname))
    if os.path.isabs(fname) or os.path.commonpath([root, full]) != root or full == root:
        raise ValueError(f"{index_path} names shard {fname!r}, which is outside the model directory "
                         f"{folder}; shards must be files inside it")
    return fname


def _open_safetensors(fpath: str):
    from safetensors import safe_open
    try:
        return safe_open(fpath, framework="np")
    except Exception as e:          # safetensors' own SafetensorError: a torn or foreign file
        raise ValueError(f"{fpath}: not a readable safetensors file ({e})") from None


_FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")


def _iter_safetensors(index: dict, names, slices: dict):
    handles = {}
    try:
        for name in names:
            fpath, stored, _ = index[name]
            if fpath not in handles:
                handles[fpath] = _open_safetensors(fpath).__enter__()
            part = handles[fpath].get_slice(stored)
            if part.get_dtype() not in _FLOAT_DTYPES:
                raise ValueError(f"{fpath}: tensor {stored} is {part.get_dtype()}; weights must be one of "
                                 f"{list(_FLOAT_DTYPES)} (quantised checkpoints are not supported)")
            if part.get_dtype() == "BF16":
                w = _bf16_slice(fpath, stored, slices[name])
            else:
                w = part[slices[name]]
            yield name, np.ascontiguousarray(w, dtype=np.float32)
    finally:
        for h in handles.values():
            h.__exit__(None, None, None)


def _bf16_slice(fpath: str, stored: str, sl: tuple) -> np.ndarray:
    """numpy has no bfloat16: memory-map the raw uint16 and widen only the slice read."""
    with open(fpath, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        meta = json.loads(f.read(n))[stored]
    start, stop = meta["data_offsets"]
    raw = np.memmap(fpath, np.uint16, "r", 8 + n + start, ((stop - start) // 2,))
    part = np.ascontiguousarray(raw.reshape(meta["shape"])[sl])
    return (part.astype(np.uint32) << 16).view(np.float32)


# ---------------------------------------------------------------- random presets

def _random_weights(config: LlamaConfig, seed: int, slices: dict):
    """Seeded per tensor (seed, name), so every rank slices the same full tensor.

    Linears ~ N(0, 1/in) keep activations O(1) through the layers (attention matters, not only the
    current token); the (tied or separate) output embedding is scaled so logits have a standard
    deviation of _RANDOM_LOGIT_STD, which leaves the top-1 logit well clear of the runner-up.
    """
    c = config
    for name, shape in expected_shapes(config).items():
        rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
        if len(shape) == 1:
            w = 1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            w = rng.standard_normal(shape, dtype=np.float32) * (_RANDOM_LOGIT_STD / np.sqrt(c.hidden_size))
        else:
            scale = 1.0 / np.sqrt(shape[1])
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                scale /= np.sqrt(2.0 * c.num_hidden_layers)
            w = rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)
        yield name, np.ascontiguousarray(w[slices[name]])
