"""ms-atb-generate: input parsing, resume bookkeeping, and a run killed mid-way then resumed."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from ms_atb.batch.cli import main
from ms_atb.batch.item import BatchItem
from ms_atb.batch.output_file import done_ids
from ms_atb.batch.prompt_file import read_requests
from engine_helpers import TINY_CLI_SET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "tiny_llama.yaml")


def test_read_requests_text_and_jsonl(tmp_path):
    txt = tmp_path / "p.txt"
    txt.write_text("hello\n\nworld\\nagain\n")
    assert read_requests(str(txt)) == [BatchItem("line-1", 1, prompt="hello"),
                                       BatchItem("line-3", 3, prompt="world\nagain")]
    js = tmp_path / "p.jsonl"
    js.write_text('{"id": 7, "prompt": [1, 2], "max_tokens": 3}\n'
                  '{"messages": [{"role": "user", "content": "hi"}]}\n')
    items = read_requests(str(js))
    assert items[0].id == 7 and type(items[0].id) is int and items[0].sampling["max_tokens"] == 3
    assert items[1].id == "line-2" and items[1].messages is not None


@pytest.mark.parametrize("content, match", [
    ('{"prompt": "a"\n', r"p\.jsonl:1: not valid JSON"),
    ('{"id": null, "prompt": "a"}\n', r"p\.jsonl:1: 'id' must be a string or an integer, got null"),
    ('{"id": [1], "prompt": "a"}\n', r"p\.jsonl:1: 'id' must be a string or an integer, got \[1\]"),
    ('{"id": 1}\n', r"p\.jsonl:1: each line needs exactly one of 'prompt' or 'messages'"),
    ('{"id": 1, "prompt": "a"}\n{"id": 1, "prompt": "b"}\n', r"id 1 appears more than once"),
])
def test_bad_input_files(tmp_path, content, match):
    path = tmp_path / "p.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=match):
        read_requests(str(path))


def test_input_encoding_and_line_endings(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"prompt": "a"}\r\n{"prompt": "b\xc3\xa9"}\r\n')     # a BOM, CRLF, UTF-8
    assert [i.prompt for i in read_requests(str(path))] == ["a", "b\u00e9"]
    path.write_bytes(b'{"prompt": "a"}\n{"prompt": "\xff"}\n')
    with pytest.raises(ValueError, match=r"p\.jsonl:2: not valid UTF-8"):
        read_requests(str(path))
    with pytest.raises(ValueError, match=r"is a directory, not a file"):
        read_requests(str(tmp_path))
    with pytest.raises(ValueError, match=r"not found"):
        read_requests(str(tmp_path / "missing.txt"))


def test_output_paths_checked_before_the_engine_is_built(tmp_path, capsys):
    inp = tmp_path / "p.jsonl"
    inp.write_text('{"id": "bad", "prompt": [1], "temperature": -1}\n')    # stops the run before the build
    assert main(["--config", TINY, "--input", str(inp), "--output", str(tmp_path), "--overwrite"]) == 2
    assert "is a directory; give a file path" in capsys.readouterr().err
    assert main(["--config", TINY, "--input", str(inp), "--output", str(inp / "o.jsonl")]) == 2
    assert "cannot create its directory" in capsys.readouterr().err
    nested = tmp_path / "new" / "dir" / "o.jsonl"
    assert main(["--config", TINY, "--input", str(inp), "--output", str(nested)]) == 2
    assert "temperature" in capsys.readouterr().err and nested.parent.is_dir()


def test_done_ids_cuts_a_torn_last_line(tmp_path):
    out = tmp_path / "o.jsonl"
    out.write_text('{"id": "a", "text": "x"}\n{"id": "b", "text": "y"}\n{"id": "c", "te')
    assert done_ids(str(out)) == {"a", "b"}
    assert out.read_text() == '{"id": "a", "text": "x"}\n{"id": "b", "text": "y"}\n'


def test_done_ids_restores_a_lost_newline(tmp_path):
    out = tmp_path / "o.jsonl"
    out.write_text('{"id": "a", "text": "x"}\n\n{"id": "b", "text": "y"}')       # killed before the newline
    assert done_ids(str(out)) == {"a", "b"}
    assert out.read_text() == '{"id": "a", "text": "x"}\n\n{"id": "b", "text": "y"}\n'
    assert done_ids(str(out)) == {"a", "b"} and out.read_text().endswith('"y"}\n')


@pytest.mark.parametrize("bad", ['{"id": "b", "te', '[1, 2]', '{"text": "no id"}'])
def test_done_ids_never_truncates_results_after_a_bad_line(tmp_path, bad):
    out = tmp_path / "o.jsonl"
    content = '{"id": "a", "text": "x"}\n' + bad + '\n{"id": "c", "text": "z"}\n'
    out.write_text(content)
    with pytest.raises(ValueError, match=r"o\.jsonl:2 is not a result line"):
        done_ids(str(out))
    assert out.read_text() == content
    out.write_text('{"id": "a", "text": "x"}\n' + bad)                # as the last line: torn only if it
    if bad.startswith('{"id": '):                                       # is the start of a result line
        assert done_ids(str(out)) == {"a"} and out.read_text() == '{"id": "a", "text": "x"}\n'
    else:
        with pytest.raises(ValueError, match=r"o\.jsonl:2 is not a result line"):
            done_ids(str(out))
        assert out.read_text() == '{"id": "a", "text": "x"}\n' + bad


@pytest.mark.parametrize("content", ["total,3\n", "some notes without a newline", '{"id": "r0", "foo": 1}\n',
                                     '{"id": "a", "text": "x"}\n{"id": "b", "te\n'])
def test_resume_never_truncates_a_file_that_is_not_ours(tmp_path, content):
    out = tmp_path / "o.jsonl"
    out.write_text(content)
    with pytest.raises(ValueError, match="is not a result line"):
        done_ids(str(out))
    assert out.read_text() == content


def test_input_and_output_errors(tmp_path, capsys):
    inp = tmp_path / "p.jsonl"
    inp.write_text('{"id": "a", "prompt": [1, 2]}\n')
    assert main(["--config", TINY, "--input", str(inp), "--output", str(inp), "--resume"]) == 2
    assert "is the --input file" in capsys.readouterr().err
    assert inp.read_text() == '{"id": "a", "prompt": [1, 2]}\n'
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    assert main(["--config", TINY, "--input", str(empty), "--output", str(tmp_path / "o.jsonl")]) == 2
    assert "holds no prompts" in capsys.readouterr().err


def test_bad_flags_exit_with_a_message(tmp_path, capsys):
    inp = tmp_path / "p.jsonl"
    inp.write_text('{"id": "a", "prompt": [1, 2]}\n')
    out = str(tmp_path / "o.jsonl")
    assert main(["--config", TINY, "--input", str(inp), "--output", out, "--set", "num_blocks=["]) == 2
    assert "--set 'num_blocks=[': the value is not valid YAML" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["--config", TINY, "--input", str(inp), "--output", out, "--resume", "--overwrite"])
    assert info.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_chat_flag_needs_text_prompts(tmp_path, cli_on_tiny_engine):
    inp = tmp_path / "p.jsonl"
    inp.write_text('{"id": "ids", "prompt": [1, 2]}\n{"id": "text", "prompt": "hi"}\n')
    out = tmp_path / "o.jsonl"
    assert main(["--config", TINY, "--input", str(inp), "--output", str(out), "--no-progress", "--chat",
                 "--skip-invalid", "--max-tokens", "2", "--ignore-eos", *TINY_CLI_SET]) == 0
    rows = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert rows["ids"]["error"].endswith("p.jsonl:1 (id 'ids'): --chat applies the chat template to text prompts; "
                                             "this prompt is token ids")
    assert len(rows["text"]["token_ids"]) == 2


def test_bad_request_is_reported_before_any_work(tmp_path, capsys):
    inp = tmp_path / "p.jsonl"
    inp.write_text('{"id": "ok", "prompt": [1, 2]}\n{"id": "bad", "prompt": [1], "temperature": -1}\n')
    out = tmp_path / "o.jsonl"
    code = main(["--config", TINY, "--input", str(inp), "--output", str(out), "--no-progress",
                 "--set", "max_num_batched_tokens=8"])
    assert code == 2
    err = capsys.readouterr().err
    assert "p.jsonl:2 (id 'bad')" in err and "temperature" in err
    assert not out.exists() or out.read_text() == ""


def test_prompt_errors_are_reported_before_the_engine_is_built(tmp_path, capsys, monkeypatch):
    import ms_atb.worker.model_runner

    def no_build(*args, **kwargs):
        raise AssertionError("the engine was built before the prompts were checked")

    monkeypatch.setattr(ms_atb.worker.model_runner, "ModelRunner", no_build)
    inp = tmp_path / "p.jsonl"
    out = tmp_path / "o.jsonl"
    args = ["--config", TINY, "--input", str(inp), "--output", str(out), "--no-progress", "--max-tokens", "3",
            "--set", "max_model_len=128", "--set", "max_num_batched_tokens=64"]
    for line, message in [('{"id": "long", "prompt": ' + json.dumps(list(range(300))) + '}', "max_model_len"),
                          ('{"id": "vocab", "prompt": [999999]}', "outside the vocabulary"),
                          ('{"id": "chat", "messages": [{"role": "user"}]}', "messages")]:
        inp.write_text('{"id": "ok", "prompt": [1, 2]}\n' + line + "\n")
        assert main(args + ["--overwrite"]) == 2
        err = capsys.readouterr().err
        assert "p.jsonl:2 (id " in err and message in err, err
    from ms_atb.llm import LLM
    unbuilt = LLM.prepare(TINY)
    with pytest.raises(ValueError, match="not built yet"):
        unbuilt.generate([[1, 2]])


def test_guided_choice_from_the_command_line_and_per_line(tmp_path, cli_on_tiny_engine):
    inp = tmp_path / "p.jsonl"
    inp.write_text('{"id": "flag", "prompt": [1, 2, 3]}\n'
                   '{"id": "own", "prompt": [1, 2, 3], "guided_choice": ["maybe"]}\n'
                   '{"id": "bad", "prompt": [4, 5], "guided_choice": ["yes"], "ignore_eos": true}\n')
    out = tmp_path / "o.jsonl"
    assert main(["--config", TINY, "--input", str(inp), "--output", str(out), "--no-progress", "--skip-invalid",
                 *TINY_CLI_SET, "--guided-choice", "yes", "no", "--bad-words", "n"]) == 0
    rows = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert rows["flag"]["text"] == "yes" and rows["flag"]["finish_reason"] == "stop"     # "no" is a bad word
    assert rows["own"]["text"] == "maybe"
    assert "guided_choice ends the request" in rows["bad"]["error"]


def test_beam_search_from_the_command_line(tmp_path, capsys, cli_on_tiny_engine, tiny_llm):
    from ms_atb import BeamSearchParams
    inp = tmp_path / "p.jsonl"
    inp.write_text('{"id": "a", "prompt": [1, 2, 3]}\n{"id": "b", "prompt": [9, 8, 7, 6], "max_tokens": 4}\n'
                   '{"id": "c", "prompt": [5], "temperature": 0.5}\n')
    out = tmp_path / "o.jsonl"
    args = ["--config", TINY, "--input", str(inp), "--output", str(out), "--no-progress", "--max-tokens", "6",
            *TINY_CLI_SET, "--beam-width", "3", "--length-penalty", "0.5"]
    assert main(args) == 2 and "under --beam-width a request may set only" in capsys.readouterr().err
    assert main(args + ["--skip-invalid", "--overwrite"]) == 0
    rows = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert "temperature" in rows["c"]["error"]
    for rid, prompt, n in (("a", [1, 2, 3], 6), ("b", [9, 8, 7, 6], 4)):
        want = tiny_llm.beam_search([prompt], BeamSearchParams(3, max_tokens=n, length_penalty=0.5), use_tqdm=False)[0]
        assert [b["token_ids"] for b in rows[rid]["beams"]] == [s.token_ids for s in want.sequences]
        assert rows[rid]["token_ids"] == want.sequences[0].token_ids and rows[rid]["num_prompt_tokens"] == len(prompt)
    assert main(args + ["--temperature", "0.7", "--overwrite"]) == 2
    assert "--beam-width takes only --max-tokens and --ignore-eos" in capsys.readouterr().err


def test_skip_invalid_writes_error_lines_and_runs_the_rest(tmp_path, capsys, cli_on_tiny_engine):
    inp = tmp_path / "p.jsonl"
    long = json.dumps([i % 500 + 1 for i in range(600)])         # over max_model_len (512)
    inp.write_text('{"id": "ok", "prompt": [1, 2, 3]}\n'
                   '{"id": "temp", "prompt": [1], "temperature": -1}\n'
                   'not json\n'
                   '{"id": "neither"}\n'
                   '{"id": "long", "prompt": ' + long + '}\n'
                   '{"id": "cut", "prompt": ' + long + ', "truncate_prompt_tokens": 10}\n'
                   '{"id": "vocab", "prompt": [999999]}\n')
    out = tmp_path / "o.jsonl"
    args = ["--config", TINY, "--input", str(inp), "--output", str(out), "--no-progress", "--max-tokens", "3",
            "--ignore-eos", *TINY_CLI_SET]
    assert main(args + ["--skip-invalid"]) == 0
    rows = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert sorted(rows) == ["cut", "line-3", "long", "neither", "ok", "temp", "vocab"]
    assert len(rows["ok"]["token_ids"]) == 3 and "error" not in rows["ok"]
    assert rows["cut"]["num_prompt_tokens"] == 10 and len(rows["cut"]["token_ids"]) == 3
    expected = {"temp": "p.jsonl:2 (id 'temp'): temperature", "line-3": "p.jsonl:3: not valid JSON",
                "neither": "p.jsonl:4: each line needs exactly one of", "long": "p.jsonl:5 (id 'long')",
                "vocab": "outside the vocabulary"}
    for rid, text in expected.items():
        assert text in rows[rid]["error"] and "text" not in rows[rid], rows[rid]
    assert "request " not in rows["long"]["error"]        # the line names it, not the engine's batch index
    assert "5 invalid written as error lines" in capsys.readouterr().err
    # --resume counts error lines as done; without --skip-invalid the first bad line stops the run.
    assert main(args + ["--skip-invalid", "--resume"]) == 0
    assert len(out.read_text().splitlines()) == 7
    assert main(args + ["--overwrite"]) == 2
    assert "p.jsonl:3: not valid JSON" in capsys.readouterr().err


def _cmd(inp, out, *extra):
    return [sys.executable, "-m", "ms_atb.batch.cli", "--config", TINY, "--input", str(inp), "--output", str(out),
            "--no-progress", "--max-tokens", "24", "--ignore-eos", "--set", "max_num_batched_tokens=16",
            "--set", "max_num_seqs=2", *extra]


@pytest.mark.slow
def test_killed_run_resumes_without_loss_or_duplicates(tmp_path):
    inp = tmp_path / "prompts.txt"
    inp.write_text("".join(f"prompt number {i}: tell me about item {i * 7}\n" for i in range(30)))
    out = tmp_path / "out.jsonl"
    env = dict(os.environ, MS_ATB_QUIET="1")
    proc = subprocess.Popen(_cmd(inp, out), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        if out.exists() and out.read_text().count("\n") >= 4:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    first = [json.loads(line)["id"] for line in out.read_text().splitlines() if line.endswith("}")]
    assert 4 <= len(first) < 30
    subprocess.run(_cmd(inp, out, "--resume"), env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=600)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    ids = [r["id"] for r in rows]
    assert sorted(ids) == sorted(f"line-{i}" for i in range(1, 31))      # every prompt exactly once
    assert ids[:len(first)] == first
    assert all(len(r["token_ids"]) == 24 and r["finish_reason"] == "length" for r in rows)


def test_interrupt_and_write_failure_keep_what_was_written(tmp_path, capsys, monkeypatch, cli_on_tiny_engine):
    from ms_atb.batch.job import BatchJob
    inp = tmp_path / "p.jsonl"
    inp.write_text("".join(f'{{"id": "r{i}", "prompt": [{i + 1}, 2, 3]}}\n' for i in range(4)))
    out = tmp_path / "o.jsonl"
    records = BatchJob._sample_lines

    def interrupted(*args):
        for n, record in enumerate(records(*args)):
            if n == 2:
                raise KeyboardInterrupt     # Ctrl-C, as the engine raises it
            yield record
    monkeypatch.setattr(BatchJob, "_sample_lines", interrupted)
    args = ["--config", TINY, "--input", str(inp), "--no-progress", "--max-tokens", "3", *TINY_CLI_SET]
    assert main(args + ["--output", str(out)]) == 130
    assert "rerun with --resume" in capsys.readouterr().err
    assert len(done_ids(str(out))) == 2
    monkeypatch.setattr(BatchJob, "_sample_lines", records)
    assert main(args + ["--output", str(out), "--resume"]) == 0
    assert done_ids(str(out)) == {"r0", "r1", "r2", "r3"}
    if os.path.exists("/dev/full"):                  # every write fails with ENOSPC
        assert main(args + ["--output", "/dev/full", "--overwrite"]) == 2
        assert "No space left on device); the results written before are kept" in capsys.readouterr().err


def test_batch_job_orders_by_prefix_and_computes_duplicates_once(tmp_path, cli_on_tiny_engine, tiny_llm, monkeypatch):
    # scheduler.policy "auto" is "prefix" in the batch job: exact greedy duplicates are computed once and
    # every id still gets its result, equal to the engine's own fcfs answer
    from ms_atb import SamplingParams
    from ms_atb.llm import LLM
    engines = []
    real_prepare = LLM.prepare.__func__

    def spy(cls, *args, **kwargs):
        engines.append(real_prepare(cls, *args, **kwargs))
        return engines[-1]
    monkeypatch.setattr(LLM, "prepare", classmethod(spy))
    prompt = list(range(1, 40))
    inp = tmp_path / "p.jsonl"
    inp.write_text("".join(json.dumps({"id": i, "prompt": prompt, "max_tokens": 6}) + "\n" for i in range(3)))
    out = tmp_path / "o.jsonl"
    assert main(["--config", TINY, "--input", str(inp), "--output", str(out), "--no-progress", *TINY_CLI_SET]) == 0
    rows = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert sorted(rows) == [0, 1, 2]
    (llm,) = engines
    assert llm.policy == "prefix" and llm.stats()["num_deduplicated"] == 2
    expected = tiny_llm.generate([prompt], SamplingParams(max_tokens=6, temperature=0.0), use_tqdm=False)[0]
    assert tiny_llm.policy == "fcfs"
    assert all(r["token_ids"] == expected.token_ids for r in rows.values())
