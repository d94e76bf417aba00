"""OutputProcessor: the engine's sampled tokens -> RequestOutputs. It never sees the engine.

Rules:
  1. Each sample's text grows incrementally (IncrementalDetokenizer); the stop token that ended a sample is not
     part of its text. A stop string found in the text ends the sample ("stop"), the text cut before it (or
     after it with include_stop_str_in_output); stop strings count only from min_tokens on, as in vLLM.
  2. A request's output is made when all its n samples are finished, samples in index order.
  3. With deduplication (the prefix policy) a request identical to an earlier one of the run (prompt tokens, LoRA
     adapter and greedy SamplingParams, n == 1) is not computed: it gets a copy of that one's output. Sampling requests are
     never copied: each keeps its own seed.
  4. An id may be used once among the requests in flight, by a request or by one of its samples (a list given to
     generate() is all in flight at once). A finished request leaves every table: a streamed run's memory does not
     grow with its length.
"""
from __future__ import annotations

import dataclasses
from typing import Iterator

from ms_atb.engine.engine import EngineSample
from ms_atb.engine.request import Request
from ms_atb.outputs import CompletionOutput, RequestMetrics, RequestOutput
from ms_atb.text.detokenizer import IncrementalDetokenizer, find_stop


class SampleText:
    """A sample's text so far and what stopped it."""
    __slots__ = ("detok", "text", "stop_reason", "stopped")

    def __init__(self, detok):
        self.detok = detok
        self.text = ""
        self.stop_reason: int | str | None = None
        self.stopped = False             # a stop string ended it


class OutputProcessor:
    def __init__(self, tokenizer, deduplicate: bool):
        self.tokenizer = tokenizer
        self.deduplicate = deduplicate
        self.texts: dict[str, SampleText] = {}         # by sample id, in flight
        self.done: dict[int, list[EngineSample]] = {}  # by id(request): its finished samples
        self.request_ids: set[str] = set()
        self.duplicates_of: dict[int, list[Request]] = {}    # id(computed request) -> its duplicates
        self._computed: dict[tuple, list[Request]] = {}   # (adapter, prompt tokens) -> dedupable requests
        self.num_deduplicated = 0
        self.num_copied_tokens = 0       # output tokens delivered to duplicates

    def add(self, request: Request) -> bool:
        """Takes a request of the run; True if the engine computes it, False if it is a duplicate (rule 3).
        ValueError naming the request if its id is taken (rule 4)."""
        ids = request.sample_ids
        if request.request_id in self.request_ids or any(i in self.texts for i in ids):
            raise ValueError(f"request {request.index}: id {request.request_id!r} is used twice in this batch")
        self.request_ids.add(request.request_id)
        if self._is_duplicate(request):
            return False
        for sample_id in ids:
            detok = (IncrementalDetokenizer(self.tokenizer, request.prompt_token_ids,
                                            request.params.skip_special_tokens)
                     if self.tokenizer is not None else None)
            self.texts[sample_id] = SampleText(detok)
        return True

    def add_tokens(self, sampled: list[tuple[EngineSample, int]]) -> list[EngineSample]:
        """Appends each token's text; returns the samples a stop string now ends (rule 1)."""
        return [s for s, token in sampled if self._append_text(s, token)]

    def finish(self, finished: list[EngineSample]) -> Iterator[tuple[Request, RequestOutput]]:
        """The outputs that the finished samples complete, then their duplicates' copies."""
        for s in finished:
            t = self.texts.pop(s.id)
            if t.detok is not None and not isinstance(t.stop_reason, str):
                tail = t.detok.flush()        # an unfinished UTF-8 character, if any
                t.text += tail
                if tail and self._cut_at_stop(s, t, len(tail)):
                    t.stopped = True
            samples = self.done.setdefault(id(s.request), [])
            samples.append((s, t))
            if len(samples) < s.request.params.n:
                continue
            del self.done[id(s.request)]
            out = _output(sorted(samples, key=lambda x: x[0].index))
            duplicates = self._forget(s.request)
            yield s.request, out
            for dup in duplicates:
                self.num_copied_tokens += sum(len(c.token_ids) for c in out.outputs)
                yield dup, copy_output(out, dup)

    def _forget(self, request: Request) -> list[Request]:
        """A finished request leaves the run's tables (so a streamed run holds only the requests in flight);
        returns its duplicates, which finish with it."""
        duplicates = self.duplicates_of.pop(id(request), [])
        for r in (request, *duplicates):
            self.request_ids.discard(r.request_id)
        key = (request.lora_key, tuple(request.prompt_token_ids))
        same_prompt = [r for r in self._computed.get(key, ()) if r is not request]
        if same_prompt:
            self._computed[key] = same_prompt
        else:
            self._computed.pop(key, None)
        return duplicates

    def _append_text(self, s: EngineSample, token: int) -> bool:
        """Adds token's text; True if a stop string now ends the sample."""
        t = self.texts[s.id]
        if t.detok is None:
            return False
        if s.seq.finish_reason == "stop" and token in s.seq.stop_token_ids:
            t.stop_reason = token           # the stop token itself is not part of the text
            return False
        new = t.detok.add(token)
        if not new:
            return False
        t.text += new
        t.stopped = self._cut_at_stop(s, t, len(new))
        return t.stopped

    @staticmethod
    def _cut_at_stop(s: EngineSample, t: SampleText, new_len: int) -> bool:
        """Cuts t.text at the first stop string that its last new_len characters complete; True if one did."""
        params = s.request.params
        if not params.stop or s.seq.num_output_tokens < params.min_tokens:
            return False
        at = find_stop(t.text, params.stop, new_len)
        if at < 0:
            return False
        t.stop_reason = next(x for x in params.stop if t.text.startswith(x, at))
        keep = len(t.stop_reason) if params.include_stop_str_in_output else 0
        t.text = t.text[:at + keep]
        return True

    def _is_duplicate(self, r: Request) -> bool:
        """Under deduplication: True (and r noted as a copy) if an earlier request of the run has r's prompt
        tokens, r's adapter and equal greedy SamplingParams with n == 1; its output is then r's, token for token."""
        p = r.params
        if not self.deduplicate or not p.greedy or p.n != 1:
            return False
        same_prompt = self._computed.setdefault((r.lora_key, tuple(r.prompt_token_ids)), [])
        first = next((c for c in same_prompt if c.params == p), None)
        if first is None:
            same_prompt.append(r)
            return False
        self.duplicates_of.setdefault(id(first), []).append(r)
        self.num_deduplicated += 1
        return True


def _output(samples: list[tuple[EngineSample, SampleText]]) -> RequestOutput:
    first = samples[0][0]
    seqs = [s.seq for s, _ in samples]

    def earliest(times):
        times = [x for x in times if x is not None]
        return min(times) if times else None
    completions = [CompletionOutput(s.index, t.text, s.seq.output_token_ids, "stop" if t.stopped else
                                    s.seq.finish_reason, t.stop_reason, s.logprobs) for s, t in samples]
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
        prompt_logprobs=first.prompt_logprobs, lora_request=first.request.lora_request)


def copy_output(out: RequestOutput, request: Request) -> RequestOutput:
    """out, as the output of request (a duplicate of the request that made it): its own id and prompt."""
    outputs = [dataclasses.replace(c, token_ids=list(c.token_ids),
                                   logprobs=None if c.logprobs is None else [dict(d) for d in c.logprobs])
               for c in out.outputs]
    first = outputs[0]
    return dataclasses.replace(
        out, request_id=request.request_id, prompt=request.prompt, lora_request=request.lora_request,
        prompt_token_ids=list(request.prompt_token_ids), token_ids=first.token_ids, logprobs=first.logprobs,
        outputs=outputs, metrics=dataclasses.replace(out.metrics),
        prompt_logprobs=None if out.prompt_logprobs is None else [None if d is None else dict(d)
                                                                   for d in out.prompt_logprobs])
