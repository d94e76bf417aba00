"""LoRARequest: the LoRA adapter a request runs with, named as vLLM names it: LoRARequest(lora_name, lora_int_id,
lora_path), lora_path a PEFT directory (adapter_config.json + adapter_model.safetensors)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARequest:
    lora_name: str
    lora_int_id: int            # >= 1; within one engine an id names one adapter
    lora_path: str

    def __post_init__(self):
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise ValueError(f"LoRARequest: lora_name must be a non-empty string, got {self.lora_name!r}")
        if not isinstance(self.lora_int_id, int) or isinstance(self.lora_int_id, bool) or self.lora_int_id < 1:
            raise ValueError(f"LoRARequest {self.lora_name!r}: lora_int_id must be an int >= 1, got "
                             f"{self.lora_int_id!r}")
        if not isinstance(self.lora_path, str) or not self.lora_path:
            raise ValueError(f"LoRARequest {self.lora_name!r}: lora_path must be a PEFT adapter directory, got "
                             f"{self.lora_path!r}")

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    @property
    def path(self) -> str:
        return self.lora_path
