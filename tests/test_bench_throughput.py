"""scripts/bench_throughput.py: the llama.cpp batched peer's workload file, its result, the ratios and the
argument checks (no engine, no peer: a stand-in driver plays llamacpp_serve_batch)."""
import json
import os
import sys

import pytest

from scripts_import import load_script

bench = load_script("bench_throughput")


def driver_line(prompts, max_tokens, elapsed=2.0, **changes) -> str:
    """A JSON line as llamacpp_serve_batch prints it for a run that served the workload exactly."""
    out = {"requests": len(prompts), "parallel": 4, "threads": 2, "n_batch": 512, "kv": "split", "n_ctx": 2048,
           "steps": 10, "elapsed_s": elapsed, "prompt_tokens": sum(map(len, prompts)),
           "generated_tokens": sum(max_tokens), "requested_tokens": sum(max_tokens), "peak_rss_mib": 123.0,
           "ttft_s": [0.1 * (i + 1) for i in range(len(prompts))],
           "tpot_s": [0.01 * (i + 1) for i, n in enumerate(max_tokens) if n > 1]}
    out.update(changes)
    return json.dumps(out)


def test_workload_file_has_one_line_per_request_output_count_first():
    prompts, max_tokens = bench.make_workload("smoke")
    lines = bench.workload_text(prompts, max_tokens).splitlines()
    assert len(lines) == len(prompts) == 6
    for line, p, n in zip(lines, prompts, max_tokens):
        head, *ids = map(int, line.split())
        assert head == n and ids == p


def test_serve_result_rates_the_workload_from_the_driver_line():
    prompts, max_tokens = [[5] * 10, [6] * 30, [7] * 20], [4, 1, 8]
    r = bench.serve_result(driver_line(prompts, max_tokens, elapsed=2.5), prompts, max_tokens)
    assert r["output_tok_s"] == pytest.approx(13 / 2.5) and r["total_tok_s"] == pytest.approx(73 / 2.5)
    assert r["ttft_p50_ms"] == pytest.approx(200.0) and r["tpot_p50_ms"] == pytest.approx(20.0)
    assert r["peak_rss_mib"] == 123.0 and r["steps"] == 10


@pytest.mark.parametrize("changes", [{"generated_tokens": 12}, {"prompt_tokens": 61}, {"requests": 2},
                                     {"ttft_s": [0.1, 0.2]}, {"tpot_s": [0.01]}])
def test_serve_result_refuses_a_run_that_served_another_workload(changes):
    prompts, max_tokens = [[5] * 10, [6] * 30, [7] * 20], [4, 1, 8]
    with pytest.raises(ValueError, match="llamacpp_serve_batch served"):
        bench.serve_result(driver_line(prompts, max_tokens, **changes), prompts, max_tokens)


def test_peer_runs_the_driver_on_the_workload_file(tmp_path):
    """A stand-in driver checks its arguments, reads the file and answers as the real one does."""
    fake = tmp_path / "serve"
    fake.write_text(f"#!{sys.executable}\n" + """import json, sys
model, threads, parallel, n_batch, kv, path = sys.argv[1:]
assert (model, threads, parallel, n_batch, kv) == ("m.gguf", "2", "4", "512", "split"), sys.argv
reqs = [list(map(int, l.split())) for l in open(path)]
outs, prompts = [r[0] for r in reqs], [r[1:] for r in reqs]
print(json.dumps({"requests": len(reqs), "steps": 3, "elapsed_s": 0.5, "prompt_tokens": sum(map(len, prompts)),
                  "generated_tokens": sum(outs), "requested_tokens": sum(outs), "peak_rss_mib": 7.0,
                  "ttft_s": [0.1] * len(reqs), "tpot_s": [0.02 for n in outs if n > 1]}))
""")
    fake.chmod(0o755)
    peer = bench.LlamaCppBatched(str(fake), "m.gguf", threads=2, parallel=4, n_batch=512, kv="split")
    prompts, max_tokens = bench.make_workload("smoke")
    r = peer.run("smoke")
    assert r["output_tok_s"] == pytest.approx(sum(max_tokens) / 0.5) and r["peak_rss_mib"] == 7.0
    assert peer.info["versions"]["parallel"] == 4 and "llama-cpp-python==" in peer.info["versions"]["llama_cpp"]


def test_peer_reports_a_failed_driver(tmp_path):
    fake = tmp_path / "serve"
    fake.write_text("#!/bin/sh\necho 'decode failed' >&2\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(RuntimeError, match="decode failed"):
        bench.LlamaCppBatched(str(fake), "m.gguf", 2, 4, 512, "split").run("smoke")


def test_table_ratios_are_ms_atb_over_each_peer(capsys):
    rows = {"ms_atb": [{"output_tok_s": 100.0}, {"output_tok_s": 120.0}],
            "hf": [{"output_tok_s": 20.0}], "llama.cpp batched": [{"output_tok_s": 80.0}, {"output_tok_s": 40.0}]}
    for rs in rows.values():
        for r in rs:
            r.update({"total_tok_s": 2 * r["output_tok_s"], "ttft_p50_ms": 1, "ttft_p99_ms": 2, "tpot_p50_ms": 3,
                      "tpot_p99_ms": 4, "peak_rss_mib": 5})
    ratios = bench.print_table("smoke", rows, {})
    assert ratios == pytest.approx({"hf": 110 / 20, "llama.cpp batched": 110 / 60})
    assert "ms_atb / hf: 5.50x; ms_atb / llama.cpp batched: 1.83x" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["--llama-cpp-parallel", "0"], "--llama-cpp-parallel must be >= 1, got 0"),
    (["--llama-cpp-bin", "/nonexistent/serve"], "build it with `bash scripts/build_llamacpp_bench.sh`"),
    (["--llama-cpp-kv", "paged"], "invalid choice: 'paged'"),
])
def test_bad_llama_cpp_arguments_exit_2_before_any_work(args, message, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["bench_throughput.py", "--json", str(tmp_path / "o.json"), *args])
    with pytest.raises(SystemExit) as info:
        bench.main()
    err = capsys.readouterr().err
    assert info.value.code == 2 and message in err, err
    assert not os.path.exists(tmp_path / "o.json")
