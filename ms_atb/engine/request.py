"""Request: one validated generate() input, before the scheduler sees it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ms_atb.lora_request import LoRARequest
from ms_atb.sampling_params import SamplingParams
from ms_atb.text.grammar import Guide


@dataclass
class Request:
    request_id: str
    index: int                      # position in the caller's list
    prompt: str | None              # None for token-id prompts
    prompt_token_ids: list[int]
    params: SamplingParams
    guide: Guide | None = None      # params.structured over the tokenizer's vocabulary, shared by equal constraints
    bad_words_ids: list[tuple[int, ...]] = field(default_factory=list)   # token sequences never completed
    tag: Any = None                 # the caller's own data, handed back with the output (LLM.stream)
    lora_request: LoRARequest | None = None   # its adapter; None: the base model
    lora_key: str | None = None               # the adapter's identity and its extra key (ms_atb/engine/adapters.py)

    @property
    def sample_ids(self) -> list[str]:
        """The id of each of its samples' sequences: the request id itself when n == 1."""
        n = self.params.n
        return [self.request_id] if n == 1 else [f"{self.request_id}#{i}" for i in range(n)]
