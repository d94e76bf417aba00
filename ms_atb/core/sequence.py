"""Per-request state: token ids and a few counters; everything else is derived."""
from __future__ import annotations

import enum
import numbers
import time


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """One request. Its KV is computed for token_ids[:num_computed_tokens]; the scheduler lets
    num_computed_tokens catch up with num_tokens (there is no separate prefill or decode phase).
    A sampled token in stop_token_ids ends it, unless ignore_eos (then only max_tokens and max_model_len do);
    the engine leaves stop_token_ids empty when the request ignores EOS."""

    def __init__(self, request_id: str, prompt_token_ids: list[int], max_tokens: int,
                 ignore_eos: bool = False, stop_token_ids: frozenset[int] | set[int] = frozenset(),
                 arrival_time: float | None = None, extra_key: str | None = None,
                 lora_key: str | None = None):
        if len(prompt_token_ids) == 0:
            raise ValueError(f"request {request_id!r}: the prompt is empty")
        if not isinstance(max_tokens, numbers.Integral) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise ValueError(f"request {request_id!r}: max_tokens must be an int >= 1, got {max_tokens!r}")
        self.request_id = request_id
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.max_tokens = max_tokens
        self.ignore_eos = ignore_eos
        self.stop_token_ids = frozenset(stop_token_ids)
        # its LoRA adapter's identity (ms_atb/core/lora_slots.py), None: the base model; its extra_key too
        self.lora_key = lora_key
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0       # prompt tokens found in the prefix cache at first admission
        self.num_preemptions = 0
        self.needs_prompt_logits = False  # the logits of every prompt position are still wanted: no cache hits
        self.extra_key = extra_key       # what else its KV depends on (an adapter's name): shared only within it
        self.finish_reason: str | None = None
        self.arrival_time = time.perf_counter() if arrival_time is None else arrival_time
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.finish_time: float | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[:self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_remaining_tokens(self) -> int:
        """Tokens it may still generate."""
        return self.max_tokens - self.num_output_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def __repr__(self) -> str:
        return (f"Sequence({self.request_id!r}, {self.status.value}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens})")
