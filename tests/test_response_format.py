"""Structured outputs in ms-atb-generate: OpenAI batch lines with each response_format on both endpoints, our JSONL
with response_format and the API's fields, a bad schema as an error line while the rest of the job runs, and the
answer of a constrained request shaped as any other (the JSON in message.content / text)."""
import json
import os

import jsonschema
import pytest

from ms_atb import SamplingParams, StructuredOutputsParams
from ms_atb.batch.cli import main
from ms_atb.batch.openai_batch import CHAT_URL, COMPLETIONS_URL, parse_line
from ms_atb.batch.response_format import line_sampling, structured_fields
from engine_helpers import TINY_CLI_SET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "tiny_llama.yaml")
SCHEMA = {"type": "object", "properties": {"label": {"enum": ["spam", "ham"]},
                                           "score": {"type": "integer", "minimum": 0, "maximum": 9}},
          "required": ["label", "score"], "additionalProperties": False}
CHAT = [{"role": "user", "content": "classify: hello"}]


def batch_line(custom_id, url=CHAT_URL, **body) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def json_schema(schema=SCHEMA, **extra) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "verdict", "schema": schema, **extra}}


# ---- response_format -> SamplingParams fields ------------------------------------------------------------
def test_each_response_format_maps_onto_structured_outputs():
    assert structured_fields({"type": "text"}) == {}
    assert structured_fields({"type": "json_object"}) == {"structured_outputs": {"json_object": True}}
    assert structured_fields(json_schema(strict=True, description="d")) == {"structured_outputs": {"json": SCHEMA}}
    params = SamplingParams.from_dict(line_sampling({"response_format": json_schema(), "max_tokens": 9}, {}))
    assert params.structured == StructuredOutputsParams(json=SCHEMA) and params.max_tokens == 9


@pytest.mark.parametrize("rf, words", [
    ("json", "must be an object whose type is one of ['text', 'json_object', 'json_schema']"),
    ({"type": "xml"}, "whose type is one of"),
    ({"type": "json_object", "json_schema": {}}, "takes ['type']"),
    ({"type": "json_schema"}, "takes ['type', 'json_schema']"),
    ({"type": "json_schema", "json_schema": {"schema": SCHEMA}}, "a string 'name'"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": "{}"}}, "a JSON Schema object 'schema'"),
    (json_schema(strict="yes"), "'strict' a bool"),
    (json_schema(examples=[]), "takes ['name', 'schema', 'strict', 'description']"),
])
def test_a_bad_response_format_says_what_is_wrong(rf, words):
    with pytest.raises(ValueError) as e:
        structured_fields(rf)
    assert words in str(e.value)
    item = parse_line(batch_line("a", messages=CHAT, response_format=rf), 1, "p")
    assert item.error_code == "invalid_request" and words in item.error


def test_a_line_gives_one_constraint_and_the_jobs_default_gives_way():
    defaults = {"guided_choice": ["yes", "no"], "max_tokens": 4}
    assert line_sampling({}, defaults) == defaults
    assert line_sampling({"response_format": {"type": "json_object"}}, defaults) == {
        "max_tokens": 4, "structured_outputs": {"json_object": True}}
    assert line_sampling({"guided_regex": "a+"}, defaults) == {"max_tokens": 4, "guided_regex": "a+"}
    with pytest.raises(ValueError, match=r"response_format and \['guided_json'\] both ask"):
        line_sampling({"response_format": {"type": "json_object"}, "guided_json": {}}, defaults)


# ---- whole jobs on the tiny engine -------------------------------------------------------------------
def test_openai_lines_with_each_response_format_and_a_bad_schema(tmp_path, capsys, cli_on_tiny_engine, tiny_llm):
    lines = [batch_line("schema", messages=CHAT, max_tokens=60, temperature=0, response_format=json_schema()),
             batch_line("object", COMPLETIONS_URL, prompt="{", max_tokens=80, temperature=0,
                        response_format={"type": "json_object"}),
             batch_line("text", COMPLETIONS_URL, prompt="hi", max_tokens=4, temperature=0, ignore_eos=True,
                        response_format={"type": "text"}),
             batch_line("comp", COMPLETIONS_URL, prompt="hi", max_tokens=60, temperature=0,
                        response_format=json_schema(strict=True)),
             batch_line("bad", messages=CHAT, response_format=json_schema({"type": "objectx"})),
             batch_line("regex", COMPLETIONS_URL, prompt="hi", max_tokens=20, temperature=0, guided_regex="[0-9]{3}"),
             batch_line("so", messages=CHAT, max_tokens=20, temperature=0, structured_outputs={"choice": ["a", "b"]})]
    inp, out = tmp_path / "batch.jsonl", tmp_path / "out.jsonl"
    inp.write_text("\n".join(lines) + "\n")
    assert main(["--config", TINY, "--input", str(inp), "--output", str(out), "--no-progress", *TINY_CLI_SET]) == 0
    assert "1 invalid written as error lines" in capsys.readouterr().err
    rows = {r["custom_id"]: r for r in map(json.loads, out.read_text().splitlines())}
    bad = rows["bad"]
    assert bad["response"] is None and bad["error"]["code"] == "invalid_request"
    assert "batch.jsonl:5 (custom_id 'bad'): structured outputs json: " in bad["error"]["message"]
    assert "objectx" in bad["error"]["message"]

    def choice(key):
        body = rows[key]["response"]["body"]
        assert rows[key]["error"] is None and set(body) == {"id", "object", "created", "model", "choices", "usage"}
        c = body["choices"][0]
        assert set(c) == {"index", "message" if "message" in c else "text", "logprobs", "finish_reason"}
        return c.get("message", {}).get("content", c.get("text")), c["finish_reason"]

    for key in ("schema", "comp"):
        text, reason = choice(key)
        assert reason == "stop"
        jsonschema.validate(json.loads(text), SCHEMA)
    want = tiny_llm.chat(CHAT, SamplingParams(max_tokens=60, temperature=0, guided_json=SCHEMA), use_tqdm=False)[0]
    assert choice("schema") == (want.text, "stop")               # the same request as the API's
    text, reason = choice("object")
    assert text.startswith("{") and (reason == "length" or isinstance(json.loads(text), dict))
    assert choice("text")[1] == "length" and len(choice("regex")[0]) == 3 and choice("so")[0] in ("a", "b")


def test_our_jsonl_takes_response_format_and_the_apis_fields(tmp_path, cli_on_tiny_engine):
    rows = [{"id": "rf", "prompt": [1, 2, 3], "max_tokens": 60, "response_format": json_schema()},
            {"id": "so", "prompt": [1, 2, 3], "max_tokens": 60, "structured_outputs": {"json": SCHEMA}},
            {"id": "gj", "prompt": [1, 2, 3], "max_tokens": 60, "guided_json": json.dumps(SCHEMA)},
            {"id": "flag", "prompt": [4, 5], "max_tokens": 10},
            {"id": "bad", "prompt": [4, 5], "response_format": json_schema({"type": "string", "pattern": "("})},
            {"id": "two", "prompt": [4, 5], "response_format": {"type": "json_object"}, "guided_regex": "a"}]
    inp, out = tmp_path / "p.jsonl", tmp_path / "o.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["--config", TINY, "--input", str(inp), "--output", str(out), "--no-progress", "--skip-invalid",
                 *TINY_CLI_SET, "--guided-regex", "[xyz]{2}"]) == 0
    got = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert got["rf"]["text"] == got["so"]["text"] == got["gj"]["text"] and got["rf"]["finish_reason"] == "stop"
    jsonschema.validate(json.loads(got["rf"]["text"]), SCHEMA)
    assert len(got["flag"]["text"]) == 2 and set(got["flag"]["text"]) <= set("xyz")     # the job's default
    assert "structured outputs json: " in got["bad"]["error"] and "p.jsonl:5" in got["bad"]["error"]
    assert "both ask for a structured output" in got["two"]["error"]


def test_beam_search_refuses_a_constraint(tmp_path, capsys, cli_on_tiny_engine):
    inp, out = tmp_path / "p.jsonl", tmp_path / "o.jsonl"
    inp.write_text(json.dumps({"id": 1, "prompt": [1, 2], "response_format": {"type": "json_object"}}) + "\n")
    assert main(["--config", TINY, "--input", str(inp), "--output", str(out), "--no-progress", *TINY_CLI_SET,
                 "--beam-width", "2"]) == 2
    assert "beam search takes no structured output constraint, got ['response_format']" in capsys.readouterr().err
