"""InputProcessor: prompts and SamplingParams -> Requests, every one checked before any work starts.

Owned by LLM. It reads the tokenizer and the vocabulary size it was given, and checks each request's size
against the engine's limits (`limits.check`, `limits.max_output_tokens`: the Engine, which alone reads the
scheduler's KV pool and max_model_len; `limits.check_guide`: its StructuredOutputManager, against the tokenizer)
and its LoRA adapter through `adapters` (ms_atb/engine/adapters.py); it owns the request id counter and the cache
of Guides (one per distinct structured output constraint)."""
from __future__ import annotations

import dataclasses
import re
from typing import Union

import numpy as np

from ms_atb.engine.request import Request
from ms_atb.sampling_params import SamplingParams
from ms_atb.structured_outputs import StructuredOutputsParams
from ms_atb.text.grammar import Guide, make_guide

_SURROGATE = re.compile("[\ud800-\udfff]")   # what a str may hold and UTF-8 cannot encode

# text, token ids (a list, tuple or 1-D integer array), or vLLM's {"prompt": text} / {"prompt_token_ids": ids}
Prompt = Union[str, list[int], tuple[int, ...], np.ndarray, dict]


class InputProcessor:
    def __init__(self, tokenizer, vocab_size: int, max_model_len: int, limits, adapters=None):
        self.tokenizer = tokenizer
        self.limits = limits            # check(num_prompt_tokens, max_tokens), max_output_tokens(num_prompt_tokens)
        self.adapters = adapters        # Adapters (check(lora_request) -> key), or None: no LoRA request is taken
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self._next_id = 0
        self._guides: dict[tuple, Guide] = {}

    @property
    def num_built(self) -> int:
        """Requests built with a generated id so far (the engine's default seed mixes it in)."""
        return self._next_id

    def build_all(self, prompts, sampling_params, defaults: SamplingParams,
                  add_special_tokens: bool = True, lora_request=None) -> list[Request]:
        """One Request per prompt; ValueError naming the first bad one's index. sampling_params: one
        SamplingParams, one per prompt, or None (defaults); lora_request: None, one LoRARequest, or one (or None)
        per prompt."""
        if isinstance(prompts, np.ndarray) and prompts.ndim in (1, 2):
            prompts = [prompts] if prompts.ndim == 1 else list(prompts)     # one prompt, or one per row
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, (list, tuple)) and prompts
                                                and all(_is_integer(t) for t in prompts)):
            prompts = [prompts]
        if not isinstance(prompts, (list, tuple)):
            raise ValueError(f"prompts must be a string, a list of token ids (or a 1-D integer array), a "
                             f"{{'prompt' | 'prompt_token_ids': ...}} dict, or a list of those (or a 2-D integer "
                             f"array, one prompt per row); got {type(prompts).__name__}")
        if sampling_params is None:
            sampling_params = defaults
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(prompts)
        elif not isinstance(sampling_params, (list, tuple)) or len(sampling_params) != len(prompts) \
                or not all(isinstance(p, SamplingParams) for p in sampling_params):
            raise ValueError(f"sampling_params must be one SamplingParams or a list of {len(prompts)} "
                             f"(one per prompt)")
        checked = set()
        for i, sp in enumerate(sampling_params):    # fields may have been changed since construction
            if id(sp) not in checked:
                checked.add(id(sp))
                try:
                    sp.validate()
                except ValueError as e:
                    raise ValueError(f"request {i}: {e}") from None
        if not isinstance(lora_request, (list, tuple)):
            lora_request = [lora_request] * len(prompts)
        elif len(lora_request) != len(prompts):
            raise ValueError(f"lora_request must be one LoRARequest (or None) or a list of {len(prompts)} (one per "
                             f"prompt), got a list of {len(lora_request)}")
        return [self.build(p, sp, i, add_special_tokens=add_special_tokens, lora_request=lr)
                for i, (p, sp, lr) in enumerate(zip(prompts, sampling_params, lora_request))]

    def build(self, prompt: Prompt, params: SamplingParams, index: int, request_id: str | None = None,
              add_special_tokens: bool = True, tag=None, lora_request=None) -> Request:
        """Validates one request; ValueError naming its index. tag: the caller's data, carried to its output;
        lora_request: its LoRA adapter (a LoRARequest), None for the base model."""
        try:
            lora_key = self._lora_key(lora_request)
            if isinstance(prompt, dict):
                keys = sorted(prompt)
                if keys not in (["prompt"], ["prompt_token_ids"]):
                    raise ValueError(f"a dict prompt has exactly one key, 'prompt' (text) or 'prompt_token_ids', "
                                     f"got {keys}")
                prompt = prompt[keys[0]]
                if isinstance(prompt, str) != (keys[0] == "prompt"):
                    raise ValueError(f"'{keys[0]}' must be {'a string' if keys[0] == 'prompt' else 'token ids'}")
            if isinstance(prompt, str):
                if not prompt:
                    raise ValueError("the prompt is empty")
                bad = _SURROGATE.search(prompt)
                if bad is not None:
                    raise ValueError(f"the prompt is not valid Unicode: a lone surrogate ({bad.group()!r}) at "
                                     f"character {bad.start()}")
                if self.tokenizer is None:
                    raise ValueError("this model has no tokenizer (no tokenizer.json or tokenizer.model in its "
                                     "directory, and no model.tokenizer set): pass token ids")
                ids = self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
                text = prompt
            elif isinstance(prompt, (list, tuple)) or (isinstance(prompt, np.ndarray) and prompt.ndim == 1):
                if not all(_is_integer(t) for t in prompt):
                    raise ValueError("a token-id prompt must be a list of ints")
                ids, text = [int(t) for t in prompt], None
            else:
                raise ValueError(f"a prompt must be a string or a list of token ids (or a 1-D integer "
                                 f"array), got {type(prompt).__name__}")
            if not ids:
                raise ValueError("the prompt is empty")
            if params.truncate_prompt_tokens is not None:
                ids = ids[-params.truncate_prompt_tokens:]       # the last K tokens, as in vLLM
            vocab = self.vocab_size
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise ValueError(f"token id {bad[0]} is outside the vocabulary [0, {vocab})")
            named = [t for t in params.token_ids_used if t >= vocab]
            if named:
                raise ValueError(f"token id {named[0]} in the sampling parameters (stop_token_ids, "
                                 f"logit_bias, allowed_token_ids) is outside the vocabulary [0, {vocab})")
            if params.max_tokens is None:           # as many as max_model_len (and the KV pool) leave
                room = self.limits.max_output_tokens(len(ids))
                if room < 1:
                    raise ValueError(f"the prompt ({len(ids)} tokens) leaves no room to generate within "
                                     f"max_model_len {self.max_model_len} and the KV pool")
                params = dataclasses.replace(params, max_tokens=room)
            self.limits.check(len(ids), params.max_tokens)
            guide, bad_words_ids = self._text_constraints(params)
        except ValueError as e:
            raise ValueError(f"request {index}: {e}") from None
        if request_id is None:
            request_id = f"req-{self._next_id}"
            self._next_id += 1
        return Request(request_id, index, text, ids, params, guide, bad_words_ids, tag, lora_request, lora_key)

    def _lora_key(self, lora_request) -> str | None:
        """The adapter's key (Adapters.check), None for the base model."""
        if lora_request is None:
            return None
        if self.adapters is None:
            raise ValueError("this engine takes no LoRA adapters")
        return self.adapters.check(lora_request)

    def _text_constraints(self, params: SamplingParams) -> tuple[Guide | None, list[tuple[int, ...]]]:
        """The Guide of params.structured and the token sequences of params.bad_words (each word as encoded alone
        and after a space, as in vLLM)."""
        structured = params.structured
        if structured is None and params.bad_words is None:
            return None, []
        if self.tokenizer is None:
            raise ValueError("structured outputs (guided_choice, ...) and bad_words need a tokenizer; this model "
                             "has none")
        guide = None if structured is None else self._guide(structured)
        sequences = {}
        for word in params.bad_words or ():
            for text in (word, " " + word.lstrip()):
                ids = tuple(self.tokenizer.encode(text, add_special_tokens=False))
                if ids:
                    sequences[ids] = None
        return guide, list(sequences)

    def _guide(self, structured: StructuredOutputsParams) -> Guide:
        """One Guide per distinct constraint, checked against the tokenizer when first made."""
        key = structured.key
        guide = self._guides.get(key)
        if guide is None:
            guide = make_guide(key, getattr(structured, structured.kind), self.tokenizer)
            self.limits.check_guide(guide)
            if len(self._guides) >= 256:
                self._guides.clear()
            self._guides[key] = guide
        return guide


def _is_integer(x) -> bool:
    """A token id's type: a Python int or a NumPy integer (prompts may be integer arrays), not a bool."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)
