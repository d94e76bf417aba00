"""Adapters: the LoRA adapters an engine's requests name, each checked once and known by its content
(LoraAdapter.key).

Owned by LLM. The InputProcessor checks each request's LoRARequest through it (`check`: the adapter's files read
and checked against the model and max_lora_rank, a ValueError naming the directory otherwise); the Engine finds
the directory of an adapter the scheduler asks to load (`path`). Within one engine a lora_int_id names one
adapter (one name and one directory).
"""
from __future__ import annotations

import os

from ms_atb.formats.peft_adapter import load_adapter
from ms_atb.lora_request import LoRARequest


class Adapters:
    def __init__(self, model_config, max_rank: int | None):
        """max_rank: lora.max_lora_rank, or None with LoRA off (every LoRARequest refused)."""
        self.model_config = model_config
        self.max_rank = max_rank
        self._keys: dict[LoRARequest, str] = {}        # checked requests -> their adapter's key
        self._ids: dict[int, LoRARequest] = {}
        self._paths: dict[str, str] = {}               # key -> a directory holding it

    def check(self, lora_request) -> str:
        """The adapter's key (LoraAdapter.key: named by its content; the requests' extra key); ValueError when LoRA
        is off, the request is not a LoRARequest, its id names another adapter, or its directory is not an adapter
        this model and max_lora_rank take."""
        if not isinstance(lora_request, LoRARequest):
            raise ValueError(f"lora_request must be a LoRARequest (or None), got {type(lora_request).__name__}")
        key = self._keys.get(lora_request)
        if key is not None:
            return key
        if self.max_rank is None:
            raise ValueError(f"LoRA adapter {lora_request.lora_name!r}: LoRA is off; build the engine with "
                             f"enable_lora=True (and max_loras, max_lora_rank)")
        other = self._ids.get(lora_request.lora_int_id)
        if other is not None:
            raise ValueError(f"LoRA adapter {lora_request.lora_name!r}: lora_int_id {lora_request.lora_int_id} "
                             f"already names {other.lora_name!r} ({other.lora_path}); give each adapter its own id")
        adapter = load_adapter(lora_request.lora_path, self.model_config, self.max_rank)
        self._keys[lora_request], self._ids[lora_request.lora_int_id] = adapter.key, lora_request
        self._paths.setdefault(adapter.key, os.path.abspath(lora_request.lora_path))
        return adapter.key

    def path(self, key: str) -> str:
        """A directory holding the adapter of `key` (a key check() returned)."""
        return self._paths[key]
