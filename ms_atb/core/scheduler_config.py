"""SchedulerConfig: everything a Scheduler is built from, validated once."""
from __future__ import annotations

from dataclasses import dataclass

from ms_atb.core.block_manager import PLACEMENTS

# the block manager's placements, and "static": the article's baseline, an admission policy of the scheduler
ALLOCATIONS = PLACEMENTS + ("static",)


@dataclass(frozen=True)
class SchedulerConfig:
    num_blocks: int                     # KV blocks in the pool
    block_size: int                     # tokens per block
    max_model_len: int                  # prompt + output tokens of one request
    max_num_seqs: int = 32              # sequences in one step
    max_num_batched_tokens: int = 512   # tokens in one step
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = False
    allocation: str = "contiguous"      # one of ALLOCATIONS
    max_loras: int = 0                  # LoRA adapters resident at once; 0: LoRA off

    def __post_init__(self):
        if self.allocation not in ALLOCATIONS:
            raise ValueError(f"allocation must be one of {ALLOCATIONS}, got {self.allocation!r}")
        if not isinstance(self.max_loras, int) or isinstance(self.max_loras, bool) or self.max_loras < 0:
            raise ValueError(f"max_loras must be an integer >= 0 (0: LoRA off), got {self.max_loras!r}")
        for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
