"""The KV disk tier in batch jobs (ms-atb-generate --set disk_cache_dir=...): a job resumed after a SIGKILL
recomputes no prefix block that had reached the tier, and the replicas of a data-parallel job under msrun read
each other's prefixes."""
import json
import os
import random
import re
import signal
import subprocess
import sys
import time

import pytest

from ms_atb.batch.cli import main
from ms_atb.worker.tier_writer import TierWriter
from engine_helpers import TINY_CLI_SET, TINY_CONFIG

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _job(inp, out, disk, *extra):
    return ["--config", TINY_CONFIG, "--input", str(inp), "--output", str(out), "--no-progress", "--max-tokens", "8",
            "--ignore-eos", "--set", f"disk_cache_dir={disk}", *TINY_CLI_SET, *extra]


def _block_files(disk) -> set[str]:
    return {p.name for p in (disk / "blocks").iterdir() if p.suffix == ".kv"}


@pytest.mark.slow
def test_a_resumed_job_recomputes_no_block_that_reached_the_tier(tmp_path, monkeypatch, capsys):
    rng = random.Random(7)
    system = [rng.randrange(500) for _ in range(70)]           # 4 whole blocks shared by every prompt
    inp = tmp_path / "in.jsonl"
    prompts = [system + [rng.randrange(500) for _ in range(rng.randrange(20, 60))] for _ in range(40)]
    inp.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n" for i, p in enumerate(prompts)))
    # prefix blocks: whole blocks of prompt tokens only (a block a killed request filled with generated tokens is
    # computed again when the request reruns: its outputs were not kept)
    prefixes = {tuple(p[:k]) for p in prompts for k in range(16, len(p) + 1, 16)}
    out, disk = tmp_path / "out.jsonl", tmp_path / "kv"
    env = dict(os.environ, MS_ATB_QUIET="1")
    proc = subprocess.Popen([sys.executable, "-m", "ms_atb.batch.cli", *_job(inp, out, disk, "--set", "max_num_seqs=2")],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None and not (out.exists() and out.read_text().count("\n") >= 6):
        time.sleep(0.05)
    assert proc.poll() is None, "the job ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = out.read_text().count("\n")
    on_disk = _block_files(disk)
    assert 6 <= done < 40 and len(on_disk) >= 4

    computed = []                                  # the hash of every prefix block the resumed job computes
    real_put = TierWriter.put

    def put(self, stores, data, used=()):
        computed.extend(f"{s.hash.hex()}.kv" for s in stores if tuple(s.token_ids[:s.num_tokens]) in prefixes)
        return real_put(self, stores, data, used)
    monkeypatch.setattr(TierWriter, "put", put)
    capsys.readouterr()
    assert main(_job(inp, out, disk, "--resume")) == 0
    err = capsys.readouterr().err
    assert computed and not set(computed) & on_disk             # no prefix block that had reached the tier
    hit = _disk_hits(err)
    assert hit >= 4 * 16, err                                   # the shared system prompt came from the tier
    assert len(out.read_text().splitlines()) == 40


def _disk_hits(summary: str) -> int:
    """The prompt tokens a job's summary says it read from the KV disk tier."""
    return int(re.search(r"KV disk tier +(\d+) prompt tokens read", summary).group(1))


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_the_replicas_of_a_dp_job_read_each_others_prefixes(tmp_path):
    # Replica 0 runs groups 0..11 in order and replica 1 groups 11..0 (the split sends the equal-length copies of
    # each group to both replicas): whichever reaches a group second finds its prefix in the tier.
    rng = random.Random(3)
    groups = [[rng.randrange(500) for _ in range(64 + 8 * (11 - g))] for g in range(12)]
    lines = [groups[g] + [1, 2, 3] for g in range(12)] + [groups[g] + [4, 5, 6] for g in reversed(range(12))]
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"id": f"q{i}", "prompt": p}) + "\n" for i, p in enumerate(lines)))
    disk, out, log = tmp_path / "kv", tmp_path / "out.jsonl", tmp_path / "log"
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    for name in ("MS_WORKER_NUM", "MS_ROLE", "MS_NODE_ID", "RANK_ID"):
        env.pop(name, None)
    command = ["bash", os.path.join(ROOT, "scripts", "msrun_generate.sh"), "-n", "1", "--dp", "2",
               "--master-port", str(_free_port()), "--log-dir", str(log), "--",
               *_job(inp, out, disk, "--set", "policy=fcfs", "--set", "max_num_seqs=1")]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
                          start_new_session=True)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    hits = []
    for k in (0, 1):
        text = (log / f"worker_{k}.log").read_text()
        hits.append(_disk_hits(text))
    assert sum(hits) >= 4 * 4 * 16, hits                        # at least 4 groups' 4 whole blocks each
    assert len(out.read_text().splitlines()) == 24


@pytest.mark.slow
def test_tensor_parallel_ranks_keep_their_shards_and_agree_on_hits(tmp_path):
    # TP=2 under msrun, twice on one directory: each rank keeps its own shard of every block (its identity names
    # the rank), and the second job reads them back on both ranks (the ranks agree on each fetch's count), with
    # the first job's tokens and every step's sampled tokens checked equal across ranks (MS_ATB_DEBUG=1).
    rng = random.Random(11)
    system = [rng.randrange(500) for _ in range(50)]
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"id": f"t{i}", "prompt": system + [rng.randrange(500) for _ in range(9 + i)]})
                           + "\n" for i in range(6)))
    disk = tmp_path / "kv"
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
               MS_ATB_DEBUG="1")
    for name in ("MS_WORKER_NUM", "MS_ROLE", "MS_NODE_ID", "RANK_ID"):
        env.pop(name, None)
    outputs, hits = [], []
    for k in range(2):
        out, log = tmp_path / f"out{k}.jsonl", tmp_path / f"log{k}"
        command = ["bash", os.path.join(ROOT, "scripts", "msrun_generate.sh"), "-n", "2", "--master-port",
                   str(_free_port()), "--log-dir", str(log), "--", *_job(inp, out, disk)]
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
                              start_new_session=True)
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        outputs.append({x["id"]: x["token_ids"] for x in map(json.loads, out.read_text().splitlines())})
        hits.append(_disk_hits((log / "worker_0.log").read_text()))
        if k == 0:
            shards = len(_block_files(disk))
    assert outputs[0] == outputs[1] and len(outputs[0]) == 6
    assert hits[0] == 0 and hits[1] >= 3 * 16
    assert shards % 2 == 0 and len(_block_files(disk)) == shards       # one file per block and rank, none new
