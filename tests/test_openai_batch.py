"""ms-atb-generate's OpenAI batch format: lines mapped onto requests, both endpoints on the tiny engine, one
error line per invalid line, usage counts, --resume by custom_id, duplicate custom_ids."""
import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from ms_atb import SamplingParams
from ms_atb.batch.cli import main
from ms_atb.batch.item import BatchItem, OpenAIEndpoint
from ms_atb.batch.openai_batch import CHAT_URL, COMPLETIONS_URL, parse_line
from ms_atb.batch.output_file import done_ids
from ms_atb.batch.prompt_file import read_input
from engine_helpers import TINY_CLI_SET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "tiny_llama.yaml")


def batch_line(custom_id, url=CHAT_URL, **body) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def test_a_line_maps_onto_a_request_item():
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    item = parse_line(batch_line("c", model="any-name", messages=[{"role": "user", "content": parts}],
                                 max_completion_tokens=5, temperature=0.5, stop=["x"], seed=3, n=2, logprobs=True,
                                 top_logprobs=4, top_k=7, stream=False, user="u", presence_penalty=None), 1, "p")
    assert item == BatchItem("c", 1, messages=[{"role": "user", "content": "ab"}],
                             sampling={"max_tokens": 5, "temperature": 0.5, "stop": ["x"], "seed": 3, "n": 2,
                                       "logprobs": 4, "top_k": 7},
                             openai=OpenAIEndpoint(CHAT_URL, "any-name", 4))
    assert SamplingParams.from_dict(item.sampling).logprobs == 4
    item = parse_line(batch_line("t", COMPLETIONS_URL, prompt=[[1, 2, 3]], logprobs=2, echo=False), 9, "p")
    assert item == BatchItem("t", 9, prompt=[1, 2, 3], sampling={"logprobs": 2},
                             openai=OpenAIEndpoint(COMPLETIONS_URL, None, None))


@pytest.mark.parametrize("line, code, words", [
    ("not json", "invalid_json_line", "p:1: not valid JSON"),
    ("[1]", "invalid_custom_id", "a string 'custom_id', got a JSON list"),
    (json.dumps({"url": CHAT_URL, "body": {}}), "invalid_custom_id", "got null"),
    (json.dumps({"custom_id": 7, "url": CHAT_URL, "body": {}}), "invalid_custom_id", "got 7"),
    (json.dumps({"custom_id": "a", "method": "GET", "url": CHAT_URL, "body": {}}), "invalid_method", "'GET'"),
    (batch_line("a", "/v1/embeddings", input="x"), "invalid_url", "url '/v1/embeddings' is not supported"),
    (batch_line("a", messages=[{"role": "user", "content": "x"}], stream=True), "unsupported_parameter",
     "['stream: true']"),
    (batch_line("a", COMPLETIONS_URL, prompt="x", echo=True, best_of=2), "unsupported_parameter",
     "['best_of: 2', 'echo: true']"),
    (batch_line("a", messages=[{"role": "user", "content": "x"}], tools=[]), "unsupported_parameter", "['tools']"),
    (batch_line("a", messages=[{"role": "user", "content": "x"}], prompt="x"), "unsupported_parameter", "['prompt']"),
    (batch_line("a", COMPLETIONS_URL, messages=[{"role": "user", "content": "x"}]), "unsupported_parameter",
     "['messages']"),
    (batch_line("a", COMPLETIONS_URL, prompt=["x", "y"]), "invalid_request", "one prompt a line"),
    (batch_line("a", COMPLETIONS_URL, max_tokens=3), "invalid_request", "needs 'prompt'"),
    (batch_line("a", max_tokens=3), "invalid_request", "needs 'messages'"),
    (batch_line("a", messages=[{"role": "user", "content": "x"}], top_logprobs=2), "invalid_request",
     "top_logprobs needs logprobs: true"),
    (batch_line("a", messages=[{"role": "user", "content": "x"}], logprobs=1), "invalid_request",
     "logprobs must be a bool"),
    (batch_line("a", messages=[{"role": "user", "content": "x"}], logprobs=True, top_logprobs=21), "invalid_request",
     "top_logprobs must be an int in [0, 20]"),
    (batch_line("a", messages=[{"role": "user", "content": "x"}], max_tokens=3, max_completion_tokens=4),
     "invalid_request", "differ"),
    (batch_line("a", messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
     "invalid_request", "only text parts"),
    (json.dumps({"custom_id": "a", "url": CHAT_URL, "body": "hi"}), "invalid_request", "body must be an object"),
    (json.dumps({"custom_id": "a", "url": CHAT_URL, "body": {"messages": [{"role": "user", "content": "x"}]},
                 "extra": 1}), "invalid_request", "unknown field(s) ['extra']"),
])
def test_a_bad_line_is_an_error_item_naming_what_is_wrong(line, code, words):
    item = parse_line(line, 1, "p")
    assert item.error_code == code and words in item.error, item
    assert item.id == ("a" if '"custom_id": "a"' in line else ("line", 1))


def test_the_format_is_found_and_duplicate_custom_ids_stop_the_reading(tmp_path, monkeypatch):
    path = tmp_path / "p.jsonl"
    ok = batch_line("a", messages=[{"role": "user", "content": "x"}])
    path.write_text("{broken\n" + ok + "\n")
    fmt, items = read_input(str(path))
    assert fmt == "openai" and items[0].id == ("line", 1) and items[1].id == "a"
    path.write_text('{"id": "a", "prompt": "x"}\n')
    assert read_input(str(path)) == ("ms_atb", [BatchItem("a", 1, prompt="x")])
    txt = tmp_path / "p.txt"
    txt.write_text(ok + "\n")
    assert read_input(str(txt))[0] == "ms_atb" and read_input(str(txt), "openai")[1][0].id == "a"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"\n" + ok.encode() + b"\n")))
    assert read_input("-")[0] == "openai"
    bad_url = batch_line("a", "/v1/embeddings")             # an error line's custom_id counts too
    for content in (ok + "\n" + batch_line("b", prompt="y") + "\n\n" + ok + "\n",
                    "\n" + ok + "\n" + bad_url + "\n"):
        path.write_text(content)
        lines = [n for n, text in enumerate(content.splitlines(), 1) if '"custom_id": "a"' in text]
        message = rf'custom_id "a" appears more than once \(lines {lines[0]} and {lines[1]}\)'
        with pytest.raises(ValueError, match=message):
            read_input(str(path))


def test_resume_counts_custom_ids_and_error_lines(tmp_path):
    out = tmp_path / "o.jsonl"
    def error(line):
        return {"code": "x", "message": "m", "line": line}
    lines = [{"id": "batch_req_1", "custom_id": "a", "response": {"status_code": 200}, "error": None},
             {"id": "batch_req_2", "custom_id": "b", "response": None, "error": error(2)},
             {"id": "batch_req_3", "custom_id": None, "response": None, "error": error(3)}]
    text = "".join(json.dumps(r) + "\n" for r in lines)
    out.write_text(text + '{"id": "batch_req_4", "custom_id": "d", "resp')
    assert done_ids(str(out)) == {"a", "b", ("line", 3)}
    assert out.read_text() == text                                          # the torn line is cut off


def _rows(out):
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    by_key = {r["custom_id"] if r["custom_id"] is not None else r["error"]["line"]: r for r in rows}
    assert len(by_key) == len(rows)                                         # each request once
    return by_key


def test_both_endpoints_error_lines_and_usage(tmp_path, capsys, cli_on_tiny_engine, tiny_llm):
    greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    plain = tiny_llm.generate(["hello world"], greedy, use_tqdm=False)[0]
    stop = next(ch for ch in plain.text[1:] if ch.isprintable() and ch != "\ufffd")
    chat = [{"role": "user", "content": "hi there"}]
    lines = [batch_line("chat", model="whatever-model", messages=chat, max_tokens=5, ignore_eos=True),
             batch_line("text", COMPLETIONS_URL, prompt="hello world", max_tokens=8, ignore_eos=True, stop=stop),
             batch_line("ids", COMPLETIONS_URL, prompt=[5, 6, 7, 8], max_tokens=3, n=3, temperature=1.0, seed=11),
             "not json",
             batch_line("emb", "/v1/embeddings", input="x"),
             batch_line("stream", messages=chat, stream=True),
             batch_line("long", COMPLETIONS_URL, prompt=[i % 200 + 1 for i in range(600)]),    # max_model_len 512
             batch_line("lp_chat", messages=chat, max_tokens=3, ignore_eos=True, logprobs=True, top_logprobs=3),
             batch_line("lp_text", COMPLETIONS_URL, prompt=[9, 10], max_tokens=3, ignore_eos=True, logprobs=2),
             batch_line("seed", COMPLETIONS_URL, prompt=[5, 6, 7, 8], max_tokens=3, temperature=1.0, seed=11)]
    inp = tmp_path / "batch.jsonl"
    inp.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.jsonl"
    assert main(["--config", TINY, "--input", str(inp), "--output", str(out), "--no-progress", *TINY_CLI_SET]) == 0
    assert "4 invalid written as error lines" in capsys.readouterr().err
    rows = _rows(out)
    assert len(rows) == len(lines)
    for key, code, words in ((4, "invalid_json_line", "batch.jsonl:4: not valid JSON"),
                             ("emb", "invalid_url", "/v1/embeddings"),
                             ("stream", "unsupported_parameter", "stream: true"),
                             ("long", "invalid_request", "batch.jsonl:7 (custom_id 'long'): ")):
        row = rows[key]
        assert row["response"] is None and row["error"]["code"] == code and words in row["error"]["message"], row
    assert "max_model_len" in rows["long"]["error"]["message"]
    bodies = {k: r["response"]["body"] for k, r in rows.items() if r["error"] is None}
    assert sorted(bodies) == ["chat", "ids", "lp_chat", "lp_text", "seed", "text"]
    assert all(rows[k]["response"]["status_code"] == 200 for k in bodies)

    def check(key, want, chat_form):
        body = bodies[key]
        assert body["object"] == ("chat.completion" if chat_form else "text_completion")
        assert [c["index"] for c in body["choices"]] == list(range(len(want.outputs)))
        texts = [c["message"]["content"] if chat_form else c["text"] for c in body["choices"]]
        assert texts == [c.text for c in want.outputs]
        assert [c["finish_reason"] for c in body["choices"]] == [c.finish_reason for c in want.outputs]
        completion = sum(len(c.token_ids) for c in want.outputs)
        assert body["usage"] == {"prompt_tokens": len(want.prompt_token_ids), "completion_tokens": completion,
                                 "total_tokens": len(want.prompt_token_ids) + completion}
        return body

    body = check("chat", tiny_llm.chat(chat, SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True),
                                       use_tqdm=False)[0], True)
    assert body["model"] == "whatever-model" and body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] == 5 and body["usage"]["prompt_tokens"] > len("hi there")
    stopped = tiny_llm.generate(["hello world"], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True,
                                                                stop=stop), use_tqdm=False)[0]
    assert check("text", stopped, False)["choices"][0]["finish_reason"] == "stop" and stopped.text != plain.text
    sampled = SamplingParams(max_tokens=3, temperature=1.0, seed=11)
    check("seed", tiny_llm.generate([[5, 6, 7, 8]], sampled, use_tqdm=False)[0], False)
    n3 = check("ids", tiny_llm.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=3, temperature=1.0, seed=11, n=3),
                                        use_tqdm=False)[0], False)
    assert len(n3["choices"]) == 3 and n3["usage"]["prompt_tokens"] == 4

    tok = tiny_llm.get_tokenizer()
    want = tiny_llm.chat(chat, SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True, logprobs=3),
                         use_tqdm=False)[0]
    content = check("lp_chat", want, True)["choices"][0]["logprobs"]["content"]
    assert [e["bytes"] for e in content] == [list(tok.token_bytes(t)) for t in want.token_ids]
    for entry, t, alternatives in zip(content, want.token_ids, want.logprobs):
        assert entry["logprob"] == pytest.approx(alternatives[t], abs=1e-4)     # float32, another batch
        best = sorted(alternatives.values(), reverse=True)[:3]
        assert [e["logprob"] for e in entry["top_logprobs"]] == pytest.approx(best, abs=1e-4)
    want = tiny_llm.generate([[9, 10]], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True, logprobs=2),
                             use_tqdm=False)[0]
    lp = check("lp_text", want, False)["choices"][0]["logprobs"]
    assert lp["token_logprobs"] == pytest.approx([a[t] for a, t in zip(want.logprobs, want.token_ids)], abs=1e-4)
    texts = [{tok.token_bytes(t).decode("utf-8", "replace") for t in a} for a in want.logprobs]
    assert [len(d) for d in lp["top_logprobs"]] == [len(t) for t in texts]      # the chosen token and the top 2
    assert bodies["text"]["choices"][0]["logprobs"] is None


def test_resume_runs_only_the_missing_custom_ids(tmp_path, capsys, cli_on_tiny_engine):
    lines = [batch_line(f"r{i}", COMPLETIONS_URL, prompt=[i + 1, 2, 3], max_tokens=3) for i in range(5)]
    lines.insert(2, "not json")
    inp = tmp_path / "batch.jsonl"
    inp.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.jsonl"
    args = ["--config", TINY, "--input", str(inp), "--output", str(out), "--no-progress", *TINY_CLI_SET]
    assert main(args) == 0
    full = out.read_text().splitlines(keepends=True)
    assert len(full) == 6
    kept = "".join(full[:3])                    # as a killed run leaves it: three lines and a torn fourth
    out.write_text(kept + full[3][:40])
    capsys.readouterr()
    assert main(args + ["--resume"]) == 0
    assert "3 requests to run (3 already in" in capsys.readouterr().err
    text = out.read_text()
    assert text.startswith(kept)
    rows = _rows(out)
    assert sorted(rows, key=str) == sorted([3] + [f"r{i}" for i in range(5)], key=str)
    assert main(args + ["--resume"]) == 0 and out.read_text() == text       # nothing left to run


def test_duplicate_custom_ids_exit_2_before_any_work(tmp_path, capsys, monkeypatch):
    from ms_atb.llm import LLM

    def no_engine(*args, **kwargs):
        raise AssertionError("the engine was prepared before the input was checked")

    monkeypatch.setattr(LLM, "prepare", no_engine)
    inp = tmp_path / "batch.jsonl"
    dup = batch_line("same", COMPLETIONS_URL, prompt="x")
    inp.write_text(dup + "\n" + batch_line("other", COMPLETIONS_URL, prompt="y") + "\n" + dup + "\n")
    out = tmp_path / "out.jsonl"
    assert main(["--config", TINY, "--input", str(inp), "--output", str(out)]) == 2
    assert 'custom_id "same" appears more than once (lines 1 and 3)' in capsys.readouterr().err
    assert not out.exists()
    inp.write_text(dup + "\n")
    assert main(["--config", TINY, "--input", str(inp), "--output", str(out), "--chat"]) == 2
    assert "--chat and --beam-width do not apply to OpenAI batch input" in capsys.readouterr().err


@pytest.mark.slow
def test_sigterm_then_resume_finishes_every_custom_id_once(tmp_path):
    inp = tmp_path / "batch.jsonl"
    inp.write_text("".join(batch_line(f"r{i}", COMPLETIONS_URL, prompt=f"prompt number {i}: item {i * 7}",
                                      max_tokens=24, ignore_eos=True) + "\n" for i in range(30)))
    out = tmp_path / "out.jsonl"
    cmd = [sys.executable, "-m", "ms_atb.batch.cli", "--config", TINY, "--input", str(inp), "--output", str(out),
           "--no-progress", "--set", "max_num_batched_tokens=16", "--set", "max_num_seqs=2"]
    env = dict(os.environ, MS_ATB_QUIET="1")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None and not (out.exists() and out.read_text().count("\n") >= 2):
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be signalled"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]
    first = [r["custom_id"] for r in map(json.loads, out.read_text().splitlines())]
    assert 2 <= len(first) < 30
    subprocess.run(cmd + ["--resume"], env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=600)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["custom_id"] for r in rows][:len(first)] == first
    assert sorted(r["custom_id"] for r in rows) == sorted(f"r{i}" for i in range(30))
    assert all(r["response"]["body"]["usage"]["completion_tokens"] == 24 for r in rows)
