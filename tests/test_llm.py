"""End-to-end generate() on the tiny random Llama: against an independent numpy model, with prefix
caching on and off, under preemption, seeded sampling, stop conditions and bad input."""
import os
import subprocess
import sys

import numpy as np
import pytest

from ms_atb import LLM, SamplingParams
from engine_helpers import EXACT, scheduler_settings, tiny_logits, with_buckets

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "tiny_llama.yaml")
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


@pytest.fixture
def llm(tiny_llm):
    return tiny_llm         # conftest.py: one tiny engine for the whole run, reset for each test


def numpy_greedy(prompt, n):
    tokens = list(prompt)
    for _ in range(n):
        tokens.append(int(np.argmax(tiny_logits(tokens)[-1])))
    return tokens[len(prompt):]


def numpy_greedy_penalised(prompt, n, repetition=1.0, presence=0.0, frequency=0.0):
    """Greedy on the numpy model with vLLM's penalties written out token by token."""
    tokens = list(prompt)
    for _ in range(n):
        logits = [float(x) for x in tiny_logits(tokens)[-1]]
        for t in set(tokens):
            logits[t] = logits[t] / repetition if logits[t] > 0 else logits[t] * repetition
        output = tokens[len(prompt):]
        for t in set(output):
            logits[t] -= presence + frequency * output.count(t)
        tokens.append(max(range(len(logits)), key=lambda i: (logits[i], -i)))
    return tokens[len(prompt):]


def prompts_with_shared_prefix(n, prefix_len=40, seed=0):
    rng = np.random.default_rng(seed)
    prefix = rng.integers(0, 500, prefix_len).tolist()
    return [prefix + rng.integers(0, 500, int(rng.integers(1, 30))).tolist() for _ in range(n)]


def tokens_of(outs):
    return [o.token_ids for o in outs]


def test_greedy_matches_numpy_reference(llm):
    prompts = [[1, 2, 3, 4, 5], list(range(100, 170)), [7]]     # the 70-token prompt is chunked
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.prompt_token_ids for o in outs] == prompts
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == numpy_greedy(prompt, 12)
        assert out.finish_reason == "length"


def test_prefix_caching_on_and_off_give_identical_tokens(llm):
    prompts = prompts_with_shared_prefix(6)
    llm.reset_scheduler(enable_prefix_caching=True)
    cached = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert llm.stats()["prefix_cache_hit_rate"] > 0.3
    assert all(o.num_cached_tokens == 32 for o in cached[1:])      # two whole 16-token blocks
    llm.reset_scheduler(enable_prefix_caching=False)
    plain = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert all(o.num_cached_tokens == 0 for o in plain)
    assert tokens_of(cached) == tokens_of(plain)
    llm.reset_scheduler(enable_prefix_caching=True)


def test_a_prefix_hit_gives_the_log_probabilities_of_recomputing_bit_for_bit(llm):
    """Three shared blocks, then 1 to 7 tokens of each prompt's own: with the hit only those few rows are computed
    (a lone last token beside the one before it), without it they sit at the end of a longer chunk. Every row comes
    out the same (the attention kernel's path is the sequence's, not the chunk's): not only the tokens, the
    log-probabilities to the last bit."""
    rng = np.random.default_rng(5)
    prefix = rng.integers(0, 500, 48).tolist()
    prompts = [prefix + rng.integers(0, 500, k).tolist() for k in range(1, 8)]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=3)
    runs = {}
    for caching in (True, False):
        llm.reset_scheduler(enable_prefix_caching=caching)
        runs[caching] = llm.generate(prompts, params, use_tqdm=False)
    assert [o.num_cached_tokens for o in runs[True][1:]] == [48] * 6
    assert tokens_of(runs[True]) == tokens_of(runs[False])
    assert [o.logprobs for o in runs[True]] == [o.logprobs for o in runs[False]]
    llm.reset_scheduler(enable_prefix_caching=True)


def test_tight_pool_preempts_and_gives_identical_tokens(llm):
    prompts = prompts_with_shared_prefix(8, seed=1)
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    llm.reset_scheduler(num_blocks=96)
    roomy = llm.generate(prompts, params, use_tqdm=False)
    assert llm.stats()["num_preemptions"] == 0
    llm.reset_scheduler(num_blocks=10)
    tight = llm.generate(prompts, params, use_tqdm=False)
    assert llm.stats()["num_preemptions"] > 0
    assert tokens_of(tight) == tokens_of(roomy)
    llm.reset_scheduler(num_blocks=96)


def _mixed_batch():
    """A shared-prefix batch, half greedy and half seeded sampling, with lengths that cross blocks."""
    prompts = prompts_with_shared_prefix(7, prefix_len=37, seed=3)
    params = [SamplingParams(max_tokens=8 + 5 * i, temperature=0.0 if i % 2 else 0.8, top_k=-1 if i % 3 else 20,
                             seed=100 + i, ignore_eos=True) for i in range(len(prompts))]
    return prompts, params


# (allocation, enable_chunked_prefill, enable_prefix_caching, max_num_seqs, max_num_batched_tokens, num_blocks)
LAYOUTS = [("scattered", True, True, 8, 64, 96), ("static", True, False, 8, 64, 96),
           ("contiguous", False, True, 3, 64, 9), ("scattered", True, True, 2, 16, 8),
           ("contiguous", True, False, 1, 24, 96)]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda t: "-".join(map(str, t)))
def test_every_scheduling_layout_gives_the_same_tokens(llm, layout):
    prompts, params = _mixed_batch()
    llm.reset_scheduler(num_blocks=96)
    reference = tokens_of(llm.generate(prompts, params, use_tqdm=False))
    allocation, chunked, caching, seqs, budget, blocks = layout
    llm.reset_scheduler(allocation=allocation, enable_chunked_prefill=chunked, enable_prefix_caching=caching,
                        max_num_seqs=seqs, max_num_batched_tokens=budget, num_blocks=blocks)
    try:
        assert tokens_of(llm.generate(prompts, params, use_tqdm=False)) == reference
        assert (llm.stats()["num_preemptions"] > 0) == (blocks < 20)     # the tight pools preempt
    finally:
        llm.reset_scheduler(allocation="contiguous", enable_chunked_prefill=True, enable_prefix_caching=True,
                            max_num_seqs=8, max_num_batched_tokens=64, num_blocks=96)


@pytest.mark.slow               # an engine of its own for each block size
@pytest.mark.parametrize("block_size", [1, 8, 32])
def test_other_block_sizes_give_the_same_tokens(llm, block_size):
    prompts, params = _mixed_batch()
    llm.reset_scheduler(num_blocks=96)
    reference = tokens_of(llm.generate(prompts, params, use_tqdm=False))
    other = with_buckets(LLM(TINY, max_num_batched_tokens=64, max_num_seqs=8, block_size=block_size,
                             num_blocks=max(8, 1536 // block_size), precompile=False, **EXACT), [64])  # one graph
    fresh = other.stats()          # docs/design.md's keys before any run too
    assert {"kv_cache_usage", "prefix_cache_hit_rate", "num_preemptions", "contiguity", "allocation_contiguity",
            "peak_running", "tokens_per_s"} <= set(fresh) and fresh["tokens_per_s"] == 0.0
    assert tokens_of(other.generate(prompts, params, use_tqdm=False)) == reference
    assert other.stats()["tokens_per_s"] > 0


def test_token_ids_as_tuples_and_numpy_arrays(llm):
    ids = [3, 14, 15, 92, 65, 35]
    expected = llm.generate([ids], GREEDY, use_tqdm=False)[0].token_ids
    for prompt in (tuple(ids), np.array(ids, dtype=np.int64), np.array(ids, dtype=np.int32)):
        out = llm.generate([prompt], GREEDY, use_tqdm=False)[0]
        assert out.token_ids == expected
        assert out.prompt_token_ids == ids and all(type(t) is int for t in out.prompt_token_ids)
    alone = llm.generate(np.array(ids), GREEDY, use_tqdm=False)       # one prompt, not a list of them
    assert len(alone) == 1 and alone[0].token_ids == expected
    rows = llm.generate(np.array([ids, ids[::-1]]), GREEDY, use_tqdm=False)       # a 2-D array: one per row
    assert [o.prompt_token_ids for o in rows] == [ids, ids[::-1]] and rows[0].token_ids == expected


def test_truncate_prompt_tokens_keeps_the_last_tokens(llm):
    long = [i * 7 % 500 + 1 for i in range(600)]          # over the tiny model's max_model_len (512)
    with pytest.raises(ValueError, match="request 0"):
        llm.generate([long], GREEDY, use_tqdm=False)
    cut = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, truncate_prompt_tokens=9)
    out = llm.generate([long, [5, 6]], cut, use_tqdm=False)
    assert out[0].prompt_token_ids == long[-9:] and out[0].token_ids == numpy_greedy(long[-9:], 12)
    assert out[1].prompt_token_ids == [5, 6]                # shorter prompts are left alone


def test_allowed_token_ids_and_logit_bias_match_the_numpy_reference(llm):
    prompt, allowed = [2, 7, 1, 8, 2, 8], [5, 50, 77, 300, 411]
    bias = {50: 0.5, 300: -0.25}
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, allowed_token_ids=allowed,
                            logit_bias=bias)
    out = llm.generate([prompt], params, use_tqdm=False)[0]
    tokens = list(prompt)
    for _ in range(8):
        logits = tiny_logits(tokens)[-1]
        tokens.append(max(allowed, key=lambda t: (logits[t] + bias.get(t, 0.0), -t)))
    assert out.token_ids == tokens[len(prompt):] and len(set(out.token_ids)) > 1


def test_penalties_match_the_numpy_reference(llm):
    prompts = [[7, 7, 7, 8], list(range(100, 130))]
    cases = [dict(repetition_penalty=1.8), dict(presence_penalty=1.5, frequency_penalty=0.7),
             dict(repetition_penalty=1.3, frequency_penalty=-0.5)]
    plain = llm.generate(prompts, GREEDY, use_tqdm=False)
    for kw in cases:
        params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, **kw)
        outs = llm.generate(prompts, [params, GREEDY], use_tqdm=False)      # a penalised and a plain request
        assert outs[0].token_ids == numpy_greedy_penalised(prompts[0], 12, kw.get("repetition_penalty", 1.0),
                                                            kw.get("presence_penalty", 0.0),
                                                            kw.get("frequency_penalty", 0.0))
        assert outs[0].token_ids != plain[0].token_ids and outs[1].token_ids == plain[1].token_ids


def test_logprobs_match_the_numpy_reference(llm):
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=3)
    out, plain = llm.generate([prompt, prompt], [params, GREEDY], use_tqdm=False)
    assert plain.logprobs is None and plain.cumulative_logprob is None
    assert len(out.logprobs) == len(out.token_ids) == 6 and out.token_ids == plain.token_ids[:6]
    tokens = list(prompt)
    for token, lp in zip(out.token_ids, out.logprobs):
        logits = tiny_logits(tokens)[-1].astype(np.float64)
        ref = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
        top = [int(i) for i in np.argsort(-ref, kind="stable")[:3]]
        assert token == top[0] and list(lp) == top                # greedy: the token is the top one, listed once
        np.testing.assert_allclose([lp[i] for i in top], ref[top], atol=2e-4)
        tokens.append(token)
    assert out.cumulative_logprob == pytest.approx(sum(lp[t] for lp, t in zip(out.logprobs, out.token_ids)))
    sampled = llm.generate([prompt], SamplingParams(max_tokens=20, temperature=1.5, seed=3, logprobs=0),
                           use_tqdm=False)[0]
    assert [list(lp) for lp in sampled.logprobs] == [[t] for t in sampled.token_ids]
    assert all(v <= 0.0 for lp in sampled.logprobs for v in lp.values())


def test_min_tokens_holds_back_stop_tokens(llm):
    prompt = [1, 2, 3, 4, 5]
    expected = numpy_greedy(prompt, 12)
    stop = expected[1]
    early = llm.generate([prompt], SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=[stop]),
                         use_tqdm=False)[0]
    assert early.token_ids == expected[:2] and early.finish_reason == "stop"
    late = llm.generate([prompt], SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=[stop], min_tokens=4),
                        use_tqdm=False)[0]
    # The numpy model, stop ids masked for 4 tokens.
    tokens, stops = list(prompt), {stop, llm.get_tokenizer().eos_token_id}
    while len(tokens) - len(prompt) < 12:
        logits = tiny_logits(tokens)[-1].astype(np.float64)
        if len(tokens) - len(prompt) < 4:
            logits[list(stops)] = -np.inf
        tokens.append(int(np.argmax(logits)))
        if tokens[-1] in stops:
            break
    assert late.token_ids == tokens[len(prompt):] and len(late.token_ids) > 4
    assert stop not in late.token_ids[:4]


def test_seeded_sampling_is_independent_of_the_batch(llm):
    p = SamplingParams(max_tokens=16, temperature=0.9, top_p=0.95, seed=1234)
    alone = llm.generate([[5, 6, 7]], p, use_tqdm=False)[0].token_ids
    others = [SamplingParams(max_tokens=9, temperature=1.0, seed=s) for s in range(3)]
    batch = llm.generate([[40, 41], [5, 6, 7], list(range(60)), [9]], [others[0], p, others[1], others[2]],
                         use_tqdm=False)
    assert batch[1].token_ids == alone
    again = llm.generate([[5, 6, 7]], p, use_tqdm=False)[0].token_ids
    assert again == alone
    different = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=16, temperature=0.9, top_p=0.95, seed=99),
                             use_tqdm=False)[0].token_ids
    assert different != alone


def test_stop_token_ids_end_the_request(llm):
    expected = llm.generate([[1, 2, 3, 4, 5]], GREEDY, use_tqdm=False)[0].token_ids
    stop = expected[3]
    first = expected.index(stop)
    out = llm.generate([[1, 2, 3, 4, 5]], SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=[stop]),
                       use_tqdm=False)[0]
    assert out.finish_reason == "stop"
    assert out.token_ids == expected[:first + 1]           # includes the token that ended it
    # ignore_eos: no stop token of any kind ends the request, stop_token_ids included (docs/design.md)
    ignored = llm.generate([[1, 2, 3, 4, 5]], SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=[stop],
                                                            ignore_eos=True), use_tqdm=False)[0]
    assert ignored.token_ids == expected and ignored.finish_reason == "length"


def test_ignore_eos_generates_exactly_max_tokens(llm):
    eos = llm.get_tokenizer().eos_token_id
    forced = dict(max_tokens=5, temperature=0.0, logit_bias={eos: 100.0})      # EOS wins every step
    stops = llm.generate([[1, 2, 3]], SamplingParams(**forced), use_tqdm=False)[0]
    assert stops.token_ids == [eos] and stops.finish_reason == "stop"
    runs = llm.generate([[1, 2, 3]], SamplingParams(**forced, ignore_eos=True), use_tqdm=False)[0]
    assert runs.token_ids == [eos] * 5 and runs.finish_reason == "length"
    # under ignore_eos a stop id is neither a stop nor held back by min_tokens: it is an ordinary token
    runs = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=6, temperature=0.0, logit_bias={7: 100.0},
                                                    stop_token_ids=[7], min_tokens=3, ignore_eos=True),
                        use_tqdm=False)[0]
    assert runs.token_ids == [7] * 6 and runs.finish_reason == "length"
    held = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=6, temperature=0.0, logit_bias={7: 100.0},
                                                    stop_token_ids=[7], min_tokens=3), use_tqdm=False)[0]
    assert 7 not in held.token_ids[:3] and held.token_ids[3] == 7 and held.finish_reason == "stop"


def test_tiny_temperatures_are_greedy(llm):
    expected = llm.generate([[1, 2, 3, 4, 5]], GREEDY, use_tqdm=False)[0].token_ids
    for t in (5e-324, 1e-46, 1e-30, 9e-6):       # 0 in float32, or an overflow of logits / t
        for extra in ({}, dict(top_k=5), dict(top_p=0.5, seed=3)):
            params = SamplingParams(max_tokens=12, temperature=t, ignore_eos=True, **extra)
            out = llm.generate([[1, 2, 3, 4, 5]], params, use_tqdm=False)[0]
            assert out.token_ids == expected, (t, extra)


def test_string_prompts_and_stop_strings(llm):
    out = llm.generate("hello", SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True), use_tqdm=False)
    assert len(out) == 1 and out[0].prompt == "hello"
    assert out[0].prompt_token_ids == llm.get_tokenizer().encode("hello")
    text = out[0].text
    assert text == llm.get_tokenizer().decode(out[0].token_ids)
    if len(text) >= 3:
        stop = text[1:3]
        cut = llm.generate("hello", SamplingParams(max_tokens=8, temperature=0.0, stop=[stop]), use_tqdm=False)[0]
        assert cut.text == text[:text.index(stop)] and cut.finish_reason == "stop"
        kept = llm.generate("hello", SamplingParams(max_tokens=8, temperature=0.0, stop=[stop],
                                                    include_stop_str_in_output=True), use_tqdm=False)[0]
        assert kept.text == text[:text.index(stop) + 2] and kept.stop_reason == stop


def test_stop_string_completed_by_the_final_flush(llm):
    # Greedy on [1..5] ends, after 10 tokens, with byte 237: the lead of an unfinished UTF-8 character that
    # only the end-of-request flush renders, as U+FFFD. A stop string ending there must still cut the text.
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    full = llm.generate([[1, 2, 3, 4, 5]], params, use_tqdm=False)[0]
    assert full.token_ids[-1] == 237 and full.text.endswith("4\ufffd") and full.text.count("\ufffd") == 1
    stop = "4\ufffd"
    cut = llm.generate([[1, 2, 3, 4, 5]], SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True,
                                                         stop=[stop]), use_tqdm=False)[0]
    assert cut.text == full.text[:full.text.index(stop)] and cut.finish_reason == "stop"
    assert cut.stop_reason == stop and cut.token_ids == full.token_ids


@pytest.mark.parametrize("prompt, params, match", [
    ([], None, r"request 1: the prompt is empty"),
    ("", None, r"request 1: the prompt is empty"),
    ([1] * 600, None, r"request 1: .*max_model_len"),
    ([1, 2, 512], None, r"request 1: token id 512 is outside the vocabulary \[0, 512\)"),
    ([1, -1], None, r"request 1: token id -1"),
    ([1, 2], SamplingParams(max_tokens=511), r"request 1: .*= 513 exceeds max_model_len 512"),
    ([1.5], None, r"request 1: a token-id prompt must be a list of ints"),
    (np.array([1.0, 2.0]), None, r"request 1: a token-id prompt must be a list of ints"),
    (np.array([[1, 2]]), None, r"request 1: a prompt must be a string or a list of token ids"),
    (b"abc", None, r"request 1: a prompt must be a string or a list of token ids .* got bytes"),
    ([1, 2], SamplingParams(logit_bias={600: 1.0}), r"request 1: token id 600 in the sampling parameters"),
    ([1, 2], SamplingParams(allowed_token_ids=[3, 512]), r"request 1: token id 512 in the sampling parameters"),
])
def test_bad_requests_are_rejected_before_any_work(llm, prompt, params, match):
    steps = llm.scheduler.num_steps
    with pytest.raises(ValueError, match=match):
        llm.generate([[1, 2, 3], prompt], [GREEDY, params or GREEDY], use_tqdm=False)
    assert llm.scheduler.num_steps == steps and not llm.scheduler.has_unfinished()
    assert llm.generate([[1, 2, 3]], GREEDY, use_tqdm=False)[0].token_ids == numpy_greedy([1, 2, 3], 12)


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_tokens=0), "max_tokens"), (dict(max_tokens=-3), "max_tokens"),
    (dict(temperature=-0.1), "temperature"), (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"),
    (dict(top_k=0), "top_k"), (dict(top_k=-2), "top_k"), (dict(top_k=1.5), "top_k"),
    (dict(logit_bias={"²": 1.0}), "logit_bias"),
])
def test_bad_sampling_params(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("field, value, match", [
    ("max_tokens", 0, "max_tokens"), ("top_k", -5, "top_k"), ("temperature", -1.0, "temperature"),
    ("top_p", 0.0, "top_p"), ("stop", [""], "stop"),
])
def test_sampling_params_changed_after_construction_are_checked(llm, field, value, match):
    params = SamplingParams(max_tokens=4, temperature=0.0)
    setattr(params, field, value)
    steps = llm.scheduler.num_steps
    with pytest.raises(ValueError, match=f"request 1: {match}"):
        llm.generate([[1, 2, 3], [4, 5]], [GREEDY, params], use_tqdm=False)
    assert llm.scheduler.num_steps == steps and not llm.scheduler.has_unfinished()
    assert llm.generate([[1, 2, 3]], GREEDY, use_tqdm=False)[0].token_ids == numpy_greedy([1, 2, 3], 12)


def test_sampling_params_list_must_match(llm):
    with pytest.raises(ValueError, match="one per prompt"):
        llm.generate([[1], [2]], [GREEDY], use_tqdm=False)


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_blocsk=3), "unknown keyword 'num_blocsk'"),
    (dict(block_size="16"), r"kv_cache\.block_size must be an integer"),
    (dict(path="/no/such/model.gguf"), "not found"),
])
def test_bad_engine_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LLM(TINY, **kwargs)


@pytest.mark.slow
def test_a_device_this_mindspore_cannot_use_is_a_value_error():
    # its own process: a MindSpore that can switch to Ascend would stay switched
    code = ("import sys\nfrom ms_atb import LLM\ntry:\n    LLM(sys.argv[1], device='npu')\n"
            "except ValueError as e:\n    print('ValueError:', e)\nelse:\n    print('built')\n")
    run = subprocess.run([sys.executable, "-c", code, TINY], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    if run.stdout.strip().endswith("built"):
        pytest.skip("this MindSpore runs on Ascend")
    assert "ValueError: context.device 'npu': this MindSpore" in run.stdout and "'cpu' works" in run.stdout


def test_stop_strings_wait_for_min_tokens(llm):
    prompt = [1, 2, 3, 4, 5]
    tokens = llm.generate([prompt], GREEDY, use_tqdm=False)[0].token_ids
    pieces = [llm.get_tokenizer().decode([t]) for t in tokens]
    # a printable character that token k spells and no earlier token does
    k = next(i for i in range(2, 8) if len(pieces[i]) == 1 and pieces[i].isprintable()
             and pieces[i] not in "".join(pieces[:i]))
    stop = dict(max_tokens=12, temperature=0.0, ignore_eos=True, stop=[pieces[k]])
    early = llm.generate([prompt], SamplingParams(**stop), use_tqdm=False)[0]
    assert early.token_ids == tokens[:k + 1] and early.finish_reason == "stop"
    late = llm.generate([prompt], SamplingParams(**stop, min_tokens=k + 3), use_tqdm=False)[0]
    assert len(late.token_ids) >= k + 3 and late.token_ids == tokens[:len(late.token_ids)]


def test_a_run_cannot_start_inside_an_open_generate_iter(llm):
    requests = [llm.make_request([1, 2, 3], GREEDY, i) for i in range(3)]
    outputs = {}
    for index, out in llm.generate_iter(requests, use_tqdm=False):
        outputs[index] = out.token_ids
        with pytest.raises(ValueError, match="already running a generate_iter"):
            llm.generate([[4, 5]], GREEDY, use_tqdm=False)
    assert outputs == {i: numpy_greedy([1, 2, 3], 12) for i in range(3)}
    assert llm.generate([[1, 2, 3]], GREEDY, use_tqdm=False)[0].token_ids == numpy_greedy([1, 2, 3], 12)


def test_stats_scopes_last_run_and_since_the_cache_was_emptied(llm):
    four, three = (SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (4, 3))
    llm.reset_scheduler(enable_prefix_caching=True)
    llm.generate([[1, 2, 3], [7, 8, 9, 10]], four, use_tqdm=False)
    first = llm.stats()
    llm.generate([[1, 2, 3]], three, use_tqdm=False)
    second = llm.stats()
    assert (first["num_output_tokens"], second["num_output_tokens"]) == (8, 3)         # the last run
    assert (first["prefix_cache_queries"], second["prefix_cache_queries"]) == (7, 10)  # added up
    llm.reset_scheduler()
    assert llm.stats()["prefix_cache_queries"] == 0 and llm.stats()["num_output_tokens"] == 3


def test_a_kv_cache_larger_than_memory_is_refused_before_the_build():
    if not os.path.exists("/proc/meminfo"):
        pytest.skip("no /proc/meminfo here")
    with pytest.raises(ValueError, match=r"the KV cache \(100000000 blocks, [\d.]+ GiB\) does not fit in the "
                                         r"[\d.]+ GiB of memory available; lower kv_cache.num_blocks"):
        LLM(TINY, num_blocks=100_000_000)


def test_generate_iter_takes_requests_not_prompts(llm):
    for bad in (["hi"], [[1, 2]], "hi"):
        with pytest.raises(ValueError, match="generate_iter"):
            list(llm.generate_iter(bad, use_tqdm=False))
    assert llm.generate([[1, 2, 3]], GREEDY, use_tqdm=False)[0].token_ids == numpy_greedy([1, 2, 3], 12)


def test_padded_vocabulary_and_the_models_eos_when_the_tokenizer_has_none(tmp_path):
    # A common hub layout: embedding rows past the tokenizer's vocabulary, and the EOS id only in config.json.
    import dataclasses
    import json
    from safetensors.numpy import save_file
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from ms_atb.formats.loader import load_config
    from ms_atb.models.weights import iter_weights
    config = load_config("random:tiny-llama?seed=0")               # vocab 512
    fields = {k: v for k, v in dataclasses.asdict(config).items() if k != "extra"}
    (tmp_path / "config.json").write_text(json.dumps(dict(fields, model_type="llama", eos_token_id=2)))
    save_file(dict(iter_weights("random:tiny-llama?seed=0", config)), str(tmp_path / "model.safetensors"))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tok.train_from_iterator(["hello world, the quick brown fox"] * 20, trainers.BpeTrainer(
        vocab_size=300, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(tmp_path / "tokenizer.json"))                      # ~270 tokens, no EOS named
    llm = LLM(str(tmp_path), num_blocks=32, max_model_len=128, max_num_batched_tokens=1, max_num_seqs=1)  # 1 graph
    assert llm.tokenizer.eos_token_id is None and llm.stop_token_ids == {2}
    out = llm.generate(["hello"], SamplingParams(max_tokens=4, temperature=0.0, logit_bias={2: 100.0}),
                       use_tqdm=False)[0]
    assert out.token_ids == [2] and out.finish_reason == "stop"
    padded = llm.generate(["hello"], SamplingParams(max_tokens=3, temperature=0.0, logit_bias={450: 100.0}),
                          use_tqdm=False)[0]
    assert padded.token_ids == [450] * 3 and padded.text == "" and padded.finish_reason == "length"


def test_failure_mid_batch_keeps_finished_results_and_engine_usable(llm, monkeypatch):
    prompts = prompts_with_shared_prefix(5, seed=2)
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (2, 30, 30, 30, 30)]
    expected = llm.generate(prompts, params, use_tqdm=False)
    llm.reset_scheduler()
    real = llm.runner.execute
    calls = {"n": 0}

    def flaky(step):
        calls["n"] += 1
        if calls["n"] == 6:
            raise RuntimeError("device lost")
        return real(step)

    monkeypatch.setattr(llm.runner, "execute", flaky)
    with pytest.raises(RuntimeError, match="device lost") as info:
        llm.generate(prompts, params, use_tqdm=False)
    assert [o.token_ids for o in info.value.partial_outputs] == [expected[0].token_ids]
    monkeypatch.setattr(llm.runner, "execute", real)
    assert not llm.scheduler.has_unfinished()
    assert tokens_of(llm.generate(prompts, params, use_tqdm=False)) == tokens_of(expected)


def test_failure_right_after_schedule_leaves_no_uncomputed_blocks_in_the_cache(llm):
    # schedule() commits the step's blocks; a failure before the model writes their KV must drop them
    prompt = list(range(7, 107))
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    llm.reset_scheduler()
    expected = llm.generate([prompt], params, use_tqdm=False)[0].token_ids
    llm.reset_scheduler()
    schedule = llm.scheduler.schedule

    def schedule_then_fail():
        schedule()
        raise MemoryError("out of memory after scheduling")

    llm.scheduler.schedule = schedule_then_fail
    with pytest.raises(MemoryError):
        llm.generate([prompt], params, use_tqdm=False)
    again = llm.generate([prompt], params, use_tqdm=False)[0]
    assert again.num_cached_tokens == 0 and again.token_ids == expected


def test_chat_and_stats(llm):
    outs = llm.chat([[{"role": "user", "content": "hi"}], [{"role": "user", "content": "yo"}]],
                    SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True), use_tqdm=False)
    assert len(outs) == 2 and all(len(o.token_ids) == 4 for o in outs)
    with pytest.raises(ValueError, match="conversation 0"):
        llm.chat([{"role": "user"}])
    stats = llm.stats()
    for key in ("kv_cache_usage", "prefix_cache_hit_rate", "num_preemptions", "contiguity",
                "allocation_contiguity", "peak_running", "tokens_per_s"):
        assert key in stats
    assert 0 < stats["kv_cache_usage"] <= 1 and stats["tokens_per_s"] > 0


def test_requests_made_before_a_smaller_pool_are_rejected_cleanly(llm):
    greedy = SamplingParams(max_tokens=5, temperature=0.0)
    requests = [llm.make_request([1, 2, 3], greedy, 0), llm.make_request(list(range(1, 200)), greedy, 1)]
    with scheduler_settings(llm, num_blocks=8):
        with pytest.raises(ValueError, match="request 1: the request needs 13 KV blocks but the pool has only 8"):
            list(llm.generate_iter(requests, use_tqdm=False))
        assert not llm.scheduler.has_unfinished()
        assert llm.generate([[1, 2, 3]], greedy, use_tqdm=False)[0].token_ids == numpy_greedy([1, 2, 3], 5)


def test_reset_scheduler_limits(llm):
    with pytest.raises(ValueError, match="num_blocks must be an integer in"):
        llm.reset_scheduler(num_blocks=10_000)
    with pytest.raises(ValueError, match="reset_scheduler"):
        llm.reset_scheduler(block_size=32)


def test_reset_scheduler_rejection_changes_nothing(llm):
    blocks, kv, scheduler = llm.num_blocks, llm.config.kv_cache, llm.scheduler
    before = (kv.allocation, kv.enable_prefix_caching)
    with pytest.raises(ValueError, match="allocation"):
        llm.reset_scheduler(num_blocks=8, enable_prefix_caching=not kv.enable_prefix_caching, allocation="bogus")
    with pytest.raises(ValueError, match="reset_scheduler"):
        llm.reset_scheduler(num_blocks=8, max_model_len=1)
    assert llm.num_blocks == blocks and (kv.allocation, kv.enable_prefix_caching) == before
    assert llm.scheduler is scheduler and llm.scheduler.block_manager.num_blocks == blocks
    llm.reset_scheduler(enable_prefix_caching=kv.enable_prefix_caching)     # the config it keeps is still valid
    assert llm.generate([[1, 2, 3]], GREEDY, use_tqdm=False)[0].token_ids == numpy_greedy([1, 2, 3], 12)
