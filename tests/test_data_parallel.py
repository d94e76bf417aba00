"""Data parallelism: the split is deterministic and balanced by prompt tokens; the merge writes every id once in
input order from the output and its parts, keeps the parts while an id is missing, and leaves a torn line out;
--resume skips ids done in parts or the merged output; the launch is checked against dp x tp. Under msrun
(slow): dp=2 writes the output of a single process, and a replica killed mid-run loses no written line and
--resume completes the job."""
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from ms_atb.batch import replicas
from ms_atb.batch.cli import main
from ms_atb.worker.distributed import init_distributed, replica_index
from engine_helpers import TINY_CLI_SET, TINY_CONFIG


def result(rid, tokens=(1, 2)) -> bytes:
    return (json.dumps({"id": rid, "text": "x", "token_ids": list(tokens)}) + "\n").encode()


def write(path, *lines: bytes):
    with open(path, "wb") as f:
        f.write(b"".join(lines))


# ---------------------------------------------------------------- the split

def test_split_is_deterministic_and_balanced_by_prompt_tokens():
    rng = random.Random(0)
    tokens = [rng.choice([4, 8, 300, 900]) for _ in range(101)]
    for n in (1, 2, 3, 8):
        shares = replicas.split(tokens, n)
        assert shares == replicas.split(list(tokens), n)               # a function of its input
        assert sorted(i for s in shares for i in s) == list(range(len(tokens)))    # every request once
        assert all(s == sorted(s) for s in shares)                           # input order within a share
        loads = [sum(tokens[i] for i in s) for s in shares]
        assert max(loads) - min(loads) <= max(tokens)                        # balanced by tokens ...
    # ... not by line count: one long prompt weighs as much as many short ones.
    shares = replicas.split([1000] + [10] * 100, 2)
    assert shares[0] == [0] and len(shares[1]) == 100


def test_split_with_more_replicas_than_requests_and_bad_sizes():
    assert replicas.split([5, 3], 4) == [[0], [1], [], []]
    with pytest.raises(ValueError, match="data_parallel_size must be an int >= 1"):
        replicas.split([1], 0)


def test_part_paths_name_and_find_parts_of_any_layout(tmp_path):
    out = str(tmp_path / "o[1].jsonl")                 # glob characters in the name are literal
    for k, n in ((1, 2), (0, 2), (0, 3)):
        write(replicas.part_path(out, k, n), result(k))
    write(replicas.part_path(out, 0, 2) + ".lock", b"pid 1\n")
    write(out + ".partial", b"")
    assert replicas.part_paths(out) == [out + ".part0-of-2", out + ".part1-of-2", out + ".part0-of-3"]


# ---------------------------------------------------------------- the merge

def test_merge_writes_input_order_every_id_once_and_removes_the_parts(tmp_path):
    out = str(tmp_path / "out.jsonl")
    ids = ["a", 7, "7", "b", "c"]
    write(out, result("c"))                                            # merged earlier
    write(replicas.part_path(out, 0, 2), result("b"), result("a"))
    write(replicas.part_path(out, 1, 2), result("7"), result(7), result("c", (9,)))
    merged = replicas.merge(out, ids)
    assert merged.missing == [] and merged.num_written == 5
    lines = [json.loads(x) for x in open(out)]
    assert [x["id"] for x in lines] == ids                              # 7 and "7" are two ids
    assert lines[-1]["token_ids"] == [1, 2]                             # the output's line came first
    assert replicas.part_paths(out) == [] and not os.path.exists(out + ".merging")


def test_merge_with_a_missing_or_torn_part_keeps_the_parts(tmp_path):
    out = str(tmp_path / "out.jsonl")
    ids = ["a", "b", "c", "d"]
    torn = result("a") + result("c")[:-9]                                        # torn by a kill
    write(replicas.part_path(out, 0, 3), torn)
    write(replicas.part_path(out, 2, 3), result("d"))                       # part 1 never started
    merged = replicas.merge(out, ids)
    assert merged.missing == ["b", "c"]
    assert [json.loads(x)["id"] for x in open(out)] == ["a", "d"]      # complete lines only
    assert len(replicas.part_paths(out)) == 2                     # kept for --resume
    assert open(replicas.part_path(out, 0, 3), "rb").read() == torn         # parts are not changed
    write(replicas.part_path(out, 1, 3), b"not json\n")
    with pytest.raises(ValueError, match=r"part1-of-3:1 is not a result line"):
        replicas.merge(out, ids)


def test_merge_command(tmp_path, capsys):
    inp, out = tmp_path / "in.jsonl", str(tmp_path / "out.jsonl")
    inp.write_text("".join(json.dumps({"id": i, "prompt": [1, 2]}) + "\n" for i in ("x", "y")))
    with pytest.raises(SystemExit):
        main(["--input", str(inp), "--output", out])                    # --config is needed to generate
    assert main(["--merge", "--input", str(inp), "--output", out]) == 2
    assert "has no part files" in capsys.readouterr().err
    write(replicas.part_path(out, 1, 2), result("y"))
    assert main(["--merge", "--input", str(inp), "--output", out]) == 1
    assert "1 input ids have no result (first 'x')" in capsys.readouterr().err
    write(replicas.part_path(out, 0, 2), result("x"))
    assert main(["--merge", "--input", str(inp), "--output", out]) == 0
    assert [json.loads(x)["id"] for x in open(out)] == ["x", "y"] and replicas.part_paths(out) == []


# ---------------------------------------------------------------- resume and launch checks

def test_resume_skips_ids_done_in_parts_or_the_merged_output(cli_on_tiny_engine, tmp_path, capsys):
    """A single process (data_parallel_size 1) resuming a data-parallel job: what the parts and the output
    hold is not run again, the rest is, and the end merges everything in input order."""
    inp, out = tmp_path / "in.jsonl", str(tmp_path / "out.jsonl")
    ids = [f"r{i}" for i in range(5)]
    inp.write_text("".join(json.dumps({"id": rid, "prompt": [3 + i, 5, 7]}) + "\n" for i, rid in enumerate(ids)))
    write(replicas.part_path(out, 0, 2), result("r0", (42,)), result("r4")[:-5])     # r4 torn
    write(replicas.part_path(out, 1, 2), result("r1", (42,)))
    argv = ["--config", TINY_CONFIG, "--input", str(inp), "--output", out, "--max-tokens", "3",
            "--ignore-eos", "--no-progress"] + TINY_CLI_SET
    assert main(argv) == 2
    assert "has the part file" in capsys.readouterr().err              # neither --resume nor --overwrite
    write(out, result("r3", (42,)))
    assert main(argv + ["--resume"]) == 0
    assert "2 requests to run (3 already in" in capsys.readouterr().err
    lines = [json.loads(x) for x in open(out)]
    assert [x["id"] for x in lines] == ids
    assert [x["id"] for x in lines if x["token_ids"] == [42]] == ["r0", "r1", "r3"]    # kept, not rerun
    assert all(len(x["token_ids"]) == 3 for x in lines if x["id"] in ("r2", "r4"))
    assert replicas.part_paths(out) == []


def test_launch_is_checked_against_dp_times_tp(monkeypatch):
    for name in ("MS_WORKER_NUM", "RANK_TABLE_FILE", "MS_ROLE", "RANK_ID"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="data_parallel_size 2 needs one process per rank: launch with msrun "
                                         "--worker_num=2"):
        init_distributed(1, 2)
    with pytest.raises(ValueError, match="data_parallel_size must be an int >= 1"):
        init_distributed(1, 0)
    monkeypatch.setenv("MS_WORKER_NUM", "4")
    with pytest.raises(ValueError, match="tensor_parallel_size 1 x data_parallel_size 2 does not match the "
                                         "msrun world size 4"):
        init_distributed(1, 2)
    with pytest.raises(ValueError, match="set data_parallel_size=4"):
        init_distributed(1, 1)
    monkeypatch.setenv("MS_WORKER_NUM", "2")
    monkeypatch.setenv("RANK_ID", "1")
    assert init_distributed(1, 2) == 0 and replica_index(1, 2) == 1     # no communicator for tp 1
    monkeypatch.setenv("MS_ROLE", "MS_SCHED")
    with pytest.raises(SystemExit) as stopped:                         # msrun's scheduler has no job
        init_distributed(1, 2)
    assert stopped.value.code == 0


# ---------------------------------------------------------------- under msrun

MSRUN_TIMEOUT = 300


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_job(argv: list[str], log_dir) -> subprocess.Popen:
    """scripts/msrun_generate.sh --dp 2 -n 1 in a process group of its own."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    bin_dir = os.path.dirname(sys.executable)
    env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""), MS_ATB_QUIET="1")
    for name in ("MS_WORKER_NUM", "MS_ROLE", "MS_NODE_ID", "RANK_ID"):
        env.pop(name, None)
    command = ["bash", os.path.join(root, "scripts", "msrun_generate.sh"), "-n", "1", "--dp", "2",
               "--master-port", str(_free_port()), "--log-dir", str(log_dir), "--"] + argv
    return subprocess.Popen(command, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def _finish(proc: subprocess.Popen) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=MSRUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"the msrun job ran over {MSRUN_TIMEOUT} s\n{out[-3000:]}")
    return proc.returncode, out


def _complete_lines(path) -> list[dict]:
    with open(path, "rb") as f:
        return [json.loads(raw) for raw in f if raw.endswith(b"\n")]     # a torn last line may follow


@pytest.mark.slow
def test_dp2_under_msrun_killed_replica_then_resume_equals_one_process(cli_on_tiny_engine, tmp_path, capsys):
    inp, ref, out = tmp_path / "in.jsonl", str(tmp_path / "ref.jsonl"), str(tmp_path / "out.jsonl")
    rng = random.Random(4)
    ids = [f"p{i}" for i in range(40)]      # 20 a replica, 8 at a time: replica 1 still runs after its first line
    inp.write_text("".join(json.dumps({"id": rid, "prompt": [rng.randrange(500) for _ in range(rng.randrange(3, 40))]})
                           + "\n" for rid in ids))
    argv = ["--config", TINY_CONFIG, "--input", str(inp), "--max-tokens", "12", "--ignore-eos",
            "--no-progress"] + TINY_CLI_SET
    assert main(argv + ["--output", ref]) == 0                       # one process: the reference
    want = {x["id"]: x["token_ids"] for x in _complete_lines(ref)}
    capsys.readouterr()

    # Replica 1 is killed once it has written a line: msrun ends replica 0, the job fails naming rank 1.
    job = _start_job(argv + ["--output", out], tmp_path / "log1")
    part1 = replicas.part_path(out, 1, 2)
    end = time.monotonic() + MSRUN_TIMEOUT
    while job.poll() is None and time.monotonic() < end and not (
            os.path.exists(part1) and len(_complete_lines(part1)) >= 1):
        time.sleep(0.05)
    with open(part1 + ".lock") as f:                                # "pid P on host": replica 1's writer
        os.kill(int(f.read().split()[1]), signal.SIGKILL)
    t_kill = time.monotonic()
    rc, log = _finish(job)
    assert rc != 0, log[-3000:]
    assert "rank 1 failed first" in log, log[-3000:]
    assert time.monotonic() - t_kill < 60                           # the survivor was stopped, not waited for
    kept = {}
    for k in (0, 1):
        lines = _complete_lines(replicas.part_path(out, k, 2))    # every written line is a whole result
        assert all(x["token_ids"] == want[x["id"]] for x in lines)
        kept.update((x["id"], x) for x in lines)
    assert 1 <= len(kept) < len(ids) and not os.path.exists(out)      # part of the job, not merged

    # --resume runs only what is missing; the last replica merges: the single process's output, in input order.
    rc, log = _finish(_start_job(argv + ["--output", out, "--resume"], tmp_path / "log2"))
    assert rc == 0, log[-3000:]
    with open(tmp_path / "log2" / "worker_0.log") as f0, open(tmp_path / "log2" / "worker_1.log") as f1:
        runs = [int(ln.split(": ")[1].split()[0]) for ln in f0.read().splitlines() + f1.read().splitlines()
                if "requests to run" in ln]
    assert sum(runs) == len(ids) - len(kept)
    lines = _complete_lines(out)
    assert [x["id"] for x in lines] == ids
    assert {x["id"]: x["token_ids"] for x in lines} == want
    assert replicas.part_paths(out) == []
