"""LoRA in the control plane (pure Python): the slots' assignment and LRU eviction, the scheduler admitting
requests only with their adapter resident and making them wait (never fail) for a slot, with a bound on how long,
and the prefix cache keyed by the adapter: blocks never shared across adapters, even when every hash collides."""
import pytest

from ms_atb.core.block_manager import BlockManager
from ms_atb.core.lora_slots import LoraSlots
from ms_atb.core.scheduler import MAX_LORA_OVERTAKES, Scheduler, SchedulerConfig
from ms_atb.core.sequence import Sequence

A, B, C = "lora:a", "lora:b", "lora:c"


def test_slots_fill_empty_ones_first_then_evict_the_least_recently_used():
    slots = LoraSlots(2)
    assert slots.acquire(A) == 0 and slots.acquire(B) == 1 and slots.acquire(A) == 0
    assert slots.take_loads() == [(0, A), (1, B)] and slots.take_loads() == []
    assert not slots.can_acquire(C) and slots.can_acquire(A)       # both slots in use: C waits
    slots.release(B)
    slots.release(A)
    assert slots.can_acquire(C)          # A still has a user: only B's slot is free
    assert slots.acquire(C) == 1 and slots.take_loads() == [(1, C)]
    slots.release(A)
    slots.release(C)                     # A released before C: A is the least recently used
    assert slots.acquire(B) == 0 and slots.resident == {0: B, 1: C} and slots.num_loads == 4
    assert slots.acquire(C) == 1 and slots.take_loads() == [(0, B)]    # resident: no load
    with pytest.raises(ValueError, match="max_loras"):
        LoraSlots(0)


def seq(rid, key, n=8, max_tokens=4, start=0):
    return Sequence(rid, list(range(start, start + n)), max_tokens, ignore_eos=True, extra_key=key, lora_key=key)


def run(scheduler, seqs, max_steps=200):
    """Runs to the end, feeding token 1; returns every step (its request ids, slots and loads)."""
    for s in seqs:
        scheduler.add(s)
    steps = []
    while scheduler.has_unfinished() and len(steps) < max_steps:
        step = scheduler.schedule()
        steps.append(step)
        scheduler.update(step, [1 if sampled else None for sampled in step.sampled])
    assert not scheduler.has_unfinished()
    return steps


def test_requests_wait_for_a_slot_and_each_step_names_slots_and_loads():
    sched = Scheduler(SchedulerConfig(num_blocks=64, block_size=4, max_model_len=64, max_loras=2))
    seqs = [seq("a0", A), seq("b0", B), seq("c0", C), seq("base", None), seq("a1", A)]
    steps = run(sched, seqs)
    first = steps[0]
    # c0 waits (both slots taken by a0 and b0); the requests behind it that can run are admitted
    assert first.request_ids == ["a0", "b0", "base", "a1"] and first.lora_slots == [0, 1, -1, 0]
    assert first.lora_loads == [(0, A), (1, B)]
    loaded = [(i, load) for i, s in enumerate(steps) for load in s.lora_loads]
    later = [(i, load) for i, load in loaded if i > 0]
    assert later and later[0][1][1] == C           # c0's adapter takes a slot once one is free of users
    c_step = next(s for s in steps if "c0" in s.request_ids)
    assert c_step.lora_slots[c_step.request_ids.index("c0")] == later[0][1][0]
    for s in steps:                                   # a slot serves one adapter within a step
        by_slot = {}
        for rid, slot in zip(s.request_ids, s.lora_slots):
            key = {"a": A, "b": B, "c": C}.get(rid[0])
            if slot >= 0:
                assert by_slot.setdefault(slot, key) == key
    assert sched.stats()["num_lora_loads"] == 3


def test_a_request_waiting_for_a_slot_is_overtaken_a_bounded_number_of_times():
    sched = Scheduler(SchedulerConfig(num_blocks=512, block_size=4, max_model_len=256, max_loras=1,
                                      max_num_seqs=4, max_num_batched_tokens=512))
    # a long request of A holds the only slot; B waits behind it while base requests keep arriving
    for s in [seq("a", A, max_tokens=200), seq("b", B)] + [seq(f"n{i}", None, max_tokens=1) for i in range(200)]:
        sched.add(s)
    seen = set()
    while True:
        step = sched.schedule()
        if "b" in step.request_ids:
            break
        seen.update(step.request_ids)
        sched.update(step, [1 if sampled else None for sampled in step.sampled])
    # admitted before b: exactly the bound's worth of base requests; then admission waited for b, until a finished
    assert len(seen - {"a"}) == MAX_LORA_OVERTAKES
    assert step.request_ids[0] == "b" and "a" not in step.request_ids


def test_a_request_of_an_adapter_needs_lora_on():
    sched = Scheduler(SchedulerConfig(num_blocks=8, block_size=4, max_model_len=32))
    with pytest.raises(ValueError, match="LoRA is off"):
        sched.add(seq("a", A))


def test_preempted_requests_release_their_slot_and_get_it_back():
    sched = Scheduler(SchedulerConfig(num_blocks=6, block_size=4, max_model_len=32, max_loras=1,
                                      max_num_batched_tokens=64))
    steps = run(sched, [seq("a0", A, n=8, max_tokens=12), seq("a1", A, n=8, max_tokens=12, start=50)])
    assert sched.num_preemptions > 0
    assert sched.stats()["num_lora_loads"] == 1      # one adapter: loaded once, kept while preempted
    assert all(slot == 0 for s in steps for slot in s.lora_slots)


@pytest.mark.parametrize("collide", [False, True])
def test_prefix_blocks_are_shared_only_under_the_same_extra_key(monkeypatch, collide):
    if collide:        # every hash, the roots' included, collides: the chains still keep the keys apart
        from ms_atb.core import prefix_cache
        monkeypatch.setattr(prefix_cache, "hash_block", lambda *a, **k: b"\0" * 16)
    bm = BlockManager(32, 4, enable_prefix_caching=True)
    tokens = list(range(13))                  # three whole blocks and one token
    for rid, key in (("a", A), ("base", None), ("b", B)):
        assert bm.allocate(rid, tokens, extra_key=key) == 0
        bm.commit(rid, len(tokens))
        bm.free(rid)
    for rid, key in (("a2", A), ("base2", None), ("b2", B)):
        assert bm.allocate(rid, tokens, extra_key=key) == 12, rid      # its own adapter's blocks only
        assert bm.allocate(rid + "-c", tokens, extra_key=C) == 0
        bm.free(rid + "-c")
    tables = [bm.block_table(r)[:3] for r in ("a2", "base2", "b2")]
    assert len({b for t in tables for b in t}) == 9                     # no block in two tables
