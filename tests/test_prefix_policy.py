"""The scheduler.policy leaf on the engine (tiny model): prefix order and deduplication give every request the
tokens FCFS gives it, in input order; exact greedy duplicates are computed once, seeded ones each time."""
import os
import random

import pytest

from ms_atb import LLM, SamplingParams
from ms_atb.config import EngineConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "tiny_llama.yaml")
NUM_BLOCKS = 24          # 384 tokens: three 48-token prefixes do not stay cached beside the running requests


@pytest.fixture
def llm(tiny_llm):
    """The shared tiny engine (conftest.py) on a pool of NUM_BLOCKS; each run() sets its policy."""
    tiny_llm.reset_scheduler(num_blocks=NUM_BLOCKS)
    return tiny_llm


def batch(seed=0):
    """Prompts over three shared 48-token prefixes (shuffled), then exact copies of three of them."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1, 256) for _ in range(48)] for _ in range(3)]
    prompts = [rng.choice(prefixes) + [rng.randrange(1, 256) for _ in range(rng.randint(3, 40))] for _ in range(18)]
    return prompts + [prompts[0], prompts[4], prompts[4]]


def greedy(max_tokens=12):
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def run(llm, policy, prompts, params):
    llm.reset_scheduler(policy=policy)            # an empty cache for each run
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return outputs, llm.stats()


def test_prefix_policy_gives_the_tokens_of_fcfs_in_input_order(llm):
    prompts = batch()
    params = [greedy() if i % 3 else SamplingParams(max_tokens=12, temperature=0.9, top_k=50, seed=i % 5,
                                                     ignore_eos=True) for i in range(len(prompts))]
    params[-1] = params[-2] = params[4] = greedy()      # the copies of prompt 4 are greedy duplicates
    fcfs, fcfs_stats = run(llm, "fcfs", prompts, params)
    prefix, prefix_stats = run(llm, "prefix", prompts, params)
    assert fcfs_stats["evictions"] > 0 and prefix_stats["evictions"] > 0
    assert prefix_stats["num_deduplicated"] == 2 and fcfs_stats["num_deduplicated"] == 0
    assert [o.token_ids for o in prefix] == [o.token_ids for o in fcfs]
    assert [o.text for o in prefix] == [o.text for o in fcfs]
    assert [o.prompt_token_ids for o in prefix] == prompts
    assert len({o.request_id for o in prefix}) == len(prompts)
    assert prefix_stats["num_computed_tokens"] < fcfs_stats["num_computed_tokens"]
    assert prefix_stats["num_output_tokens"] == fcfs_stats["num_output_tokens"] == 12 * len(prompts)


def test_greedy_duplicates_are_computed_once_and_each_gets_its_own_output(llm):
    prompts = batch(seed=1)
    unique = prompts[:-3]
    _, alone = run(llm, "prefix", unique, greedy())
    outputs, with_copies = run(llm, "prefix", prompts, greedy())
    assert with_copies["num_computed_tokens"] == alone["num_computed_tokens"]      # the copies cost nothing
    assert with_copies["num_deduplicated"] == 3
    _, fcfs = run(llm, "fcfs", prompts, greedy())
    assert fcfs["num_computed_tokens"] > with_copies["num_computed_tokens"]
    copy, first = outputs[-1], outputs[4]
    assert copy.token_ids == first.token_ids and copy.token_ids is not first.token_ids
    assert copy.request_id != first.request_id


def test_requests_that_differ_in_any_field_or_sample_are_each_computed(llm):
    prompt = batch(seed=2)[0]
    _, one = run(llm, "prefix", [prompt], greedy())
    for params in ([greedy(), SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=2)],
                   [greedy(), greedy(max_tokens=11)],
                   [SamplingParams(max_tokens=12, temperature=0.8, seed=3, ignore_eos=True)] * 2):
        outputs, two = run(llm, "prefix", [prompt, prompt], params)
        assert two["num_deduplicated"] == 0
        assert two["num_computed_tokens"] > one["num_computed_tokens"]
    assert outputs[0].token_ids == outputs[1].token_ids          # the same seed, computed twice


def test_generate_iter_yields_every_duplicate_with_its_own_index(llm):
    llm.reset_scheduler(policy="prefix")
    prompts = batch(seed=3)
    requests = llm.make_requests(prompts, greedy(4))
    seen = {}
    for index, out in llm.generate_iter(requests, use_tqdm=False):
        seen[index] = out.request_id
    assert seen == {r.index: r.request_id for r in requests}


def test_policy_leaf_and_default_policy():
    for bad in ("lifo", "", "PREFIX"):
        with pytest.raises(ValueError, match=r"scheduler\.policy must be one of \['auto', 'fcfs', 'prefix'\]"):
            EngineConfig.load(TINY, policy=bad)
    with pytest.raises(ValueError, match=r"scheduler\.policy must be a string"):
        EngineConfig.load(TINY, policy=1)
    assert EngineConfig.load(TINY).scheduler.policy == "auto"
    assert LLM.prepare(TINY).policy == "fcfs"                               # what LLM(...) uses
    batch_tool = LLM.prepare(TINY, default_policy="prefix")
    assert batch_tool.policy == batch_tool.scheduler.policy == "prefix"
    assert LLM.prepare(TINY, default_policy="prefix", policy="fcfs").scheduler.policy == "fcfs"
    assert LLM.prepare(TINY, policy="prefix").scheduler.policy == "prefix"
    with pytest.raises(ValueError, match=r"default_policy must be one of \['fcfs', 'prefix'\], got 'auto'"):
        LLM.prepare(TINY, default_policy="auto")


def test_reset_scheduler_checks_the_policy(llm):
    scheduler = llm.scheduler
    with pytest.raises(ValueError, match=r"scheduler\.policy must be one of"):
        llm.reset_scheduler(policy="sjf")
    assert llm.scheduler is scheduler
