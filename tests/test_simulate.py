"""The capacity simulator: cost model arithmetic, KV sizes, and the scheduler-driven rows."""
import math
import pathlib
import re
import subprocess
import sys

import pytest

from ms_atb.sim.cost_model import (ATLAS_800I_A2, LLAMA2_7B, LLAMA2_70B, CostModel, Device, GiB, MiB,
                               ModelShape)
from ms_atb.core.scheduler import Scheduler, SchedulerConfig
from ms_atb.core.sequence import Sequence
from ms_atb.sim.simulator import (Workload, output_len_for_static_utilisation, simulate,
                              ttft_one_by_one)
from scripts_import import load_script

TINY = ModelShape("tiny", vocab_size=10, hidden_size=4, intermediate_size=8, num_layers=2,
                  num_heads=2, num_kv_heads=1, head_dim=2, dtype_bytes=2)
SLOW = Device("slow", peak_flops=1e3, mem_bandwidth=1e2, memory_bytes=1e9, efficiency=0.5,
              step_overhead_s=0.01)
# Small setting for the scheduler-driven tests: Llama2-7B on the Atlas card, 256-token contexts.
SMALL = dict(num_blocks=8 * 16, block_size=16, max_model_len=256)   # 8 static slots
ATLAS_7B = CostModel(LLAMA2_7B, ATLAS_800I_A2)
SCRIPTS = pathlib.Path(__file__).resolve().parents[1] / "scripts"


def test_cost_model_hand_computed():
    # layer params: 2 layers x (q,o: 4x4 x2 + k,v: 4x2 x2 + mlp 3x4x8) = 2 x (32 + 16 + 96) = 288
    assert TINY.layer_params == 288 and TINY.lm_head_params == 40
    assert TINY.kv_bytes_per_token == 2 * 2 * 1 * 2 * 2 == 16
    # seq a: prefill of 3 tokens (context 3), seq b: one decode token at position 4 (context 5)
    c = CostModel(TINY, SLOW).cost([3, 1], [3, 5], num_sampled=2)
    pairs = (1 + 2 + 3) + 5
    flops = 2 * 288 * 4 + 2 * 40 * 2 + 4 * 2 * 2 * 2 * pairs            # 2304 + 160 + 352
    nbytes = (288 + 40) * 2 + 16 * (3 + 5) + 16 * 4                      # 656 + 128 + 64
    assert (c.flops, c.bytes) == (flops, nbytes) == (2816, 848)
    assert c.bound == "memory"
    assert c.seconds == pytest.approx(848 / 1e2 / 0.5 + 0.01)           # 16.97 s
    fast_memory = Device("f", 1e3, 1e6, 1e9, 1.0, 0.0)
    c2 = CostModel(TINY, fast_memory).cost([3, 1], [3, 5], 2)
    assert c2.bound == "compute" and c2.seconds == pytest.approx(2.816)


def test_step_cost_matches_scheduler_step():
    sched = Scheduler(SchedulerConfig(num_blocks=16, block_size=4, max_model_len=64, max_num_batched_tokens=64))
    sched.add(Sequence("a", [1, 2, 3], 4, ignore_eos=True))
    sched.add(Sequence("b", [4, 5, 6, 7, 8], 4, ignore_eos=True))
    step = sched.schedule()
    cm = CostModel(TINY, SLOW)
    assert cm.step_cost(step) == cm.cost([3, 5], [3, 5], 2)


def test_bad_device_is_value_error():
    with pytest.raises(ValueError, match="efficiency"):
        Device("x", 1e12, 1e12, 1e9, efficiency=0.0, step_overhead_s=0.0)


def test_kv_arithmetic_7b_and_70b():
    assert LLAMA2_7B.kv_bytes_per_token == 0.5 * MiB
    assert 12 * 4096 * LLAMA2_7B.kv_bytes_per_token == 24 * GiB      # the article's static row
    assert 32 * 4096 * LLAMA2_7B.kv_bytes_per_token == 64 * GiB      # the article's "64GB"
    assert LLAMA2_7B.num_params == pytest.approx(6.74e9, rel=0.01)
    assert LLAMA2_70B.kv_bytes_per_token == 320 * 1024
    assert 32 * 4096 * LLAMA2_70B.kv_bytes_per_token == 40 * GiB
    fp32 = ModelShape(**{**LLAMA2_70B.__dict__, "dtype_bytes": 4})
    assert 32 * 4096 * fp32.kv_bytes_per_token == 80 * GiB           # the article's "80GB"
    assert LLAMA2_70B.num_params * 2 == pytest.approx(138e9, rel=0.01)


def test_workload_is_deterministic_and_shares_prefix():
    w = Workload(20, prefix_len=40, shared_fraction=0.5, user_len=8, output_len=30, vocab_size=100)
    a, b = w.requests(), w.requests()
    assert a == b
    prefixes = [tuple(p[:40]) for p, _ in a]
    assert max(prefixes.count(x) for x in prefixes) == 10
    for p, mt in a:
        assert 41 <= len(p) <= 40 + 15 and 15 <= mt <= 45
    with pytest.raises(ValueError, match="shared_fraction"):
        Workload(4, 10, 1.5, 4, 8)


def _small_requests(shared=1.0, n=48):
    """A 40-token system prompt (2 whole blocks shareable), user messages of mean 24 tokens."""
    out = output_len_for_static_utilisation(0.45, 256, 40, 24)
    return Workload(n, 40, shared, 24, out, seed=1).requests(), out


def test_static_utilisation_matches_the_derivation():
    reqs, out = _small_requests()
    assert out == round((0.45 * 256 - 64) / (13 / 24))
    r = simulate(ATLAS_7B, reqs, "static", **SMALL)
    assert r.saturated and r.peak_running == 8 and r.num_preemptions == 0
    assert r.utilisation == pytest.approx(0.45, abs=0.04)


def test_paged_holds_at_least_twice_static():
    reqs, _ = _small_requests()
    cm = ATLAS_7B
    static = simulate(cm, reqs, "static", **SMALL)
    paged = simulate(cm, reqs, "paged", **SMALL)
    assert paged.saturated
    assert paged.sustained_running >= 2 * static.sustained_running
    assert paged.utilisation > 0.9 > static.utilisation
    assert paged.output_tokens == static.output_tokens == sum(mt for _, mt in reqs)
    assert paged.output_tokens_per_s > static.output_tokens_per_s


def test_prefix_caching_computes_fewer_prefill_tokens_and_holds_more():
    reqs, _ = _small_requests()
    cm = ATLAS_7B
    paged = simulate(cm, reqs, "paged", **SMALL)
    prefix = simulate(cm, reqs, "prefix", **SMALL)
    assert prefix.sustained_running > paged.sustained_running
    # The shared blocks are computed once; paged (with recompute) computes every prompt in full.
    prompt_tokens = sum(len(p) for p, _ in reqs)
    assert paged.prompt_tokens_computed >= prompt_tokens
    assert prefix.prompt_tokens_computed < paged.prompt_tokens_computed - 32 * len(reqs) // 2


def test_ttft_one_by_one_skips_cached_prefix():
    reqs = Workload(4, prefix_len=1000, shared_fraction=1.0, user_len=24, output_len=8).requests()
    setting = dict(num_blocks=256, block_size=16, max_model_len=2048)
    first, *later = ttft_one_by_one(ATLAS_7B, reqs, "prefix", **setting)
    alone = ttft_one_by_one(ATLAS_7B, reqs, "paged", **setting)
    # A ~1,024-token prefill is compute-bound (~90 ms); with 992 tokens cached, weight reads bound it.
    assert first == alone[0] and 0.07 < first < 0.12
    assert all(t < 0.25 * first for t in later) and all(a > 0.07 for a in alone[1:])


def test_script_prints_rows_and_70b(capsys):
    mod = load_script("simulate")
    assert mod.main(["--requests", "24", "--prefix-len", "100", "--user-len", "16",
                     "--output-len", "32", "--static-slots", "1", "--ttft-requests", "2"]) == 0
    text = capsys.readouterr().out
    for label in ("static pre-allocation", "paged KV cache", "paged + prefix caching", "article"):
        assert label in text
    assert "40.0 GiB" in text and "fp32 KV with 8 KV heads (80 GiB)" in text
    assert math.isclose(float(text.split("KV budget from the article's static row: 1 requests x 4096 "
                                         "tokens x 0.5 MiB = ")[1].split()[0]), 2.0)


@pytest.mark.parametrize("args, message", [
    (["--block-size", "0"], "--block-size must be >= 1"),
    (["--ttft-requests", "1"], "--ttft-requests must be >= 2"),
    (["--kv-budget-gib", "nan"], r"--kv-budget-gib must be in \(0, inf\]"),
    (["--shared-fraction", "1.5"], r"--shared-fraction must be in \[0, 1\]"),
    (["--static-utilisation", "0"], r"--static-utilisation must be in \(0, 1\]"),
    (["--overhead-ms", "-5"], r"--overhead-ms must be in \[0, inf\]"),
    (["--requests", "0"], "--requests must be >= 1"),
    (["--kv-budget-gib", "1e-9"], "holds no block of 16 tokens"),
    (["--cache-dtype", "auto,fp8"], r"--cache-dtype: each must be one of \['auto', 'float16', 'bfloat16', 'int8'\]"),
])
def test_simulate_rejects_bad_arguments_with_a_message(args, message):
    run = subprocess.run([sys.executable, str(SCRIPTS / "simulate.py"), *args], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode != 0 and re.search(message, run.stderr) and "Traceback" not in run.stderr, run.stderr


def test_article_rows_checked_against_one_another():
    mod = load_script("simulate")
    text = "\n".join(mod.article_check_lines(992, 4096))
    # pool 12 x 4,096 = 49,152 tokens; paged: 0.88 x 49,152 / 24 = 1,802 held per request
    assert "1,843 tokens held" in text and "/ 24 = 1,802" in text
    # 0.92 x 49,152 = 45,220 stored; 30 x 1,802.24 - 45,219.84 = 8,847 saved = 992 x (sharers - 1)
    assert "45,220 tokens stored" in text and "saved 8,847 tokens" in text and "shared by 10 of the 30" in text
    # every request sharing: (45,219.84 - 992) / (1,802.24 - 992) = 54.6; <= 36 needs 35 x 992 / 0.4 = 86,800
    assert "= 54.6 requests, 1.82x" in text and "86,800 tokens" in text and "hold 21 requests" in text
    assert "max_model_len would be 7,233" in text
    # A smaller prefix changes the answer the same way; a prefix no request could share is refused.
    assert "= 48.9 requests" in "\n".join(mod.article_check_lines(896, 4096))  # 44,323.84 / 906.24
    assert "needs a shared prefix" in mod.article_check_lines(0, 4096)[0]
    assert "needs a shared prefix" in mod.article_check_lines(1840, 4096)[0]


def test_kv_bytes_per_token_of_each_cache_dtype():
    """int8: one byte a value plus a float32 scale per (K or V, layer, KV head) row; Llama2-7B's fp16 block of 16
    tokens (8 MiB) holds 1.94x the tokens in int8 at one budget."""
    import dataclasses
    int8 = dataclasses.replace(LLAMA2_7B, kv_cache_dtype="int8")
    assert int8.kv_bytes_per_token == 2 * 32 * 32 * (128 + 4) == 270_336
    assert dataclasses.replace(LLAMA2_7B, kv_cache_dtype="bfloat16").kv_bytes_per_token == 0.5 * MiB
    assert dataclasses.replace(TINY, kv_cache_dtype="int8").kv_bytes_per_token == 2 * 2 * 1 * (2 + 4)
    assert LLAMA2_7B.kv_bytes_per_token / int8.kv_bytes_per_token >= 1.9
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        dataclasses.replace(TINY, kv_cache_dtype="fp8").kv_bytes_per_token


def test_script_puts_an_int8_table_beside_fp16(capsys):
    mod = load_script("simulate")
    assert mod.main(["--requests", "40", "--prefix-len", "400", "--shared-fraction", "0", "--user-len", "16",
                     "--output-len", "32", "--static-slots", "1", "--ttft-requests", "2", "--modes", "paged",
                     "--cache-dtype", "auto,int8"]) == 0
    text = capsys.readouterr().out
    assert "KV cache int8 + a float32 scale per token, layer and KV head" in text
    rows = {line.split("|")[1].strip(): line.split("|")[2:-1] for line in text.splitlines()
            if line.startswith(("| auto |", "| int8 |"))}
    # the same 2 GiB budget: 256 blocks of 16 fp16 tokens (8 MiB each) or 496 int8 ones (4.125 MiB each); the
    # ~430-token requests (none sharing) bind both pools
    assert [c.strip() for c in rows["auto"][:2]] == ["524,288", "256"]
    assert [c.strip() for c in rows["int8"][:2]] == ["270,336", "496"]
    assert float(rows["int8"][2]) > 1.8 * float(rows["auto"][2])


def test_data_parallel_estimate_splits_the_batch_and_scales_with_replicas(capsys):
    simulate_dp = load_script("simulate_dp")
    assert simulate_dp.main(["--requests", "24", "--replicas", "1,2", "--user-len", "16"]) == 0
    rows = [line.split("|") for line in capsys.readouterr().out.splitlines() if re.match(r"\| \d", line)]
    assert [int(r[1]) for r in rows] == [1, 2]
    one, two = (float(r[3].replace(",", "")) for r in rows)
    assert 1.2 * one < two <= 2.05 * one          # two cards: more output tokens/s, at most about twice
    with pytest.raises(SystemExit):
        simulate_dp.main(["--replicas", "0"])
