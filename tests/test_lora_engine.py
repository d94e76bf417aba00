"""LoRA adapters through the engine (the tiny Llama 3 fixture, adapters rebuilt from their seeds): a batch mixing
three adapters and the base model gives each request's tokens as run alone; more adapters than slots are evicted
and reloaded, and a request waits for a slot; prefix-cache blocks, in the pool and in the KV disk tier, are found
only by requests of the same adapter content; preempted requests give the same tokens; every malformed adapter is a
ValueError naming its directory."""
import json
import os

import numpy as np
import pytest

from ms_atb import LLM, LoRARequest, SamplingParams
from engine_helpers import EXACT, ROOT, with_buckets
from scripts_import import load_script

fixtures = load_script("make_lora_fixtures")
MODEL = os.path.join(ROOT, "tests", "data", "families", "llama3")
CONFIG = fixtures.model_config("llama3")
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
BUILD = {"max_num_seqs": 8, "max_num_batched_tokens": 32, "num_blocks": 64, "max_model_len": 128, "block_size": 16,
         "precompile": False, **EXACT}


def engine(max_loras=2, **keywords) -> LLM:
    return with_buckets(LLM(MODEL, enable_lora=True, max_loras=max_loras, max_lora_rank=16,
                            **{**BUILD, **keywords}), [32])


def prompts(n=8, seed=0, prefix=()):
    rng = np.random.default_rng(seed)
    return [list(prefix) + rng.integers(3, 200, int(rng.integers(4, 30))).tolist() for _ in range(n)]


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    """{name: LoRARequest} of the fixture's three adapters."""
    folder = tmp_path_factory.mktemp("adapters")
    return {name: LoRARequest(name, i + 1, fixtures.write_adapter(str(folder / name), CONFIG, name, 0.6))
            for i, name in enumerate(fixtures.ADAPTERS)}


@pytest.fixture(scope="module")
def llm():
    return engine()


def tokens(llm, batch, lora):
    return [o.token_ids for o in llm.generate(batch, GREEDY, use_tqdm=False, lora_request=lora)]


def test_a_mixed_batch_gives_each_request_its_tokens_alone(llm, adapters):
    batch = prompts()
    names = [None, "wide", "rs16", "qkv", "wide", None, "rs16", "qkv"]
    lora = [None if n is None else adapters[n] for n in names]
    mixed = tokens(llm, batch, lora)
    alone = [tokens(llm, [p], r)[0] for p, r in zip(batch, lora)]
    assert mixed == alone
    # the adapters change the tokens: the same prompt under each adapter and the base
    per_adapter = [tokens(llm, [batch[0]], r)[0] for r in [None] + list(adapters.values())]
    assert len({tuple(t) for t in per_adapter}) == 4
    outs = llm.generate(batch[:2], GREEDY, use_tqdm=False, lora_request=lora[:2])
    assert outs[0].lora_request is None and outs[1].lora_request == adapters["wide"]


def test_more_adapters_than_slots_are_evicted_and_reloaded(adapters):
    single = engine(max_loras=1)
    batch = prompts(6, seed=1)
    order = [adapters[n] for n in ("wide", "rs16", "qkv", "wide", "rs16", "qkv")]
    first = tokens(single, batch, order)             # one slot: requests wait for it, adapters take turns
    loads = single.stats()["lora_loads"]
    assert loads >= 3
    again = [tokens(single, [p], r)[0] for p, r in zip(batch, order)]
    assert again == first and single.stats()["lora_loads"] > loads
    assert single.stats()["lora_load_s"] > 0


def test_prefix_blocks_are_never_found_across_adapters(adapters):
    cached = engine(enable_prefix_caching=True)
    shared = list(range(3, 3 + 48))                  # three whole blocks
    prompt = shared + [7, 8, 9]
    runs = [None, adapters["wide"], adapters["rs16"]]
    for r in runs:                                    # each adapter (and the base) computes its own blocks
        out = cached.generate([prompt], GREEDY, use_tqdm=False, lora_request=r)[0]
        assert out.num_cached_tokens == 0, r
    for r in runs:                                    # and finds them again
        out = cached.generate([prompt], GREEDY, use_tqdm=False, lora_request=r)[0]
        assert out.num_cached_tokens == 48, r
    assert cached.generate([prompt], GREEDY, use_tqdm=False,
                           lora_request=adapters["qkv"])[0].num_cached_tokens == 0


def test_disk_tier_blocks_are_keyed_by_the_adapter_content(adapters, tmp_path):
    prompt = list(range(3, 3 + 48)) + [5, 6]
    folder = str(tmp_path / "adapter")
    same_name = LoRARequest("mine", 9, fixtures.write_adapter(folder, CONFIG, "wide", 0.6))

    def hits(lora):
        llm = engine(enable_prefix_caching=True, disk_cache_dir=str(tmp_path / "kv"))
        llm.generate([prompt], GREEDY, use_tqdm=False, lora_request=lora)
        llm.flush_disk_cache()
        return llm.stats()["disk_cache_hit_tokens"]

    assert hits(same_name) == 0
    assert hits(same_name) == 48                     # a later engine reads the adapter's blocks back
    assert hits(None) == 0 and hits(adapters["rs16"]) == 0
    # other files under the same name and directory: another adapter, none of the first one's blocks
    fixtures.write_adapter(folder, CONFIG, "rs16", 0.3)
    assert hits(same_name) == 0
    assert hits(same_name) == 48


def test_preempted_adapter_requests_give_their_tokens(adapters, llm):
    batch = prompts(6, seed=2)
    lora = [adapters["wide"], None, adapters["rs16"], adapters["wide"], adapters["qkv"], None]
    reference = tokens(llm, batch, lora)
    tight = engine(num_blocks=8)
    assert tokens(tight, batch, lora) == reference
    assert tight.stats()["num_preemptions"] > 0


def _malformed(folder, case):
    settings = json.load(open(os.path.join(folder, "adapter_config.json")))
    if case == "dora":
        settings["use_dora"] = True
    elif case == "target":
        settings["target_modules"] = ["q_proj", "lm_head"]
    elif case == "embeddings":
        settings["modules_to_save"] = ["embed_tokens"]
    elif case == "shape":
        from safetensors.numpy import load_file, save_file
        file = os.path.join(folder, "adapter_model.safetensors")
        tensors = load_file(file)
        name = next(n for n in tensors if "lora_A" in n)
        tensors[name] = np.zeros((tensors[name].shape[0], 3), np.float32)
        save_file(tensors, file)
    elif case == "config":
        os.remove(os.path.join(folder, "adapter_config.json"))
        return
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        json.dump(settings, f)


@pytest.mark.parametrize("case, match", [
    ("dora", "DoRA|use_dora"), ("target", "lm_head"), ("embeddings", "modules_to_save|embed"),
    ("shape", "shape"), ("config", "adapter_config.json is missing"), ("rank", "max_lora_rank"),
    ("missing", "not a directory")])
def test_malformed_adapters_are_value_errors_naming_the_directory(llm, tmp_path, case, match):
    folder = str(tmp_path / "bad")
    if case != "missing":
        fixtures.write_adapter(folder, CONFIG, "rs16" if case == "rank" else "wide", 0.6)
        _malformed(folder, case)
    small = LLM(MODEL, enable_lora=True, max_loras=1, max_lora_rank=8, **BUILD) if case == "rank" else llm
    with pytest.raises(ValueError, match=match) as info:
        small.generate([[5, 6, 7]], GREEDY, use_tqdm=False, lora_request=LoRARequest("bad", 50, folder))
    assert folder in str(info.value) and "request 0" in str(info.value)


def test_lora_requests_need_lora_on_and_one_adapter_per_id(llm, adapters, tiny_engine):
    with pytest.raises(ValueError, match="enable_lora"):
        tiny_engine.generate([[5, 6, 7]], GREEDY, use_tqdm=False, lora_request=adapters["wide"])
    with pytest.raises(ValueError, match="lora_int_id 1 already names"):
        llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False,
                     lora_request=LoRARequest("other", 1, adapters["rs16"].lora_path))
    with pytest.raises(ValueError, match="one per prompt"):
        llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False, lora_request=[None, None])
    with pytest.raises(ValueError, match="lora_int_id must be an int >= 1"):
        LoRARequest("x", 0, "/tmp")


def test_deduplication_copies_only_within_one_adapter(llm, adapters):
    prompt = prompts(1, seed=3)[0]
    lora = [None, adapters["wide"], adapters["rs16"], adapters["wide"]]
    llm.reset_scheduler(policy="prefix")              # the policy that deduplicates
    try:
        outs = tokens(llm, [prompt] * 4, lora)
        deduplicated = llm.stats()["num_deduplicated"]           # of the last run
    finally:
        llm.reset_scheduler(policy="fcfs")
    assert outs == [tokens(llm, [prompt], r)[0] for r in lora]
    assert outs[0] != outs[1] != outs[2] and outs[1] == outs[3]
    assert deduplicated == 1                          # only the second "wide" request is a copy
