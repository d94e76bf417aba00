"""Engine: owns the scheduler, the model runner, the sampler and the structured output manager; step() is
schedule -> execute -> sample -> update. It is the only code that reads scheduler or block-manager state
(docs/design.md, section 2).

A request with a structured output constraint enters the scheduler once its grammar is compiled (on the manager's
thread): until then it waits apart, and the other requests run. Each step, the masks of the constrained rows are
filled on another thread while the model runs, and applied before sampling.
"""
from __future__ import annotations

import concurrent.futures
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ms_atb.core.scheduler import Scheduler, Step
from ms_atb.core.sequence import Sequence, SequenceStatus
from ms_atb.engine.constraints import SampleConstraints
from ms_atb.engine.request import Request
from ms_atb.engine.structured_outputs import StructuredOutputManager
from ms_atb.worker.sampler import rows_logprobs, token_logprobs


@dataclass(eq=False)
class EngineSample:
    """One sample of a request in flight: its sequence, random generator and constraints, and the
    log-probabilities it collects."""
    request: Request
    index: int                                   # which of the request's n samples
    seq: Sequence
    generator: np.random.Generator | None        # None: greedy
    constraints: SampleConstraints
    logprobs: list[dict[int, float]] | None = None            # with SamplingParams.logprobs: one per token
    prompt_logprobs: list[dict[int, float] | None] | None = None   # with prompt_logprobs, sample 0 only

    @property
    def id(self) -> str:
        return self.seq.request_id


@dataclass
class StepOutput:
    sampled: list[tuple[EngineSample, int]] = field(default_factory=list)   # each token sampled, with its sample
    finished: list[EngineSample] = field(default_factory=list)   # ended by a stop token, length or a grammar


class Engine:
    def __init__(self, new_scheduler: Callable[[], Scheduler], sampler,
                 structured: StructuredOutputManager | None = None, adapters=None):
        """adapters: the LoRA adapters requests name (ms_atb/engine/adapters.py: path(key)), or None."""
        self._new_scheduler = new_scheduler
        self.adapters = adapters
        self.scheduler = new_scheduler()
        self.sampler = sampler
        self.runner = None                       # set once the model is built
        self.structured = structured             # grammars and their masks; None without a tokenizer
        self.samples: dict[str, EngineSample] = {}   # in flight, by sequence id
        self.compiling: list[tuple[concurrent.futures.Future, list[EngineSample]]] = []   # waiting for a grammar
        self.failed = False          # a step failed after schedule() committed its blocks
        self._usage = [0, 0.0, 0.0]              # steps, sum and peak of the pool's usage since begin_run()
        self.num_sampled_tokens = 0

    # ---- limits: the input processor checks requests against them ------------------------
    def check(self, num_prompt_tokens: int, max_tokens: int) -> None:
        self.scheduler.check(num_prompt_tokens, max_tokens)

    def max_output_tokens(self, num_prompt_tokens: int) -> int:
        return self.scheduler.max_output_tokens(num_prompt_tokens)

    def check_guide(self, guide) -> None:
        """ValueError saying what is wrong with a structured output constraint's schema, regex or grammar."""
        self.structured.check(guide)

    @property
    def policy(self) -> str:
        return self.scheduler.policy

    def stats(self) -> dict:
        return self.scheduler.stats()

    def reset(self, scheduler: Scheduler | None = None) -> None:
        """A fresh scheduler (an empty prefix cache), or the one given; only between runs."""
        self.scheduler = scheduler if scheduler is not None else self._new_scheduler()

    # ---- requests -------------------------------------------------------------------------
    def begin_run(self) -> None:
        self._usage, self.num_sampled_tokens = [0, 0.0, 0.0], 0

    def usage_stats(self) -> dict:
        """The KV pool's mean and peak usage over the steps since begin_run()."""
        steps, total, peak = self._usage
        return {"kv_cache_usage_mean": total / steps if steps else 0.0, "kv_cache_usage_peak": peak}

    def add(self, request: Request, stop_token_ids: set[int], seed: list[int], now: float) -> list[EngineSample]:
        """The request's samples, made and queued. ignore_eos: no stop token of any kind ends it, neither EOS nor
        stop_token_ids (docs/design.md); stop strings, matched on the text, still do. seed: the engine's default
        random stream for this request when its params have no seed. A request with a guide whose grammar is not
        compiled yet waits apart until it is (compiling), and the next steps queue it."""
        p = request.params
        stops = set() if p.ignore_eos else set(p.stop_token_ids or ()) | stop_token_ids
        samples = []
        for i, seq_id in enumerate(request.sample_ids):
            seq = Sequence(seq_id, request.prompt_token_ids, p.max_tokens, stop_token_ids=stops, arrival_time=now,
                           extra_key=request.lora_key, lora_key=request.lora_key)
            gen = None
            if not p.greedy:   # sample i > 0 of a seeded request: its own stream, derived from the seed
                base = [p.seed] if p.seed is not None else seed
                gen = np.random.default_rng(base + [i] if i else base)
            sample = EngineSample(request, i, seq, gen, SampleConstraints(request),
                                  None if p.logprobs is None else [])
            if i == 0 and p.prompt_logprobs is not None:       # the other samples share the prompt
                sample.prompt_logprobs = [None]                  # nothing predicts the first token
                seq.needs_prompt_logits = len(request.prompt_token_ids) > 1
            samples.append(sample)
        if request.guide is not None:
            compiled = self.structured.compile(request.guide)
            if not compiled.done():
                self.scheduler.check(len(request.prompt_token_ids), p.max_tokens)   # fails now, not once compiled
                self.compiling.append((compiled, samples))
                return samples
            self._give_matchers(samples, compiled)
        self._queue(samples)
        return samples

    def _queue(self, samples: list[EngineSample]) -> None:
        for sample in samples:
            self.scheduler.add(sample.seq)      # ValueError if the scheduler changed since the request was made
            self.samples[sample.id] = sample

    def _give_matchers(self, samples: list[EngineSample], compiled: concurrent.futures.Future) -> None:
        """Each sample its own matcher; ValueError if its grammar failed to compile."""
        for sample in samples:
            sample.constraints.matcher = self.structured.matcher(compiled)

    def _admit_compiled(self) -> None:
        """Queues the samples whose grammar is compiled now; waits for one when nothing else could run."""
        if not self.compiling:
            return
        if not self.scheduler.has_unfinished():
            concurrent.futures.wait([f for f, _ in self.compiling], return_when=concurrent.futures.FIRST_COMPLETED)
        waiting = []
        for compiled, samples in self.compiling:
            if compiled.done():
                try:
                    self._give_matchers(samples, compiled)
                    self._queue(samples)
                except ValueError as e:
                    raise ValueError(f"request {samples[0].request.index}: {e}") from None
            else:
                waiting.append((compiled, samples))
        self.compiling = waiting

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self.compiling)

    def finish(self, samples: list[EngineSample], reason: str, now: float) -> list[EngineSample]:
        """Ends samples with reason (a sample already finished takes the reason); returns those it ended."""
        ended = []
        for s in samples:
            if s.seq.is_finished:
                s.seq.finish_reason = reason
            else:
                self.scheduler.finish(s.seq, reason, now)
                ended.append(s)
        return ended

    def release(self, samples: list[EngineSample]) -> None:
        """Forgets finished samples."""
        for s in samples:
            del self.samples[s.id]

    def abort_unfinished(self) -> None:
        """Drops what did not finish. After a failure inside a step, blocks committed for that step hold no KV,
        so the prefix cache is dropped with them."""
        for s in self.samples.values():
            if s.seq.status is not SequenceStatus.FINISHED:
                self.scheduler.finish(s.seq, "abort")
        self.samples.clear()
        self.compiling.clear()
        if self.failed:
            self.scheduler = self._new_scheduler()
            self.failed = False

    # ---- one step -------------------------------------------------------------------------
    def step(self) -> StepOutput:
        """schedule -> execute (the constrained rows' masks filled meanwhile) -> sample -> update."""
        self._admit_compiled()
        self.failed = True           # schedule() commits the step's blocks: failed until their KV is written
        step = self.scheduler.schedule()
        now = time.perf_counter()
        for seq in step.seqs:
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = now
        for slot, key in step.lora_loads:                  # the adapters this step's new requests need
            self.runner.load_lora(slot, self.adapters.path(key), key)
        rows = [b for b, s in enumerate(step.sampled) if s]
        masks = self._fill_masks(step, rows)
        try:
            logits = self._execute(step)                   # [B, vocab]
        finally:
            allowed = self.structured.masks(masks) if masks is not None else None   # [R, vocab], R constrained
        self.failed = False
        tokens = self._sample(step, rows, logits, allowed)   # [B], None where b did not sample
        now = time.perf_counter()
        out = StepOutput(finished=[self.samples[seq.request_id] for seq in self.scheduler.update(step, tokens, now)])
        usage = self.scheduler.stats()["usage"]
        self._usage = [self._usage[0] + 1, self._usage[1] + usage, max(self._usage[2], usage)]
        for b in rows:
            sample = self.samples[step.request_ids[b]]
            out.sampled.append((sample, tokens[b]))
            if sample.constraints.advance(sample.seq, tokens[b]):
                out.finished += self.finish([sample], "stop", now)
        self.num_sampled_tokens += len(rows)
        return out

    def _fill_masks(self, step: Step, rows: list[int]) -> concurrent.futures.Future | None:
        """The masks of the sampling rows that have a grammar, in their order among rows, filled on the manager's
        thread; None when no row has one."""
        samples = [self.samples[step.request_ids[b]] for b in rows]
        guided = [s for s in samples if s.constraints.matcher is not None]
        if not guided:
            return None
        return self.structured.fill([s.constraints.matcher for s in guided], [s.seq.stop_token_ids for s in guided])

    def _execute(self, step: Step) -> np.ndarray:
        """The logits [B, vocab] of each sequence's last scheduled token; sequences still collecting prompt
        log-probabilities get theirs from the every-token logits."""
        if not any(seq.needs_prompt_logits for seq in step.seqs):
            return self.runner.execute(step)
        every = self.runner.execute(step, every_token=True)            # [T, vocab]
        self._collect_prompt_logprobs(step, every)
        return every[np.asarray(step.query_start_loc[1:]) - 1]         # [B, vocab]

    def _sample(self, step: Step, rows: list[int], logits: np.ndarray, masks: np.ndarray | None
                ) -> list[int | None]:
        """One token per sampling row, with its log-probabilities when asked. masks [R, vocab]: the additive masks
        (0 allowed, -inf not) of the rows with a grammar, in their order among rows."""
        tokens: list[int | None] = [None] * len(step.seqs)
        if not rows:
            return tokens
        samples = [self.samples[step.request_ids[b]] for b in rows]
        params = [s.request.params for s in samples]
        histories = ([(s.seq.token_ids, s.seq.num_prompt_tokens) for s in samples]
                     if any(p.has_penalties for p in params) else None)
        banned = [s.constraints.banned(s.seq) for s in samples]
        allowed = None
        if masks is not None:
            guided = iter(masks)
            allowed = [next(guided) if s.constraints.matcher is not None else None for s in samples]
        # every row sampled (a decode step): the logits themselves, no copy (sample() writes none)
        chosen = logits if len(rows) == len(logits) else logits[rows]      # [S, vocab]
        picked = self.sampler.sample(chosen, params, [s.generator for s in samples], histories, banned, allowed)
        for b, token, s in zip(rows, picked, samples):
            tokens[b] = int(token)
            if s.logprobs is not None:
                s.logprobs.append(token_logprobs(logits[b], int(token), s.request.params.logprobs))
        return tokens

    def _collect_prompt_logprobs(self, step: Step, every: np.ndarray) -> None:
        """every [T, vocab]: row i predicts the token after step.positions[i]. Appends to each waiting
        sample's prompt_logprobs the prompt tokens it reaches next (a recompute after preemption
        reaches them again: they are kept once)."""
        for b, seq in enumerate(step.seqs):
            if not seq.needs_prompt_logits:
                continue
            s = self.samples[seq.request_id]
            prompt, done = s.request.prompt_token_ids, len(s.prompt_logprobs)
            lo, hi = step.query_start_loc[b], step.query_start_loc[b + 1]
            first = step.positions[lo]              # row lo + j predicts token first + j + 1
            start, stop = max(done - 1 - first, 0), min(hi - lo, len(prompt) - 1 - first)
            if start < stop and first + start + 1 == done:
                rows = np.arange(lo + start, lo + stop)
                s.prompt_logprobs.extend(rows_logprobs(every[rows], prompt[done:first + stop + 1],
                                                       s.request.params.prompt_logprobs))
            seq.needs_prompt_logits = len(s.prompt_logprobs) < len(prompt)
