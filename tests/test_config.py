"""YAML config: sections, keyword overrides, and errors that name the key."""
import os

import pytest

from ms_atb.config import EngineConfig, config_keys, parse_size

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "tiny_llama.yaml")


def test_tiny_config_loads_and_keywords_override():
    cfg = EngineConfig.load(TINY, num_blocks=64, tensor_parallel_size=2, enable_prefix_caching=False)
    assert cfg.kv_cache.num_blocks == 64
    assert cfg.parallel.tensor_parallel_size == 2
    assert cfg.kv_cache.enable_prefix_caching is False
    assert cfg.model.path.startswith("random:tiny-llama")
    assert cfg.model.max_model_len >= 256


def test_a_none_keyword_overrides_too():
    # None is a value: the documented null setting of an optional leaf, an error for the others
    cfg = EngineConfig.load(TINY, max_tokens=None, max_model_len=None, compile_cache=None)
    assert (cfg.sampling.max_tokens, cfg.model.max_model_len, cfg.context.compile_cache) == (None, None, None)
    for key, match in (("num_blocks", "kv_cache.num_blocks must be an integer >= 1 or 'auto', got None"),
                       ("enable_prefix_caching", "must be true or false, got None")):
        with pytest.raises(ValueError, match=match):
            EngineConfig.load(TINY, **{key: None})


def test_leaf_names_are_unique_and_cover_every_section():
    keys = config_keys()
    assert {"path", "block_size", "num_blocks", "memory_budget", "max_num_seqs", "tensor_parallel_size",
            "device", "seed", "temperature"} <= set(keys)
    assert set(keys.values()) == {"model", "kv_cache", "scheduler", "parallel", "lora", "context", "sampling"}


@pytest.mark.parametrize("data, match", [
    ({"model": {"path": "random:tiny-llama", "colour": 1}}, r"unknown config key model\.colour"),
    ({"modle": {"path": "random:tiny-llama"}}, r"unknown config section 'modle'"),
    ({"model": {"path": "random:tiny-llama"}, "kv_cache": {"block_size": "16"}}, r"kv_cache\.block_size must be an integer"),
    ({"model": {"path": "random:tiny-llama"}, "kv_cache": {"enable_prefix_caching": "yes"}}, r"enable_prefix_caching must be true or false"),
    ({"model": {"path": "random:tiny-llama"}, "kv_cache": {"allocation": "lazy"}}, r"kv_cache\.allocation must be one of"),
    ({"model": {"path": "random:tiny-llama"}, "kv_cache": {"num_blocks": 0}}, r"num_blocks"),
    ({"model": {"path": "random:tiny-llama"}, "kv_cache": {"memory_budget": "lots"}}, r"memory_budget"),
    ({"model": {"path": "random:tiny-llama"}, "context": {"device": "gpu"}}, r"context\.device must be one of"),
    ({"model": {"path": "random:tiny-llama"}, "context": {"seed": -1}}, r"context\.seed must be an integer >= 0"),
    ({"model": {"path": "random:tiny-llama", "dtype": "bfloat16"}}, r"bfloat16 does not run on the CPU"),
    ({"model": {"path": "/nonexistent/model.gguf"}}, r"not found"),
    ({"model": {"path": "pkg:no_such_package_xyz/m.gguf"}}, r"not installed"),
    ({"scheduler": {"max_num_seqs": 4}}, r"model\.path is required"),
    ({"model": {"path": "random:tiny-llama", "max_model_len": 0}}, r"model\.max_model_len must be >= 1"),
    ({"model": {"path": "random:tiny-llama", "max_model_len": "2k"}}, r"model\.max_model_len must be an integer"),
    ({"model": {"path": "random:tiny-llama"}, "kv_cache": {"num_blocks": True}},
     r"kv_cache\.num_blocks must be an integer >= 1 or 'auto', got True"),
    ({"model": {"path": "random:tiny-llama"}, "kv_cache": {"memory_budget": [1]}},
     r"kv_cache\.memory_budget must be a byte count or a size"),
    ({"model": {"path": "random:tiny-llama"}, "sampling": {"temperature": -1}},
     r"sampling\.temperature must be a finite number >= 0"),
    ({"model": {"path": "random:tiny-llama"}, "sampling": {"top_p": 0}}, r"sampling\.top_p must be a number in \(0, 1\]"),
    ({"model": {"path": "random:tiny-llama"}, "sampling": {"max_tokens": 0}}, r"sampling\.max_tokens must be None \(up to max_model_len\) or an int >= 1"),
])
def test_bad_configs_name_the_key(data, match):
    with pytest.raises(ValueError, match=match):
        EngineConfig.load(data)


def test_unknown_keyword_is_an_error():
    with pytest.raises(ValueError, match="unknown keyword 'num_blocsk'"):
        EngineConfig.load(TINY, num_blocsk=3)


def test_missing_yaml_file():
    with pytest.raises(ValueError, match="config file not found"):
        EngineConfig.load("/nonexistent/x.yaml")


@pytest.mark.parametrize("text, match", [
    ("model:\n  path: random:tiny-llama\nkv_cache: [\n", r"c\.yaml:4:1: not valid YAML"),
    ("model:\n  path: a\n   dtype: float32\n", r"c\.yaml:3:\d+: not valid YAML"),
    ("model:\n  path: random:tiny-llama\nkv_cache:\n  num_blocks: 64\n  num_blocks: 32\n",
     r"c\.yaml:5:3: not valid YAML \(key 'num_blocks' appears twice\)"),
])
def test_invalid_yaml_names_the_file_and_line(tmp_path, text, match):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=match):
        EngineConfig.load(str(path))


def test_the_same_key_in_two_sections_is_fine(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  path: random:tiny-llama\nkv_cache:\n  num_blocks: 64\nscheduler:\n  max_num_seqs: 4\n")
    assert EngineConfig.load(str(path)).kv_cache.num_blocks == 64


def test_max_model_len_defaults_to_the_models_limit():
    from ms_atb import LLM
    assert EngineConfig.load({"model": {"path": "random:tiny-llama"}}).model.max_model_len is None
    llm = LLM({"model": {"path": "random:tiny-llama?seed=0"}}, num_blocks=8, max_num_seqs=1,
              max_num_batched_tokens=1)                                   # one token bucket: one graph
    assert llm.max_model_len == 1024 == llm.model_config.max_position_embeddings     # below the 2,048 default
    assert llm.scheduler.max_model_len == 1024
    with pytest.raises(ValueError, match="max_model_len 1025 exceeds the model's max_position_embeddings 1024"):
        LLM({"model": {"path": "random:tiny-llama?seed=0", "max_model_len": 1025}})


def test_sizes_and_package_paths():
    assert parse_size("1GiB", "x") == 2**30
    assert parse_size("512 MiB", "x") == 512 * 2**20
    assert parse_size(1000, "x") == 1000
    cfg = EngineConfig.load(os.path.join(ROOT, "configs", "smollm2_135m.yaml"))
    assert cfg.model.path.endswith("SmolLM2-135M-Instruct.Q4_1.gguf") and os.path.isfile(cfg.model.path)
    assert cfg.kv_cache.num_blocks == "auto"


def test_relative_model_path_is_relative_to_the_yaml(tmp_path):
    (tmp_path / "weights").mkdir()
    (tmp_path / "c.yaml").write_text("model:\n  path: weights\n")
    assert EngineConfig.load(str(tmp_path / "c.yaml")).model.path == str(tmp_path / "weights")
