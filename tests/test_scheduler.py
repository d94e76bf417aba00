"""Scheduler tests with a deterministic fake model: next token = a fixed function of the tokens so far."""
import random

import pytest

from ms_atb.core.scheduler import Scheduler, SchedulerConfig
from ms_atb.core.sequence import Sequence, SequenceStatus

VOCAB = 1000


def fake_next_token(tokens: list[int]) -> int:
    return (tokens[-1] * 31 + len(tokens) * 7 + (tokens[-2] if len(tokens) > 1 else 3)) % VOCAB


def run(sched: Scheduler, seqs: list[Sequence], check_step=None, max_steps=100_000) -> list[list]:
    """Drives the scheduler to completion; returns the steps' (request_id, num_tokens) lists."""
    for s in seqs:
        sched.add(s)
    history = []
    kv = {}                          # slot -> (request id, position) written by the "model"
    for _ in range(max_steps):
        if not sched.has_unfinished():
            break
        step = sched.schedule()
        if check_step:
            check_step(step)
        # The model writes each token's KV into its slot; shared (cached) slots are never rewritten.
        i = 0
        for seq, n in zip(step.seqs, step.num_scheduled_tokens):
            for j in range(n):
                pos = step.positions[i + j]
                kv[step.slot_mapping[i + j]] = seq.token_ids[:pos + 1]
            i += n
        # Attention reads the context through the block table: every position must hold this
        # sequence's tokens (its own or a shared prefix with identical tokens).
        for seq, table, ctx in zip(step.seqs, step.block_tables, step.context_lens):
            for pos in range(ctx):
                slot = table[pos // sched.block_size] * sched.block_size + pos % sched.block_size
                assert kv[slot] == seq.token_ids[:pos + 1], (seq.request_id, pos)
        sampled = [fake_next_token(s.token_ids) if smp else None
                   for s, smp in zip(step.seqs, step.sampled)]
        sched.update(step, sampled)
        history.append(list(zip(step.request_ids, step.num_scheduled_tokens)))
    assert not sched.has_unfinished()
    return history


def make_seqs(lengths, max_tokens, seed=0, prefix=()):
    rng = random.Random(seed)
    return [Sequence(f"r{i}", list(prefix) + [rng.randrange(VOCAB) for _ in range(n)], mt, ignore_eos=True)
            for i, (n, mt) in enumerate(zip(lengths, max_tokens))]


def test_budgets_respected_every_step():
    sched = Scheduler(SchedulerConfig(num_blocks=64, block_size=16, max_model_len=512, max_num_seqs=4,
                                      max_num_batched_tokens=48))

    def check(step):
        assert step.num_tokens <= 48
        assert len(step.seqs) <= 4
        assert len(sched.running) <= 4
        assert step.query_start_loc[-1] == step.num_tokens
        assert len(step.slot_mapping) == len(set(step.slot_mapping)) == step.num_tokens

    seqs = make_seqs([5, 70, 33, 100, 8, 17], [10, 5, 20, 3, 30, 9])
    run(sched, seqs, check)
    assert all(s.num_output_tokens == s.max_tokens for s in seqs)


def test_chunked_prefill_splits_as_configured():
    sched = Scheduler(SchedulerConfig(num_blocks=64, block_size=16, max_model_len=512, max_num_batched_tokens=32))
    (seq,) = make_seqs([100], [2])
    history = run(sched, [seq])
    assert [h[0][1] for h in history] == [32, 32, 32, 4, 1]
    assert seq.num_output_tokens == 2


def test_without_chunked_prefill_a_prompt_waits_for_a_whole_step():
    sched = Scheduler(SchedulerConfig(num_blocks=64, block_size=16, max_model_len=512, max_num_batched_tokens=64,
                                      enable_chunked_prefill=False))
    a, b = make_seqs([40, 40], [3, 3])
    history = run(sched, [a, b])
    assert history[0] == [("r0", 40)]                 # b does not fit beside a: no split
    assert history[1] == [("r0", 1), ("r1", 40)]
    with pytest.raises(ValueError, match="chunked prefill is disabled"):
        sched.add(make_seqs([65], [1])[0])


def test_preemption_reproduces_roomy_streams():
    lengths = [30, 50, 20, 64, 45, 10, 33, 28]
    max_tokens = [40, 25, 60, 30, 35, 50, 20, 45]
    roomy = make_seqs(lengths, max_tokens, seed=1)
    run(Scheduler(SchedulerConfig(num_blocks=256, block_size=16, max_model_len=256, max_num_batched_tokens=128)), roomy)
    tight = make_seqs(lengths, max_tokens, seed=1)
    sched = Scheduler(SchedulerConfig(num_blocks=12, block_size=16, max_model_len=256, max_num_batched_tokens=128,
                                      enable_prefix_caching=True))
    run(sched, tight)
    assert sched.num_preemptions > 0
    assert [s.token_ids for s in tight] == [s.token_ids for s in roomy]
    assert sched.block_manager.stats()["usage"] == 0


def test_preempted_request_resumes_on_its_own_cached_blocks():
    sched = Scheduler(SchedulerConfig(num_blocks=8, block_size=4, max_model_len=64, max_num_batched_tokens=64,
                                      enable_prefix_caching=True))
    a, b = make_seqs([8, 8], [20, 20], seed=2)
    run(sched, [a, b])
    assert sched.num_preemptions > 0
    assert sched.block_manager.stats()["prefix_cache_hits"] > 0


def test_same_step_prefix_sharing():
    prefix = list(range(100, 132))                    # two whole blocks
    sched = Scheduler(SchedulerConfig(num_blocks=32, block_size=16, max_model_len=256, max_num_batched_tokens=256,
                                      enable_prefix_caching=True))
    seqs = make_seqs([5, 7, 9], [4, 4, 4], seed=3, prefix=prefix)
    for s in seqs:
        sched.add(s)
    step = sched.schedule()
    assert step.request_ids == ["r0", "r1", "r2"]
    assert step.num_scheduled_tokens == [37, 7, 9]    # r1 and r2 compute only their suffix
    assert [s.num_cached_tokens for s in seqs] == [0, 32, 32]
    assert step.block_tables[1][:2] == step.block_tables[0][:2] == step.block_tables[2][:2]


def test_no_sharing_without_prefix_caching():
    prefix = list(range(100, 132))
    sched = Scheduler(SchedulerConfig(num_blocks=32, block_size=16, max_model_len=256, max_num_batched_tokens=256))
    seqs = make_seqs([5, 7], [4, 4], seed=3, prefix=prefix)
    for s in seqs:
        sched.add(s)
    assert sched.schedule().num_scheduled_tokens == [37, 39]


def test_static_admits_fewer_than_paged():
    def peak(allocation):
        sched = Scheduler(SchedulerConfig(num_blocks=64, block_size=16, max_model_len=256, max_num_seqs=64,
                                          max_num_batched_tokens=4096, allocation=allocation))
        run(sched, make_seqs([40] * 20, [20] * 20, seed=4))
        return sched.peak_running

    static, paged = peak("static"), peak("contiguous")
    assert static == 64 // 16
    assert paged >= 2 * static


def test_impossible_requests_rejected_when_added():
    sched = Scheduler(SchedulerConfig(num_blocks=4, block_size=16, max_model_len=128))
    with pytest.raises(ValueError, match="max_model_len"):
        sched.add(Sequence("a", [1] * 100, 29))
    with pytest.raises(ValueError, match="KV blocks"):
        sched.add(Sequence("b", [1] * 60, 20))
    with pytest.raises(ValueError, match="static allocation"):
        Scheduler(SchedulerConfig(num_blocks=4, block_size=16, max_model_len=128, allocation="static"))
    with pytest.raises(ValueError, match="allocation"):
        Scheduler(SchedulerConfig(num_blocks=4, block_size=16, max_model_len=128, allocation="lazy"))
    assert not sched.has_unfinished()


@pytest.mark.parametrize("prompt, max_tokens, match", [
    ([], 4, "the prompt is empty"), ([1], 0, "max_tokens must be an int >= 1"),
    ([1], None, "max_tokens must be an int >= 1"), ([1], 2.0, "max_tokens must be an int >= 1"),
])
def test_bad_sequences_are_value_errors(prompt, max_tokens, match):
    with pytest.raises(ValueError, match=match):
        Sequence("a", prompt, max_tokens)


def test_stop_conditions():
    sched = Scheduler(SchedulerConfig(num_blocks=16, block_size=16, max_model_len=128))
    seq = Sequence("a", [1, 2, 3], max_tokens=10, stop_token_ids={7})
    sched.add(seq)
    step = sched.schedule()
    assert sched.update(step, [5]) == []
    step = sched.schedule()
    assert sched.update(step, [7]) == [seq]
    assert seq.finish_reason == "stop" and seq.output_token_ids == [5, 7]
    assert seq.status is SequenceStatus.FINISHED
    ignore = Sequence("b", [1, 2, 3], max_tokens=2, ignore_eos=True, stop_token_ids={7})
    sched.add(ignore)
    sched.update(sched.schedule(), [7])
    sched.update(sched.schedule(), [7])
    assert ignore.finish_reason == "length" and ignore.output_token_ids == [7, 7]
    assert sched.block_manager.stats()["usage"] == 0


def test_finished_request_last_token_never_committed():
    sched = Scheduler(SchedulerConfig(num_blocks=16, block_size=4, max_model_len=128, enable_prefix_caching=True))
    a = Sequence("a", [1, 2, 3], max_tokens=1)        # prompt 3 + sampled 1 = one full block
    run(sched, [a])
    b = Sequence("b", a.token_ids + [9], max_tokens=1)
    run(sched, [b])
    assert b.num_cached_tokens == 0                     # a's 4th token never had its KV written


@pytest.mark.parametrize("seed", range(5))
def test_random_workloads_finish_without_deadlock(seed):
    rng = random.Random(seed)
    n = 30
    sched = Scheduler(SchedulerConfig(num_blocks=rng.randint(10, 40), block_size=rng.choice([4, 16]), max_model_len=160,
                                      max_num_seqs=rng.randint(1, 8), max_num_batched_tokens=rng.randint(16, 128),
                                      enable_chunked_prefill=True, enable_prefix_caching=rng.random() < 0.5,
                                      allocation=rng.choice(["contiguous", "scattered"])))
    shared = [rng.randrange(VOCAB) for _ in range(24)]
    seqs = []
    for i in range(n):
        plen = rng.randint(1, 60)
        body = shared[:rng.randint(0, 24)] + [rng.randrange(VOCAB) for _ in range(plen)]
        mt = rng.randint(1, 160 - len(body))
        blocks = -(-(len(body) + mt - 1) // sched.block_size)
        if blocks > sched.block_manager.num_blocks:
            mt = sched.block_manager.num_blocks * sched.block_size - len(body) + 1
            if mt < 1:
                continue
        seqs.append(Sequence(f"r{i}", body, mt, ignore_eos=True))
    run(sched, seqs)
    assert all(s.num_output_tokens == s.max_tokens for s in seqs)
    assert sched.block_manager.stats()["usage"] == 0


@pytest.mark.parametrize("budget", [4, 5, 7, 16, 33])
def test_a_prompt_row_is_never_computed_alone(budget):
    """Every step computes two or more rows of a prompt of two or more tokens (the attention kernel rounds a lone
    row otherwise, so a prefix hit would not give the tokens of recomputing)."""
    sched = Scheduler(SchedulerConfig(num_blocks=96, block_size=4, max_model_len=256, max_num_seqs=6,
                                      max_num_batched_tokens=budget, enable_prefix_caching=True))
    rng = random.Random(budget)
    shared = [rng.randrange(VOCAB) for _ in range(13)]
    seqs = make_seqs([rng.randrange(1, 30) for _ in range(20)], [rng.randrange(1, 6) for _ in range(20)],
                     seed=budget, prefix=shared)

    def check(step):
        for seq, n, ctx in zip(step.seqs, step.num_scheduled_tokens, step.context_lens):
            if ctx - n < seq.num_prompt_tokens:          # this step computes prompt rows
                assert n >= 2 or seq.num_prompt_tokens == 1, (seq.request_id, n, ctx)
    run(sched, seqs, check)
    assert any(s.num_cached_tokens > 0 for s in seqs)


def test_a_hit_that_leaves_only_the_last_prompt_token_computes_it_beside_the_one_before():
    """The token before it is cached: it is computed again, into no slot (-1), and only the last row samples."""
    sched = Scheduler(SchedulerConfig(num_blocks=32, block_size=4, max_model_len=64, max_num_seqs=4,
                                      max_num_batched_tokens=16, enable_prefix_caching=True))
    first, second = make_seqs([9, 9], [1, 1], seed=3)
    second.token_ids[:9] = first.token_ids[:9]
    sched.add(first)
    step = sched.schedule()
    sched.update(step, [fake_next_token(first.token_ids)])
    sched.add(second)
    step = sched.schedule()
    assert second.num_cached_tokens == 8 and step.positions == [7, 8] and step.num_scheduled_tokens == [2]
    assert step.slot_mapping[0] == -1 and step.slot_mapping[1] >= 0
    assert step.query_start_loc == [0, 2] and step.context_lens == [9] and step.sampled == [True]


def test_a_step_cap_of_one_token_still_finishes_prompts_that_hit_the_cache():
    sched = Scheduler(SchedulerConfig(num_blocks=32, block_size=4, max_model_len=64, max_num_seqs=2,
                                      max_num_batched_tokens=1, enable_prefix_caching=True))
    seqs = make_seqs([1, 1, 1], [2, 2, 2], seed=4, prefix=[5] * 8)   # 9 tokens: a hit leaves the last alone
    history = run(sched, seqs)
    assert all(n == 1 for step in history for _, n in step)
    assert any(s.num_cached_tokens == 8 for s in seqs)
