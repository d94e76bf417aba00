"""A KV tier beside the pool, as the block manager sees it: blocks kept outside the pool (on disk, in
another process's past), found by the pool's own chained hashes. The core decides which blocks move, by
ids and hashes; moving their bytes is the model runner's (ms_atb/worker/disk_tier.py keeps them on disk).

A tier keys its blocks as the pool does: `hash_key` keys the chained hashes (so every process sharing the
tier hashes a prefix alike) and `hash_root` is mixed into the root of every chain (the identity of the KV
bytes: the model, dtypes, block size, tensor-parallel rank; ms_atb/core/prefix_cache.py). A request's extra
key joins the root too, so a block of one extra key is never found for another.

Each step carries its transfers (ms_atb/core/scheduler.py, Step): `kv_loads`, blocks the tier staged when
the block manager found them, to be copied into the pool before the step's graph runs; `kv_stores`, blocks
whose KV the step computes, to be copied out after it runs and kept in the tier; and `kv_used`, the (hash,
blocks before it) of each block a request found in the pool, so that the tier's recency counts those uses.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class PrefixTier(Protocol):
    hash_key: bytes         # the key of the chained block hashes, shared by every process using the tier
    hash_root: bytes        # mixed into the root of every chain: what the KV bytes depend on

    def fetch(self, token_ids: list[int], extra_key: str | None, first: int, hashes: list[bytes]) -> int:
        """Stages blocks first, first + 1, ... of token_ids (hashes[i] is block first + i's) while it holds
        them, checked against their tokens; returns how many it staged (a leading run of hashes). Every
        call made on one rank is made on all (tensor parallelism): the count is what all ranks staged."""
        ...


@dataclass(frozen=True)
class KVLoad:
    """Copy the block the tier staged under `hash` into pool block `block` before the step runs."""
    block: int
    hash: bytes


@dataclass(frozen=True)
class KVStore:
    """After the step runs, pool block `block` holds the KV of token_ids[:num_tokens] (its last block_size
    tokens are the block's own) under extra_key, and hashes to `hash`: keep a copy in the tier.
    token_ids is the request's list, read only up to num_tokens (it may grow meanwhile)."""
    block: int
    hash: bytes
    token_ids: list
    num_tokens: int
    extra_key: str | None = None
