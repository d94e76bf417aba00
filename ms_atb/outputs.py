"""RequestOutput: what generate() returns for each request; CompletionOutput: one of its samples."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RequestMetrics:
    arrival_time: float                   # time.perf_counter() seconds
    first_scheduled_time: float | None
    first_token_time: float | None
    finish_time: float | None
    num_output_tokens: int = 0            # with SamplingParams(n > 1): the longest sample's

    @property
    def ttft(self) -> float | None:
        """Seconds from arrival to the first generated token."""
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time

    @property
    def tpot(self) -> float | None:
        """Mean seconds per output token after the first."""
        if self.finish_time is None or self.first_token_time is None or self.num_output_tokens < 2:
            return None
        return (self.finish_time - self.first_token_time) / (self.num_output_tokens - 1)


def _cumulative(logprobs, token_ids) -> float | None:
    if logprobs is None:
        return None
    return float(sum(lp[t] for lp, t in zip(logprobs, token_ids)))


@dataclass
class CompletionOutput:
    """One sample of a request (SamplingParams(n=...) asks for several)."""
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str
    stop_reason: int | str | None = None
    logprobs: list[dict[int, float]] | None = None

    @property
    def cumulative_logprob(self) -> float | None:
        return _cumulative(self.logprobs, self.token_ids)


@dataclass
class RequestOutput:
    """text, token_ids, finish_reason, stop_reason and logprobs are those of the first sample;
    outputs holds every sample (one unless SamplingParams(n > 1))."""
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]               # includes the token that ended the request (e.g. EOS)
    finish_reason: str                 # "stop" | "length"
    num_cached_tokens: int
    metrics: RequestMetrics
    stop_reason: int | str | None = None   # the stop token id or stop string that ended it
    # With SamplingParams(logprobs=N): one {token id: log-probability} per token of token_ids (the
    # token itself and the N most likely), under the model's distribution before penalties and temperature.
    logprobs: list[dict[int, float]] | None = None
    outputs: list[CompletionOutput] = field(default_factory=list)
    # With SamplingParams(prompt_logprobs=N): one entry per prompt token, None for the first (nothing
    # predicts it), else {token id: log-probability} of that token and the N most likely there.
    prompt_logprobs: list[dict[int, float] | None] | None = None
    lora_request: Any = None               # the LoRARequest it ran with; None: the base model

    def __post_init__(self):
        if not self.outputs:
            self.outputs = [CompletionOutput(0, self.text, self.token_ids, self.finish_reason,
                                             self.stop_reason, self.logprobs)]

    @property
    def cumulative_logprob(self) -> float | None:
        """Sum of the log-probabilities of token_ids (None without logprobs)."""
        return _cumulative(self.logprobs, self.token_ids)
