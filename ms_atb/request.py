"""Request: one validated generate() input, before the scheduler sees it."""
from __future__ import annotations

from dataclasses import dataclass

from ms_atb.sampling_params import SamplingParams


@dataclass
class Request:
    request_id: str
    index: int                      # position in the caller's list
    prompt: str | None              # None for token-id prompts
    prompt_token_ids: list[int]
    params: SamplingParams
