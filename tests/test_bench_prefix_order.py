"""scripts/bench_prefix_order.py: its workload, its oracle, and its argument checks (no engine)."""
import subprocess
import sys

from scripts_import import SCRIPTS, load_script

bench = load_script("bench_prefix_order")


def test_workload_is_shuffled_groups_with_exact_duplicates_after_their_original():
    prompts, max_tokens, duplicate = bench.make_workload(0, systems=8, system_len=500, turns=12, user=(32, 160),
                                                         output=(16, 64), duplicates=10, vocab=512)
    assert len(prompts) == len(max_tokens) == len(duplicate) == 106 and sum(duplicate) == 10
    heads = [tuple(p[:400]) for p in prompts]
    assert len(set(heads)) == 8 and all(heads.count(h) >= 12 for h in set(heads))
    assert all(480 + 32 <= len(p) <= 520 + 160 and 1 <= t < 256 for p in prompts for t in p)
    for i, d in enumerate(duplicate):
        earlier = [(prompts[j], max_tokens[j]) for j in range(i) if not duplicate[j]]
        assert ((prompts[i], max_tokens[i]) in earlier) == d
    assert heads[:12] != sorted(heads[:12])                         # shuffled, not grouped


def test_oracle_counts_each_distinct_prefix_once():
    assert bench.distinct_prefix_tokens([[1, 2, 3], [1, 2, 4], [1, 2, 3], [5]]) == 3 + 1 + 1
    assert bench.distinct_prefix_tokens([[7] * 10]) == 10


def test_bad_arguments_exit_2_before_any_work():
    for args, message in ((["--user", "9", "3"], "--user LO HI needs 1 <= LO <= HI"),
                          (["--repeats", "0"], "--repeats must be >= 1"),
                          (["--duplicates", "-2"], "--duplicates must be >= -1")):
        run = subprocess.run([sys.executable, str(SCRIPTS / "bench_prefix_order.py"), *args], capture_output=True,
                             text=True, timeout=120)
        assert run.returncode == 2 and message in run.stderr, run.stderr
