"""SamplingParams(prompt_logprobs=N): every prompt token's log-probability under the model, against
the independent numpy model; across prefill chunks, past the prefix cache, under preemption."""
import json

import numpy as np
import pytest

from ms_atb import SamplingParams
from ms_atb.batch.cli import main as cli_main
from engine_helpers import TINY_CLI_SET, TINY_CONFIG, scheduler_settings, tiny_logits

PREFIX = [7 * i % 500 + 1 for i in range(37)]            # 2 whole blocks of 16 and 5 more


@pytest.fixture
def llm(tiny_llm):
    return tiny_llm         # conftest.py: one tiny engine for the whole run, reset for each test


def reference(prompt, top):
    """[None, {token: logp, top ids...}, ...] from the numpy model's logits at every position."""
    logits = tiny_logits(prompt).astype(np.float64)                        # [P, V]
    logp = logits - logits.max(1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(1, keepdims=True))
    out = [None]
    for k in range(1, len(prompt)):
        ids = [int(i) for i in np.argsort(-logp[k - 1], kind="stable")[:top]]
        out.append({t: logp[k - 1, t] for t in [prompt[k], *ids]})
    return out


def assert_close(got, ref):
    assert len(got) == len(ref) and got[0] is None
    for g, r in zip(got[1:], ref[1:]):
        assert list(g) == list(r)                                   # the token first, then the top ids
        np.testing.assert_allclose(list(g.values()), list(r.values()), atol=2e-4)


@pytest.mark.parametrize("chunk", [64, 16, 7])
def test_prompt_logprobs_match_the_numpy_reference(llm, chunk):
    prompt = PREFIX + [3, 1, 4, 1, 5, 9]
    with scheduler_settings(llm, max_num_batched_tokens=chunk):
        out = llm.generate([prompt], SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=3),
                           use_tqdm=False)[0]
    assert_close(out.prompt_logprobs, reference(prompt, 3))
    plain = llm.generate([prompt], SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)[0]
    assert plain.prompt_logprobs is None and plain.token_ids == out.token_ids


def test_a_cached_prefix_is_recomputed_for_its_logprobs_and_still_shared(llm):
    llm.reset_scheduler()
    a, b, c = PREFIX + [11, 12], PREFIX + [13, 14, 15], PREFIX + [16]
    greedy = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    scored = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True, prompt_logprobs=0)
    first = llm.generate([a], greedy, use_tqdm=False)[0]
    out_b, out_c = llm.generate([b, c], [scored, greedy], use_tqdm=False)
    assert first.num_cached_tokens == 0 and out_b.num_cached_tokens == 0 and out_c.num_cached_tokens == 32
    assert_close(out_b.prompt_logprobs, reference(b, 0))
    with scheduler_settings(llm, enable_prefix_caching=False):
        assert llm.generate([b], greedy, use_tqdm=False)[0].token_ids == out_b.token_ids


def test_one_list_for_n_samples_and_unchanged_under_preemption(llm):
    prompts = [PREFIX, PREFIX[5:30], [9]]
    params = [SamplingParams(max_tokens=30, temperature=1.0, seed=s, n=2, ignore_eos=True, prompt_logprobs=1)
              for s in (1, 2, 3)]
    llm.reset_scheduler()
    roomy = llm.generate(prompts, params, use_tqdm=False)
    # Sample 0 computes the prompt for its logprobs; sample 1 of the first prompt finds its whole blocks.
    assert roomy[0].num_cached_tokens == 0 and llm.stats()["prefix_cache_hits"] >= 32
    assert roomy[2].prompt_logprobs == [None]
    for out, prompt in zip(roomy[:2], prompts):
        assert_close(out.prompt_logprobs, reference(prompt, 1))
    with scheduler_settings(llm, num_blocks=8):
        tight = llm.generate(prompts, params, use_tqdm=False)
        assert llm.stats()["num_preemptions"] > 0
    for x, y in zip(tight, roomy):
        assert [c.token_ids for c in x.outputs] == [c.token_ids for c in y.outputs]
        assert (x.prompt_logprobs is None) == (y.prompt_logprobs is None)
        for g, r in zip(x.prompt_logprobs[1:], y.prompt_logprobs[1:]):
            assert list(g) == list(r) and np.allclose(list(g.values()), list(r.values()), atol=1e-5)


def test_bad_prompt_logprobs_and_the_cli(tmp_path, cli_on_tiny_engine):
    for bad in (-1, 21, 1.5, True):
        with pytest.raises(ValueError, match="prompt_logprobs must be None"):
            SamplingParams(prompt_logprobs=bad)
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": "s", "prompt": PREFIX[:9], "prompt_logprobs": 2}) + "\n")
    dst = tmp_path / "out.jsonl"
    assert cli_main(["--config", TINY_CONFIG, "--input", str(src), "--output", str(dst), "--no-progress",
                     "--max-tokens", "1", *TINY_CLI_SET]) == 0
    row = json.loads(dst.read_text())
    assert row["prompt_logprobs"][0] is None and len(row["prompt_logprobs"]) == 9
    ref = reference(PREFIX[:9], 2)
    for got, want in zip(row["prompt_logprobs"][1:], ref[1:]):
        assert [int(k) for k in got] == list(want)
