"""LoraChoice: the LoRA adapters of a batch job (`--lora NAME=PATH`, repeatable) and which one each line runs with.

Rules:
  1. `--lora` turns LoRA on (lora.enable_lora), with lora.max_lora_rank the largest given adapter's rank unless
     `--set max_lora_rank=...` says otherwise. Names are distinct; each adapter is checked when the engine takes
     its first line (a malformed adapter: a ValueError naming its directory).
  2. An OpenAI batch line chooses by its body's `model`: an adapter's name, or the base model's (--config or
     model.path, or either's last part; absent: the base model). With --lora, any other name makes that line an error
     line; without --lora, `model` is echoed and not checked.
  3. A line of our JSONL chooses by its `lora` field: an adapter's name, or absent / null for the base model; a
     name --lora did not give is that line's error.
"""
from __future__ import annotations

import json
import os

from ms_atb.batch.item import BatchItem
from ms_atb.lora_request import LoRARequest

FIELD = "lora"          # our JSONL's field naming a line's adapter


def parse_loras(pairs: list[str]) -> dict[str, str]:
    """--lora NAME=PATH flags -> {name: path}; ValueError for a malformed flag or a name given twice."""
    loras: dict[str, str] = {}
    for pair in pairs:
        name, eq, path = pair.partition("=")
        name, path = name.strip(), path.strip()
        if not eq or not name or not path:
            raise ValueError(f"--lora expects NAME=PATH (a PEFT adapter directory), got {pair!r}")
        if name in loras:
            raise ValueError(f"--lora {name!r} is given twice ({loras[name]!r} and {path!r}); names must differ")
        loras[name] = path
    return loras


def lora_overrides(loras: dict[str, str], overrides: dict) -> dict:
    """The config overrides --lora implies (rule 1), beside the --set ones (which win)."""
    if not loras:
        return overrides
    from ms_atb.formats.peft_adapter import read_adapter_config
    rank = max(read_adapter_config(path)["rank"] for path in loras.values())
    return {"enable_lora": True, "max_lora_rank": rank, **overrides}


class LoraChoice:
    def __init__(self, loras: dict[str, str], base_paths):
        """loras: parse_loras' {name: path}; base_paths: --config and model.path, the base model's names (rule 2)."""
        self.requests = {name: LoRARequest(name, i + 1, path) for i, (name, path) in enumerate(loras.items())}
        bases = [str(p).rstrip("/") for p in base_paths if p]
        self.base_names = set(bases) | {os.path.basename(p) for p in bases}

    def of(self, item: BatchItem) -> LoRARequest | None:
        """The adapter the line runs with, None for the base model; ValueError naming what is wrong (rules 2-3)."""
        if item.openai is not None:
            model = item.openai.model
            if not self.requests or model is None or model in self.base_names:
                return None
            if model not in self.requests:
                raise ValueError(f"model {model!r} names neither a LoRA adapter ({sorted(self.requests)}) nor the "
                                 f"base model ({sorted(self.base_names)})")
            return self.requests[model]
        name = item.sampling.get(FIELD)
        if name is None:
            return None
        if not isinstance(name, str):
            raise ValueError(f"'{FIELD}' must be an adapter's name (a string) or null, got {json.dumps(name)}")
        if name not in self.requests:
            given = f"--lora gave {sorted(self.requests)}" if self.requests else "no --lora was given"
            raise ValueError(f"'{FIELD}' names the adapter {name!r}; {given}")
        return self.requests[name]


def without_lora(sampling: dict) -> dict:
    """A line's sampling fields less its `lora` field."""
    return {k: v for k, v in sampling.items() if k != FIELD} if FIELD in sampling else sampling
