"""RequestOutput: what generate() returns for each request."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RequestMetrics:
    arrival_time: float                   # time.perf_counter() seconds
    first_scheduled_time: float | None
    first_token_time: float | None
    finish_time: float | None
    num_output_tokens: int = 0

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


@dataclass
class RequestOutput:
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

    @property
    def cumulative_logprob(self) -> float | None:
        """Sum of the log-probabilities of token_ids (None without logprobs)."""
        if self.logprobs is None:
            return None
        return float(sum(lp[t] for lp, t in zip(self.logprobs, self.token_ids)))
