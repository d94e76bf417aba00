"""ms-atb-generate against a hostile neighbour and hostile input: locks that follow the file, side files that
never follow links, ids and models that are not valid Unicode, JSON nested without end, full disks, and a
complete line that only looks torn."""
import errno
import json
import os
import subprocess
import sys
import textwrap

import pytest

from ms_atb.batch import replicas
from ms_atb.batch.cli import main
from ms_atb.batch.output_file import OutputLock, done_ids
from engine_helpers import TINY_CLI_SET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "tiny_llama.yaml")
HOLD = textwrap.dedent("""
    import sys, time
    from ms_atb.batch.output_file import OutputLock
    lock = OutputLock(sys.argv[1], job=sys.argv[2] if len(sys.argv) > 2 else None)
    if len(sys.argv) > 2:
        lock.share(2)                      # rank 0 of a data-parallel job, its replicas running
    print("locked", flush=True)
    time.sleep(600)
""")
CHAT = "/v1/chat/completions"


def _holder(*argv):
    proc = subprocess.Popen([sys.executable, "-c", HOLD, *map(str, argv)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def _args(inp, out, *more):
    return ["--config", TINY, "--input", str(inp), "--output", str(out), "--no-progress", "--max-tokens", "2",
            *TINY_CLI_SET, *more]


def _prompts(tmp_path, n=2):
    inp = tmp_path / "p.jsonl"
    inp.write_text("".join(json.dumps({"id": f"r{i}", "prompt": [i + 1, 2, 3]}) + "\n" for i in range(n)))
    return inp


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_the_lock_follows_the_file_not_the_text_of_its_path(tmp_path, capsys, link):
    out = tmp_path / "out.jsonl"
    out.write_text('{"id": "x", "text": "kept"}\n')
    other = tmp_path / "other.jsonl"
    (os.symlink if link == "symlink" else os.link)(out, other)
    holder = _holder(out)
    try:
        for mode in ("--resume", "--overwrite"):
            assert main(_args(_prompts(tmp_path), other, mode)) == 2
            assert "is being written by another ms-atb-generate job" in capsys.readouterr().err
            assert out.read_text() == '{"id": "x", "text": "kept"}\n'
    finally:
        holder.kill()
        holder.wait()


def test_a_single_process_job_waits_for_no_data_parallel_job(tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    holder = _holder(out, "msrun 127.0.0.1:1")          # a dp job's rank 0, sharing the lock with its replicas
    try:
        assert main(_args(_prompts(tmp_path), out, "--resume")) == 2
        assert "is being written by another ms-atb-generate job" in capsys.readouterr().err
        assert not out.exists()
        with pytest.raises(ValueError, match="did not take its lock"):    # another job's replica cannot join
            OutputLock.join(str(out), "msrun 127.0.0.1:2", 1, timeout=0.3)
        joined = OutputLock.join(str(out), "msrun 127.0.0.1:1", 1, timeout=5)   # its own replica does
        joined.release()
    finally:
        holder.kill()
        holder.wait()


def test_a_side_file_that_is_a_link_is_refused_and_its_target_untouched(tmp_path, capsys):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    out = tmp_path / "out.jsonl"
    os.symlink(victim, str(out) + ".lock")
    assert main(_args(_prompts(tmp_path), out)) == 2
    assert "is a symbolic link" in capsys.readouterr().err
    assert victim.read_text() == "precious\n" and not out.exists()
    os.unlink(str(out) + ".lock")
    os.link(victim, str(out) + ".lock")                   # another name of someone else's file
    assert main(_args(_prompts(tmp_path), out)) == 2
    assert "is not a side file" in capsys.readouterr().err
    assert victim.read_text() == "precious\n"


def test_merge_never_writes_through_a_linked_side_file(tmp_path, capsys):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    inp = _prompts(tmp_path)
    out = tmp_path / "out.jsonl"
    for k in range(2):
        with open(replicas.part_path(str(out), k, 2), "w") as f:
            f.write(json.dumps({"id": f"r{k}", "text": "t", "token_ids": [1]}) + "\n")
    os.symlink(victim, str(out) + ".merging")
    assert main(["--input", str(inp), "--output", str(out), "--merge"]) == 2
    assert "is a symbolic link" in capsys.readouterr().err
    assert victim.read_text() == "precious\n" and not out.exists() and not os.path.islink(out)
    os.unlink(str(out) + ".merging")
    assert main(["--input", str(inp), "--output", str(out), "--merge"]) == 0
    assert not os.path.islink(out) and [json.loads(x)["id"] for x in out.read_text().splitlines()] == ["r0", "r1"]


def test_ids_and_models_that_are_not_valid_unicode_get_lines_not_tracebacks(tmp_path, capsys, cli_on_tiny_engine):
    inp = tmp_path / "batch.jsonl"
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    lines = [{"custom_id": "\udc80", "method": "POST", "url": CHAT, "body": body},
             {"custom_id": "m", "method": "POST", "url": CHAT, "body": {**body, "model": "x\udc80"}},
             {"custom_id": "p", "method": "POST", "url": CHAT,
              "body": {**body, "messages": [{"role": "user", "content": "a\ud800b"}]}}]
    inp.write_text("".join(json.dumps(x) + "\n" for x in lines))          # JSON escapes: valid JSON, not Unicode
    out = tmp_path / "out.jsonl"
    assert main(_args(inp, out)) == 0, capsys.readouterr().err
    rows = {json.loads(x)["custom_id"]: json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()}
    assert rows["\udc80"]["response"]["status_code"] == 200                 # the id round-trips, escaped
    assert rows["m"]["response"]["body"]["model"] == "x\udc80"
    assert rows["p"]["response"] is None and "not valid Unicode" in rows["p"]["error"]["message"]
    assert main(_args(inp, out, "--resume")) == 0                           # every id counts as done
    assert "0 requests to run (3 already in" in capsys.readouterr().err
    ours = tmp_path / "ours.jsonl"
    ours.write_text(json.dumps({"id": "\udc81", "prompt": [1, 2], "temperature": -1}) + "\n"
                    + json.dumps({"id": "ok", "prompt": [1, 2]}) + "\n")
    assert main(_args(ours, tmp_path / "ours_out.jsonl", "--skip-invalid")) == 0
    assert done_ids(str(tmp_path / "ours_out.jsonl")) == {"\udc81", "ok"}


def test_json_nested_without_end_is_an_error_line_or_a_clear_error(tmp_path, capsys, cli_on_tiny_engine):
    deep = "[" * 5000 + "]" * 5000
    ours = tmp_path / "ours.jsonl"
    ours.write_text('{"id": "a", "prompt": [1, 2]}\n{"id": "b", "prompt": ' + deep + "}\n")
    out = tmp_path / "out.jsonl"
    assert main(_args(ours, out)) == 2
    assert "ours.jsonl:2: not valid here: nested more than" in capsys.readouterr().err
    assert main(_args(ours, out, "--skip-invalid")) == 0
    assert done_ids(str(out)) == {"a", "line-2"}
    batch = tmp_path / "batch.jsonl"
    batch.write_text(json.dumps({"custom_id": "a", "method": "POST", "url": CHAT,
                                 "body": {"messages": [{"role": "user", "content": "x"}]}}) + "\n"
                     + '{"custom_id": "b", "body": ' + deep + "}\n")
    assert main(_args(batch, tmp_path / "b_out.jsonl")) == 0
    rows = [json.loads(x) for x in (tmp_path / "b_out.jsonl").read_text().splitlines()]
    assert {r["error"]["code"] for r in rows if r["error"]} == {"invalid_json_line"}
    out.write_text(out.read_text() + '{"id": "c", "text": ' + deep + "}\n")      # a deep line in the output
    assert main(_args(ours, out, "--resume", "--skip-invalid")) == 2
    assert "is not a result line" in capsys.readouterr().err


def test_a_complete_line_without_its_newline_is_never_cut(tmp_path):
    out = tmp_path / "o.jsonl"
    out.write_text('{"id": 1}')                                # parses, but is not a result: not ours to cut
    with pytest.raises(ValueError, match="is not a result line"):
        done_ids(str(out))
    assert out.read_text() == '{"id": 1}'
    out.write_text('{"id": 1, "text": "x"}')                  # a whole result that lost only its newline
    assert done_ids(str(out)) == {1} and out.read_text() == '{"id": 1, "text": "x"}\n'


def test_resume_on_a_full_disk_is_a_clear_error_and_leaves_no_lock_file(tmp_path, capsys, monkeypatch):
    from ms_atb.batch import output_file
    out = tmp_path / "o.jsonl"
    out.write_text('{"id": "r0", "text": "x"}')                # its lost newline must be written back

    def full_disk_open(path, mode="r", *args, **kwargs):
        if "a" in mode or "+" in mode:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return open(path, mode, *args, **kwargs)
    monkeypatch.setattr(output_file, "open", full_disk_open, raising=False)
    assert main(_args(_prompts(tmp_path), out, "--resume")) == 2
    err = capsys.readouterr().err
    assert "cannot repair its last line for --resume (No space left on device)" in err, err
    assert not (tmp_path / "o.jsonl.lock").exists()
    monkeypatch.setattr(output_file.os, "write", lambda fd, data: full_disk_open("", "a"))
    assert main(_args(_prompts(tmp_path), tmp_path / "new.jsonl")) == 2      # not even the lock file's line fits
    assert "cannot write its lock file" in capsys.readouterr().err
    assert not (tmp_path / "new.jsonl.lock").exists()
