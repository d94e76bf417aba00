"""Reading LoRA adapters from PEFT directories: what is supported, and a clear error naming the directory for
everything else."""
import json
import math
import os

import numpy as np
import pytest
from safetensors.numpy import save_file

from ms_atb.formats.loader import load_config
from ms_atb.formats.peft_adapter import load_adapter, target_shape

TINY = "random:tiny-llama?seed=0"        # 2 layers, hidden 64, 4 heads / 2 KV heads of 16, FFN 128


def write_adapter(folder, config=None, tensors=None, rank=4, targets=("q_proj", "v_proj"), layers=2, seed=0,
                  **settings):
    """A PEFT directory: adapter_config.json and adapter_model.safetensors with random weights."""
    os.makedirs(folder, exist_ok=True)
    base = load_config(TINY)
    rng = np.random.default_rng(seed)
    if tensors is None:
        tensors = {}
        for i in range(layers):
            for t in targets:
                out, inp = target_shape(base, t)
                module = "self_attn" if t in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
                p = f"base_model.model.model.layers.{i}.{module}.{t}"
                tensors[p + ".lora_A.weight"] = rng.standard_normal((rank, inp)).astype(np.float32)
                tensors[p + ".lora_B.weight"] = rng.standard_normal((out, rank)).astype(np.float16)
    save_file(tensors, os.path.join(folder, "adapter_model.safetensors"))
    cfg = {"peft_type": "LORA", "r": rank, "lora_alpha": 8, "target_modules": list(targets), "bias": "none",
           "use_dora": False, "use_rslora": False, **settings}
    if config is not None:
        cfg = config
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        json.dump(cfg, f)
    return folder


def test_a_lora_adapter_is_read_with_its_scaling(tmp_path):
    base = load_config(TINY)
    a = load_adapter(write_adapter(tmp_path / "a"), base, max_rank=8)
    assert a.rank == 4 and a.scaling == 8 / 4 and a.targets == ("q_proj", "v_proj")
    assert set(a.lora_a) == {(i, t) for i in range(2) for t in ("q_proj", "v_proj")}
    assert a.lora_a[(0, "q_proj")].shape == (4, 64) and a.lora_b[(1, "v_proj")].shape == (32, 4)
    assert a.lora_b[(1, "v_proj")].dtype == np.float32
    r = load_adapter(write_adapter(tmp_path / "r", use_rslora=True, targets=("gate_proj", "down_proj")), base, 8)
    assert r.scaling == pytest.approx(8 / math.sqrt(4)) and r.lora_a[(0, "down_proj")].shape == (4, 128)
    regex = load_adapter(write_adapter(tmp_path / "x", config={"r": 4, "lora_alpha": 4,
                                                               "target_modules": ".*(q|v)_proj"}), base, 8)
    assert regex.targets == ("q_proj", "v_proj") and regex.scaling == 1.0


@pytest.mark.parametrize("make, words", [
    (lambda d: write_adapter(d, use_dora=True), "use_dora True is not supported"),
    (lambda d: write_adapter(d, modules_to_save=["lm_head"]), "modules_to_save ['lm_head'] is not supported"),
    (lambda d: write_adapter(d, bias="all"), "bias 'all' is not supported"),
    (lambda d: write_adapter(d, rank_pattern={"q_proj": 8}), "rank_pattern"),
    (lambda d: write_adapter(d, peft_type="IA3"), "peft_type 'IA3' is not supported"),
    (lambda d: write_adapter(d, target_modules=["q_proj", "embed_tokens"]), "target_modules ['embed_tokens']"),
    (lambda d: write_adapter(d, rank=16), "rank 16 is above max_lora_rank 8"),
    (lambda d: write_adapter(d, layers=3), "is for layer 2; the base model has 2 layers"),
    (lambda d: write_adapter(d, tensors={"base_model.model.model.embed_tokens.lora_A.weight": np.zeros((4, 512))}),
     "is not supported (only lora_A / lora_B"),
    (lambda d: write_adapter(d, tensors={"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight":
                                         np.zeros((4, 64), np.float32)}), "has only one of lora_A and lora_B"),
    (lambda d: write_adapter(d, tensors={"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight":
                                         np.zeros((4, 65), np.float32)}), "the base model needs (4, 64)"),
    (lambda d: write_adapter(d, tensors={"base_model.model.model.layers.0.mlp.up_proj.lora_A.weight":
                                         np.zeros((4, 64), np.float32)}), "which target_modules"),
    (lambda d: write_adapter(d, r=0), "r must be an int >= 1"),
    (lambda d: write_adapter(d, tensors={}), "holds no LoRA weights"),
])
def test_an_unsupported_adapter_is_a_value_error_naming_its_directory(tmp_path, make, words):
    folder = str(tmp_path / "bad")
    make(folder)
    with pytest.raises(ValueError) as e:
        load_adapter(folder, load_config(TINY), max_rank=8)
    assert folder in str(e.value) and words in str(e.value), str(e.value)


def test_missing_or_damaged_files_are_value_errors(tmp_path):
    base = load_config(TINY)
    with pytest.raises(ValueError, match="not a directory"):
        load_adapter(str(tmp_path / "nowhere"), base, 8)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="adapter_config.json is missing"):
        load_adapter(str(tmp_path / "empty"), base, 8)
    folder = write_adapter(tmp_path / "bin")
    os.rename(os.path.join(folder, "adapter_model.safetensors"), os.path.join(folder, "adapter_model.bin"))
    with pytest.raises(ValueError, match="adapter_model.bin, a pickle, is not read"):
        load_adapter(str(folder), base, 8)
    folder = write_adapter(tmp_path / "torn")
    with open(os.path.join(folder, "adapter_model.safetensors"), "r+b") as f:
        f.truncate(100)
    with pytest.raises(ValueError, match="adapter_model.safetensors cannot be read"):
        load_adapter(str(folder), base, 8)
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        f.write("{not json")
    with pytest.raises(ValueError, match="adapter_config.json is not valid JSON"):
        load_adapter(str(folder), base, 8)
