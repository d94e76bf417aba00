"""ms-atb-generate with LoRA adapters (`--lora NAME=PATH`): our JSONL chooses by its `lora` field, an OpenAI batch
line by its body's `model` (an adapter's name or the base model's; another name is that line's error line with
--lora, echoed and unchecked without it); each line gives the tokens the API gives it with its adapter."""
import json
import os

import pytest

from ms_atb import LLM, LoRARequest, SamplingParams
from ms_atb.batch.cli import main
from ms_atb.batch.lora_choice import parse_loras
from ms_atb.formats.loader import load_config
from engine_helpers import TINY_BUILD, TINY_CLI_SET, TINY_CONFIG, TINY_MODEL
from scripts_import import load_script

fixtures = load_script("make_lora_fixtures")
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
PROMPTS = {"p0": [5, 6, 7, 8, 9], "p1": [40, 41, 42], "p2": [100, 3, 200, 17, 9, 9]}
CHAT_URL, COMPLETIONS_URL = "/v1/chat/completions", "/v1/completions"


def tiny_config() -> dict:
    c = load_config(TINY_MODEL)
    return {"hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size, "head_dim": c.head_dim,
            "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
            "num_hidden_layers": c.num_hidden_layers}


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    folder = tmp_path_factory.mktemp("adapters")
    config = tiny_config()
    return {"a": fixtures.write_adapter(str(folder / "a"), config, "wide", 0.6),
            "b": fixtures.write_adapter(str(folder / "b"), config, "rs16", 0.6)}


@pytest.fixture(scope="module")
def reference(adapters):
    """{(prompt key, adapter name or None): token ids} from the API."""
    llm = LLM(TINY_CONFIG, enable_lora=True, max_loras=2, max_lora_rank=16, **TINY_BUILD)
    requests = {None: None, "a": LoRARequest("a", 1, adapters["a"]), "b": LoRARequest("b", 2, adapters["b"])}
    keys = [(p, a) for p in PROMPTS for a in requests]
    outs = llm.generate([PROMPTS[p] for p, _ in keys], GREEDY, use_tqdm=False,
                        lora_request=[requests[a] for _, a in keys])
    table = {k: o.token_ids for k, o in zip(keys, outs)}
    assert table[("p0", "a")] != table[("p0", None)] != table[("p0", "b")]
    return table


def lora_flags(adapters):
    return [arg for name, path in adapters.items() for arg in ("--lora", f"{name}={path}")]


def run(tmp_path, lines, *flags) -> tuple[int, list[dict]]:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    code = main(["--config", TINY_CONFIG, "--input", str(inp), "--output", str(out), "--no-progress",
                 "--max-tokens", "6", "--ignore-eos", *TINY_CLI_SET, *flags])
    return code, [json.loads(x) for x in out.read_text().splitlines()] if out.exists() else []


def test_jsonl_lines_choose_adapters_by_their_lora_field(tmp_path, adapters, reference):
    lines = [{"id": f"{p}-{a}", "prompt": ids, **({} if a is None else {"lora": a})}
             for p, ids in PROMPTS.items() for a in (None, "a", "b")]
    lines.append({"id": "unknown", "prompt": [5, 6], "lora": "zzz"})
    code, rows = run(tmp_path, lines, "--skip-invalid", *lora_flags(adapters))
    assert code == 0
    by_id = {r["id"]: r for r in rows}
    for p in PROMPTS:
        for a in (None, "a", "b"):
            assert by_id[f"{p}-{a}"]["token_ids"] == reference[(p, a)], (p, a)
    assert "'zzz'" in by_id["unknown"]["error"] and "['a', 'b']" in by_id["unknown"]["error"]


def test_a_lora_field_without_lora_flags_stops_the_job(tmp_path, capsys):
    code, _ = run(tmp_path, [{"prompt": [5, 6], "lora": "a"}])
    assert code == 2 and "no --lora was given" in capsys.readouterr().err


def batch_line(custom_id, model, prompt):
    body = {"prompt": [prompt], "max_tokens": 6, "ignore_eos": True}
    if model is not None:
        body["model"] = model
    return {"custom_id": custom_id, "method": "POST", "url": COMPLETIONS_URL, "body": body}


def test_openai_lines_choose_adapters_by_model(tmp_path, adapters, reference):
    base = os.path.basename(TINY_CONFIG)
    lines = [batch_line("p0-a", "a", PROMPTS["p0"]), batch_line("p1-b", "b", PROMPTS["p1"]),
             batch_line("p2-base", base, PROMPTS["p2"]), batch_line("p0-none", None, PROMPTS["p0"]),
             batch_line("bad", "nope", PROMPTS["p0"])]
    code, rows = run(tmp_path, lines, *lora_flags(adapters))
    assert code == 0
    by_id = {r["custom_id"]: r for r in rows}
    assert "'nope' names neither a LoRA adapter" in by_id["bad"]["error"]["message"]
    assert by_id["bad"]["response"] is None
    # the completions' text is the reference tokens' text (byte-level vocabulary)
    texts = {k: by_id[k]["response"]["body"]["choices"][0]["text"] for k in ("p0-a", "p1-b", "p2-base", "p0-none")}
    assert by_id["p0-a"]["response"]["body"]["model"] == "a"
    (tmp_path / "plain").mkdir()
    code, plain = run(tmp_path / "plain", [{"id": k, "prompt": PROMPTS[k[:2]],
                                         **({"lora": k[3:]} if k[3:] in ("a", "b") else {})} for k in texts],
                      *lora_flags(adapters))
    assert code == 0 and {r["id"]: r["text"] for r in plain} == texts
    assert {r["id"]: r["token_ids"] for r in plain} == {
        "p0-a": reference[("p0", "a")], "p1-b": reference[("p1", "b")], "p2-base": reference[("p2", None)],
        "p0-none": reference[("p0", None)]}


def test_without_lora_flags_an_openai_model_is_echoed_unchecked(tmp_path, reference):
    code, rows = run(tmp_path, [batch_line("x", "some-model", PROMPTS["p0"])])
    assert code == 0 and rows[0]["error"] is None
    assert rows[0]["response"]["body"]["model"] == "some-model"


@pytest.mark.parametrize("flags, match", [(["x"], "NAME=PATH"), (["=p"], "NAME=PATH"),
                                          (["a=p", "a=q"], "given twice")])
def test_bad_lora_flags(flags, match):
    with pytest.raises(ValueError, match=match):
        parse_loras(flags)
