"""SamplingParams(n=...): several samples of one prompt, sharing its cached KV, each with its own
random stream, stop conditions and logprobs; against single-sample runs of the same engine."""
import json

import pytest

from ms_atb import SamplingParams
from ms_atb.batch.cli import main as cli_main
from ms_atb.batch.summary import summarize
from engine_helpers import TINY_CLI_SET, TINY_CONFIG, scheduler_settings

PROMPT = list(range(3, 43))          # 40 tokens: 2 whole blocks of 16 and 8 more


@pytest.fixture
def llm(tiny_llm):
    return tiny_llm         # conftest.py: one tiny engine for the whole run, reset for each test


def test_samples_are_seeded_streams_and_sample_0_is_the_single_sample(llm):
    params = SamplingParams(max_tokens=16, temperature=1.2, seed=7, n=4, ignore_eos=True)
    out = llm.generate([PROMPT], params, use_tqdm=False)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2, 3]
    assert all(len(c.token_ids) == 16 and c.finish_reason == "length" for c in out.outputs)
    assert len({tuple(c.token_ids) for c in out.outputs}) == 4          # four different streams
    first = out.outputs[0]
    assert (out.token_ids, out.text, out.finish_reason) == (first.token_ids, first.text, first.finish_reason)
    single = llm.generate([PROMPT], SamplingParams(max_tokens=16, temperature=1.2, seed=7, ignore_eos=True),
                          use_tqdm=False)[0]
    assert single.token_ids == first.token_ids and len(single.outputs) == 1
    # Each sample's stream depends only on the seed: not on the batch, the other samples, or their order.
    others = SamplingParams(max_tokens=5, temperature=1.0, seed=1, n=2)
    batch = llm.generate([[9, 9, 9], PROMPT, PROMPT[:7]], [others, params, others], use_tqdm=False)
    assert [c.token_ids for c in batch[1].outputs] == [c.token_ids for c in out.outputs]


def test_samples_share_the_prompt_blocks(llm):
    llm.reset_scheduler()
    greedy = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, n=3)
    out = llm.generate([PROMPT], greedy, use_tqdm=False)[0]
    assert out.outputs[1].token_ids == out.outputs[2].token_ids == out.token_ids     # greedy: identical
    # Sample 0 computes the prompt; samples 1 and 2 find its 2 whole blocks and compute the last 8
    # tokens. Each feeds back 5 of its 6 output tokens.
    assert llm.stats()["num_computed_tokens"] == 40 + 2 * 8 + 3 * 5
    assert out.num_cached_tokens == 0
    with scheduler_settings(llm, enable_prefix_caching=False):
        again = llm.generate([PROMPT], greedy, use_tqdm=False)[0]
        assert llm.stats()["num_computed_tokens"] == 3 * 40 + 3 * 5
        assert [c.token_ids for c in again.outputs] == [c.token_ids for c in out.outputs]


def test_each_sample_stops_on_its_own(llm):
    params = SamplingParams(max_tokens=24, temperature=1.5, seed=11, n=5, logprobs=2)
    probe = llm.generate([PROMPT], params, use_tqdm=False)[0]
    stop = probe.outputs[2].token_ids[3]              # a token sample 2 draws early
    params = SamplingParams(max_tokens=24, temperature=1.5, seed=11, n=5, logprobs=2, stop_token_ids=[stop])
    out = llm.generate([PROMPT], params, use_tqdm=False)[0]
    for before, after in zip(probe.outputs, out.outputs):
        cut = before.token_ids.index(stop) + 1 if stop in before.token_ids else len(before.token_ids)
        assert after.token_ids == before.token_ids[:cut]
        assert after.finish_reason == ("stop" if cut < len(before.token_ids) or stop in before.token_ids
                                       else before.finish_reason)
        assert len(after.logprobs) == len(after.token_ids)
        assert after.cumulative_logprob == pytest.approx(sum(lp[t] for lp, t in zip(after.logprobs, after.token_ids)))
    assert out.outputs[2].stop_reason == stop and len(out.outputs[2].token_ids) <= 4
    assert out.metrics.num_output_tokens == max(len(c.token_ids) for c in out.outputs)
    assert summarize([out], 1.0, {})["output_tokens"] == sum(len(c.token_ids) for c in out.outputs)


def test_samples_survive_preemption_unchanged(llm):
    prompts = [PROMPT, PROMPT[:20], list(range(100, 130))]
    params = [SamplingParams(max_tokens=30, temperature=1.0, seed=s, n=3, ignore_eos=True) for s in (1, 2, 3)]
    roomy = llm.generate(prompts, params, use_tqdm=False)
    with scheduler_settings(llm, num_blocks=12):
        tight = llm.generate(prompts, params, use_tqdm=False)
        assert llm.stats()["num_preemptions"] > 0
    assert [[c.token_ids for c in o.outputs] for o in tight] == [[c.token_ids for c in o.outputs] for o in roomy]


def test_bad_n_and_duplicate_ids_are_rejected_and_the_engine_stays_usable(llm):
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="n must be an int >= 1"):
            SamplingParams(n=bad)
    greedy = SamplingParams(max_tokens=3, temperature=0.0, n=2)
    requests = [llm.make_request(PROMPT, greedy, 0, request_id="a"),
                llm.make_request(PROMPT, greedy, 1, request_id="a")]
    with pytest.raises(ValueError, match="request 1: id 'a' is used twice"):
        list(llm.generate_iter(requests, use_tqdm=False))
    assert not llm.scheduler.has_unfinished()
    assert len(llm.generate([PROMPT], greedy, use_tqdm=False)[0].outputs) == 2


def test_cli_writes_every_sample(tmp_path, cli_on_tiny_engine):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": "x", "prompt": PROMPT, "n": 3, "temperature": 1.0, "seed": 5}) + "\n"
                   + json.dumps({"id": "y", "prompt": PROMPT[:9]}) + "\n")
    dst = tmp_path / "out.jsonl"
    rc = cli_main(["--config", TINY_CONFIG, "--input", str(src), "--output", str(dst), "--no-progress",
                   "--max-tokens", "5", "--ignore-eos", *TINY_CLI_SET])
    assert rc == 0
    rows = {r["id"]: r for r in map(json.loads, dst.read_text().splitlines())}
    assert [s["index"] for s in rows["x"]["outputs"]] == [0, 1, 2]
    assert rows["x"]["outputs"][0]["token_ids"] == rows["x"]["token_ids"]
    assert all(len(s["token_ids"]) == 5 for s in rows["x"]["outputs"])
    assert "outputs" not in rows["y"]
