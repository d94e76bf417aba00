"""The simulator's KV tier (ms_atb/sim/kv_tier.py) and scripts/simulate_tier.py: a workload whose prefixes exceed
the card reads them back from the tier instead of computing them, priced by bytes / bandwidth; one whose prefixes
fit never reads it."""
import subprocess
import sys

import pytest

from ms_atb.core.scheduler import Scheduler, SchedulerConfig
from ms_atb.core.sequence import Sequence
from ms_atb.sim.cost_model import ATLAS_800I_A2, LLAMA2_7B, CostModel
from ms_atb.sim.kv_tier import HOST_DRAM, NVME_SSD, SimTier, TierDevice
from ms_atb.sim.simulator import simulate
from scripts_import import SCRIPTS, load_script

tier_script = load_script("simulate_tier")
BLOCK = 16 * LLAMA2_7B.kv_bytes_per_token


def test_the_tier_keeps_what_steps_compute_least_recently_used_first():
    tier = SimTier(TierDevice("t", read_bandwidth=1e9, capacity_bytes=3 * 100), block_bytes=100, block_size=4)
    sched = Scheduler(SchedulerConfig(num_blocks=32, block_size=4, max_model_len=64, enable_prefix_caching=True),
                      kv_tier=tier)
    sched.add(Sequence("a", list(range(17)), 1))               # 4 full blocks: the tier holds the last 3
    step = sched.schedule()
    assert tier.after_step(step) == 0.0 and len(step.kv_stores) == 4
    hashes = [s.hash for s in step.kv_stores]
    assert tier.fetch(None, None, 0, hashes) == 0               # block 0 was dropped: nothing leads
    assert tier.fetch(None, None, 1, hashes[1:]) == 3
    assert tier.load_seconds(3) == pytest.approx(300 / 1e9)


def _rounds(prefixes, per_prefix, prefix_len=512):
    args = tier_script.parse_args(["--prefixes", str(prefixes), "--per-prefix", str(per_prefix), "--prefix-len",
                                   str(prefix_len), "--user-len", "8", "--output-len", "8"])
    return tier_script.grouped_requests(args, LLAMA2_7B.vocab_size)


def test_prefixes_beyond_the_card_come_back_from_the_tier():
    cm = CostModel(LLAMA2_7B, ATLAS_800I_A2)
    requests = _rounds(8, 3)                                    # 8 x 32 blocks of prefix, the card holds 64
    runs = {name: simulate(cm, requests, "prefix", 64, 16, 4096, 4, 8192,
                           None if device is None else SimTier(device, BLOCK, 16))
            for name, device in (("none", None), ("dram", HOST_DRAM), ("ssd", NVME_SSD))}
    assert runs["none"].tier_tokens_read == 0
    for name in ("dram", "ssd"):
        assert runs[name].tier_tokens_read >= 2 * 8 * 512 - 16 * 8 * 2
        assert runs[name].prompt_tokens_computed + runs[name].tier_tokens_read == runs["none"].prompt_tokens_computed
        assert runs[name].output_tokens == runs["none"].output_tokens
    assert runs["dram"].sim_seconds < runs["none"].sim_seconds          # a block reads 8x faster than it computes
    assert runs["ssd"].sim_seconds > runs["dram"].sim_seconds


def test_prefixes_that_fit_the_card_never_read_the_tier():
    cm = CostModel(LLAMA2_7B, ATLAS_800I_A2)
    result = simulate(cm, _rounds(2, 3), "prefix", 256, 16, 4096, 8, 8192, SimTier(HOST_DRAM, BLOCK, 16))
    assert result.tier_tokens_read == 0


def test_a_tier_needs_the_prefix_mode():
    with pytest.raises(ValueError, match="a KV tier needs the prefix mode"):
        simulate(CostModel(LLAMA2_7B, ATLAS_800I_A2), _rounds(1, 1), "paged", 64, 16, 4096,
                 tier=SimTier(HOST_DRAM, BLOCK, 16))


def test_the_script_prints_the_table_and_the_block_costs():
    run = subprocess.run([sys.executable, str(SCRIPTS / "simulate_tier.py"), "--prefixes", "6", "--per-prefix", "3",
                          "--prefix-len", "96", "--user-len", "8", "--output-len", "8", "--kv-budget-gib", "0.2",
                          "--max-num-seqs", "2"], capture_output=True, text=True, timeout=300, cwd=SCRIPTS)
    assert run.returncode == 0, run.stderr
    rows = [line for line in run.stdout.splitlines() if line.startswith("|   + ") or line.startswith("| paged")]
    assert len(rows) == 3 and "read back from host DRAM" in run.stdout and "PCIe" in run.stdout


@pytest.mark.parametrize("argv, match", [(["--prefixes", "0"], "--prefixes must be >= 1"),
                                         (["--tiers", "tape"], "--tiers: each must be one of"),
                                         (["--prefix-len", "4000"], "exceeds max_model_len")])
def test_bad_arguments_exit_2_with_a_message(argv, match):
    run = subprocess.run([sys.executable, str(SCRIPTS / "simulate_tier.py"), *argv], capture_output=True, text=True,
                         timeout=120, cwd=SCRIPTS)
    assert run.returncode == 2 and match in run.stderr and "Traceback" not in run.stderr
