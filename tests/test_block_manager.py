import sys

import numpy as np
import pytest

from ms_atb.core.block_manager import BlockManager, NoFreeBlocksError


def toks(start, n):
    return list(range(start, start + n))


def snapshot(bm, rids):
    return ({r: bm.block_table(r) for r in rids}, bm.num_free_blocks, bm.num_cached_free_blocks, bm.stats())


@pytest.mark.parametrize("kwargs", [dict(num_blocks=0), dict(num_blocks=4, block_size=0),
                                    dict(num_blocks=4, allocation="static")])
def test_bad_construction_is_value_error(kwargs):
    with pytest.raises(ValueError):
        BlockManager(**kwargs)


def test_user_errors_are_value_errors():
    bm = BlockManager(8, 4, enable_prefix_caching=True)
    bm.allocate("a", toks(0, 5))
    with pytest.raises(ValueError, match="already"):
        bm.allocate("a", toks(0, 5))
    with pytest.raises(ValueError, match="empty"):
        bm.allocate("b", [])
    with pytest.raises(ValueError, match="max_tokens"):
        bm.allocate("b", [1], max_tokens=-1)
    with pytest.raises(ValueError, match="num_tokens"):
        bm.commit("a", 6)
    for call in (lambda: bm.append_token("x", 1), lambda: bm.free("x"), lambda: bm.block_table("x"),
                 lambda: bm.commit("x", 0)):
        with pytest.raises(ValueError, match="unknown request"):
            call()


def test_exact_ids_on_fresh_pool():
    bm = BlockManager(16, 4)
    assert bm.allocate("a", toks(0, 10), max_tokens=8) == 0
    assert bm.block_table("a") == [0, 1, 2]
    assert bm.allocate("b", toks(100, 5)) == 0
    assert bm.block_table("b") == [3, 4]
    assert bm.num_free_blocks == 11 and bm.num_blocks == 16
    for t in range(2):                      # a's last block has room for 2 more tokens
        bm.append_token("a", t)
    assert bm.block_table("a") == [0, 1, 2]
    bm.append_token("a", 9)                 # 3 is held by b: the lowest clean block
    assert bm.block_table("a") == [0, 1, 2, 5]
    for t in range(4):
        bm.append_token("b", t)             # b's next block 5 is a's now: the lowest clean is 6
    assert bm.block_table("b") == [3, 4, 6]
    bm.append_token("a", 1)
    assert bm.block_table("a") == [0, 1, 2, 5]
    assert bm.stats()["usage"] == 7 / 16


def test_growth_in_place_and_best_fit():
    bm = BlockManager(32, 4)
    bm.allocate("a", toks(0, 8))            # [0, 1]
    bm.allocate("b", toks(0, 16))           # [2..5]
    bm.allocate("c", toks(0, 8))            # [6, 7]
    bm.free("b")                            # hole [2, 6) of 4; tail range [8, 32)
    bm.allocate("d", toks(0, 12))           # best fit: the 4-hole, from its start
    assert bm.block_table("d") == [2, 3, 4]
    for t in range(5):
        bm.append_token("d", t)             # grows in place into 5, then hops to the lowest clean block
    assert bm.block_table("d") == [2, 3, 4, 5, 8]
    s = bm.stats()
    assert s["allocation_contiguity"] == 1.0
    assert s["contiguity"] == pytest.approx((1 + 3 + 1 + 2 + 1) / (1 + 3 + 1 + 2 + 2))


def test_sharing_after_commit_drops_free_count_by_private_blocks_only():
    bm = BlockManager(16, 4, enable_prefix_caching=True)
    prefix = toks(0, 8)
    bm.allocate("a", prefix + [50, 51])
    bm.commit("a", 10)
    free_before = bm.num_free_blocks
    assert bm.allocate("b", prefix + [60, 61, 62]) == 8
    assert bm.block_table("b")[:2] == bm.block_table("a")[:2]
    assert bm.block_table("b")[2] != bm.block_table("a")[2]
    assert bm.num_free_blocks == free_before - 1
    s = bm.stats()
    assert (s["prefix_cache_queries"], s["prefix_cache_hits"]) == (10 + 11, 8)


def test_no_sharing_before_commit():
    bm = BlockManager(16, 4, enable_prefix_caching=True)
    bm.allocate("a", toks(0, 10))
    bm.commit("a", 7)                       # only block 0 is committed
    assert bm.allocate("b", toks(0, 10)) == 4
    assert bm.allocate("c", toks(0, 10)) == 4
    assert len(set(bm.block_table("b")[1:]) & set(bm.block_table("a"))) == 0


def test_caching_disabled_shares_nothing():
    bm = BlockManager(16, 4)
    bm.allocate("a", toks(0, 10))
    bm.commit("a", 10)
    assert bm.allocate("b", toks(0, 10)) == 0
    assert bm.stats()["prefix_cache_queries"] == 0


def test_commit_in_same_step_makes_blocks_shareable():
    bm = BlockManager(16, 4, enable_prefix_caching=True)
    bm.allocate("a", toks(0, 9))
    bm.commit("a", 9)                       # scheduled now: K/V written before attention reads
    assert bm.allocate("b", toks(0, 9)) == 8


def test_hit_after_free_takes_cached_blocks_out_of_free_pool():
    bm = BlockManager(8, 4, enable_prefix_caching=True)
    bm.allocate("a", toks(0, 10))
    bm.commit("a", 10)
    table_a = bm.block_table("a")
    bm.free("a")
    assert bm.num_free_blocks == 8 and bm.num_cached_free_blocks == 2
    assert bm.stats()["usage"] == 0.0
    assert bm.allocate("b", toks(0, 10)) == 8
    assert bm.block_table("b")[:2] == table_a[:2]
    assert bm.num_cached_free_blocks == 0 and bm.num_free_blocks == 5


def test_allocate_without_cache_lookup_takes_no_hits_but_keeps_the_cache():
    bm = BlockManager(12, 4, enable_prefix_caching=True)
    bm.allocate("a", toks(0, 10))
    bm.commit("a", 10)
    queries = bm.stats()["prefix_cache_queries"]
    assert bm.allocate("b", toks(0, 10), cache_lookup=False) == 0       # e.g. for prompt logprobs
    assert not set(bm.block_table("b")) & set(bm.block_table("a"))
    assert bm.stats()["prefix_cache_queries"] == queries
    bm.commit("b", 10)                                  # same content: b's copy is cached too; a's comes first
    assert bm.allocate("c", toks(0, 10)) == 8 and bm.block_table("c")[:2] == bm.block_table("a")[:2]


def test_never_cached_blocks_used_before_eviction_then_lru_tail_first():
    bm = BlockManager(6, 2, enable_prefix_caching=True)
    bm.allocate("a", toks(0, 4))            # [0, 1]
    bm.allocate("b", toks(100, 4))          # [2, 3]
    bm.commit("a", 4)
    bm.commit("b", 4)
    bm.free("a")                            # freed first: evicted first, tail (1) before head (0)
    bm.free("b")
    assert bm.num_cached_free_blocks == 4
    bm.allocate("c", toks(200, 4))          # the 2 never-cached blocks, no eviction
    assert bm.block_table("c") == [4, 5] and bm.stats()["evictions"] == 0
    bm.allocate("d", toks(300, 1))
    assert bm.block_table("d") == [1] and bm.stats()["evictions"] == 1
    bm.allocate("e", toks(400, 1))
    assert bm.block_table("e") == [0]
    assert bm.allocate("g", toks(100, 3)) == 2  # b's head is still cached; b's tail is evicted
    assert bm.block_table("g") == [2, 3]
    assert bm.stats()["evictions"] == 3 and bm.num_free_blocks == 0


def test_atomic_failure_of_allocate_and_append():
    bm = BlockManager(5, 4, enable_prefix_caching=True)
    bm.allocate("a", toks(0, 8))
    bm.commit("a", 8)
    bm.free("a")                            # blocks 0, 1 cached free; 2..4 clean
    bm.allocate("b", toks(50, 8))           # [2, 3]
    before = snapshot(bm, ["b"])
    with pytest.raises(NoFreeBlocksError):
        bm.allocate("c", toks(0, 17))       # would hit 0, 1 and need 3 new: 1 left
    assert snapshot(bm, ["b"]) == before    # stats counters included
    assert bm.allocate("c", toks(0, 12)) == 8
    assert bm.block_table("c") == [0, 1, 4] and bm.num_free_blocks == 0
    before = snapshot(bm, ["b", "c"])
    for _ in range(3):
        with pytest.raises(NoFreeBlocksError):
            bm.append_token("b", 1)         # b's last block is full
    assert snapshot(bm, ["b", "c"]) == before
    bm.free("c")
    bm.append_token("b", 1)
    assert bm.block_table("b") == [2, 3, 4]


def test_changed_token_in_block_k_misses_from_k_on():
    bm = BlockManager(32, 4, enable_prefix_caching=True)
    base = toks(0, 17)
    bm.allocate("a", base)
    bm.commit("a", 17)
    for k in range(4):
        changed = list(base)
        changed[4 * k + 2] = 999
        assert bm.allocate(f"b{k}", changed) == 4 * k
        assert bm.block_table(f"b{k}")[:k] == bm.block_table("a")[:k]
        assert not set(bm.block_table(f"b{k}")[k:]) & set(bm.block_table("a"))


def test_partial_blocks_never_shared():
    bm = BlockManager(16, 4, enable_prefix_caching=True)
    bm.allocate("a", toks(0, 6))
    bm.commit("a", 6)
    for t in range(2):
        bm.append_token("a", 6 + t)         # a's 2nd block fills only now; committed 6 tokens
    assert bm.allocate("b", toks(0, 8) + [99]) == 4
    assert bm.block_table("b")[1] != bm.block_table("a")[1]


def test_whole_prompt_hit_leaves_one_token():
    bm = BlockManager(16, 4, enable_prefix_caching=True)
    bm.allocate("a", toks(0, 8))
    bm.commit("a", 8)
    assert bm.allocate("b", toks(0, 8)) == 4    # the last block is private: b computes token 7
    assert bm.block_table("b")[0] == bm.block_table("a")[0]
    assert bm.block_table("b")[1] != bm.block_table("a")[1]
    assert bm.allocate("c", toks(0, 9)) == 8


def test_duplicate_content_is_cached_in_every_copy():
    bm = BlockManager(16, 4, enable_prefix_caching=True)
    bm.allocate("a", toks(0, 5))
    bm.allocate("b", toks(0, 5))            # same content, neither committed yet
    bm.commit("a", 5)
    bm.commit("b", 5)
    bm.free("b")                            # b's copy stays cached (evictable), as in vLLM
    assert bm.num_cached_free_blocks == 1
    assert bm.allocate("c", toks(0, 5)) == 4
    assert bm.block_table("c")[0] == bm.block_table("a")[0]      # the live copy, not the free one
    assert bm.num_cached_free_blocks == 1


def test_a_copy_keeps_its_content_when_the_other_copy_is_evicted():
    bm = BlockManager(6, 2, enable_prefix_caching=True)
    bm.allocate("a", [1, 2, 3])
    bm.commit("a", 3)
    assert bm.allocate("b", [1, 2, 3]) == 2                         # b shares a's first block
    for rid in ("a", "b"):                                          # both grow the same (3, 4) block
        bm.append_token(rid, 4)
        bm.commit(rid, 4)
    a1, b1 = bm.block_table("a")[1], bm.block_table("b")[1]
    assert a1 != b1
    bm.free("a")
    bm.allocate("f", [9] * 6)               # takes the clean blocks, then evicts a's (3, 4) copy
    bm.append_token("f", 9)
    assert a1 in bm.block_table("f") and bm.stats()["evictions"] == 1
    bm.free("f")
    assert bm.allocate("c", [1, 2, 3, 4, 5]) == 4 and bm.block_table("c")[:2] == bm.block_table("b")[:2]
    bm.free("c")
    bm.free("b")                            # b's copy stays cached after b is gone
    assert bm.allocate("d", [1, 2, 3, 4, 5]) == 4 and bm.block_table("d")[1] == b1


def test_sizes_may_be_numpy_integers_but_not_bools():
    bm = BlockManager(np.int64(8), np.int32(4))
    assert (bm.num_blocks, bm.block_size) == (8, 4) and type(bm.num_blocks) is int
    for bad in (True, 2.0, "8"):
        with pytest.raises(ValueError, match="num_blocks must be an int >= 1"):
            BlockManager(bad, 4)


def test_contiguity_on_fragmented_pool():
    bm = BlockManager(20, 4)
    for i in range(5):
        bm.allocate(f"r{i}", toks(0, 16))   # r_i holds [4i, 4i+4)
    bm.free("r1")
    bm.free("r3")                           # holes of 4 at 4 and 12
    bm.allocate("x", toks(0, 12))           # fits a hole: one run
    assert bm.block_table("x") == [4, 5, 6]
    bm.allocate("y", toks(0, 20))           # 5 blocks, largest range is 4: scatters, the largest last
    assert bm.block_table("y") == [7, 12, 13, 14, 15]
    s = bm.stats()
    assert s["allocation_contiguity"] == pytest.approx(6 / 7)
    assert s["contiguity"] == pytest.approx((5 * 3 + 2 + 3) / (5 * 3 + 2 + 4))
    assert BlockManager(4, 4).stats()["contiguity"] == 1.0


def test_a_scattering_prompt_spares_the_largest_range():
    bm = BlockManager(20, 1)
    for name, n in (("a", 4), ("b", 1), ("c", 6), ("d", 1), ("e", 4), ("f", 4)):
        bm.allocate(name, toks(0, n))       # a [0, 4), b [4], c [5, 11), d [11], e [12, 16), f [16, 20)
    for name in "ace":
        bm.free(name)                       # free ranges of 4, 6 and 4 blocks
    bm.allocate("x", toks(0, 7))            # no range holds 7: the 4 at 0, then the lowest others
    assert bm.block_table("x") == [0, 1, 2, 3, 12, 13, 14]
    bm.allocate("y", toks(0, 6))            # the 6-block range survived the scatter
    assert bm.block_table("y") == [5, 6, 7, 8, 9, 10]
    assert bm.stats()["allocation_contiguity"] == pytest.approx(5 / 6)
    bm.free("x")
    bm.allocate("z", toks(0, 6))            # two ranges of 4: the lower is spared, and used last
    assert bm.block_table("z") == [12, 13, 14, 15, 0, 1]
    assert bm.num_free_blocks == 2


def test_scattered_is_a_plain_free_list():
    bm = BlockManager(8, 4, allocation="scattered")
    bm.allocate("a", toks(0, 8))
    bm.allocate("b", toks(0, 8))
    bm.free("a")
    bm.allocate("c", toks(0, 20))
    assert bm.block_table("c") == [4, 5, 6, 7, 1]
    assert bm.block_table("b") == [2, 3]


def _line_events(num_blocks):
    bm = BlockManager(num_blocks, 4, enable_prefix_caching=True)
    count = 0

    def tracer(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
        return tracer

    sys.settrace(tracer)
    try:
        for i in range(20):
            bm.allocate(f"r{i}", toks(i * 100, 30), max_tokens=10)
            bm.commit(f"r{i}", 30)
            for t in range(10):
                bm.append_token(f"r{i}", t)
            if i % 2:
                bm.free(f"r{i - 1}")
    finally:
        sys.settrace(None)
    return count


def test_no_per_call_work_proportional_to_pool():
    # the same calls on pools of 2**10, 2**15 and 2**20 blocks (rounded up): each 32x larger pool adds
    # the same few lines (5 more levels of the orphan index's min-tree): O(log n), no scan
    small, mid, large = _line_events(1_000), _line_events(32_000), _line_events(1_000_000)
    assert large - mid == mid - small
    assert large < 1.25 * small


def test_contiguous_beats_scattered_on_fragmented_pool():
    def run(allocation):
        bm = BlockManager(32, 4, allocation=allocation)
        for i in range(8):
            bm.allocate(f"r{i}", toks(0, 16))   # r_i holds 4 blocks
        for i in range(0, 8, 2):
            bm.free(f"r{i}")                    # four holes of 4 blocks
        for i in range(4):
            bm.allocate(f"n{i}", toks(0, 13))   # 4 blocks each
        return bm.stats()
    c, s = run("contiguous"), run("scattered")
    assert c["allocation_contiguity"] == 1.0
    assert s["allocation_contiguity"] < 1.0
    assert c["contiguity"] > s["contiguity"]



@pytest.mark.parametrize("first_hole, start", [(5, 4), (8, 4), (9, 17)])
def test_near_best_fits_go_to_the_lowest_address(first_hole, start):
    bm = BlockManager(64, 4)
    for rid, blocks in (("r0", 4), ("r1", first_hole), ("r2", 4), ("r3", 4), ("r4", 4)):
        bm.allocate(rid, toks(0, 4 * blocks))   # no max_tokens: no room left between them
    bm.free("r1")                               # hole [4, 4 + first_hole)
    bm.free("r3")                               # hole of exactly 4 blocks after r2
    assert bm.block_table("r2")[-1] + 1 == 8 + first_hole
    bm.allocate("n", toks(0, 16))               # within 4 blocks of the best fit, the lower hole wins
    assert bm.block_table("n") == list(range(start, start + 4))


@pytest.mark.parametrize("max_tokens, start", [(100, 7), (8, 4), (None, 4)])
def test_new_prompt_leaves_the_request_before_it_a_quarter_of_its_expected_growth(max_tokens, start):
    bm = BlockManager(64, 4)
    bm.allocate("a", toks(0, 16), max_tokens=max_tokens)   # [0, 4)
    bm.allocate("b", toks(0, 8))
    # max_tokens=100: a is expected to reach 16 + 50 tokens = 17 blocks, 13 more; a quarter is 3
    assert bm.block_table("b") == [start, start + 1]
    for t in range(4 * (start - 4)):
        bm.append_token("a", t)                            # a grows in place into that room
    assert bm.block_table("a") == list(range(start))


def test_left_room_never_costs_a_prompt_its_fit():
    bm = BlockManager(12, 4)
    bm.allocate("a", toks(0, 16), max_tokens=100)   # [0, 4)
    bm.allocate("x", toks(0, 8))                    # [7, 9): a keeps the room [4, 7)
    assert bm.block_table("x") == [7, 8]
    bm.allocate("y", toks(0, 12))                   # 3 blocks: a's room is an exact fit, taken whole
    assert bm.block_table("y") == [4, 5, 6]


def test_near_fits_prefer_a_range_nobody_grows_into():
    bm = BlockManager(64, 4)
    for rid, blocks in (("p", 2), ("h", 3), ("x", 2), ("y", 3), ("z", 1)):
        bm.allocate(rid, toks(0, 4 * blocks))   # p [0, 2), h [2, 5), x [5, 7), y [7, 10), z [10]
    bm.append_token("x", 0)                     # 7 is y's: x jumps to 11, so 6 is no longer its tail
    assert bm.block_table("x") == [5, 6, 11]
    bm.free("h")                                # [2, 5): room after p's tail
    bm.free("y")                                # [7, 10): after x's old end, nobody's room
    bm.allocate("n", toks(0, 12))               # both fit exactly: the one nobody grows into wins
    assert bm.block_table("n") == [7, 8, 9]


def test_left_room_is_at_most_half_of_what_the_range_leaves():
    bm = BlockManager(10, 4)
    bm.allocate("a", toks(0, 16), max_tokens=100)   # [0, 4); a quarter of its expected growth is 3
    bm.allocate("x", toks(0, 8))                    # the range [4, 10) leaves 4: a gets 2, x keeps 2
    assert bm.block_table("x") == [6, 7]


def test_a_request_short_of_its_end_takes_the_top_of_a_small_hole():
    bm = BlockManager(64, 4)
    bm.allocate("h", toks(0, 8))                    # [0, 2)
    bm.allocate("w", toks(0, 24))                   # [2, 8)
    bm.allocate("a", toks(0, 40), max_tokens=36)    # [8, 18): at most 9 more blocks, fewer than its prompt's 10
    bm.allocate("z", toks(0, 4))                    # [19]: a keeps [18] as room
    bm.free("h")                                    # a 2-block hole nobody grows into
    for t in range(8):
        bm.append_token("a", t)                     # block 18, then blocked: expected growth 4, the hole is 2
    # a takes the hole's last block, not its first: [0] stays an orphan anyone may fill
    assert bm.block_table("a") == list(range(8, 19)) + [1]
    assert bm.placement.ranges.end_of(0) == 1 and 0 in bm.placement.ranges.orphans.size_of


def test_a_jumping_request_goes_home_next_to_its_own_blocks():
    bm = BlockManager(10, 1)
    for r in "abcd":
        bm.allocate(r, [1, 1])
    assert [bm.block_table(r) for r in "abcd"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    bm.append_token("a", 1)                         # 2 is b's: a jumps to [8, 10), whose rest is its room
    bm.free("b")                                    # [2, 4): right after a's first run, right below c's
    bm.append_token("c", 1)                         # 6 is d's: c takes the top of the hole, below its own run
    assert bm.block_table("c") == [4, 5, 3]
    bm.append_token("a", 1)                         # 9, its room
    bm.append_token("a", 1)                         # a takes 2, right after its own first run
    assert bm.block_table("a") == [0, 1, 8, 9, 2]
    bm.free("a")                                    # its blocks come back as two ranges, not three
    assert bm.allocate("e", [1, 1, 1]) == 0 and bm.block_table("e") == [0, 1, 2]
    assert bm.stats()["allocation_contiguity"] == 1.0


def test_a_blocked_request_jumps_into_a_small_hole_it_will_fill():
    bm = BlockManager(64, 4)
    bm.allocate("r0", toks(0, 32))                  # [0, 8)
    bm.allocate("x", toks(0, 8))                    # [8, 10)
    bm.allocate("y", toks(0, 4))                    # [10]
    bm.allocate("a", toks(0, 16), max_tokens=40)    # [11, 15); expected growth 20 tokens: 5 blocks
    bm.allocate("z", toks(0, 4))                    # [16]: a keeps one block of room
    bm.append_token("x", 0)                         # x is blocked and takes a's room
    assert bm.block_table("x") == [8, 9, 15]
    bm.free("y")                                    # a 1-block hole after x's old end
    bm.free("r0")                                   # an 8-block range below it
    for t in range(4):
        bm.append_token("a", t)                     # a's 17th-20th tokens: one more block
    # blocked: a takes the hole of at most half its expected growth (2), not the lowest range's start,
    # which stays whole for a prompt
    assert bm.block_table("a") == [11, 12, 13, 14, 10]
    assert bm.placement.ranges.end_of(0) == 8


# a prompt is a list of chunks; one chunk fills one block of 4 tokens, the last prompt entry is a partial block
_CHUNKS = {name: [10 * i + k for k in range(4)] for i, name in enumerate("PQRS", 1)}
_PROMPTS = [("QP", [1]), ("P", [2]), ("PQR", [3]), ("QPR", [4]), ("PQR", [5, 5]), ("QPRS", [6]),
            ("PQS", [7]), ("SP", [8]), ("QPRS", [9])]


def _share_run(num_blocks=64):
    """Allocate, commit and free the prompts in turn, some kept alive; returns each allocation's hits and
    table, and checks that every hit block holds KV computed for this request's whole chain of tokens."""
    bm = BlockManager(num_blocks, 4, enable_prefix_caching=True)
    computed = {}     # block -> the tokens (whole prefix) its KV was computed for
    out = []
    for n, (names, tail) in enumerate(_PROMPTS):
        tokens = [t for name in names for t in _CHUNKS[name]] + tail
        rid = f"r{n}"
        cached = bm.allocate(rid, tokens)
        table = bm.block_table(rid)
        for i, b in enumerate(table):
            prefix = tuple(tokens[:(i + 1) * 4])
            if i < cached // 4:
                assert computed[b] == prefix, f"{rid}: block {b} at {i} holds KV of another prefix"
            else:
                computed[b] = prefix
        bm.commit(rid, len(tokens))
        out.append((cached, table))
        if n % 3 != 2:
            bm.free(rid)
    return out


def test_prefix_sharing_is_exact_even_when_every_hash_collides(monkeypatch):
    # a crafted collision must not serve one prefix's KV to another: hits are checked by their chain of tokens
    reference = _share_run()
    assert sum(cached for cached, _ in reference) >= 5 * 4          # the prompts do share
    from ms_atb.core import block_manager, prefix_cache

    def collide(*args, **kwargs):
        return b"\0" * 16
    monkeypatch.setattr(prefix_cache, "hash_block", collide)
    monkeypatch.setattr(block_manager, "hash_block", collide, raising=False)
    assert _share_run() == reference                                   # the same hits, the same tables
