"""Request: one validated generate() input, before the scheduler sees it."""
from __future__ import annotations

from dataclasses import dataclass, field

from ms_atb.text.guided_choice import ChoiceGuide
from ms_atb.sampling_params import SamplingParams


@dataclass
class Request:
    request_id: str
    index: int                      # position in the caller's list
    prompt: str | None              # None for token-id prompts
    prompt_token_ids: list[int]
    params: SamplingParams
    guide: ChoiceGuide | None = None     # params.guided_choice over the tokenizer's vocabulary
    bad_words_ids: list[tuple[int, ...]] = field(default_factory=list)   # token sequences never completed
