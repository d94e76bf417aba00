"""The front door on the embedded default (SmolLM2-135M-Instruct GGUF): greedy continuations and prompt
log-probabilities equal HF transformers' (checked in by scripts/make_hf_reference.py), the chat answers, and the results
do not depend on prefix caching, preemption or batch composition."""
import json
import os

import pytest

from ms_atb import SamplingParams

pytestmark = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCE = os.path.join(ROOT, "tests", "data", "smollm2_reference.json")


@pytest.fixture(scope="module")
def llm(smollm2_llm):
    smollm2_llm.reset_scheduler()
    return smollm2_llm


@pytest.fixture(scope="module")
def reference():
    with open(REFERENCE, encoding="utf-8") as f:
        return json.load(f)


def test_batched_greedy_matches_hf(llm, reference):
    cases = reference["prompts"]
    params = SamplingParams(max_tokens=reference["num_new_tokens"], temperature=0.0)   # HF stops at EOS too
    outs = llm.generate([c["prompt_ids"] for c in cases], params, use_tqdm=False)
    for case, out in zip(cases, outs):
        assert out.token_ids == case["greedy_ids"], case["name"]


def test_prompt_logprobs_match_hf(llm, reference):
    cases = reference["prompts"]
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    outs = llm.generate([c["prompt_ids"] for c in cases], params, use_tqdm=False)
    for case, out in zip(cases, outs):
        ours = [lp[t] for lp, t in zip(out.prompt_logprobs[1:], case["prompt_ids"][1:])]
        assert out.prompt_logprobs[0] is None and len(ours) == len(case["prompt_logprobs"])
        assert max(abs(a - b) for a, b in zip(ours, case["prompt_logprobs"])) < 5e-4, case["name"]


def test_special_tokens_in_the_text_only_when_asked(llm):
    tok = llm.get_tokenizer()
    (start,) = tok.encode("<|im_start|>", add_special_tokens=False)
    assert tok.is_special(start)
    forced = dict(max_tokens=2, temperature=0.0, ignore_eos=True, allowed_token_ids=[start])
    skipped, kept = llm.generate(["Hi", "Hi"], [SamplingParams(**forced),
                                                SamplingParams(**forced, skip_special_tokens=False)], use_tqdm=False)
    assert skipped.token_ids == kept.token_ids == [start, start]
    assert skipped.text == "" and kept.text == "<|im_start|><|im_start|>"


def test_tokenizer_matches_hf_on_the_reference_prompts(llm, reference):
    tok = llm.get_tokenizer()
    for case in reference["prompts"]:
        if case.get("text") is not None and not case.get("messages"):
            assert tok.encode(case["text"]) == case["prompt_ids"], case["name"]


def test_chat_says_paris(llm):
    out = llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                   SamplingParams(max_tokens=24, temperature=0.0))[0]
    assert "Paris" in out.text
    assert out.finish_reason == "stop" and out.token_ids[-1] in llm.get_tokenizer().stop_token_ids
    assert "<|im_end|>" not in out.text


def test_guided_choice_and_bad_words_label_reviews(llm):
    reviews = ["I loved this film, the acting was wonderful.", "Terrible food and rude staff. Never again.",
               "The package arrived on time and works as described.", "Worst purchase I have made this year."]
    chats = [[{"role": "user", "content": "Classify the sentiment of this review as positive or negative.\n"
                                          f"Review: {r}\nAnswer with one word."}] for r in reviews]
    params = SamplingParams(max_tokens=8, temperature=0.0, guided_choice=["positive", "negative"])
    outs = llm.chat(chats, params, use_tqdm=False)
    assert [o.text for o in outs] == ["positive", "negative", "positive", "negative"]
    assert all(o.finish_reason == "stop" and len(o.token_ids) == 1 for o in outs)   # one token each, no EOS step
    free = llm.chat(chats[:1], SamplingParams(max_tokens=24, temperature=0.0), use_tqdm=False)[0]
    banned = llm.chat(chats[:1], SamplingParams(max_tokens=24, temperature=0.0, bad_words=["positive"]),
                      use_tqdm=False)[0]
    assert "positive" in free.text.lower() and "positive" not in banned.text


def test_json_schema_extraction_stops_and_validates(llm):
    """Structured outputs on a real vocabulary: the extracted JSON parses, validates and holds the facts."""
    import jsonschema
    schema = {"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"},
        "occupation": {"enum": ["engineer", "teacher", "doctor", "farmer"]},
        "skills": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        "address": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                    "additionalProperties": False}},
        "required": ["name", "age", "occupation", "skills", "address"], "additionalProperties": False}
    people = [("Alice Martin", 34, "teacher", "Lyon"), ("Bob Chen", 51, "doctor", "Osaka"),
              ("Carla Rossi", 27, "engineer", "Porto"), ("David Okafor", 45, "farmer", "Nairobi")]
    chats = [[{"role": "user", "content": f"{n} is {a} years old, works as a {j} and lives in {c}. Extract this "
                                          f"person's details as JSON."}] for n, a, j, c in people]
    outs = llm.chat(chats, SamplingParams(max_tokens=120, temperature=0.0, guided_json=schema), use_tqdm=False)
    for (name, age, job, city), out in zip(people, outs):
        assert out.finish_reason == "stop" and out.text.endswith("}")     # the grammar's end: no EOS step needed
        got = json.loads(out.text)
        jsonschema.validate(got, schema)
        assert (got["name"], got["age"], got["occupation"], got["address"]["city"]) == (name, age, job, city)


def test_prefix_caching_and_preemption_do_not_change_tokens(llm):
    system = ("You are a meticulous assistant for a library. Always answer briefly, cite the shelf "
              "number when you know it, and never invent titles. ") * 3
    chats = [[{"role": "system", "content": system}, {"role": "user", "content": q}]
             for q in ("Where are the atlases?", "Do you have poetry?", "When do you close?",
                       "Can I print here?", "Is there a quiet room?")]
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    llm.reset_scheduler(enable_prefix_caching=True, num_blocks=160)
    cached = llm.chat(chats, params, use_tqdm=False)
    assert all(o.num_cached_tokens >= 64 for o in cached[1:])
    llm.reset_scheduler(enable_prefix_caching=False)
    plain = llm.chat(chats, params, use_tqdm=False)
    llm.reset_scheduler(enable_prefix_caching=True, num_blocks=24)
    tight = llm.chat(chats, params, use_tqdm=False)
    assert llm.stats()["num_preemptions"] > 0
    llm.reset_scheduler(num_blocks=160)
    assert [o.token_ids for o in cached] == [o.token_ids for o in plain] == [o.token_ids for o in tight]
