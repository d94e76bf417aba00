"""The prefix-grouped waiting order (ms_atb/core/prefix_order.py), on the scheduler with the fake model of
test_scheduler.py: grouping, the bound on waiting, and the same tokens as first come, first served."""
import random

import pytest

from ms_atb.core.prefix_order import MAX_OVERTAKES, FcfsQueue, PrefixQueue
from ms_atb.core.scheduler import Scheduler, SchedulerConfig
from ms_atb.core.sequence import Sequence
from test_scheduler import VOCAB, run


def seq(name, tokens, max_tokens=4):
    return Sequence(name, list(tokens), max_tokens, ignore_eos=True)


def admission_order(sched, seqs):
    """Request ids in order of first admission, driving sched to completion."""
    order = []
    inner = sched.block_manager.allocate

    def allocate(request_id, *args, **kwargs):
        cached = inner(request_id, *args, **kwargs)
        if request_id not in order:
            order.append(request_id)
        return cached
    sched.block_manager.allocate = allocate
    run(sched, seqs)
    return order


def test_queue_walks_sorted_order_from_the_last_admitted_prompt():
    q = PrefixQueue()
    a1, b1, a2, c1, b2 = (seq(n, t) for n, t in (("a1", [1, 1, 5]), ("b1", [2, 2, 9]), ("a2", [1, 1, 3]),
                                                 ("c1", [3, 0, 0]), ("b2", [2, 2, 1])))
    for s in (a1, b1, a2, c1, b2):
        q.add(s, step=0)
    assert [q.pop().request_id for _ in range(2)] == ["a2", "a1"]
    q.add(seq("b3", [2, 2, 5]), step=1)
    late = seq("a3", [1, 1, 9])            # sorts before b*, shares the prefix just admitted
    q.add(late, step=1)
    assert q.pop() is late
    assert [q.pop().request_id for _ in range(len(q))] == ["b2", "b3", "b1", "c1"]


def test_preempted_requests_go_first_and_waiting_ones_can_be_removed():
    q = PrefixQueue()
    x, y, z = seq("x", [5]), seq("y", [1]), seq("z", [3])
    for s in (x, y, z):
        q.add(s, step=0)
    q.add_preempted(x)                    # as the scheduler does after admitting and preempting it
    q.remove(z)
    assert len(q) == 3 and list(q)[0] is x
    assert [q.pop().request_id for _ in range(3)] == ["x", "x", "y"]
    with pytest.raises(ValueError, match=r"max_overtakes must be an integer >= 0"):
        PrefixQueue(max_overtakes=-1)


def test_prefix_groups_are_admitted_together_and_computed_once():
    rng = random.Random(0)
    systems = [[rng.randrange(VOCAB) for _ in range(64)] for _ in range(6)]
    order = list(range(24))
    rng.shuffle(order)
    seqs_of = {}

    def make(policy):
        seqs_of[policy] = [seq(f"r{i}", systems[i % 6] + [rng.randrange(VOCAB) for _ in range(8)], 6)
                           for i in order]
        # Room for about three system prompts with the running requests: FCFS keeps evicting.
        sched = Scheduler(SchedulerConfig(num_blocks=16, block_size=16, max_model_len=256, max_num_seqs=2,
                                          max_num_batched_tokens=64, enable_prefix_caching=True))
        sched.set_policy(policy)
        return sched, admission_order(sched, seqs_of[policy])
    rng_state = rng.getstate()
    fcfs, fcfs_order = make("fcfs")
    rng.setstate(rng_state)
    prefix, prefix_order = make("prefix")
    groups = [int(r[1:]) % 6 for r in prefix_order]
    assert groups == sorted(groups, key=groups.index)          # each system prompt's requests in one run
    assert fcfs_order == [f"r{i}" for i in order]
    assert prefix.num_computed_prompt_tokens < fcfs.num_computed_prompt_tokens
    assert prefix.num_computed_prompt_tokens == 6 * 64 + 24 * (8 + 6 - 1)  # each system prompt computed once
    assert prefix.block_manager.stats()["prefix_cache_hits"] >= 18 * 64   # every request after a group's first
    assert [s.token_ids for s in seqs_of["prefix"]] == [s.token_ids for s in seqs_of["fcfs"]]


@pytest.mark.parametrize("max_overtakes", [0, 5, MAX_OVERTAKES])
def test_a_request_is_overtaken_by_at_most_max_overtakes_later_arrivals(max_overtakes):
    """Two requests of a hot prefix arrive every step, each sorting before a lone request that arrived
    first; the lone one is admitted after at most max_overtakes of them."""
    rng = random.Random(1)
    hot = [1] * 32
    sched = Scheduler(SchedulerConfig(num_blocks=64, block_size=16, max_model_len=128, max_num_seqs=1,
                                      max_num_batched_tokens=256, enable_prefix_caching=True))
    sched.set_policy("prefix")
    sched.waiting.max_overtakes = max_overtakes
    lone = seq("lone", [VOCAB - 1] * 20, 2)
    sched.add(lone)
    sched.add(seq("h-first", hot + [0], 2))
    admitted, n, steps = [], 0, 0
    while lone.num_computed_tokens == 0:
        step = sched.schedule()
        admitted += [s.request_id for s in step.seqs if s.request_id not in admitted]
        sched.update(step, [rng.randrange(VOCAB) if smp else None for smp in step.sampled])
        for _ in range(2):
            sched.add(seq(f"h{n}", hot + [rng.randrange(2, VOCAB - 1)], 2))
            n += 1
        steps += 1
        assert steps < 1000
    later = admitted.index("lone") - 1          # hot requests admitted before it, h-first excepted
    assert later == max_overtakes


def test_without_the_bound_the_lone_request_would_wait_on_every_later_arrival():
    rng = random.Random(1)
    sched = Scheduler(SchedulerConfig(num_blocks=64, block_size=16, max_model_len=128, max_num_seqs=1,
                                      max_num_batched_tokens=256, enable_prefix_caching=True))
    sched.set_policy("prefix")
    sched.waiting.max_overtakes = 10 ** 9
    lone = seq("lone", [VOCAB - 1] * 20, 2)
    sched.add(lone)
    for n in range(300):
        sched.add(seq(f"h{n}", [1] * 32 + [rng.randrange(2, VOCAB - 1)], 2))
        step = sched.schedule()
        sched.update(step, [rng.randrange(VOCAB) if smp else None for smp in step.sampled])
    assert lone.num_computed_tokens == 0


def test_a_batch_added_at_once_is_one_arrival_and_admitted_in_one_pass():
    rng = random.Random(2)
    seqs = [seq(f"r{i}", [rng.randrange(VOCAB) for _ in range(rng.randint(1, 40))], rng.randint(1, 8))
            for i in range(3 * MAX_OVERTAKES)]
    sched = Scheduler(SchedulerConfig(num_blocks=32, block_size=16, max_model_len=128, max_num_seqs=4,
                                      max_num_batched_tokens=64, enable_prefix_caching=True))
    sched.set_policy("prefix")
    order = admission_order(sched, seqs)
    assert order == [s.request_id for s in sorted(seqs, key=lambda s: s.prompt_token_ids)]


@pytest.mark.parametrize("seed", range(4))
def test_prefix_order_gives_every_request_the_tokens_of_fcfs(seed):
    rng = random.Random(seed)
    shared = [[rng.randrange(VOCAB) for _ in range(rng.randint(16, 48))] for _ in range(3)]
    specs = [(rng.choice(shared)[:rng.randint(0, 48)] + [rng.randrange(VOCAB) for _ in range(rng.randint(1, 30))],
              rng.randint(1, 40)) for _ in range(30)]
    specs += rng.sample(specs, 4)                                 # exact duplicates
    tokens = {}
    for policy in ("fcfs", "prefix"):
        sched = Scheduler(SchedulerConfig(num_blocks=16, block_size=8, max_model_len=128,
                                          max_num_seqs=rng.randint(2, 8),
                                          max_num_batched_tokens=32, enable_prefix_caching=True))
        sched.set_policy(policy)
        seqs = [seq(f"r{i}", p, m) for i, (p, m) in enumerate(specs)]
        run(sched, seqs)
        assert sched.block_manager.stats()["usage"] == 0
        tokens[policy] = [s.token_ids for s in seqs]
    assert tokens["prefix"] == tokens["fcfs"]


def test_policy_is_checked_and_changes_only_between_runs():
    sched = Scheduler(SchedulerConfig(num_blocks=8, block_size=16, max_model_len=64))
    with pytest.raises(ValueError, match=r"policy must be one of \['fcfs', 'prefix'\], got 'lifo'"):
        sched.set_policy("lifo")
    assert isinstance(sched.waiting, FcfsQueue) and sched.policy == "fcfs"
    sched.set_policy("prefix")
    assert isinstance(sched.waiting, PrefixQueue) and sched.policy == "prefix"
