"""KVRequest: the block manager's record of one live request's KV blocks.

The BlockManager creates one per allocate() and owns its fields, except `homes` and
`homes_cap`, which only FreeRanges touches (ms_atb/core/free_ranges.py). Placements read
block_ids, token_ids, max_len and num_prompt_blocks; they never write them.
"""
from __future__ import annotations


class KVRequest:
    __slots__ = ("block_ids", "token_ids", "num_hashed", "last_hash", "root", "max_len", "num_prompt_blocks", "homes",
                 "homes_cap")

    def __init__(self, token_ids: list[int], max_tokens: int | None = None, root: tuple = (None, None)):
        self.block_ids: list[int] = []
        self.num_prompt_blocks = 0   # blocks of the table once allocate() placed the prompt
        self.max_len = None if max_tokens is None else len(token_ids) + max_tokens
        self.token_ids = token_ids
        self.num_hashed = 0          # leading full blocks already visited by commit / hits
        # the hash of the last hashed block; before any, the root's: PrefixCache.root of the request's extra key
        self.last_hash: bytes | None = root[0]
        self.root = root[1]          # the chain a first block is registered after
        # (table position, 0 | 1, block): free blocks next to a run of this request's own blocks, 0 right after
        # the run, 1 right below it (a lazy heap: FreeRanges.home checks each entry when it surfaces)
        self.homes: list[tuple[int, int, int]] = []
        self.homes_cap = 16          # entries past which the stale ones are dropped
