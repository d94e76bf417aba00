import numpy as np
import pytest

from ms_atb.worker.sampler import Sampler, apply_penalties, token_logprobs
from ms_atb.sampling_params import SamplingParams


# ---- SamplingParams ---------------------------------------------------------------------------

def test_defaults_and_normalisation():
    p = SamplingParams()
    assert (p.max_tokens, p.temperature, p.top_k, p.top_p, p.seed, p.stop, p.stop_token_ids, p.ignore_eos) == \
        (16, 1.0, -1, 1.0, None, None, None, False)
    q = SamplingParams(temperature=0, top_p=1, stop="###", stop_token_ids=(3, 4))
    assert q.greedy and isinstance(q.temperature, float) and q.stop == ["###"] and q.stop_token_ids == [3, 4]


@pytest.mark.parametrize("field,value", [
    ("max_tokens", 0), ("max_tokens", -3), ("max_tokens", 2.0), ("max_tokens", True), ("max_tokens", "8"),
    ("temperature", -0.1), ("temperature", float("nan")), ("temperature", float("inf")), ("temperature", "1"),
    ("top_k", 0), ("top_k", -2), ("top_k", 1.5),
    ("top_p", 0.0), ("top_p", 1.01), ("top_p", -0.5), ("top_p", float("nan")),
    ("min_p", -0.1), ("min_p", 1.5), ("min_p", float("nan")), ("min_p", "0.1"),
    ("seed", 1.5), ("seed", "7"), ("seed", -1),
    ("stop", ""), ("stop", ["ok", ""]), ("stop", [1]), ("stop", 5), ("stop", "\ud800"),
    ("guided_choice", ["yes", "\ud800"]), ("bad_words", ["x\udfff"]),
    ("stop_token_ids", [-1]), ("stop_token_ids", [1.0]), ("stop_token_ids", 3),
    ("ignore_eos", 1), ("ignore_eos", "yes"), ("skip_special_tokens", 0), ("include_stop_str_in_output", "yes"),
    ("n", 0), ("truncate_prompt_tokens", 0), ("prompt_logprobs", 21),
    ("repetition_penalty", 0), ("repetition_penalty", -1.0), ("repetition_penalty", float("inf")),
    ("repetition_penalty", float("nan")), ("repetition_penalty", "2"),
    ("min_tokens", -1), ("min_tokens", 17), ("min_tokens", 1.0),
    ("logprobs", -1), ("logprobs", 21), ("logprobs", 1.0), ("logprobs", True),
    ("presence_penalty", 2.5), ("presence_penalty", float("nan")), ("frequency_penalty", -3), ("frequency_penalty", None),
])
def test_bad_value_names_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_from_dict():
    p = SamplingParams.from_dict({"max_tokens": 5, "top_k": 3, "stop": ["x"]})
    assert (p.max_tokens, p.top_k, p.stop) == (5, 3, ["x"])
    with pytest.raises(ValueError, match="max_token"):
        SamplingParams.from_dict({"max_token": 5})
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams.from_dict({"top_p": 0})


# ---- Sampler ----------------------------------------------------------------------------------

def _reference(logits_row, p, u):
    """Plain full-sort reference with the same single uniform draw u."""
    z = logits_row.astype(np.float64) / p.temperature
    order = np.argsort(-z, kind="stable")
    if p.top_k == -1 and p.top_p == 1.0:
        order = np.arange(len(z))                        # unfiltered: drawn in id order
    if p.top_k != -1:
        order = order[:p.top_k]
    if p.min_p > 0.0:                                    # min-p: p / p_max >= min_p, before top-p
        order = order[np.exp(z[order] - z.max()).astype(np.float32) >= np.float32(p.min_p)]
    probs = np.exp(z[order] - z.max())
    probs /= probs.sum()
    if p.top_p < 1.0:
        keep = 1
        while keep < len(probs) and probs[:keep].sum() < p.top_p:
            keep += 1
        order, probs = order[:keep], probs[:keep]
    cdf = np.cumsum(probs)
    return int(order[min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), len(order) - 1)])


def _gens(seeds):
    return [np.random.default_rng(s) for s in seeds]


def test_greedy_argmax_ties_lowest_id():
    logits = np.array([[0.0, 3.0, 3.0, 1.0], [5.0, 5.0, 5.0, 5.0], [-1.0, -2.0, -0.5, -0.5]], np.float32)
    out = Sampler().sample(logits, [SamplingParams(temperature=0)] * 3, [None] * 3)
    assert out == [1, 0, 2]


def test_top_k1_and_tiny_top_p_equal_greedy():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((16, 1000)).astype(np.float32)
    logits[3, [7, 11]] = logits[3].max() + 1.0           # a tie at the top
    greedy = Sampler().sample(logits, [SamplingParams(temperature=0)] * 16, [None] * 16)
    assert greedy[3] == 7
    for p in (SamplingParams(temperature=1.5, top_k=1), SamplingParams(temperature=2.0, top_p=1e-9)):
        assert Sampler().sample(logits, [p] * 16, _gens(range(16))) == greedy


def test_extreme_temperatures_keep_masks_and_greedy():
    logits = np.random.default_rng(2).standard_normal((4, 50)).astype(np.float32)
    greedy = Sampler().sample(logits, [SamplingParams(temperature=0)] * 4, [None] * 4)
    tiny = [SamplingParams(temperature=t, top_k=k) for t, k in ((5e-324, -1), (1e-46, 5), (1e-20, -1), (9e-6, 3))]
    assert Sampler().sample(logits, tiny, _gens(range(4))) == greedy     # under 1e-5: greedy, no 0 divisor
    for t in (1e39, 1e300):             # beyond float32: flat, but masked tokens stay out
        for seed in range(20):
            params = [SamplingParams(temperature=t, allowed_token_ids=[3, 4]),
                      SamplingParams(temperature=t, top_k=2), SamplingParams(temperature=t, top_p=0.05),
                      SamplingParams(temperature=t, logit_bias={i: -100.0 for i in range(1, 50)})]
            out = Sampler().sample(logits, params, _gens(range(seed, seed + 4)))
            top2 = set(np.argsort(-logits[1], kind="stable")[:2].tolist())
            assert out[0] in (3, 4) and out[1] in top2 and 0 <= out[2] < 50, (t, seed, out)


def test_matches_reference_exactly():
    rng = np.random.default_rng(1)
    v = 3000
    cases = [SamplingParams(temperature=t, top_k=k, top_p=tp, min_p=mp)
             for t in (0.3, 1.0, 2.5) for k in (-1, 1, 5, 400) for tp in (0.05, 0.5, 0.9, 0.999, 1.0)
             for mp in (0.0, 0.05, 0.6)]
    logits = rng.standard_normal((len(cases), v)).astype(np.float32)
    logits[::4] = np.round(logits[::4])                  # many ties, also at top-k boundaries
    logits[1::7] *= 0.01                                 # flat rows: nuclei bigger than the probe
    seeds = list(range(100, 100 + len(cases)))
    out = Sampler().sample(logits, cases, _gens(seeds))
    us = [np.random.default_rng(s).random() for s in seeds]
    assert out == [_reference(logits[i], cases[i], us[i]) for i in range(len(cases))]


def test_seed_reproducible_across_batch_compositions():
    rng = np.random.default_rng(2)
    v = 500
    target = rng.standard_normal(v).astype(np.float32)
    p = SamplingParams(temperature=0.9, top_p=0.95, seed=42)

    def run(others):
        # Each step: the target request's generator persists across steps, as in the engine.
        gen = np.random.default_rng(p.seed)
        toks = []
        for step in range(20):
            noise = rng.standard_normal((others, v)).astype(np.float32)
            pos = step % (others + 1)
            batch = np.insert(noise, pos, target + 0.01 * step, axis=0)
            params = [SamplingParams(temperature=1.0, top_k=(3 if j % 2 else -1)) for j in range(others)]
            params.insert(pos, p)
            gens = [np.random.default_rng(1000 + j) for j in range(others)]
            gens.insert(pos, gen)
            toks.append(Sampler().sample(batch, params, gens)[pos])
        return toks

    alone = run(0)
    assert run(3) == alone and run(8) == alone
    assert len(set(alone)) > 1                           # it really samples


def _chi_square(counts, probs):
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("params,support", [
    (SamplingParams(temperature=0.7), 6),
    (SamplingParams(temperature=1.3, top_k=3), 3),
    (SamplingParams(temperature=1.0, top_p=0.8), None),
    (SamplingParams(temperature=1.0, min_p=0.3), 2),                      # p / p_max: 1, 0.37, 0.22, ...
    (SamplingParams(temperature=2.0, min_p=0.3, top_k=3), 3),             # at T=2: 1, 0.61, 0.47, 0.37, ...
])
def test_distribution(params, support):
    logits_row = np.array([2.0, 1.0, 0.5, 0.0, -0.5, -1.0], np.float32)
    z = logits_row.astype(np.float64) / params.temperature
    probs = np.exp(z - z.max())
    probs /= probs.sum()
    probs[probs < params.min_p * probs.max()] = 0.0
    probs /= probs.sum()
    if params.top_k != -1:
        probs[params.top_k:] = 0.0
        probs /= probs.sum()
    if params.top_p < 1.0:
        keep = np.count_nonzero(np.cumsum(probs) - probs < params.top_p)
        probs[keep:] = 0.0
        probs /= probs.sum()
        support = keep
    n = 6000
    logits = np.tile(logits_row, (n, 1))
    gens = [np.random.default_rng(s) for s in np.random.SeedSequence(7).spawn(n)]
    out = np.array(Sampler().sample(logits, [params] * n, gens))
    counts = np.bincount(out, minlength=6).astype(np.float64)
    assert np.all(counts[support:] == 0)
    # chi-square with support-1 dof; 99.9th percentile for <= 5 dof is < 21
    assert _chi_square(counts[:support], probs[:support]) < 21.0


# ---- penalties ----------------------------------------------------------------------------------

def test_penalties_exact_values():
    logits = np.array([[2.0, -1.0, 0.5, 3.0, -2.0, 1.0]] * 2, dtype=np.float32)     # [2, V=6]
    before = logits.copy()
    pen = SamplingParams(repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25)
    out = apply_penalties(logits, [pen, SamplingParams()], [([0, 1, 3, 3, 5], 2), ([0, 1, 3, 3, 5], 2)])
    # repetition on the tokens seen {0, 1, 3, 5}; then presence + frequency on the output 3, 3, 5
    np.testing.assert_allclose(out[0], [1.0, -2.0, 0.5, 1.5 - 0.5 - 2 * 0.25, -2.0, 0.5 - 0.5 - 0.25])
    np.testing.assert_array_equal(out[1], before[1])
    np.testing.assert_array_equal(logits, before)                        # the caller's logits are untouched
    assert apply_penalties(logits, [SamplingParams()] * 2, None) is logits


def test_penalties_steer_greedy_and_need_histories():
    logits = np.array([[0.0, 5.0, 4.0, -1.0]], dtype=np.float32)
    s = Sampler()
    greedy = SamplingParams(temperature=0.0)
    assert s.sample(logits, [greedy], [None], [([1, 1], 1)]) == [1]
    assert s.sample(logits, [SamplingParams(temperature=0.0, repetition_penalty=1.5)], [None], [([1], 1)]) == [2]
    assert s.sample(logits, [SamplingParams(temperature=0.0, frequency_penalty=0.6)], [None], [([0, 1, 1], 1)]) == [2]
    assert s.sample(logits, [SamplingParams(temperature=0.0, presence_penalty=-2.0)], [None], [([0, 2], 1)]) == [2]
    with pytest.raises(ValueError, match="need each request's tokens"):
        s.sample(logits, [SamplingParams(temperature=0.0, repetition_penalty=1.5)], [None])


def test_penalised_sampling_keeps_one_draw_per_request():
    logits = np.random.default_rng(0).normal(size=(3, 50)).astype(np.float32)
    params = [SamplingParams(temperature=0.8, seed=1)] * 3
    pen = SamplingParams(temperature=0.8, seed=1, repetition_penalty=1.3)
    hist = [([1, 2, 3], 3)] * 3
    plain = Sampler().sample(logits, params, [np.random.default_rng(1) for _ in range(3)], hist)
    mixed = Sampler().sample(logits, [params[0], pen, params[2]], [np.random.default_rng(1) for _ in range(3)], hist)
    assert mixed[0] == plain[0] and mixed[2] == plain[2]                 # a neighbour's penalty changes nothing


def test_token_logprobs():
    logits = np.array([1.0, 3.0, 3.0, -2.0, 0.5], dtype=np.float32)
    ref = logits.astype(np.float64) - np.log(np.exp(logits.astype(np.float64)).sum())
    got = token_logprobs(logits, 4, 2)
    assert list(got) == [4, 1, 2]                                          # the token, then the top 2 (ties: lowest id)
    np.testing.assert_allclose([got[i] for i in (4, 1, 2)], ref[[4, 1, 2]], rtol=1e-6)
    assert token_logprobs(logits, 1, 0) == pytest.approx({1: ref[1]}, rel=1e-6)
    assert token_logprobs(logits, 2, 1) == pytest.approx({2: ref[2], 1: ref[1]}, rel=1e-6)
    assert list(token_logprobs(logits, 2, 1)) == [2, 1]
    big = np.array([1000.0, 0.0], dtype=np.float32)                       # no overflow
    assert token_logprobs(big, 1, 1) == {1: -1000.0, 0: 0.0}


def test_banned_tokens_are_never_chosen():
    logits = np.array([[0.0, 9.0, 8.0, 1.0]] * 2, dtype=np.float32)
    s = Sampler()
    greedy = SamplingParams(temperature=0.0)
    before = logits.copy()
    assert s.sample(logits, [greedy, greedy], [None, None], banned=[{1}, None]) == [2, 1]
    np.testing.assert_array_equal(logits, before)                        # the caller's logits are untouched
    hot = SamplingParams(temperature=5.0)
    draws = s.sample(np.repeat(logits[:1], 200, axis=0), [hot] * 200, [np.random.default_rng(i) for i in range(200)],
                     banned=[{1, 2}] * 200)
    assert set(draws) == {0, 3}


def test_logit_bias_and_allowed_token_ids_validate():
    p = SamplingParams(logit_bias={"7": 2, 3: -1.5}, allowed_token_ids=(9, 2, 9))
    assert p.logit_bias == {7: 2.0, 3: -1.5} and p.allowed_token_ids == [2, 9]      # JSON keys, duplicates
    assert sorted(p.token_ids_used) == [2, 3, 7, 9]
    for bad in ({"x": 1}, {-1: 1}, {1: 101}, {1: float("nan")}, [1, 2], {1.0: 1}):
        with pytest.raises(ValueError, match="logit_bias must map token ids"):
            SamplingParams(logit_bias=bad)
    for bad in ([], [-1], [1.5], 3):
        with pytest.raises(ValueError, match="allowed_token_ids must be a non-empty list"):
            SamplingParams(allowed_token_ids=bad)


def test_logit_bias_and_allowed_token_ids_steer_the_choice():
    logits = np.array([[0.0, 9.0, 8.0, 1.0, 7.0]] * 4, dtype=np.float32)
    before = logits.copy()
    g = dict(temperature=0.0)
    params = [SamplingParams(**g, logit_bias={3: 8.5}), SamplingParams(**g, logit_bias={1: -100}),
              SamplingParams(**g, allowed_token_ids=[0, 3, 4]), SamplingParams(**g, allowed_token_ids=[0, 3], logit_bias={0: 2})]
    assert Sampler().sample(logits, params, [None] * 4) == [3, 2, 4, 0]
    np.testing.assert_array_equal(logits, before)                        # the caller's logits are untouched
    # Sampled: only allowed tokens, in the proportions of the biased softmax over them.
    hot = SamplingParams(temperature=1.0, allowed_token_ids=[0, 3, 4], logit_bias={0: 6.0})
    n = 4000
    draws = Sampler().sample(np.repeat(logits[:1], n, axis=0), [hot] * n, _gens(range(n)))
    z = np.array([6.0, 1.0, 7.0])
    expected = np.exp(z - z.max()) / np.exp(z - z.max()).sum() * n
    counts = np.array([draws.count(t) for t in (0, 3, 4)])
    assert counts.sum() == n and ((counts - expected) ** 2 / expected).sum() < 13.8      # chi-square, 2 dof, p = 0.001


def test_a_ban_that_leaves_no_token_is_skipped():
    logits = np.array([[0.0, 9.0, 8.0]], dtype=np.float32)
    only_stop = SamplingParams(temperature=0.7, allowed_token_ids=[2])
    assert Sampler().sample(logits, [only_stop], _gens([0]), banned=[{2}]) == [2]
    both = SamplingParams(temperature=0.0, allowed_token_ids=[0, 2])
    assert Sampler().sample(logits, [both], [None], banned=[{2}]) == [0]


def test_infinite_logits_are_the_only_candidates_and_nan_is_an_error():
    # repetition_penalty=1e-39 divides the positive logits of seen tokens 1 and 2 past float32: both become +inf
    row = np.array([[0.5, 2.0, 1.0, -1.0]] * 400, np.float32)
    history = ([1, 2], 2)
    for kw in (dict(), dict(top_k=3), dict(top_p=0.9), dict(min_p=0.5)):
        params = [SamplingParams(temperature=1.0, repetition_penalty=1e-39, **kw)] * len(row)
        drawn = Sampler().sample(row, params, [np.random.default_rng(i) for i in range(len(row))],
                                 [history] * len(row))
        assert set(drawn) == {1, 2}, (kw, sorted(set(drawn)))
    one_inf = np.array([[0.0, 1.0, np.inf, 0.5]], np.float32)
    assert Sampler().sample(one_inf, [SamplingParams(temperature=1.0, top_k=2)], [np.random.default_rng(0)]) == [2]
    nan = np.array([[0.0, 1.0, np.nan, 0.5]], np.float32)
    for p in (SamplingParams(temperature=0.0), SamplingParams(temperature=1.0), SamplingParams(top_p=0.9)):
        with pytest.raises(RuntimeError, match="batch row 0 hold NaN"):
            Sampler().sample(nan, [p], [np.random.default_rng(0)])


# ---- one declaration of the sampling fields ----------------------------------------------------

SURFACE_FIELDS = {
    "config": {"max_tokens", "temperature", "top_k", "top_p", "min_p", "ignore_eos", "repetition_penalty",
               "presence_penalty", "frequency_penalty", "min_tokens", "n", "truncate_prompt_tokens"},
    "cli": {"max_tokens", "temperature", "top_k", "top_p", "min_p", "seed", "repetition_penalty", "presence_penalty",
            "frequency_penalty", "min_tokens", "n", "truncate_prompt_tokens", "guided_choice", "bad_words",
            "ignore_eos", "guided_json", "guided_regex", "guided_grammar"},
    "openai": {"max_tokens", "temperature", "top_p", "n", "stop", "seed", "presence_penalty", "frequency_penalty",
               "logit_bias", "top_k", "min_p", "repetition_penalty", "min_tokens", "ignore_eos", "stop_token_ids",
               "skip_special_tokens", "include_stop_str_in_output", "truncate_prompt_tokens", "allowed_token_ids",
               "bad_words", "guided_choice", "structured_outputs", "guided_json", "guided_regex", "guided_grammar"},
}


@pytest.mark.parametrize("surface", sorted(SURFACE_FIELDS))
def test_sampling_fields_of_each_surface(surface):
    from ms_atb.sampling_params import sampling_fields
    fields = sampling_fields(surface)
    assert {f.name for f in fields} == SURFACE_FIELDS[surface]
    assert len(fields) == len(SURFACE_FIELDS[surface])


def test_every_sampling_field_is_documented_and_unknown_surfaces_are_errors():
    import dataclasses
    from ms_atb.sampling_params import sampling_fields
    for f in dataclasses.fields(SamplingParams):
        assert f.metadata["doc"].strip(), f.name
        assert set(f.metadata["surfaces"]) <= set(SURFACE_FIELDS), f.name
    with pytest.raises(ValueError, match=r"surface must be one of \['config', 'cli', 'openai'\], got 'yaml'"):
        sampling_fields("yaml")


def test_the_config_section_is_derived_from_sampling_params():
    """sampling.* leaves: the fields marked config, with SamplingParams' types, and its defaults but for the
    two the config sets (max_tokens 64, temperature 0.0)."""
    import dataclasses
    from ms_atb.config import EngineConfig, SamplingSection
    leaves = {f.name: f for f in dataclasses.fields(SamplingSection)}
    assert set(leaves) == SURFACE_FIELDS["config"]
    defaults = {f.name: f.default for f in dataclasses.fields(SamplingParams)}
    assert {k: f.default for k, f in leaves.items()} == {**{k: defaults[k] for k in leaves}, "max_tokens": 64,
                                                         "temperature": 0.0}
    assert leaves["max_tokens"].type == "Union[int, None]" and leaves["top_k"].type == "int"
    cfg = EngineConfig.load({"model": {"path": "random:tiny-llama"}, "sampling": {"min_p": 0.1, "n": 2}})
    assert (cfg.sampling.min_p, cfg.sampling.n, cfg.sampling.max_tokens) == (0.1, 2, 64)
