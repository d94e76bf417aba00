"""The benchmark scripts refuse bad arguments with an argparse error (exit 2) before any work."""
import shutil
import socket
import subprocess
import sys

import pytest

from scripts_import import SCRIPTS, load_script


def run_main(script, args, monkeypatch, capsys):
    """The script's main() in this process with argv [script, *args]: its exit status and stderr."""
    module = load_script(script.removesuffix(".py"))
    monkeypatch.setattr(sys, "argv", [script, *args])
    with pytest.raises(SystemExit) as info:
        module.main()
    return info.value.code, capsys.readouterr().err

CASES = [
    ("bench_block_manager.py", ["--steps", "1"], "--steps must be >= 4"),
    ("bench_kv.py", ["--prompt", "20", "10"], "--prompt LO HI needs 1 <= LO <= HI"),
    ("bench_kv.py", ["--ttft-requests", "1"], "--ttft-requests must be >= 2"),
    ("bench_throughput.py", ["--repeats", "0"], "--repeats must be >= 1, got 0"),
    ("bench_throughput.py", ["--set", "foo"], "--set expects KEY=VALUE, got 'foo'"),
    ("research/placement_variants.py", ["--seeds", "3-1"], "--seeds takes a seed or a range LO-HI"),
    ("research/placement_variants.py", ["--steps", "1"], "--steps must be >= 4"),
    ("research/placement_lookahead.py", ["--seeds", "abc"], "--seeds takes a seed or a range LO-HI"),
    ("research/placement_lookahead.py", ["--horizon", "-3"], "--horizon must be >= 1"),
    ("soak.py", ["--requests", "0"], "--requests must be >= 1, got 0"),
    ("soak.py", ["--small-blocks", "8"], "--small-blocks must be >= 16 (one request of max_model_len 256)"),
    ("soak.py", ["--small-blocks", "300"], "--small-blocks must be <= 256"),
]


@pytest.mark.parametrize("script, args, message", CASES)
def test_bad_arguments_exit_2_with_a_message(script, args, message, monkeypatch, capsys):
    code, err = run_main(script, args, monkeypatch, capsys)       # any other exception fails the test
    assert code == 2 and message in err and "Traceback" not in err, err


def test_an_output_that_cannot_be_written_is_refused_first(tmp_path, monkeypatch, capsys):
    (tmp_path / "afile").write_text("")
    for script in ("bench_throughput.py", "bench_kv.py"):
        code, err = run_main(script, ["--json", str(tmp_path / "afile" / "o.json")], monkeypatch, capsys)
        assert code == 2 and "its folder cannot be made" in err, err


def test_seed_ranges():
    import argparse
    args = load_script("script_args")
    parser = argparse.ArgumentParser(prog="p")
    assert args.seed_range(parser, "3") == [3] and args.seed_range(parser, "0-2") == [0, 1, 2]
    for bad in ("abc", "3-1", "-2", "1-", "1-x", ""):
        with pytest.raises(SystemExit):
            args.seed_range(parser, bad)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_msrun_launcher_reads_sizes_as_decimal():
    for args, message in ((["-n", "010"], "TP must be a non-negative decimal integer without leading zeros"),
                          (["-n", "2", "--master-port", "99999"], "--master-port must be in 1..65535")):
        run = subprocess.run(["bash", str(SCRIPTS / "msrun_generate.sh"), *args, "--", "--config", "x"],
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 2 and message in run.stderr, run.stderr


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_msrun_launcher_refuses_a_port_in_use():
    with socket.socket() as held:                    # another program listens on the port
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        run = subprocess.run(["bash", str(SCRIPTS / "msrun_generate.sh"), "--master-port", str(port), "--",
                              "--config", "x"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and f"--master-port {port} cannot be used on this machine" in run.stderr, run.stderr
