"""LLM.beam_search on the tiny random Llama against beam search written out over the numpy model."""
import math

import numpy as np
import pytest

from ms_atb import BeamSearchParams
from engine_helpers import scheduler_settings, tiny_logits

EOS = 511


@pytest.fixture
def llm(tiny_llm):
    return tiny_llm         # conftest.py: one tiny engine for the whole run, reset for each test


def log_softmax(x):
    x = np.asarray(x, dtype=np.float64)
    return x - x.max() - math.log(np.exp(x - x.max()).sum())


def numpy_beam_search(prompt, width, max_tokens, ignore_eos=False, length_penalty=1.0):
    """[(tokens, cumulative logprob, finished by a stop token)], best first, written from the spec: each
    step every live beam offers its 2 x width likeliest tokens; of the best width expansions the ones
    ending with EOS are hypotheses, and the best expansions without EOS (up to width) live on."""
    def score(tokens, cum, stopped):
        return cum / max(len(tokens) - stopped, 1) ** length_penalty

    live, done = [([], 0.0)], []
    for _ in range(max_tokens):
        expansions = []
        for tokens, cum in live:
            lp = log_softmax(tiny_logits(list(prompt) + tokens)[-1])
            for t in np.argsort(-lp, kind="stable")[:2 * width]:
                expansions.append((tokens + [int(t)], cum + lp[t]))
        expansions.sort(key=lambda e: (-e[1], e[0]))
        live = []
        for rank, (tokens, cum) in enumerate(expansions):
            if tokens[-1] == EOS and not ignore_eos:
                if rank < width:
                    done.append((tokens, cum, True))
            elif len(live) < width:
                live.append((tokens, cum))
        if len(done) >= width and live:
            worst = sorted(score(*d) for d in done)[-width]
            if max(score(t, c, False) for t, c in live) <= worst:
                live = []
        if not live:
            break
    final = done + [(t, c, False) for t, c in live]
    return sorted(final, key=lambda f: -score(*f))[:width]


@pytest.mark.parametrize("width, ignore_eos, length_penalty", [(1, True, 1.0), (3, True, 1.0), (4, False, 0.5)])
def test_beams_match_numpy(llm, width, ignore_eos, length_penalty):
    prompts = [[4, 5, 6], list(range(60, 100))]     # near-ties in the ranking >= 6e-3 apart (fp32 vs fp64)
    params = BeamSearchParams(beam_width=width, max_tokens=8, ignore_eos=ignore_eos, length_penalty=length_penalty)
    outs = llm.beam_search(prompts, params, use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        expected = numpy_beam_search(prompt, width, 8, ignore_eos, length_penalty)
        assert out.prompt_token_ids == prompt and len(out.sequences) == width
        assert [s.token_ids for s in out.sequences] == [e[0] for e in expected]
        for seq, (_, cum, stopped) in zip(out.sequences, expected):
            assert abs(seq.cumulative_logprob - cum) < 1e-3
            assert seq.finish_reason == ("stop" if stopped else "length")
        scores = [s.score for s in out.sequences]
        assert scores == sorted(scores, reverse=True)


def test_a_stop_token_ends_a_hypothesis(llm):
    prompt = [134, 165, 65, 157, 195, 98, 117, 255, 206, 251, 97, 175, 243, 166]   # EOS is 3rd likeliest next
    params = BeamSearchParams(beam_width=3, max_tokens=8, length_penalty=0.0)       # rank by log-probability
    out = llm.beam_search([prompt], params, use_tqdm=False)[0]
    expected = numpy_beam_search(prompt, 3, 8, length_penalty=0.0)
    assert [s.token_ids for s in out.sequences] == [e[0] for e in expected]
    first = out.sequences[0]
    assert first.token_ids == [EOS] and first.finish_reason == "stop" and first.text == ""
    assert [s.finish_reason for s in out.sequences[1:]] == ["length", "length"]
    ranked = llm.beam_search([prompt], BeamSearchParams(beam_width=3, max_tokens=8, length_penalty=1.0),
                             use_tqdm=False)[0]
    assert EOS not in [t for s in ranked.sequences for t in s.token_ids]   # -2.2 / 1 loses to ~-3.3 / 8


def test_width_one_is_greedy(llm):
    from ms_atb import SamplingParams
    prompt = list(range(5, 25))
    greedy = llm.generate([prompt], SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True),
                          use_tqdm=False)[0]
    beam = llm.beam_search([prompt], BeamSearchParams(beam_width=1, max_tokens=10, ignore_eos=True),
                           use_tqdm=False)[0]
    assert beam.sequences[0].token_ids == greedy.token_ids


def test_beams_under_a_tight_pool_and_without_the_prefix_cache(llm):
    prompts = [list(range(100, 140)), list(range(200, 230))]
    params = BeamSearchParams(beam_width=3, max_tokens=6, ignore_eos=True)
    roomy = llm.beam_search(prompts, params, use_tqdm=False)
    assert llm.stats()["prefix_cache_hits"] > 0             # later steps find the beams' whole blocks
    for settings in (dict(num_blocks=12), dict(enable_prefix_caching=False)):
        with scheduler_settings(llm, **settings) as other:
            outs = other.beam_search(prompts, params, use_tqdm=False)
        assert [[s.token_ids for s in o.sequences] for o in outs] == \
               [[s.token_ids for s in o.sequences] for o in roomy]


@pytest.mark.parametrize("kwargs, match", [
    (dict(beam_width=0), r"beam_width must be an int in \[1, 10\]"), (dict(beam_width=11), "beam_width"),
    (dict(beam_width=2, max_tokens=0), "max_tokens"), (dict(beam_width=2, length_penalty=float("nan")),
                                                        "length_penalty"),
])
def test_bad_params(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BeamSearchParams(**kwargs)


def test_bad_prompt_is_rejected_before_any_work(llm):
    steps = llm.scheduler.num_steps
    with pytest.raises(ValueError, match="request 1: .*max_model_len"):
        llm.beam_search([[1, 2], [3] * 510], BeamSearchParams(beam_width=2, max_tokens=8), use_tqdm=False)
    assert llm.scheduler.num_steps == steps
