"""Malformed or hostile model files: every one is a ValueError naming the file, never a traceback from
deep inside a parser, and a sharded checkpoint reads only files inside its own directory."""
import json
import os

import numpy as np
import pytest

from ms_atb.models.llama import LlamaConfig
from ms_atb.models.loader import expected_shapes, iter_weights, load_config

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
