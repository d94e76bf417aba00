"""scripts/research/placement_catalogue.py (run by placement_variants.py): every variant keeps the block
manager's bookkeeping sound; and the kept placement places every block as its scanning form
(tests/placement_oracle.py) does.

The variants override the placement's decisions; a variant that lost or double-counted a block
would make its benchmark figures meaningless, so each one runs a short churn workload here and
the pool is checked block by block afterwards.
"""
import pytest
from placement_oracle import ScanningPlacement
from scripts_import import load_script

from ms_atb.core.placement import ContiguousPlacement

variants = load_script("research/placement_variants")
bench = load_script("bench_block_manager")


@pytest.mark.parametrize("name", list(variants.VARIANTS))
def test_variant_keeps_the_pool_consistent(name):
    cls, tell_end = variants.VARIANTS[name]
    adapter = bench.OursAdapter("contiguous", 512, 16, placement=cls)
    r = bench.run_workload(adapter, bench.MIXES["churn 16-1024/16-1024"], 300, num_blocks=512,
                           tell_end=tell_end)
    _check_pool(adapter.bm, r)


@pytest.mark.parametrize("mix", list(bench.SHAPED_MIXES))
def test_shaped_mixes_draw_their_lengths(mix):
    draws = []

    def draw(rng):
        draws.append(bench.SHAPED_MIXES[mix](rng))
        return draws[-1]
    adapter = bench.OursAdapter("contiguous", 512, 16)
    r = bench.run_workload(adapter, draw, 800, num_blocks=512)
    _check_pool(adapter.bm, r)
    # every admitted request was drawn once (a preempted one is re-admitted without a new draw)
    assert len(draws) >= r["allocations"] - r["preemptions"]
    assert all(16 <= p <= 1024 and 16 <= m <= 2048 for p, m in draws)


def _check_pool(bm, r):
    held = [b for req in bm._requests.values() for b in req.block_ids]
    assert len(held) == len(set(held))                       # no block in two tables (no sharing here)
    ranges = bm.placement.ranges
    free = [b for start, end in ranges.ranges() for b in range(start, end)]
    assert len(free) == len(set(free)) and not set(free) & set(held)
    assert len(free) + len(held) == bm.num_blocks == 512
    assert all(bm._ref_counts[b] == 1 for b in held) and all(bm._ref_counts[b] == 0 for b in free)
    for start, end in ranges.ranges():                       # ranges are maximal: neighbours are held
        assert ranges.start_ending_at(start) is None and ranges.end_of(end) is None
    assert r["allocations"] > 20 and 0.0 <= r["allocation_contiguity"] <= 1.0


def test_kept_policy_is_the_block_manager():
    assert variants.VARIANTS["kept policy"][0] is ContiguousPlacement


@pytest.mark.parametrize("mix", ["churn 16-1024/16-1024", "long-heavy 512-2048/256-1024"])
def test_block_manager_places_every_block_as_the_scanning_form_of_its_policy(mix):
    # the kept placement was measured in its scanning form, which scans the free ranges and the request's
    # table; the placement answers the same questions from its indexes: every table must come out the same
    for seed in (0, 1):
        adapters = [bench.OursAdapter("contiguous", 4096, 16, placement=cls)
                    for cls in (None, ScanningPlacement)]
        runs = [bench.run_workload(a, bench.MIXES[mix], 1500, seed=seed) for a in adapters]
        kept, scan = (a.bm for a in adapters)
        assert {r: q.block_ids for r, q in kept._requests.items()} == {r: q.block_ids for r, q in scan._requests.items()}
        assert kept._counters == scan._counters
        timings = ("allocate", "append", "free")
        assert {k: v for k, v in runs[0].items() if k not in timings} == {k: v for k, v in runs[1].items() if k not in timings}
        assert kept._counters["multi_block_allocations"] > 100
