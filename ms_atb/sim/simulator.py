"""Capacity simulation: the real Scheduler and BlockManager driven by a cost model instead of a model.

Every step the scheduler builds is priced by CostModel; simulated time advances by that price.
Tokens come from a deterministic fake (no model) and every request runs to max_tokens
(ignore_eos), so a run is exact and repeatable. Measured per step, weighted by step time:
running requests, KV utilisation (tokens held / token slots reserved) and pool occupancy.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from ms_atb.sim.cost_model import CostModel
from ms_atb.core.scheduler import Scheduler, SchedulerConfig
from ms_atb.core.sequence import Sequence
from ms_atb.sim.kv_tier import SimTier

# mode -> (Scheduler allocation, enable_prefix_caching)
MODES = {"static": ("static", False), "paged": ("contiguous", False), "prefix": ("contiguous", True)}

# Output lengths are uniform on [mean / 2, 3 mean / 2]: E[O^2] / (2 E[O]) = (13 / 24) mean.
_LENGTH_BIAS = 13 / 24


@dataclass(frozen=True)
class Workload:
    """An offline batch: a system prompt of prefix_len tokens (the same one in a shared_fraction
    of the requests, a distinct one in the others), a user message of 1..2*user_len-1 tokens and
    an output of output_len/2..3*output_len/2 tokens, all uniform; all arrive at time 0."""
    num_requests: int
    prefix_len: int
    shared_fraction: float
    user_len: int
    output_len: int
    vocab_size: int = 32000
    seed: int = 0

    def __post_init__(self):
        if self.num_requests < 1 or self.user_len < 1 or self.output_len < 2 or self.prefix_len < 0:
            raise ValueError("num_requests, user_len >= 1, output_len >= 2, prefix_len >= 0 required, "
                             f"got {self}")
        if not 0.0 <= self.shared_fraction <= 1.0:
            raise ValueError(f"shared_fraction must be in [0, 1], got {self.shared_fraction}")

    @property
    def max_total_len(self) -> int:
        return self.prefix_len + 2 * self.user_len - 1 + self.output_len * 3 // 2

    def requests(self) -> list[tuple[list[int], int]]:
        """(prompt token ids, max_tokens) per request, deterministic in seed."""
        rng = random.Random(self.seed)
        v = self.vocab_size
        shared = [rng.randrange(v) for _ in range(self.prefix_len)]
        num_shared = round(self.shared_fraction * self.num_requests)
        out = []
        for i in range(self.num_requests):
            system = shared if i < num_shared else [rng.randrange(v) for _ in range(self.prefix_len)]
            user = [rng.randrange(v) for _ in range(rng.randint(1, 2 * self.user_len - 1))]
            max_tokens = rng.randint(self.output_len // 2, self.output_len * 3 // 2)
            out.append((system + user, max_tokens))
        rng.shuffle(out)                 # sharing and non-sharing requests interleaved
        return out


def output_len_for_static_utilisation(utilisation: float, max_model_len: int, prefix_len: int,
                                      user_len: int) -> int:
    """Mean output length at which static pre-allocation's time-averaged utilisation (tokens held /
    max_model_len per running request) is `utilisation`. A request holds its prompt plus the tokens
    generated so far; over its decode steps that averages prompt + E[O^2] / (2 E[O]) (longer
    requests are present longer)."""
    mean_prompt = prefix_len + user_len
    target = utilisation * max_model_len
    if target <= mean_prompt:
        raise ValueError(f"utilisation {utilisation} x {max_model_len} = {target:.0f} tokens is not "
                         f"above the mean prompt ({mean_prompt} tokens)")
    return round((target - mean_prompt) / _LENGTH_BIAS)


@dataclass
class SimResult:
    mode: str
    num_requests: int
    sim_seconds: float
    num_steps: int
    peak_running: int
    sustained_running: float     # time-weighted mean of running requests while some wait
    utilisation: float           # tokens held / slots reserved, same window
    pool_occupancy: float        # tokens held / all slots of the pool, same window
    saturated: bool              # did requests ever wait? (if not, the window is the whole run)
    output_tokens: int
    prompt_tokens_computed: int  # prompt positions fed to the model, recompute included
    num_preemptions: int
    ttft: list[float] = field(default_factory=list)   # per request, arrival -> first token
    tier_tokens_read: int = 0    # prompt tokens loaded from a KV tier instead of computed

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.sim_seconds


def _fake_token(seq: Sequence) -> int:
    return (seq.num_tokens * 7919 + seq.token_ids[0] * 31) % 32000


def _make_scheduler(mode: str, num_blocks: int, block_size: int, max_model_len: int,
                    max_num_seqs: int, max_num_batched_tokens: int, tier: SimTier | None = None) -> Scheduler:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {sorted(MODES)}, got {mode!r}")
    allocation, caching = MODES[mode]
    if tier is not None and not caching:
        raise ValueError(f"a KV tier needs the prefix mode (its blocks are found by the prefix cache), got {mode!r}")
    return Scheduler(SchedulerConfig(num_blocks, block_size, max_model_len, max_num_seqs=max_num_seqs,
                                     max_num_batched_tokens=max_num_batched_tokens, enable_chunked_prefill=True,
                                     enable_prefix_caching=caching, allocation=allocation), kv_tier=tier)


def _step_seconds(cost_model: CostModel, step, tier: SimTier | None) -> float:
    """The step's price: its compute, and the blocks it loads from the tier."""
    return cost_model.step_cost(step).seconds + (tier.after_step(step) if tier is not None else 0.0)


def simulate(cost_model: CostModel, requests: list[tuple[list[int], int]], mode: str,
             num_blocks: int, block_size: int, max_model_len: int, max_num_seqs: int = 256,
             max_num_batched_tokens: int = 8192, tier: SimTier | None = None) -> SimResult:
    """Runs the whole batch (all arriving at t = 0) to completion; tier: a KV tier beside the pool (prefix mode)."""
    sched = _make_scheduler(mode, num_blocks, block_size, max_model_len, max_num_seqs,
                            max_num_batched_tokens, tier)
    bm = sched.block_manager
    seqs = [Sequence(f"r{i}", p, mt, ignore_eos=True, arrival_time=0.0)
            for i, (p, mt) in enumerate(requests)]
    for s in seqs:
        sched.add(s)
    pool_slots = num_blocks * block_size
    now = 0.0
    sums = {True: [0.0] * 4, False: [0.0] * 4}   # saturated steps / all steps: time, running, util, pool
    prompt_computed = 0
    while sched.has_unfinished():
        step = sched.schedule()
        dt = _step_seconds(cost_model, step, tier)
        held = waste = 0
        row = 0
        for seq, n, ctx, table in zip(step.seqs, step.num_scheduled_tokens, step.context_lens,
                                      step.block_tables):
            p = seq.num_prompt_tokens
            new = n - (step.slot_mapping[row] < 0)   # a row into no slot recomputes a cached token beside a lone one
            row += n
            prompt_computed += min(ctx, p) - min(ctx - new, p)
            num_tokens = len(seq.token_ids)
            held += num_tokens
            waste += len(table) * block_size - num_tokens
        running = sched.running
        if len(running) != len(step.seqs):           # some were left out by the token budget
            ids = set(step.request_ids)
            for s in running:
                if s.request_id not in ids:
                    held += len(s.token_ids)
                    waste += len(bm.block_table(s.request_id)) * block_size - len(s.token_ids)
        if sched.static:
            reserved, physical = len(running) * max_model_len, held
        else:
            # Shared blocks are full: only each request's own tail is partly empty.
            reserved = (bm.num_blocks - bm.num_free_blocks) * block_size
            physical = reserved - waste
        for acc in (sums[False], sums[True]) if sched.waiting else (sums[False],):
            acc[0] += dt
            acc[1] += dt * len(running)
            acc[2] += dt * physical / reserved
            acc[3] += dt * physical / pool_slots
        now += dt
        sched.update(step, [_fake_token(s) if smp else None
                            for s, smp in zip(step.seqs, step.sampled)], now=now)
    saturated = sums[True][0] > 0.0
    w, run_sum, util_sum, occ_sum = sums[saturated]
    return SimResult(
        mode=mode, num_requests=len(seqs), sim_seconds=now, num_steps=sched.num_steps,
        peak_running=sched.peak_running, sustained_running=run_sum / w,
        utilisation=util_sum / w, pool_occupancy=occ_sum / w, saturated=saturated,
        output_tokens=sum(s.num_output_tokens for s in seqs), prompt_tokens_computed=prompt_computed,
        num_preemptions=sched.num_preemptions,
        ttft=[s.first_token_time - s.arrival_time for s in seqs],
        tier_tokens_read=bm.stats()["disk_cache_hit_tokens"])


def ttft_one_by_one(cost_model: CostModel, requests: list[tuple[list[int], int]], mode: str,
                    num_blocks: int, block_size: int, max_model_len: int,
                    max_num_batched_tokens: int = 8192, tier: SimTier | None = None) -> list[float]:
    """TTFT of each request submitted once the previous one has finished (its own prefill,
    no queueing); one scheduler throughout, so a prefix cache persists between requests.
    Only the first token is generated: later tokens do not change the next request's TTFT."""
    sched = _make_scheduler(mode, num_blocks, block_size, max_model_len, 1, max_num_batched_tokens, tier)
    out = []
    now = 0.0
    for i, (prompt, _) in enumerate(requests):
        seq = Sequence(f"t{i}", prompt, 1, ignore_eos=True, arrival_time=now)
        sched.add(seq)
        while sched.has_unfinished():
            step = sched.schedule()
            now += _step_seconds(cost_model, step, tier)
            sched.update(step, [_fake_token(s) if smp else None
                                for s, smp in zip(step.seqs, step.sampled)], now=now)
        out.append(seq.first_token_time - seq.arrival_time)
    return out
