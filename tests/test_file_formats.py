"""Malformed or hostile model files: every one is a ValueError naming the file, never a traceback from
deep inside a parser, and a sharded checkpoint reads only files inside its own directory."""
import json
import os

import numpy as np
import pytest

from ms_atb.formats.llama_config import LlamaConfig
from ms_atb.formats.loader import expected_shapes, load_config
from ms_atb.models.weights import iter_weights

HF_CONFIG = dict(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                 num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=1e4,
                 max_position_embeddings=64, tie_word_embeddings=True, model_type="llama")


def _weights() -> dict:
    c = LlamaConfig(**{k: v for k, v in HF_CONFIG.items() if k != "model_type"}, head_dim=8)
    rng = np.random.default_rng(0)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in expected_shapes(c).items()}


def _write_sharded(folder, shard_names: list[str]) -> dict:
    """An HF directory whose index maps the weights, round robin, to `shard_names` (relative to it)."""
    from safetensors.numpy import save_file
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(HF_CONFIG, f)
    w, weight_map = _weights(), {}
    names = list(w)
    for i, shard in enumerate(shard_names):
        part = {n: w[n] for n in names[i::len(shard_names)]}
        target = shard if os.path.isabs(shard) else os.path.join(folder, shard)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        save_file(part, target)
        weight_map.update({n: shard for n in part})
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"weight_map": weight_map}, f)
    # a placeholder so that the directory is recognised as an HF directory
    if not any(s.endswith(".safetensors") and "/" not in s for s in shard_names):
        save_file({"unused": np.zeros(1, np.float32)}, os.path.join(folder, "unused.safetensors"))
    return w


# ------------------------------------------------------------ B: shards stay inside the model directory

def test_shards_in_subfolder_load(tmp_path):
    w = _write_sharded(tmp_path / "m", ["a.safetensors", "sub/b.safetensors"])
    c = load_config(str(tmp_path / "m"))
    got = dict(iter_weights(str(tmp_path / "m"), c))
    assert all(np.array_equal(got[n], w[n]) for n in w)


@pytest.mark.parametrize("outside", ["../outside/x.safetensors", "ABS", "sub/../../outside/x.safetensors"])
def test_shard_outside_model_dir_is_refused(tmp_path, outside):
    if outside == "ABS":
        outside = str(tmp_path / "outside" / "x.safetensors")
    _write_sharded(tmp_path / "m", ["a.safetensors", outside])
    c = load_config(str(tmp_path / "m"))
    with pytest.raises(ValueError, match=r"model.safetensors.index.json names shard .* outside the model "
                                         r"directory"):
        list(iter_weights(str(tmp_path / "m"), c))


def test_shard_symlink_held_by_the_directory_is_followed(tmp_path):
    """The HF hub cache's layout: snapshot files are links into its blob store."""
    w = _write_sharded(tmp_path / "m", ["a.safetensors", "../outside/x.safetensors"])
    os.symlink(tmp_path / "outside" / "x.safetensors", tmp_path / "m" / "link.safetensors")
    index = tmp_path / "m" / "model.safetensors.index.json"
    d = json.loads(index.read_text())
    d["weight_map"] = {n: ("link.safetensors" if f.startswith("..") else f) for n, f in d["weight_map"].items()}
    index.write_text(json.dumps(d))
    got = dict(iter_weights(str(tmp_path / "m"), load_config(str(tmp_path / "m"))))
    assert all(np.array_equal(got[n], w[n]) for n in w)


@pytest.mark.parametrize("bad", [None, 3, "", ["a"]])
def test_shard_name_must_be_a_file_name(tmp_path, bad):
    _write_sharded(tmp_path / "m", ["a.safetensors"])
    index = tmp_path / "m" / "model.safetensors.index.json"
    d = json.loads(index.read_text())
    d["weight_map"][next(iter(d["weight_map"]))] = bad
    index.write_text(json.dumps(d))
    with pytest.raises(ValueError, match=r"index.json: weight_map values must be file names"):
        list(iter_weights(str(tmp_path / "m"), load_config(str(tmp_path / "m"))))


# ------------------------------------------------------------ A: GGUF, byte by byte

def _tiny_gguf(path) -> int:
    """A small llama GGUF with a byte-level BPE vocabulary; returns where its tensor data starts."""
    import gguf
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + list("abcdehlo ") + ["ab", "he", "ll", "llo",
                                                                                    "hello"]
    merges = ["a b", "h e", "l l", "ll o", "he llo"]
    hidden, inter, vocab = 8, 16, len(tokens)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(64)
    w.add_embedding_length(hidden)
    w.add_block_count(1)
    w.add_feed_forward_length(inter)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_bos_token_id(0)
    w.add_eos_token_id(2)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3, 3, 3] + [1] * (vocab - 3))
    w.add_token_merges(merges)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}")
    rng = np.random.default_rng(0)
    shapes = {"token_embd.weight": (vocab, hidden), "output_norm.weight": (hidden,),
              "blk.0.attn_norm.weight": (hidden,), "blk.0.ffn_norm.weight": (hidden,),
              "blk.0.attn_q.weight": (hidden, hidden), "blk.0.attn_k.weight": (4, hidden),
              "blk.0.attn_v.weight": (4, hidden), "blk.0.attn_output.weight": (hidden, hidden),
              "blk.0.ffn_gate.weight": (inter, hidden), "blk.0.ffn_up.weight": (inter, hidden),
              "blk.0.ffn_down.weight": (hidden, inter)}
    for name, shape in shapes.items():
        a = rng.standard_normal(shape).astype(np.float32)
        w.add_tensor(name, a.astype(np.float16) if name.endswith("ffn_up.weight") else a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return min(int(t.data_offset) for t in gguf.GGUFReader(str(path)).tensors)


def _engine_reads(path: str):
    """What the engine reads from a model file: its config, every weight, its tokenizer."""
    from ms_atb.text.tokenizer import load_tokenizer
    config = load_config(path)
    for _ in iter_weights(path, config):
        pass
    tok = load_tokenizer(path)
    tok.decode(tok.encode("hello ab"))


def _outcome(path: str) -> str | None:
    """None if the file loads or is refused with a ValueError naming it; else what went wrong."""
    try:
        _engine_reads(path)
    except ValueError as e:
        return None if path in str(e) else f"ValueError not naming the file: {e}"
    except Exception as e:          # noqa: BLE001 -- the point of the test: nothing else may escape
        return f"{type(e).__name__}: {e}"
    return None


def test_tiny_gguf_loads(tmp_path):
    _tiny_gguf(tmp_path / "m.gguf")
    _engine_reads(str(tmp_path / "m.gguf"))


def test_every_header_byte_flipped_or_cut_loads_or_names_the_file(tmp_path):
    good = tmp_path / "good.gguf"
    data_start = _tiny_gguf(good)
    data = good.read_bytes()
    path = str(tmp_path / "bad.gguf")
    failures = []
    cases = [(f"byte {i} ^ {x:#x}", data[:i] + bytes([data[i] ^ x]) + data[i + 1:])
             for i in range(data_start) for x in ((0xFF, 0x01) if i < 24 else (0xFF,))]
    cases += [(f"cut at {n}", data[:n]) for n in list(range(0, data_start, 3)) + [len(data) - 1]]
    for what, blob in cases:
        with open(path, "wb") as f:
            f.write(blob)
        problem = _outcome(path)
        if problem:
            failures.append(f"{what}: {problem}")
    assert not failures, f"{len(failures)} of {len(cases)} cases:\n" + "\n".join(failures[:20])


@pytest.mark.parametrize("key, value, match", [
    ("general.alignment", 0, r"general.alignment is 0; it must be a power of two"),
    ("general.alignment", 24, r"general.alignment is 24; it must be a power of two"),
    ("llama.attention.head_count", 0, r"metadata llama.attention.head_count must be an integer >= 1"),
    ("llama.block_count", 10**6, r"llama.block_count is 1000000, but the file holds only 11 tensors"),
    ("tokenizer.ggml.eos_token_id", 99, r"tokenizer.ggml.eos_token_id 99 is outside the vocabulary"),
])
def test_bad_gguf_metadata_values(tmp_path, key, value, match):
    import gguf
    _tiny_gguf(tmp_path / "m.gguf")
    w = gguf.GGUFWriter(str(tmp_path / "bad.gguf"), "llama")
    # rewrite the file with one value changed: the reader's own parse gives everything else back
    reader = gguf.GGUFReader(str(tmp_path / "m.gguf"))
    for field in reader.fields.values():
        if field.name in ("GGUF.version", "GGUF.tensor_count", "GGUF.kv_count", "general.architecture", key):
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            items = [field.parts[i].tobytes().decode() if field.types[1] == gguf.GGUFValueType.STRING
                     else field.parts[i].tolist()[0] for i in field.data]
            w.add_array(field.name, items)
        elif vtype == gguf.GGUFValueType.STRING:
            w.add_string(field.name, field.parts[field.data[0]].tobytes().decode())
        else:
            w.add_key_value(field.name, field.parts[field.data[0]].tolist()[0], vtype)
    w.add_uint32(key, value)
    for t in reader.tensors:
        w.add_tensor(t.name, np.asarray(t.data).reshape(tuple(reversed(t.shape.tolist()))))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match=str(tmp_path / "bad.gguf") + ".*" + match):
        _engine_reads(str(tmp_path / "bad.gguf"))


# ------------------------------------------------------------ A: the other formats, garbled or cut

def _garbles(data: bytes) -> list[bytes]:
    return [b"", data[:len(data) // 2], data[:7], bytes(b ^ 0x5A for b in data[:64]) + data[64:]]


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json", "tokenizer.model"])
def test_garbled_tokenizer_files_name_the_file(tmp_path, name):
    from ms_atb.text.tokenizer import load_tokenizer
    good = {"tokenizer.json": b'{"version": "1.0", "model": {"type": "WordLevel", "vocab": {"a": 0, "[UNK]": 1},'
                              b' "unk_token": "[UNK]"}, "pre_tokenizer": {"type": "Whitespace"}}',
            "tokenizer_config.json": b'{"bos_token": "a", "add_bos_token": false}'}
    for case in _garbles(good.get(name, b"\x0a\x0b" + os.urandom(200))):
        d = tmp_path / "tok"
        d.mkdir(exist_ok=True)
        for other, content in good.items():
            (d / other).write_bytes(content)
        if name == "tokenizer.model":
            (d / "tokenizer.json").unlink()
        (d / name).write_bytes(case)
        with pytest.raises(ValueError, match=str(d / name)):
            load_tokenizer(str(d))


def test_garbled_checkpoint_and_yaml_name_the_file(tmp_path):
    import mindspore as ms
    ms.save_checkpoint([{"name": "model.norm_out.weight", "data": ms.Tensor(np.ones(4, np.float32))}],
                       str(tmp_path / "m.ckpt"))
    data = (tmp_path / "m.ckpt").read_bytes()
    (tmp_path / "m.yaml").write_text("model:\n  model_config:\n    hidden_size: 32\n    num_heads: 4\n"
                                     "    num_layers: 1\n    vocab_size: 48\n    intermediate_size: 64\n"
                                     "    max_position_embedding: 64\n    rms_norm_eps: 1.0e-6\n")
    c = load_config(str(tmp_path / "m.ckpt"))
    for case in _garbles(data):
        (tmp_path / "m.ckpt").write_bytes(case)
        with pytest.raises(ValueError, match=str(tmp_path / "m.ckpt")):
            list(iter_weights(str(tmp_path / "m.ckpt"), c))
    for text in ("model: [unclosed", "- a\n- b\n", "model:\n  model_config:\n    hidden_size: x\n    num_heads: 4\n",
                 "model:\n  model_config:\n    hidden_size: 32\n    num_heads: 0\n"):
        (tmp_path / "m.yaml").write_text(text)
        with pytest.raises(ValueError, match=str(tmp_path / "m.yaml")):
            load_config(str(tmp_path / "m.ckpt"))
