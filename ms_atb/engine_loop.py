"""EngineLoop: one generate() run — schedule, execute, sample, update, detokenize, until done."""
from __future__ import annotations

import contextlib
import dataclasses
import signal
import threading
import time
from typing import Iterator

import numpy as np

from ms_atb.text.detokenizer import IncrementalDetokenizer, find_stop
from ms_atb.outputs import CompletionOutput, RequestMetrics, RequestOutput
from ms_atb.request import Request
from ms_atb.worker.sampler import rows_logprobs, token_logprobs
from ms_atb.core.sequence import Sequence, SequenceStatus


class _Tracked:
    """One sample of a request in flight: its sequence, its text so far and its random generator."""
    __slots__ = ("request", "sample", "seq", "detok", "text", "generator", "stop_reason", "logprobs",
                 "prompt_logprobs", "spelled")

    def __init__(self, request: Request, sample: int, seq: Sequence, detok, generator):
        self.request, self.sample, self.seq, self.detok, self.generator = request, sample, seq, detok, generator
        self.text = ""
        self.stop_reason = None
        self.logprobs: list[dict[int, float]] | None = None if request.params.logprobs is None else []
        self.prompt_logprobs: list[dict[int, float] | None] | None = None
        self.spelled = b""        # the output's bytes so far, for a guided choice

    def allowed(self) -> np.ndarray | None:
        """The only token ids this sample may take next (guided choice), or None."""
        guide = self.request.guide
        if guide is None:
            return None
        ids = guide.next_token_ids(self.spelled)
        if guide.is_choice(self.spelled):           # a whole choice that a longer one continues
            ids = np.union1d(ids, np.fromiter(self.seq.stop_token_ids, np.int64))
        return ids

    def banned(self) -> list[int] | None:
        """Token ids this sample may not take next: stop tokens before min_tokens, and the last token of
        each bad word whose other tokens end the output."""
        seq, p = self.seq, self.request.params
        out = list(seq.stop_token_ids) if seq.num_output_tokens < p.min_tokens and not p.ignore_eos else []
        tokens = seq.token_ids                            # only the output's tail is compared: no copy of it
        for word in self.request.bad_words_ids:
            k = len(word) - 1
            if k <= seq.num_output_tokens and tuple(tokens[len(tokens) - k:]) == word[:-1]:
                out.append(word[-1])
        return out or None


class EngineLoop:
    def __init__(self, llm, requests: list[Request]):
        self.llm = llm
        self.requests = requests
        self.tracked: dict[str, _Tracked] = {}       # by sequence id
        self.done: dict[int, list[_Tracked]] = {}     # by id(request): its finished samples
        self.request_ids: set[str] = set()
        # Under the prefix policy a request identical to an earlier one of the batch (prompt tokens and
        # greedy SamplingParams, n == 1) is not run: it gets a copy of that one's output (duplicates_of).
        self.deduplicate = llm.scheduler.policy == "prefix"
        self.duplicates_of: dict[int, list[Request]] = {}    # id(computed request) -> its duplicates
        self._computed: dict[tuple[int, ...], list[Request]] = {}   # prompt tokens -> dedupable requests
        self.num_deduplicated = 0
        self.failed = False
        self.num_output_tokens = 0
        self.usage: list[float] = []
        self.start = self.end = time.perf_counter()

    def run(self, use_tqdm: bool = True) -> Iterator[tuple[int, RequestOutput]]:
        llm, sched = self.llm, self.llm.scheduler
        eos = llm.stop_token_ids
        self.start = now = time.perf_counter()
        try:
            for r in self.requests:
                self._track(r, eos, now)
        except ValueError:
            self.tracked.clear()                      # nothing was added to the scheduler
            raise
        pending = list(self.tracked.values())
        for i, t in enumerate(pending):
            try:
                sched.add(t.seq)      # ValueError if the scheduler changed since the request was made
            except ValueError as e:
                for rest in pending[i:]:                  # not in the scheduler: nothing to abort
                    del self.tracked[rest.seq.request_id]
                raise ValueError(f"request {t.request.index}: {e}") from None
        bar = progress_bar(len(self.requests), use_tqdm, "req", "generate")
        try:
            while sched.has_unfinished():
                self.failed = True           # schedule() commits the step's blocks: failed until their KV is written
                step = sched.schedule()
                now = time.perf_counter()
                for seq in step.seqs:
                    if seq.first_scheduled_time is None:
                        seq.first_scheduled_time = now
                if any(seq.needs_prompt_logits for seq in step.seqs):
                    every = llm.runner.execute(step, every_token=True)            # [T, vocab]
                    logits = every[np.asarray(step.query_start_loc[1:]) - 1]      # [B, vocab]
                    self._collect_prompt_logprobs(step, every)
                else:
                    logits = llm.runner.execute(step)          # [B, vocab]
                self.failed = False
                rows = [b for b, s in enumerate(step.sampled) if s]
                sampled: list[int | None] = [None] * len(step.seqs)
                if rows:
                    ts = [self.tracked[step.request_ids[b]] for b in rows]
                    params = [t.request.params for t in ts]
                    histories = ([(t.seq.token_ids, t.seq.num_prompt_tokens) for t in ts]
                                 if any(p.has_penalties for p in params) else None)
                    banned = [t.banned() for t in ts]
                    allowed = [t.allowed() for t in ts]
                    if not any(a is not None for a in allowed):
                        allowed = None
                    # every row sampled (a decode step): the logits themselves, no copy (sample() writes none)
                    chosen = logits if len(rows) == len(logits) else logits[rows]      # [S, vocab]
                    tokens = llm.sampler.sample(chosen, params, [t.generator for t in ts], histories,
                                                banned, allowed)
                    for b, token, t in zip(rows, tokens, ts):
                        sampled[b] = int(token)
                        if t.logprobs is not None:
                            t.logprobs.append(token_logprobs(logits[b], int(token), t.request.params.logprobs))
                now = time.perf_counter()
                finished = sched.update(step, sampled, now=now)
                self.usage.append(sched.block_manager.stats()["usage"])
                for b in rows:
                    t = self.tracked[step.request_ids[b]]
                    self.num_output_tokens += 1
                    if self._append_text(t, sampled[b]) or self._choice_made(t, sampled[b]):
                        if t.seq.is_finished:
                            t.seq.finish_reason = "stop"
                        else:
                            sched.finish(t.seq, "stop", now)
                            finished.append(t.seq)
                for seq in finished:
                    t = self.tracked.pop(seq.request_id)
                    if t.detok is not None and not isinstance(t.stop_reason, str):
                        tail = t.detok.flush()        # an unfinished UTF-8 character, if any
                        t.text += tail
                        if tail and self._cut_at_stop(t, len(tail)):
                            seq.finish_reason = "stop"
                    samples = self.done.setdefault(id(t.request), [])
                    samples.append(t)
                    if len(samples) < t.request.params.n:
                        continue
                    del self.done[id(t.request)]
                    if bar is not None:
                        bar.update(1)
                        bar.set_postfix_str(f"{self.num_output_tokens / (now - self.start):.1f} tok/s",
                                            refresh=False)
                    out = self._output(sorted(samples, key=lambda x: x.sample))
                    yield t.request.index, out
                    for dup in self.duplicates_of.pop(id(t.request), ()):
                        self.num_output_tokens += sum(len(c.token_ids) for c in out.outputs)
                        if bar is not None:
                            bar.update(1)
                        yield dup.index, copy_output(out, dup)
        finally:
            self.end = time.perf_counter()
            if bar is not None:
                bar.close()

    def _collect_prompt_logprobs(self, step, every: np.ndarray) -> None:
        """every [T, vocab]: row i predicts the token after step.positions[i]. Appends to each waiting
        request's prompt_logprobs the prompt tokens it reaches next (a recompute after preemption
        reaches them again: they are kept once)."""
        for b, seq in enumerate(step.seqs):
            if not seq.needs_prompt_logits:
                continue
            t = self.tracked[seq.request_id]
            prompt, done = t.request.prompt_token_ids, len(t.prompt_logprobs)
            lo, hi = step.query_start_loc[b], step.query_start_loc[b + 1]
            first = step.positions[lo]              # row lo + j predicts token first + j + 1
            start, stop = max(done - 1 - first, 0), min(hi - lo, len(prompt) - 1 - first)
            if start < stop and first + start + 1 == done:
                rows = np.arange(lo + start, lo + stop)
                t.prompt_logprobs.extend(rows_logprobs(every[rows], prompt[done:first + stop + 1],
                                                       t.request.params.prompt_logprobs))
            seq.needs_prompt_logits = len(t.prompt_logprobs) < len(prompt)

    def _append_text(self, t: _Tracked, token: int) -> bool:
        """Adds token's text; True if a stop string now ends the request."""
        seq = t.seq
        if t.detok is None:
            return False
        if seq.finish_reason == "stop" and token in seq.stop_token_ids:
            t.stop_reason = token           # the stop token itself is not part of the text
            return False
        new = t.detok.add(token)
        if not new:
            return False
        t.text += new
        return self._cut_at_stop(t, len(new))

    def _choice_made(self, t: _Tracked, token: int) -> bool:
        """Adds token's bytes to a guided sample's spelling; True if it completes a choice that no
        longer choice continues."""
        guide = t.request.guide
        if guide is None or token in t.seq.stop_token_ids:
            return False
        t.spelled += self.llm.tokenizer.token_bytes(token)
        return guide.is_finished(t.spelled)

    @staticmethod
    def _cut_at_stop(t: _Tracked, new_len: int) -> bool:
        """Cuts t.text at the first stop string that its last new_len characters complete; True if one did.
        Before min_tokens, stop strings are ignored, as in vLLM."""
        stops = t.request.params.stop
        if not stops or t.seq.num_output_tokens < t.request.params.min_tokens:
            return False
        at = find_stop(t.text, stops, new_len)
        if at < 0:
            return False
        t.stop_reason = next(x for x in stops if t.text.startswith(x, at))
        keep = len(t.stop_reason) if t.request.params.include_stop_str_in_output else 0
        t.text = t.text[:at + keep]
        return True

    def _track(self, r: Request, eos: set, now: float) -> None:
        """Makes the sequences of one request: one per sample."""
        llm, p = self.llm, r.params
        tok = llm.tokenizer
        ids = [r.request_id] if p.n == 1 else [f"{r.request_id}#{i}" for i in range(p.n)]
        if r.request_id in self.request_ids or any(i in self.tracked for i in ids):
            raise ValueError(f"request {r.index}: id {r.request_id!r} is used twice in this batch")
        self.request_ids.add(r.request_id)
        if self._is_duplicate(r):
            return
        # ignore_eos: no stop token of any kind ends the request, neither EOS nor stop_token_ids (docs/design.md;
        # vLLM still stops at stop_token_ids). Stop strings, matched on the text, still do.
        stops = set() if p.ignore_eos else set(p.stop_token_ids or ()) | eos
        for i, seq_id in enumerate(ids):
            seq = Sequence(seq_id, r.prompt_token_ids, p.max_tokens, stop_token_ids=stops, arrival_time=now)
            gen = None
            if not p.greedy:   # sample i > 0 of a seeded request: its own stream, derived from the seed
                seed = [p.seed] if p.seed is not None else [llm.config.context.seed, llm.requests.num_built, r.index]
                gen = np.random.default_rng(seed + [i] if i else seed)
            detok = (IncrementalDetokenizer(tok, r.prompt_token_ids, p.skip_special_tokens)
                     if tok is not None else None)
            t = self.tracked[seq_id] = _Tracked(r, i, seq, detok, gen)
            if i == 0 and p.prompt_logprobs is not None:       # the other samples share the prompt
                t.prompt_logprobs = [None]                       # nothing predicts the first token
                seq.needs_prompt_logits = len(r.prompt_token_ids) > 1

    def _is_duplicate(self, r: Request) -> bool:
        """Under deduplication: True (and r noted as a copy) if an earlier request of the batch has r's prompt
        tokens and equal greedy SamplingParams with n == 1; its output is then r's, token for token.
        Sampling requests are never copied: each keeps its own seed."""
        p = r.params
        if not self.deduplicate or not p.greedy or p.n != 1:
            return False
        same_prompt = self._computed.setdefault(tuple(r.prompt_token_ids), [])
        first = next((c for c in same_prompt if c.params == p), None)
        if first is None:
            same_prompt.append(r)
            return False
        self.duplicates_of.setdefault(id(first), []).append(r)
        self.num_deduplicated += 1
        return True

    @staticmethod
    def _output(samples: list[_Tracked]) -> RequestOutput:
        first, seqs = samples[0], [t.seq for t in samples]

        def earliest(times):
            times = [x for x in times if x is not None]
            return min(times) if times else None
        completions = [CompletionOutput(t.sample, t.text, t.seq.output_token_ids, t.seq.finish_reason,
                                        t.stop_reason, t.logprobs) for t in samples]
        c = completions[0]
        return RequestOutput(
            request_id=first.request.request_id, prompt=first.request.prompt,
            prompt_token_ids=list(first.request.prompt_token_ids), text=c.text,
            token_ids=c.token_ids, finish_reason=c.finish_reason,
            num_cached_tokens=first.seq.num_cached_tokens,
            metrics=RequestMetrics(first.seq.arrival_time, earliest(s.first_scheduled_time for s in seqs),
                                   earliest(s.first_token_time for s in seqs),
                                   max(s.finish_time for s in seqs), max(s.num_output_tokens for s in seqs)),
            stop_reason=c.stop_reason, logprobs=c.logprobs, outputs=completions,
            prompt_logprobs=first.prompt_logprobs)

    def abort_unfinished(self) -> None:
        """Drops what did not finish. After a failure inside a step, blocks committed for that
        step hold no KV, so the prefix cache is dropped with them."""
        sched = self.llm.scheduler
        for t in self.tracked.values():
            if t.seq.status is not SequenceStatus.FINISHED:
                sched.finish(t.seq, "abort")
        self.tracked.clear()
        self.done.clear()
        if self.failed:
            self.llm.scheduler = self.llm.new_scheduler()

    def stats(self) -> dict:
        elapsed = max(self.end - self.start, 1e-9)
        return {"tokens_per_s": self.num_output_tokens / elapsed,
                "num_output_tokens": self.num_output_tokens, "elapsed_s": elapsed,
                "num_deduplicated": self.num_deduplicated,
                "kv_cache_usage_mean": float(np.mean(self.usage)) if self.usage else 0.0,
                "kv_cache_usage_peak": float(np.max(self.usage)) if self.usage else 0.0}


def copy_output(out: RequestOutput, request: Request) -> RequestOutput:
    """out, as the output of request (a duplicate of the request that made it): its own id and prompt."""
    outputs = [dataclasses.replace(c, token_ids=list(c.token_ids),
                                   logprobs=None if c.logprobs is None else [dict(d) for d in c.logprobs])
               for c in out.outputs]
    first = outputs[0]
    return dataclasses.replace(
        out, request_id=request.request_id, prompt=request.prompt,
        prompt_token_ids=list(request.prompt_token_ids), token_ids=first.token_ids, logprobs=first.logprobs,
        outputs=outputs, metrics=dataclasses.replace(out.metrics),
        prompt_logprobs=None if out.prompt_logprobs is None else [None if d is None else dict(d)
                                                                   for d in out.prompt_logprobs])


@contextlib.contextmanager
def interrupts_raise():
    """While engine work runs, Ctrl-C raises KeyboardInterrupt instead of killing the process.

    MindSpore installs its own SIGINT handler at every graph run, and that handler sends the
    process SIGTERM, whose default action kills it: every result held in memory would be lost. Here
    SIGTERM raises KeyboardInterrupt, so a run stops as an interrupted Python call does (finished
    outputs ride on the exception, the engine stays usable); afterwards Python's SIGINT handler is
    back. Left alone outside the main thread, or when the program has its own SIGTERM handler."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield
        return
    sigint = signal.getsignal(signal.SIGINT)     # Python's record; MindSpore replaced the C handler
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if sigint is not None:
            signal.signal(signal.SIGINT, sigint)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"interrupted (signal {signum}: MindSpore turns Ctrl-C into SIGTERM)")


def progress_bar(total: int, enabled: bool, unit: str, desc: str):
    """A tqdm bar, or None when disabled (tqdm is imported only then)."""
    if not enabled:
        return None
    from tqdm import tqdm
    return tqdm(total=total, unit=unit, desc=desc, dynamic_ncols=True)
