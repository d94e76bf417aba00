"""Continuous batching over the paged KV cache.

Each request has num_computed_tokens and the scheduler lets it catch up with num_tokens: a
prompt (or a chunk of it), a resumed request's recompute and a decode token are the same thing,
"tokens to compute". A step takes the running requests first (in admission order), then
waiting ones in the order of the waiting queue (ms_atb/core/prefix_order.py: arrival order
under the `fcfs` policy, prompts grouped by shared prefix under `prefix`), within
max_num_batched_tokens and max_num_seqs. As it schedules a request it commits the tokens that
request will have computed after the step, so a request admitted later in the same step shares
a prefix an earlier one computes in it. When a block cannot be had, the most recently admitted
running request is preempted by recompute.

With LoRA (max_loras > 0) a request of an adapter is admitted only when its adapter is resident or a slot is
free of running requests (ms_atb/core/lora_slots.py); the step names each sequence's slot and the adapters to load
before it runs. A waiting request held back for want of a slot lets the requests behind it that can run be
admitted (looking at most LORA_LOOKAHEAD deep), up to MAX_LORA_OVERTAKES of them; then admission waits for it,
so a slot frees as running requests finish.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from ms_atb.core.block_manager import BlockManager, NoFreeBlocksError
from ms_atb.core.lora_slots import LoraSlots
from ms_atb.core.kv_tier import KVLoad, KVStore, PrefixTier
from ms_atb.core.prefix_order import FcfsQueue, make_queue
from ms_atb.core.scheduler_config import ALLOCATIONS, SchedulerConfig
from ms_atb.core.sequence import Sequence, SequenceStatus

__all__ = ["ALLOCATIONS", "Scheduler", "SchedulerConfig", "Step"]

MAX_LORA_OVERTAKES = 64     # admissions past a request that waits for a LoRA slot, before admission waits for it
LORA_LOOKAHEAD = 256        # waiting requests looked at past one that waits for a LoRA slot


@dataclass
class Step:
    """A plain description of one model step; the model runner turns it into tensors."""
    seqs: list[Sequence] = field(default_factory=list)
    num_scheduled_tokens: list[int] = field(default_factory=list)  # [B]
    request_ids: list[str] = field(default_factory=list)           # [B]
    token_ids: list[int] = field(default_factory=list)             # [T] flattened, no padding
    positions: list[int] = field(default_factory=list)             # [T]
    slot_mapping: list[int] = field(default_factory=list)          # [T] block_id * block_size + offset
    block_tables: list[list[int]] = field(default_factory=list)    # [B][num blocks of b]
    context_lens: list[int] = field(default_factory=list)          # [B] tokens with KV after the step
    query_start_loc: list[int] = field(default_factory=lambda: [0])  # [B + 1]
    sampled: list[bool] = field(default_factory=list)              # [B] does b sample a token now?
    lora_slots: list[int] = field(default_factory=list)            # [B] b's LoRA adapter slot, -1: none
    lora_loads: list[tuple[int, str]] = field(default_factory=list)  # (slot, adapter) to load before the step
    kv_loads: list[KVLoad] = field(default_factory=list)           # tier blocks to copy in before the step runs
    kv_stores: list[KVStore] = field(default_factory=list)         # blocks it computes, to keep in the tier
    kv_used: list[tuple[bytes, int]] = field(default_factory=list)  # (hash, depth) of its pool hits: tier recency

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def __len__(self) -> int:
        return len(self.seqs)


MIN_PREFILL_ROWS = 2        # the least rows of a prompt computed in one step (chunk_size)


def chunk_size(remaining: int, budget: int, max_budget: int) -> int:
    """How many of a request's `remaining` tokens to compute in a step with `budget` tokens left, 0 for none now.
    A prompt row is never computed alone while its request has other rows to compute: the CPU attention kernel
    rounds a sequence's single query differently from the rows of a chunk (ops/paged_attention.cc, Tiled), so a
    row must take the same path however the prompt is cut. So a chunk of two or more remaining tokens is never one
    token and never leaves one (a decode token, one remaining, is alone anyway); a prefix hit that leaves only the
    last prompt token computes it beside the token before it (Scheduler._rows). A step cap under 4 tokens, where
    that rule could leave a request no chunk at all, chunks freely."""
    if remaining <= budget or remaining < 2 or max_budget < 4:
        return min(remaining, budget)
    num = min(budget, remaining - MIN_PREFILL_ROWS)
    return num if num >= MIN_PREFILL_ROWS else 0


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv_tier: PrefixTier | None = None):
        """kv_tier: blocks kept outside the pool (ms_atb/core/kv_tier.py), found by the prefix cache's hashes."""
        self.config = config
        num_blocks, block_size, max_model_len = config.num_blocks, config.block_size, config.max_model_len
        self.block_manager = BlockManager(
            num_blocks, block_size, enable_prefix_caching=config.enable_prefix_caching,
            allocation="scattered" if config.allocation == "scattered" else "contiguous", tier=kv_tier)
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.enable_chunked_prefill = config.enable_chunked_prefill
        self.static = config.allocation == "static"
        self.static_blocks_per_seq = math.ceil(max_model_len / block_size)
        if self.static and self.static_blocks_per_seq > num_blocks:
            raise ValueError(f"static allocation reserves {self.static_blocks_per_seq} blocks "
                             f"(max_model_len {max_model_len}) per request, but the pool has only "
                             f"{num_blocks}")
        self.waiting = FcfsQueue()                 # or PrefixQueue: set_policy()
        self.policy = "fcfs"
        self.running: list[Sequence] = []          # admission order: the newest is last
        self._num_slots: dict[str, int] = {}       # request id -> tokens with a KV slot reserved
        self.num_preemptions = 0
        self.peak_running = 0
        self.num_steps = 0
        self.num_computed_prompt_tokens = 0        # tokens actually fed to the model, recompute included
        self.lora_slots = LoraSlots(config.max_loras) if config.max_loras else None
        self._lora_wait: list = [None, 0]          # [a request waiting for a LoRA slot, admissions made past it]

    # ---- requests -------------------------------------------------------------------------
    def check(self, num_prompt_tokens: int, max_tokens: int) -> None:
        """ValueError if a request of this size could never run."""
        if num_prompt_tokens < 1:
            raise ValueError("the prompt is empty")
        total = num_prompt_tokens + max_tokens
        if total > self.max_model_len:
            raise ValueError(f"prompt ({num_prompt_tokens} tokens) + max_tokens ({max_tokens}) = "
                             f"{total} exceeds max_model_len {self.max_model_len}")
        # The last sampled token never gets a KV slot.
        blocks = math.ceil((total - 1) / self.block_size)
        if blocks > self.block_manager.num_blocks:
            raise ValueError(f"the request needs {blocks} KV blocks but the pool has only "
                             f"{self.block_manager.num_blocks}")
        if not self.enable_chunked_prefill and num_prompt_tokens > self.max_num_batched_tokens:
            raise ValueError(f"prompt of {num_prompt_tokens} tokens exceeds max_num_batched_tokens "
                             f"{self.max_num_batched_tokens} and chunked prefill is disabled")

    def max_output_tokens(self, num_prompt_tokens: int) -> int:
        """The largest max_tokens that check() accepts for this prompt (< 1: none)."""
        limit = min(self.max_model_len, self.block_manager.num_blocks * self.block_size + 1)
        return limit - num_prompt_tokens

    def set_policy(self, policy: str) -> None:
        """The order of admission: "fcfs" or "prefix" (ValueError otherwise). Only between runs."""
        queue = make_queue(policy)
        assert not self.has_unfinished(), "the policy changes only while no request is in flight"
        self.waiting, self.policy = queue, policy

    def add(self, seq: Sequence) -> None:
        self.check(seq.num_prompt_tokens, seq.max_tokens)
        if seq.lora_key is not None and self.lora_slots is None:
            raise ValueError(f"request {seq.request_id!r} names a LoRA adapter, but LoRA is off (enable_lora)")
        seq.status = SequenceStatus.WAITING
        self.waiting.add(seq, self.num_steps)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    # ---- scheduling -----------------------------------------------------------------------
    def schedule(self) -> Step:
        step = Step()
        budget = self.max_num_batched_tokens
        scheduled: set[int] = set()
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            num_new = chunk_size(seq.num_tokens - seq.num_computed_tokens, budget, self.max_num_batched_tokens)
            rows = self._rows(seq, num_new)
            if num_new == 0 or rows > budget:
                i += 1
                continue
            if not self._reserve(seq):
                break                      # seq itself was preempted: it was the newest
            self._add_to_step(step, seq, num_new, rows)
            budget -= rows
            scheduled.add(id(seq))
            i += 1
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self._next_waiting()
            if seq is None:
                break
            if self.static and (len(self.running) + 1) * self.static_blocks_per_seq > \
                    self.block_manager.num_blocks:
                break
            # A recompute after preemption may always be chunked: it is invisible to the user.
            may_chunk = self.enable_chunked_prefill or seq.num_preemptions > 0
            if not may_chunk and seq.num_tokens > budget:
                break
            try:
                num_cached = self.block_manager.allocate(
                    seq.request_id, seq.token_ids, max_tokens=seq.num_remaining_tokens,
                    cache_lookup=not seq.needs_prompt_logits, extra_key=seq.extra_key)
            except NoFreeBlocksError:
                break
            self._num_slots[seq.request_id] = seq.num_tokens
            num_new = seq.num_tokens - num_cached
            self._take_waiting(seq)
            seq.num_computed_tokens = num_cached
            if seq.num_preemptions == 0:
                seq.num_cached_tokens = num_cached
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            num_new = chunk_size(num_new, budget, self.max_num_batched_tokens)
            rows = self._rows(seq, num_new)
            if num_new and rows <= budget:
                self._add_to_step(step, seq, num_new, rows)
                budget -= rows
        if self.lora_slots is not None:
            step.lora_loads = self.lora_slots.take_loads()
        assert step.seqs or not self.has_unfinished(), "scheduler made no progress"
        step.kv_loads, step.kv_stores, step.kv_used = self.block_manager.take_transfers()
        self.peak_running = max(self.peak_running, len(self.running))
        self.num_steps += 1
        return step

    def _lora_ready(self, seq: Sequence) -> bool:
        return seq.lora_key is None or self.lora_slots.can_acquire(seq.lora_key)

    def _next_waiting(self) -> Sequence | None:
        """The waiting request to admit next: the queue's next, else, while that one waits for a LoRA slot, the
        first behind it that can have its adapter (see the module docstring); None: none now."""
        head = self.waiting.peek()
        if self._lora_ready(head):
            return head
        if self._lora_wait[0] is not head:
            self._lora_wait = [head, 0]
        elif self._lora_wait[1] >= MAX_LORA_OVERTAKES:
            return None
        return next((s for s in itertools.islice(self.waiting, LORA_LOOKAHEAD)
                     if s is not head and self._lora_ready(s)), None)

    def _take_waiting(self, seq: Sequence) -> None:
        """seq leaves the waiting queue to run, its adapter's slot acquired."""
        if seq is self.waiting.peek():
            self.waiting.pop()
            if seq is self._lora_wait[0]:
                self._lora_wait = [None, 0]
        else:
            self.waiting.remove(seq)
            self._lora_wait[1] += 1
        if seq.lora_key is not None:
            self.lora_slots.acquire(seq.lora_key)

    def _reserve(self, seq: Sequence) -> bool:
        """Reserves a KV slot for seq's newest token (sampled last step) if it has none yet,
        preempting the newest running requests as needed. False if seq itself was preempted."""
        if self._num_slots[seq.request_id] == seq.num_tokens:
            return True                    # a prefill chunk: its slots were reserved at allocate
        while True:
            try:
                self.block_manager.append_token(seq.request_id, seq.token_ids[-1])
                self._num_slots[seq.request_id] += 1
                return True
            except NoFreeBlocksError:
                victim = self.running[-1]
                self._preempt(victim)
                if victim is seq:
                    return False

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.add_preempted(seq)

    def _free(self, seq: Sequence) -> None:
        self.block_manager.free(seq.request_id)
        del self._num_slots[seq.request_id]
        if seq.lora_key is not None:
            self.lora_slots.release(seq.lora_key)

    def _rows(self, seq: Sequence, num_new: int) -> int:
        """The step rows of seq's num_new new tokens: one more when they are its last prompt token alone (a prefix
        hit left only it), so that it is not a lone prompt row (chunk_size): the token before it, whose KV is
        cached, is computed again beside it into no slot (-1), and its output dropped. Not under a step cap below
        4 tokens (chunk_size), where two rows might never fit."""
        lone = num_new == 1 and 1 <= seq.num_computed_tokens == seq.num_prompt_tokens - 1
        return num_new + 1 if lone and self.max_num_batched_tokens >= 4 else num_new

    def _add_to_step(self, step: Step, seq: Sequence, num_new: int, rows: int) -> None:
        """Adds seq's next num_new tokens to the step, in rows step rows (_rows)."""
        assert num_new > 0
        start = seq.num_computed_tokens
        end = start + num_new
        first = end - rows                       # start, or the row before it computed again
        self.block_manager.commit(seq.request_id, end)
        table = self.block_manager.block_table(seq.request_id)
        bs = self.block_size
        step.seqs.append(seq)
        step.request_ids.append(seq.request_id)
        step.num_scheduled_tokens.append(rows)
        step.token_ids.extend(seq.token_ids[first:end])
        step.positions.extend(range(first, end))
        step.slot_mapping.extend(table[p // bs] * bs + p % bs if p >= start else -1 for p in range(first, end))
        step.block_tables.append(table)
        step.context_lens.append(end)
        step.query_start_loc.append(step.query_start_loc[-1] + rows)
        step.sampled.append(end == seq.num_tokens)
        step.lora_slots.append(-1 if seq.lora_key is None else self.lora_slots.slot_of(seq.lora_key))
        seq.num_computed_tokens = end
        self.num_computed_prompt_tokens += num_new

    # ---- results --------------------------------------------------------------------------
    def update(self, step: Step, sampled_token_ids: list[int | None], now: float | None = None
               ) -> list[Sequence]:
        """Appends each sampling request's new token, applies the stop conditions and frees
        finished requests. sampled_token_ids is aligned with step.seqs (None where b did not
        sample). Returns the requests that finished."""
        finished = []
        for seq, sampled, token in zip(step.seqs, step.sampled, sampled_token_ids):
            if not sampled or seq.status is not SequenceStatus.RUNNING:
                continue
            assert token is not None
            seq.token_ids.append(token)
            if seq.first_token_time is None:
                seq.first_token_time = now
            reason = None
            if not seq.ignore_eos and token in seq.stop_token_ids:
                reason = "stop"
            elif seq.num_output_tokens >= seq.max_tokens or seq.num_tokens >= self.max_model_len:
                reason = "length"
            if reason is not None:
                self.finish(seq, reason, now)
                finished.append(seq)
        return finished

    def finish(self, seq: Sequence, reason: str, now: float | None = None) -> None:
        """Ends a request (also for stop strings found by the engine, or an abort)."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self._free(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.finish_time = now

    def stats(self) -> dict:
        s = dict(self.block_manager.stats())
        s.update(num_preemptions=self.num_preemptions, peak_running=self.peak_running,
                 num_running=len(self.running), num_waiting=len(self.waiting),
                 num_steps=self.num_steps,
                 num_computed_prompt_tokens=self.num_computed_prompt_tokens)
        if self.static:
            s["static_reserved_blocks"] = len(self.running) * self.static_blocks_per_seq
        if self.lora_slots is not None:
            s["num_lora_loads"] = self.lora_slots.num_loads
        return s
