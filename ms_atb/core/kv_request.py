"""KVRequest: the block manager's record of one live request's KV blocks.

The BlockManager creates one per allocate() and owns its fields, except `homes` and
`homes_cap`, which only FreeRanges touches (ms_atb/core/free_ranges.py). Placements read
block_ids, token_ids, max_len and num_prompt_blocks; they never write them.
"""
from __future__ import annotations


class KVRequest:
    __slots__ = ("block_ids", "token_ids", "num_hashed", "last_hash", "root_chain", "extra_key", "max_len",
                 "num_prompt_blocks", "homes", "homes_cap")

    def __init__(self, token_ids: list[int], max_tokens: int | None = None, root: tuple = (None, None),
                 extra_key: str | None = None):
        """root: the parent hash and chain of its first block (PrefixCache.root); extra_key: the request's."""
        self.block_ids: list[int] = []
        self.num_prompt_blocks = 0   # blocks of the table once allocate() placed the prompt
        self.max_len = None if max_tokens is None else len(token_ids) + max_tokens
        self.token_ids = token_ids
        self.num_hashed = 0          # leading full blocks already visited by commit / hits
        self.last_hash: bytes | None = root[0]   # the hash of block num_hashed - 1, or the root's
        self.root_chain = root[1]
        self.extra_key = extra_key
        # (table position, 0 | 1, block): free blocks next to a run of this request's own blocks, 0 right after
        # the run, 1 right below it (a lazy heap: FreeRanges.home checks each entry when it surfaces)
        self.homes: list[tuple[int, int, int]] = []
        self.homes_cap = 16          # entries past which the stale ones are dropped
