"""BatchItem: one input line of ms-atb-generate, from the file to its result line.

It is made once by the reader (ms_atb/batch/prompt_file.py, ms_atb/batch/openai_batch.py), rides on the
engine's Request as its tag, and comes back with the output: the job never looks an id up again.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Union

ItemId = Union[str, int, tuple]     # ours: a string or an int, as given (7 and "7" differ); OpenAI: its custom_id,
                                    # or ("line", N) for a line whose custom_id cannot be read


@dataclass(frozen=True)
class OpenAIEndpoint:
    """What an OpenAI batch line's answer needs besides the output."""
    url: str                         # /v1/chat/completions or /v1/completions
    model: str | None                # echoed in the answer; None: the config's model path
    top_logprobs: int | None = None  # chat: how many alternatives each token's logprobs list


@dataclass
class BatchItem:
    id: ItemId
    line: int                                     # 1-based line of the input
    prompt: str | list[int] | None = None         # exactly one of prompt and messages, unless error is set
    messages: list[dict] | None = None
    sampling: dict = field(default_factory=dict)  # SamplingParams fields the line sets (and its response_format)
    openai: OpenAIEndpoint | None = None          # set for an OpenAI batch line
    error: str | None = None                      # why the line cannot run (an error line is written instead)
    error_code: str = "invalid_request"           # the OpenAI error code of that line

    @property
    def engine_id(self) -> str:
        """The request id the engine runs it under: the id as JSON, so 7 and "7" stay apart."""
        return json.dumps(self.id)
