"""Structured outputs (JSON Schema, JSON object, regex, Lark and GBNF grammars, choice) through llguidance on the
tiny random Llama: every output that stops parses and validates (jsonschema is the oracle), greedy decoding is the
numpy model's argmax among the tokens the grammar allows, and the grammar state follows its request through
preemption, prefix-cache hits, n > 1 and logprobs. Also: bad constraints are ValueErrors naming the request, a slow
compile holds back only its own request, and only constrained rows get masks."""
import json
import re
import threading

import jsonschema
import numpy as np
import pytest

from ms_atb import SamplingParams, StructuredOutputsParams
from ms_atb.engine.structured_outputs import StructuredOutputManager
from engine_helpers import scheduler_settings, tiny_logits
from guide_helpers import GuideWalk

EOS = 511                  # the tiny model's byte tokenizer: ids 0-255 are bytes, 256-510 special, 511 EOS
PROMPTS = [[1, 2, 3], list(range(40, 90)), [200, 7], [9] * 20]

# Every field bounded (strings by maxLength, integers by a range, arrays by maxItems, whitespace by the grammar):
# any output of it ends within a bounded number of tokens.
BOUNDED = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "colour": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "minItems": 1, "maxItems": 2},
        "where": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9},
                                                   "y": {"type": "boolean"}},
                  "required": ["x"], "additionalProperties": False},
        "note": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 99}, {"type": "null"}]},
    },
    "required": ["name", "age", "colour", "tags", "where"],
    "additionalProperties": False,
}


@pytest.fixture
def llm(tiny_llm):
    return tiny_llm         # conftest.py: one tiny engine for the whole run, reset for each test


def greedy(max_tokens=200, **constraint):
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, structured_outputs=StructuredOutputsParams(**constraint))


def numpy_constrained_greedy(prompt, walk, max_tokens):
    """The numpy model's argmax among the tokens a fresh matcher of the same grammar allows (EOS where it may end;
    ties: the lowest id), until EOS, the end of the grammar or max_tokens."""
    matcher, tokens = walk.manager.matcher(walk.compiled), list(prompt)
    while len(tokens) - len(prompt) < max_tokens:
        allowed = np.flatnonzero(walk.allowed(matcher))
        logits = tiny_logits(tokens)[-1]
        tokens.append(int(allowed[np.argmax(logits[allowed])]))
        if tokens[-1] == EOS:
            break
        assert matcher.consume_token(tokens[-1])
        if matcher.is_stopped():
            break
    return tokens[len(prompt):]


def longest_whitespace_run(text: str) -> int:
    return max((len(m) for m in re.findall(r"[ \t\n\r]+", text)), default=0)


# ---- the parameters ---------------------------------------------------------------------------------
def test_the_api_takes_one_kind_and_vllms_older_keywords():
    assert StructuredOutputsParams(json='{"type": "object"}').json == {"type": "object"}     # text: parsed
    assert SamplingParams(guided_json={"type": "integer"}).structured == StructuredOutputsParams(json={"type": "integer"})
    assert SamplingParams(guided_regex="a+").structured.key == ("regex", "a+")
    assert SamplingParams(guided_grammar='start: "x"').structured.kind == "grammar"
    assert SamplingParams(guided_choice=["a", "b"]).structured.key == ("choice", ("a", "b"))
    from_batch = SamplingParams(structured_outputs={"json_object": True})          # a batch line's object
    assert from_batch.structured_outputs == StructuredOutputsParams(json_object=True)
    assert StructuredOutputsParams(json={"b": 1, "a": 2}).key == StructuredOutputsParams(json='{"a": 2, "b": 1}').key


@pytest.mark.parametrize("make, match", [
    (lambda: StructuredOutputsParams(), r"exactly one of \['json', 'json_object', 'regex', 'choice', 'grammar'\]"),
    (lambda: StructuredOutputsParams(json={}, regex="a"), r"exactly one of .* got \['json', 'regex'\]"),
    (lambda: StructuredOutputsParams(json="{not json"), "a schema given as text must be JSON"),
    (lambda: StructuredOutputsParams(json=[1]), "must be a JSON Schema object"),
    (lambda: StructuredOutputsParams(json_object="yes"), "json_object must be true"),
    (lambda: StructuredOutputsParams(regex=""), "regex must be a non-empty string"),
    (lambda: StructuredOutputsParams(choice=["a", " "]), "choice must be a non-empty list"),
    (lambda: SamplingParams(structured_outputs={"jsn": {}}), r"unknown structured_outputs field\(s\) \['jsn'\]"),
    (lambda: SamplingParams(guided_regex="a", guided_choice=["a"]), "one structured output constraint, got"),
    (lambda: SamplingParams(guided_json={}, ignore_eos=True), "guided_json ends the request once the text completes"),
    (lambda: SamplingParams(structured_outputs=StructuredOutputsParams(regex="a"), min_tokens=1), "min_tokens > 0"),
    (lambda: SamplingParams(guided_grammar="x", allowed_token_ids=[1]), "allowed_token_ids"),
])
def test_bad_parameters_are_value_errors(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize("constraint, match", [
    (dict(json={"type": "objectx"}), r"request 1: structured outputs json: .*objectx"),
    (dict(json={"type": "string", "pattern": "(unclosed"}), r"request 1: structured outputs json: .*regex"),
    (dict(regex="a(b"), r"request 1: structured outputs regex: .*unclosed group"),
    (dict(grammar="start: missing_rule"), r"request 1: structured outputs grammar: .*missing_rule"),
    (dict(grammar="root ::= (unclosed"), r"request 1: structured outputs grammar"),
])
def test_an_invalid_constraint_names_the_request_before_any_work(llm, constraint, match):
    params = [SamplingParams(max_tokens=4), greedy(**constraint)]
    with pytest.raises(ValueError, match=match):
        llm.generate([[1, 2], [3, 4]], params, use_tqdm=False)
    assert llm.stats()["num_computed_tokens"] == 0                  # nothing ran
    assert llm.generate([[3, 4]], greedy(choice=["ok"]), use_tqdm=False)[0].text == "ok"


def test_a_grammar_mask_is_applied_after_the_penalties_and_logit_bias():
    from ms_atb.worker.sampler import Sampler
    logits = np.array([[5.0, 1.0, 2.0, 0.5]], np.float32)
    mask = np.array([-np.inf, 0.0, 0.0, -np.inf], np.float32)              # the grammar allows tokens 1 and 2
    biased = SamplingParams(temperature=0.0, logit_bias={2: -5.0})
    assert Sampler().sample(logits, [biased], [None], None, [None], [mask]) == [1]
    overflow = SamplingParams(temperature=0.0, repetition_penalty=1e-38)    # token 0's logit becomes +inf
    assert Sampler().sample(logits, [overflow], [None], [([0], 0)], [None], [mask]) == [2]   # masked, not NaN
    sampled = SamplingParams(temperature=1.0, seed=0)
    draws = [Sampler().sample(logits, [sampled], [np.random.default_rng(i)], None, [None], [mask])[0]
             for i in range(50)]
    assert set(draws) == {1, 2}


# ---- JSON ---------------------------------------------------------------------------------------------
def test_json_schema_outputs_stop_validate_and_follow_the_numpy_model(llm):
    outs = llm.generate(PROMPTS, greedy(json=BOUNDED), use_tqdm=False)
    walk = GuideWalk(llm.tokenizer, stop=EOS, json=BOUNDED)
    for prompt, out in zip(PROMPTS, outs):
        assert out.finish_reason == "stop"
        jsonschema.validate(json.loads(out.text), BOUNDED)
        assert out.token_ids == numpy_constrained_greedy(prompt, walk, 200)
        assert all(t < 256 for t in out.token_ids[:-1]) and out.token_ids[-1] in (EOS, *range(256))   # no special
        assert longest_whitespace_run(out.text) <= 21                    # a space, or a newline and up to 20


def test_sampled_json_outputs_validate_n_samples_each_with_its_own_state(llm):
    params = SamplingParams(max_tokens=200, temperature=1.0, seed=7, n=2, guided_json=BOUNDED)
    outs = llm.generate(PROMPTS[:2], params, use_tqdm=False)
    texts = [c.text for out in outs for c in out.outputs]
    assert len(texts) == 4 and len(set(texts)) > 1
    for out in outs:
        for c in out.outputs:
            assert c.finish_reason == "stop"
            jsonschema.validate(json.loads(c.text), BOUNDED)


def test_json_object_and_numbers(llm):
    number = {"type": "object", "properties": {"v": {"type": "number"}, "w": {"type": "integer"}},
              "required": ["v", "w"], "additionalProperties": False}
    out = llm.generate([[5, 6, 7]], greedy(max_tokens=40, json=number), use_tqdm=False)[0]
    walk = GuideWalk(llm.tokenizer, stop=EOS, json=number)
    assert out.token_ids == numpy_constrained_greedy([5, 6, 7], walk, 40)
    if out.finish_reason == "stop":
        jsonschema.validate(json.loads(out.text), number)
    else:          # cut by max_tokens: the text is where the grammar was, not JSON yet
        assert out.finish_reason == "length" and len(out.token_ids) == 40
    for prompt, out in zip(PROMPTS, llm.generate(PROMPTS, greedy(max_tokens=300, json_object=True), use_tqdm=False)):
        walk = GuideWalk(llm.tokenizer, stop=EOS, json_object=True)
        assert out.token_ids == numpy_constrained_greedy(prompt, walk, 300)
        assert out.text.startswith("{")
        if out.finish_reason == "stop":
            assert isinstance(json.loads(out.text), dict)


def test_max_tokens_first_is_a_length_finish(llm):
    out = llm.generate([[1, 2, 3]], greedy(max_tokens=5, json=BOUNDED), use_tqdm=False)[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 5 and out.text.startswith("{")
    full = llm.generate([[1, 2, 3]], greedy(json=BOUNDED), use_tqdm=False)[0]
    assert full.token_ids[:5] == out.token_ids


# ---- regex, grammars, choice --------------------------------------------------------------------------
def test_regex_lark_and_gbnf_grammars(llm):
    regex = r"[a-z]{2,5}-[0-9]{2}"
    lark = 'start: "(" expr ")"\nexpr: NUM | NUM "+" expr\nNUM: /[0-9]/'
    gbnf = 'root ::= "yes" | "no" | "maybe " [a-c]'
    for constraint, check in ((dict(regex=regex), lambda t: re.fullmatch(regex, t)),
                              (dict(grammar=lark), lambda t: re.fullmatch(r"\([0-9](\+[0-9])*\)", t)),
                              (dict(grammar=gbnf), lambda t: t in ("yes", "no", "maybe a", "maybe b", "maybe c"))):
        walk = GuideWalk(llm.tokenizer, stop=EOS, **constraint)
        outs = llm.generate(PROMPTS, greedy(max_tokens=60, **constraint), use_tqdm=False)
        for prompt, out in zip(PROMPTS, outs):
            assert out.token_ids == numpy_constrained_greedy(prompt, walk, 60)
            assert out.finish_reason == "stop" and check(out.text), (constraint, out.text)


def test_choice_through_structured_outputs_is_guided_choice(llm):
    choices = ["cat", "dog", "doge", "zebra crossing"]
    new = llm.generate(PROMPTS, greedy(choice=choices), use_tqdm=False)
    old = llm.generate(PROMPTS, SamplingParams(max_tokens=200, temperature=0.0, guided_choice=choices),
                       use_tqdm=False)
    assert [o.token_ids for o in new] == [o.token_ids for o in old]
    assert all(o.text in choices and o.finish_reason == "stop" for o in new)


# ---- the grammar state follows its request ------------------------------------------------------------
def test_a_preempted_constrained_request_gives_the_roomy_pools_text(llm):
    prompts = [list(range(i, i + 30)) for i in range(8)]
    params = SamplingParams(max_tokens=120, temperature=0.8, seed=3, guided_json=BOUNDED)
    roomy = llm.generate(prompts, params, use_tqdm=False)
    with scheduler_settings(llm, num_blocks=14) as tight:
        squeezed = tight.generate(prompts, params, use_tqdm=False)
        assert tight.stats()["num_preemptions"] > 0
    assert [o.token_ids for o in squeezed] == [o.token_ids for o in roomy]
    for o in roomy:
        if o.finish_reason == "stop":
            jsonschema.validate(json.loads(o.text), BOUNDED)


def test_a_prefix_cache_hit_changes_nothing(llm):
    prompt = list(range(100, 160))                       # three whole blocks of 16, then some
    first = llm.generate([prompt], greedy(json=BOUNDED), use_tqdm=False)[0]
    again = llm.generate([prompt], greedy(json=BOUNDED), use_tqdm=False)[0]
    assert first.num_cached_tokens == 0 and again.num_cached_tokens == 48
    assert again.token_ids == first.token_ids and first.finish_reason == "stop"


def test_logprobs_are_the_models_own(llm):
    out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=12, temperature=0.0, logprobs=2, guided_regex="[0-9]+"),
                       use_tqdm=False)[0]
    tokens = [1, 2, 3] + out.token_ids
    logits = tiny_logits(tokens).astype(np.float64)
    for i, (token, entry) in enumerate(zip(out.token_ids, out.logprobs)):
        row = logits[2 + i]
        expected = row[token] - row.max() - np.log(np.exp(row - row.max()).sum())
        assert abs(entry[token] - expected) < 1e-3               # before the grammar's mask
        assert 48 <= token <= 57 or token == EOS


# ---- compiling and masking ----------------------------------------------------------------------------
def test_a_slow_compile_holds_back_only_its_own_request(llm, monkeypatch):
    release, real = threading.Event(), StructuredOutputManager._compile

    def slow(self, guide, tokenizer):
        assert release.wait(60)
        return real(self, guide, tokenizer)
    monkeypatch.setattr(StructuredOutputManager, "_compile", slow)
    guided = llm.make_request([1, 2, 3], greedy(regex="slow [0-9]"), 0)
    plain = llm.make_request([4, 5, 6], SamplingParams(max_tokens=8, temperature=0.0), 1)
    order = []
    for request, out in llm.stream([guided, plain], use_tqdm=False):
        order.append((request.index, out.text))
        release.set()                                    # the grammar is ready only once the other one is done
    assert [i for i, _ in order] == [1, 0] and re.fullmatch("slow [0-9]", order[1][1])


def test_grammars_compile_once_per_constraint_and_only_constrained_rows_get_masks(llm):
    manager = llm.engine.structured
    schema = {"type": "object", "properties": {"only_here": {"enum": [1, 2]}}, "required": ["only_here"],
              "additionalProperties": False}
    compiled, hits = len(manager.compile_seconds), manager.num_compile_hits
    manager.mask_seconds.clear()
    params = [SamplingParams(max_tokens=30, temperature=0.0)] * 3 + [greedy(json=schema)] * 2
    outs = llm.generate(PROMPTS[:3] + [[7, 8]] * 2, params, use_tqdm=False)
    assert len(manager.compile_seconds) == compiled + 1 and manager.num_compile_hits == hits + 1
    assert json.loads(outs[3].text)["only_here"] in (1, 2) and outs[3].text == outs[4].text
    rows = [r for r, _ in manager.mask_seconds]
    assert rows and max(rows) <= 2                       # the two constrained requests' rows, never the others
