"""ms-atb-generate's start-up: run as its own process it holds the collector off until the engine is built, then
freezes what exists (the engine lives as long as the process); called as a function, in a process that goes on,
it leaves the collector alone."""
import gc
import json
import os
import sys

from ms_atb.batch import cli
from engine_helpers import TINY_CLI_SET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "tiny_llama.yaml")


def test_only_the_commands_own_process_freezes_the_collector(tmp_path, cli_on_tiny_engine, monkeypatch):
    frozen = []
    monkeypatch.setattr(cli.gc, "freeze", lambda: frozen.append(gc.isenabled()))   # collector off until then
    monkeypatch.setattr(cli, "watch_signals", lambda: None)        # the test process keeps its own handlers
    inp, out = tmp_path / "p.txt", tmp_path / "o.jsonl"
    inp.write_text("hello\n")
    argv = ["--config", TINY, "--input", str(inp), "--output", str(out), "--overwrite", "--no-progress",
            "--max-tokens", "2", "--ignore-eos", *TINY_CLI_SET]
    assert cli.main(argv) == 0 and frozen == [] and gc.isenabled()
    called = json.loads(out.read_text())
    monkeypatch.setattr(sys, "argv", ["ms-atb-generate"] + argv)
    try:
        assert cli.main() == 0 and frozen == [False] and gc.isenabled()    # collecting again once built
    finally:
        gc.enable()
    assert json.loads(out.read_text())["token_ids"] == called["token_ids"] and len(called["token_ids"]) == 2
