"""scripts/placement_variants.py: every variant keeps the block manager's bookkeeping sound.

The variants override private placement hooks; a variant that lost or double-counted a block
would make its benchmark figures meaningless, so each one runs a short churn workload here and
the pool is checked block by block afterwards.
"""
import pytest

from scripts_import import load_script

variants = load_script("placement_variants")
bench = load_script("bench_block_manager")


@pytest.mark.parametrize("name", list(variants.VARIANTS))
def test_variant_keeps_the_pool_consistent(name):
    cls, tell_end = variants.VARIANTS[name]
    adapter = bench.OursAdapter("contiguous", 512, 16, manager_cls=cls)
    r = bench.run_workload(adapter, bench.MIXES["churn 16-1024/16-1024"], 300, num_blocks=512,
                           tell_end=tell_end)
    bm = adapter.bm
    held = [b for req in bm._requests.values() for b in req.block_ids]
    assert len(held) == len(set(held))                       # no block in two tables (no sharing here)
    free = [b for start, end in bm._starts.items() for b in range(start, end)]
    assert len(free) == len(set(free)) and not set(free) & set(held)
    assert len(free) + len(held) == bm.num_blocks == 512
    assert all(bm._ref_counts[b] == 1 for b in held) and all(bm._ref_counts[b] == 0 for b in free)
    for start, end in bm._starts.items():                    # ranges are maximal: neighbours are held
        assert start not in bm._ends and end not in bm._starts
    assert r["allocations"] > 20 and 0.0 <= r["allocation_contiguity"] <= 1.0


def test_kept_policy_is_the_block_manager():
    assert variants.VARIANTS["kept policy"][0] is variants.BlockManager
