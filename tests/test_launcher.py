"""scripts/msrun_generate.sh: a SIGTERM to the launcher ends the whole msrun job, and nothing of it is left."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "tiny_llama.yaml")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _processes_with(marker: str) -> dict[int, str]:
    """{pid: command line} of every live process whose command line contains `marker`."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if marker in cmd and state != "Z" and int(pid) != os.getpid():
            found[int(pid)] = cmd
    return found


def _wait_for(predicate, timeout: float, step: float = 0.2) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


@pytest.mark.slow
def test_sigterm_ends_the_whole_job_and_leaves_nothing(tmp_path):
    marker = str(tmp_path)                 # in the command line of msrun, its workers and its tails
    inp, out, log_dir = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "log"
    inp.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"prompt {i} " * 4}) + "\n" for i in range(400)))
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
               MS_ATB_QUIET="1")
    for name in ("MS_WORKER_NUM", "MS_ROLE", "MS_NODE_ID", "RANK_ID"):
        env.pop(name, None)
    launcher = subprocess.Popen(
        ["bash", os.path.join(ROOT, "scripts", "msrun_generate.sh"), "-n", "2", "--master-port", str(_free_port()),
         "--log-dir", str(log_dir), "--", "--config", TINY, "--input", str(inp), "--output", str(out),
         "--max-tokens", "200", "--ignore-eos", "--no-progress"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        workers = lambda: [p for p, c in _processes_with(marker).items() if "generate.py" in c and "msrun" not in c]
        assert _wait_for(lambda: len(workers()) >= 2, 120), _processes_with(marker)
        time.sleep(3)                                   # let them get going
        assert launcher.poll() is None, "the job ended before it could be stopped: give it more work"
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=30) == 143
        assert _wait_for(lambda: not _processes_with(marker), 5), _processes_with(marker)
        size = out.stat().st_size if out.exists() else 0
        time.sleep(2)
        assert (out.stat().st_size if out.exists() else 0) == size
    finally:
        for pid in _processes_with(marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.killpg(launcher.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
