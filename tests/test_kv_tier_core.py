"""The block manager with a KV tier beside the pool (ms_atb/core/kv_tier.py) and per-request extra keys: which
blocks it asks the tier for, which it stores, and what a hit returns. Pure Python: a dict plays the tier."""
import pytest

from ms_atb.core.block_manager import BlockManager, NoFreeBlocksError
from ms_atb.core.kv_tier import KVLoad
from ms_atb.core.scheduler import Scheduler, SchedulerConfig
from ms_atb.core.sequence import Sequence

BS = 4


class DictTier:
    """A tier that holds what it is given: {hash: the tokens of the prefix through that block, extra key}."""

    def __init__(self, key=b"k" * 32, root=b"r" * 16):
        self.hash_key, self.hash_root = key, root
        self.blocks: dict[bytes, tuple] = {}
        self.calls = []
        self.refuse: set[bytes] = set()          # hashes whose file is "damaged"

    def fetch(self, token_ids, extra_key, first, hashes):
        self.calls.append((first, len(hashes)))
        n = 0
        for i, h in enumerate(hashes):
            if h in self.refuse or self.blocks.get(h) != (tuple(token_ids[:(first + i + 1) * BS]), extra_key):
                break
            n += 1
        return n

    def keep(self, stores):
        for s in stores:              # as the disk tier does, a name already kept is not written again
            self.blocks.setdefault(s.hash, (tuple(s.token_ids[:s.num_tokens]), s.extra_key))


def toks(start, n):
    return list(range(start, start + n))


def run_one(bm, rid, tokens, tier, extra_key=None):
    """allocate, commit the whole prompt, keep its stores in the tier; returns (cached tokens, loads)."""
    cached = bm.allocate(rid, tokens, extra_key=extra_key)
    bm.commit(rid, len(tokens))
    loads, stores, _ = bm.take_transfers()
    tier.keep(stores)
    return cached, loads


def test_a_second_manager_finds_the_first_ones_blocks_in_the_tier():
    tier = DictTier()
    a = BlockManager(32, BS, enable_prefix_caching=True, tier=tier)
    prompt = toks(0, 4 * BS + 2)                  # 4 full blocks and a partial one
    assert run_one(a, "x", prompt, tier) == (0, [])
    assert len(tier.blocks) == 4                  # every full block the prompt computed, once
    b = BlockManager(32, BS, enable_prefix_caching=True, tier=tier)
    cached, loads = run_one(b, "x", prompt, tier)
    assert cached == 4 * BS
    table = b.block_table("x")
    assert [ld.block for ld in loads] == table[:4]
    assert b.stats()["disk_cache_hit_tokens"] == 4 * BS and b.stats()["prefix_cache_hits"] == 0
    # the loaded blocks are committed: a third request finds them in the pool, the tier is not asked again
    calls = len(tier.calls)
    assert b.allocate("y", prompt[:3 * BS + 1]) == 3 * BS
    assert b.block_table("y")[:3] == table[:3] and len(tier.calls) == calls


def test_at_least_one_token_is_left_and_the_pool_is_asked_first():
    tier = DictTier()
    a = BlockManager(32, BS, enable_prefix_caching=True, tier=tier)
    run_one(a, "x", toks(0, 3 * BS), tier)        # 3 full blocks (the last one is committed with its prompt)
    b = BlockManager(32, BS, enable_prefix_caching=True, tier=tier)
    run_one(b, "p", toks(0, BS + 1), tier)        # block 0 from the tier, into b's pool
    tier.calls.clear()
    cached, loads = run_one(b, "x", toks(0, 3 * BS), tier)
    assert cached == 2 * BS                       # block 0 from the pool, block 1 from the tier, block 2 computed
    assert tier.calls == [(1, 1)] and len(loads) == 1


def test_the_tier_serves_only_a_leading_run():
    tier = DictTier()
    a = BlockManager(32, BS, enable_prefix_caching=True, tier=tier)
    prompt = toks(0, 5 * BS)
    run_one(a, "x", prompt, tier)
    b = BlockManager(32, BS, enable_prefix_caching=True, tier=tier)
    hashes = list(tier.blocks)
    tier.refuse = {hashes[2]}                     # block 2's file fails its checks
    cached, loads = run_one(b, "x", prompt, tier)
    assert cached == 2 * BS and len(loads) == 2
    assert b.block_table("x")[:2] == [ld.block for ld in loads]


def test_only_computed_blocks_are_stored():
    tier = DictTier()
    bm = BlockManager(32, BS, enable_prefix_caching=True, tier=tier)
    run_one(bm, "x", toks(0, 3 * BS + 1), tier)
    bm.allocate("y", toks(0, 3 * BS + 1))         # every full block a pool hit
    bm.commit("y", 3 * BS + 1)
    assert bm.take_transfers() == ([], [], [(h, i) for i, h in enumerate(tier.blocks)][:3])
    bm.append_token("y", 99)
    bm.commit("y", 3 * BS + 2)
    assert bm.take_transfers() == ([], [], [])        # a partial block is never stored
    for t in range(2):
        bm.append_token("y", 100 + t)
    bm.commit("y", 4 * BS)
    loads, stores, _ = bm.take_transfers()
    assert loads == [] and [(s.block, s.num_tokens) for s in stores] == [(bm.block_table("y")[3], 4 * BS)]
    assert stores[0].token_ids[:4 * BS] == toks(0, 3 * BS + 1) + [99, 100, 101]


def test_a_failed_allocation_asks_the_tier_nothing():
    tier = DictTier()
    a = BlockManager(32, BS, enable_prefix_caching=True, tier=tier)
    run_one(a, "x", toks(0, 4 * BS), tier)
    b = BlockManager(3, BS, enable_prefix_caching=True, tier=tier)
    tier.calls.clear()
    with pytest.raises(NoFreeBlocksError):
        b.allocate("x", toks(0, 4 * BS))
    assert tier.calls == [] and b.take_transfers() == ([], [], [])
    assert b.stats()["disk_cache_hit_tokens"] == 0


def test_another_key_or_root_finds_nothing():
    tier = DictTier()
    run_one(BlockManager(32, BS, enable_prefix_caching=True, tier=tier), "x", toks(0, 3 * BS), tier)
    for other in (DictTier(key=b"K" * 32), DictTier(root=b"R" * 16)):
        other.blocks = tier.blocks
        bm = BlockManager(32, BS, enable_prefix_caching=True, tier=other)
        assert bm.allocate("x", toks(0, 3 * BS)) == 0


def test_extra_keys_never_share_blocks_even_when_every_hash_collides(monkeypatch):
    def share(bm, tier):
        out = []
        for i, key in enumerate([None, "a", "b", "a", None, "b"]):
            out.append(run_one(bm, f"r{i}", toks(0, 3 * BS + 1), tier, extra_key=key)[0])
        return out
    assert share(BlockManager(64, BS, enable_prefix_caching=True), DictTier()) == [0, 0, 0, 12, 12, 12]
    from ms_atb.core import prefix_cache
    monkeypatch.setattr(prefix_cache, "hash_block", lambda *a, **k: b"\0" * 16)
    assert share(BlockManager(64, BS, enable_prefix_caching=True), DictTier()) == [0, 0, 0, 12, 12, 12]


def test_a_block_of_one_extra_key_is_not_found_in_the_tier_for_another():
    tier = DictTier()
    run_one(BlockManager(64, BS, enable_prefix_caching=True, tier=tier), "x", toks(0, 3 * BS + 1), tier, "a")
    fresh = BlockManager(64, BS, enable_prefix_caching=True, tier=tier)
    assert run_one(fresh, "y", toks(0, 3 * BS + 1), tier, "b")[0] == 0
    assert run_one(fresh, "n", toks(0, 3 * BS + 1), tier)[0] == 0
    assert run_one(fresh, "z", toks(0, 3 * BS + 1), tier, "a")[0] == 3 * BS


def test_a_tier_needs_prefix_caching():
    with pytest.raises(ValueError, match="enable_prefix_caching"):
        BlockManager(8, BS, tier=DictTier())


def test_each_step_carries_its_transfers():
    tier = DictTier()
    cfg = SchedulerConfig(num_blocks=32, block_size=BS, max_model_len=64, max_num_batched_tokens=8,
                          enable_prefix_caching=True)
    first = Scheduler(cfg, kv_tier=tier)
    first.add(Sequence("a", toks(0, 3 * BS + 1), max_tokens=2))
    step = first.schedule()                       # a chunk of 8 tokens: blocks 0 and 1 computed by this step
    assert [s.num_tokens for s in step.kv_stores] == [BS, 2 * BS] and step.kv_loads == []
    tier.keep(step.kv_stores)
    second = Scheduler(cfg, kv_tier=tier)
    second.add(Sequence("b", toks(0, 3 * BS + 1), max_tokens=2))
    step = second.schedule()
    assert step.kv_loads == [KVLoad(b, h) for b, h in zip(step.block_tables[0][:2], list(tier.blocks))]
    assert step.positions[0] == 2 * BS and second.running[0].num_cached_tokens == 2 * BS
