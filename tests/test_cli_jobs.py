"""ms-atb-generate as a job among others: one writer per output, ids written back with their JSON type,
standard input, and the exit status under SIGTERM and Ctrl-C."""
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from ms_atb.batch.cli import main
from ms_atb.batch.output_file import OutputLock, done_ids
from ms_atb.batch.item import BatchItem
from ms_atb.batch.prompt_file import read_requests
from engine_helpers import TINY_CLI_SET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "tiny_llama.yaml")
HOLD = textwrap.dedent("""
    import sys, time
    from ms_atb.batch.output_file import OutputLock
    lock = OutputLock(sys.argv[1])
    print("locked", flush=True)
    time.sleep(600)
""")


def _holder(out):
    """A process holding the lock of `out` (as a running job does)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_second_job_on_a_locked_output_exits_at_once(tmp_path, capsys):
    inp = tmp_path / "p.jsonl"
    inp.write_text('{"id": "a", "prompt": [1, 2]}\n')
    out = tmp_path / "o.jsonl"
    out.write_text('{"id": "x", "text": "kept"}\n')
    holder = _holder(out)
    try:
        for mode in ("--resume", "--overwrite"):
            t0 = time.perf_counter()
            assert main(["--config", TINY, "--input", str(inp), "--output", str(out), "--no-progress", mode]) == 2
            err = capsys.readouterr().err
            assert time.perf_counter() - t0 < 10
            assert f"--output {str(out)!r} is being written by another ms-atb-generate job" in err, err
            assert f"pid {holder.pid} on " in err and f"{out}.lock" in err
            assert out.read_text() == '{"id": "x", "text": "kept"}\n'          # neither cut nor appended to
    finally:
        holder.kill()
        holder.wait()


def test_a_lock_left_by_a_killed_job_does_not_block(tmp_path, capsys):
    out = tmp_path / "o.jsonl"
    holder = _holder(out)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    lock_file = tmp_path / "o.jsonl.lock"
    assert lock_file.read_text() == f"pid {holder.pid} on {os.uname().nodename}\n"    # left behind
    with OutputLock(str(out)):
        assert lock_file.read_text().startswith(f"pid {os.getpid()} on ")
    assert not lock_file.exists()                 # the holder removes it when done
    holder = _holder(out)                         # and a new job locks it again
    holder.kill()
    holder.wait()
    inp = tmp_path / "p.jsonl"                    # the command gets past the stale lock to the requests
    inp.write_text('{"id": "bad", "prompt": [1], "temperature": -1}\n')
    assert main(["--config", TINY, "--input", str(inp), "--output", str(out)]) == 2
    assert "temperature" in capsys.readouterr().err


def test_ids_keep_their_json_type(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": 7, "prompt": "a"}\n{"id": "7", "prompt": "b"}\n{"prompt": "c"}\n')
    assert [i.id for i in read_requests(str(path))] == [7, "7", "line-3"]
    path.write_text('{"id": 7, "prompt": "a"}\n{"id": 7, "prompt": "b"}\n')
    with pytest.raises(ValueError, match="id 7 appears more than once"):
        read_requests(str(path))
    out = tmp_path / "o.jsonl"
    out.write_text('{"id": 7, "text": "x"}\n{"id": "8", "error": "e"}\n')
    assert done_ids(str(out)) == {7, "8"} and "7" not in done_ids(str(out))


def _stdin(monkeypatch, data: bytes):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))


def test_stdin_text_or_jsonl_by_content(monkeypatch):
    _stdin(monkeypatch, b"\n  hello\nworld\\nagain\n")
    assert read_requests("-") == [BatchItem("line-2", 2, prompt="  hello"), BatchItem("line-3", 3, prompt="world\nagain")]
    _stdin(monkeypatch, b'\xef\xbb\xbf\n{"id": 1, "prompt": [1, 2]}\n{"prompt": "x"}\n')
    assert read_requests("-") == [BatchItem(1, 2, prompt=[1, 2]), BatchItem("line-3", 3, prompt="x")]
    _stdin(monkeypatch, b'{"prompt": "a"}\nnot json\n')
    with pytest.raises(ValueError, match="<stdin>:2: not valid JSON"):
        read_requests("-")
    _stdin(monkeypatch, b"\n \n")
    with pytest.raises(ValueError, match="--input '<stdin>' holds no prompts"):
        read_requests("-")


def test_stdin_run_writes_ids_back_as_given_and_resume_tells_7_from_quoted_7(tmp_path, monkeypatch,
                                                                              cli_on_tiny_engine):
    out = tmp_path / "o.jsonl"
    out.write_text('{"id": 7, "text": "done before", "token_ids": [1]}\n')
    lines = [{"id": 7, "prompt": [1, 2, 3]}, {"id": "7", "prompt": [4, 5]}, {"id": 8, "prompt": [6]},
             {"prompt": [9, 9]}]
    _stdin(monkeypatch, "".join(json.dumps(x) + "\n" for x in lines).encode())
    assert main(["--config", TINY, "--input", "-", "--output", str(out), "--resume", "--no-progress",
                 "--max-tokens", "2", "--ignore-eos", *TINY_CLI_SET]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0] == {"id": 7, "text": "done before", "token_ids": [1]}        # 7 ran before: skipped
    ran = {json.dumps(r["id"]): r for r in rows[1:]}
    assert sorted(ran) == ['"7"', '"line-4"', '8'] and all(len(r["token_ids"]) == 2 for r in ran.values())
    assert ran['"7"']["num_prompt_tokens"] == 2 and ran['8']["num_prompt_tokens"] == 1


def _cmd(inp, out):
    return [sys.executable, "-m", "ms_atb.batch.cli", "--config", TINY, "--input", str(inp), "--output", str(out),
            "--no-progress", "--max-tokens", "24", "--ignore-eos", "--set", "max_num_seqs=2",
            "--set", "max_num_batched_tokens=16", "--set", "max_model_len=128", "--set", "num_blocks=64"]


PROMPTS = 2000


def _signal_mid_run(tmp_path, signum, while_running=None):
    """Starts a job over PROMPTS prompts, sends it signum once a result is written; (exit status, lines, stderr).
    The job is long (minutes at two sequences a step) so that it is still running however fast the host is and
    however long while_running takes."""
    inp = tmp_path / "prompts.txt"
    inp.write_text("".join(f"prompt number {i}: tell me about item {i * 7}\n" for i in range(PROMPTS)))
    out = tmp_path / "out.jsonl"
    env = dict(os.environ, MS_ATB_QUIET="1")
    proc = subprocess.Popen(_cmd(inp, out), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None and not (out.exists() and b"\n" in out.read_bytes()):
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be signalled"
    if while_running is not None:
        while_running(inp, out)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    text = out.read_text()
    return proc.returncode, text, err


def _complete_results(text):
    assert text.endswith("\n")
    rows = [json.loads(line) for line in text.splitlines()]
    assert 1 <= len(rows) < PROMPTS
    assert all(len(r["token_ids"]) == 24 and r["finish_reason"] == "length" for r in rows)
    return rows


@pytest.mark.slow
def test_sigterm_exits_143_keeping_complete_lines_and_the_output_is_locked_meanwhile(tmp_path, capsys):
    def second_job(inp, out):
        before = out.read_bytes()
        assert main(["--config", TINY, "--input", str(inp), "--output", str(out), "--overwrite"]) == 2
        assert "is being written by another ms-atb-generate job" in capsys.readouterr().err
        assert out.read_bytes().startswith(before)                  # not truncated under the running job
    code, text, err = _signal_mid_run(tmp_path, signal.SIGTERM, second_job)
    assert code == 143, err[-2000:]
    assert "terminated (SIGTERM)" in err and "rerun with --resume" in err
    _complete_results(text)
    assert not (tmp_path / "out.jsonl.lock").exists()


@pytest.mark.slow
def test_ctrl_c_exits_130_keeping_complete_lines(tmp_path):
    code, text, err = _signal_mid_run(tmp_path, signal.SIGINT)
    assert code == 130, err[-2000:]
    assert "interrupted; the results written so far" in err
    _complete_results(text)


def test_the_command_starts_no_thread_before_it_watches_signals():
    """watch_signals blocks SIGTERM for the threads started after it; one started before would take a SIGTERM
    itself and Ctrl-C would exit 143 (numpy's BLAS pool starts threads when numpy is imported)."""
    code = "import os, sys, ms_atb.batch.cli; print(len(os.listdir('/proc/self/task')), 'numpy' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.split() == ["1", "False"]
