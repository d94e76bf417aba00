"""BlockManager: paged KV blocks for the scheduler: reference counts, tables, exact prefix caching.

Free blocks are of two kinds. Clean blocks (never cached, or evicted) belong to the manager's
placement (ms_atb/core/placement.py), which decides where each request's blocks go. Cached free
blocks (committed, refcount 0) sit in the PrefixCache's LRU queue; they are evicted into the
placement's clean blocks only when those cannot cover an allocation, so the cache is never traded
for contiguity. Sharing is exact: a hit is checked by its tokens and its chain, not trusted to a
hash (ms_atb/core/prefix_cache.py). Contract: docs/design.md (BlockManager).

Ownership: the manager alone writes reference counts, its requests' tables, token lists and hash
state, and the PrefixCache; the placement alone writes the clean blocks (and, for contiguous
allocation, its FreeRanges). The manager hands the placement a request's record (KVRequest) read-only.

With a KV tier (ms_atb/core/kv_tier.py), a prompt's leading blocks that miss the pool are asked of the
tier; the ones it staged take new pool blocks like any others, are committed at once and leave as KVLoads
(the runner copies them in before the step runs); every block committed by computing leaves as a KVStore, and
every pool hit as a (hash, depth) use, so that the tier's recency counts hits served from the pool too.
take_transfers() hands them to the scheduler's step.
"""
from __future__ import annotations

import numbers

from ms_atb.core.kv_request import KVRequest
from ms_atb.core.kv_tier import KVLoad, KVStore, PrefixTier
from ms_atb.core.placement import PLACEMENTS, PlacementFactory, make_placement
from ms_atb.core.prefix_cache import PrefixCache

__all__ = ["PLACEMENTS", "BlockManager", "NoFreeBlocksError"]


class NoFreeBlocksError(RuntimeError):
    """Not enough free blocks; the manager's state is unchanged."""


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int = 16,
                 enable_prefix_caching: bool = False, allocation: str = "contiguous",
                 placement: PlacementFactory | None = None, tier: PrefixTier | None = None):
        # placement: (num_blocks, block_size) -> a Placement, in place of the one `allocation` names;
        # tier: blocks kept outside the pool, found by the pool's hashes (prefix caching on only)
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
            if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        num_blocks, block_size = int(num_blocks), int(block_size)
        if allocation not in PLACEMENTS:
            raise ValueError(f"allocation must be one of {PLACEMENTS}, got {allocation!r}")
        self._num_blocks = num_blocks
        self._block_size = block_size
        self._caching = bool(enable_prefix_caching)
        self._ref_counts = [0] * num_blocks
        if tier is not None and not self._caching:
            raise ValueError("a KV tier needs enable_prefix_caching: its blocks are found by the prefix cache's hashes")
        self._tier = tier
        self._prefix = (PrefixCache(num_blocks) if tier is None else
                        PrefixCache(num_blocks, key=tier.hash_key, root=tier.hash_root))
        self._loads: list[KVLoad] = []          # blocks the tier staged, for the next step to copy in
        self._stores: list[KVStore] = []        # blocks computed by the next step, for the tier to keep
        self._used: list[tuple[bytes, int]] = []   # (hash, blocks before it) of pool hits, for the tier's recency
        self._requests: dict[str, KVRequest] = {}
        self._place = (make_placement(allocation, num_blocks, block_size) if placement is None
                       else placement(num_blocks, block_size))
        self._counters = dict(prefix_cache_queries=0, prefix_cache_hits=0, disk_cache_hit_tokens=0, evictions=0,
                              multi_block_allocations=0, contiguous_allocations=0,
                              follow_blocks=0, contiguous_follow_blocks=0)

    # ---- public API -------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def placement(self):
        """The placement object (read it; only the manager calls what changes it)."""
        return self._place

    @property
    def num_free_blocks(self) -> int:
        return self._place.num_clean + len(self._prefix)

    @property
    def num_cached_free_blocks(self) -> int:
        return len(self._prefix)

    def allocate(self, request_id: str, token_ids: list[int], max_tokens: int | None = None,
                 cache_lookup: bool = True, extra_key: str | None = None) -> int:
        # cache_lookup=False: no hits (the caller computes every prompt token, e.g. for prompt logprobs);
        # extra_key: what else the request's KV depends on (an adapter's name): blocks are shared only within it
        if request_id in self._requests:
            raise ValueError(f"request {request_id!r} already holds blocks; free it first")
        if len(token_ids) == 0:
            raise ValueError(f"request {request_id!r}: token_ids must not be empty")
        if max_tokens is not None and max_tokens < 0:
            raise ValueError(f"request {request_id!r}: max_tokens must be >= 0, got {max_tokens}")
        bs = self._block_size
        num_tokens = len(token_ids)
        lookup = self._caching and cache_lookup
        hits, hashes = self._prefix.lookup(token_ids, bs, extra_key) if lookup else ([], [])
        num_new = -(-num_tokens // bs) - len(hits)
        assert num_new >= 1  # the block holding the last prompt token is always private
        revived = sum(1 for b in hits if self._ref_counts[b] == 0)
        if num_new > self.num_free_blocks - revived:
            raise NoFreeBlocksError(
                f"request {request_id!r} needs {num_new} new blocks, "
                f"{self.num_free_blocks - revived} free")
        req = KVRequest(list(token_ids), max_tokens, self._prefix.root(extra_key), extra_key)
        for b in hits:
            if self._ref_counts[b] == 0:
                self._prefix.revive(b)
            self._ref_counts[b] += 1
        req.block_ids.extend(hits)
        if hits:
            req.num_hashed, req.last_hash = len(hits), hashes[len(hits) - 1]
            if self._tier is not None:
                self._used.extend(zip(hashes, range(len(hashes))))
        num_staged = self._fetch(req) if lookup and self._tier is not None else 0
        self._evict_for(num_new)
        new_ids = self._take_new(req, num_new)
        self._commit_staged(req, num_staged)
        req.num_prompt_blocks = len(req.block_ids)
        self._requests[request_id] = req
        self._count_allocation(req, new_ids, len(hits) * bs if lookup else None, num_tokens)
        return (len(hits) + num_staged) * bs

    def _count_allocation(self, req: KVRequest, new_ids: list[int], hit_tokens: int | None,
                          num_tokens: int) -> None:
        """hit_tokens: the pool's hits, None when the allocation looked nothing up."""
        c = self._counters
        num_new = len(new_ids)
        if hit_tokens is not None:
            c["prefix_cache_queries"] += num_tokens
            c["prefix_cache_hits"] += hit_tokens
        if num_new >= 2:
            c["multi_block_allocations"] += 1
            if new_ids[-1] - new_ids[0] == num_new - 1 and _ascending_run(new_ids):
                c["contiguous_allocations"] += 1
        table = req.block_ids
        c["follow_blocks"] += len(table) - 1
        c["contiguous_follow_blocks"] += sum(1 for i in range(1, len(table))
                                             if table[i] == table[i - 1] + 1)

    def _fetch(self, req: KVRequest) -> int:
        """Asks the tier for the leading blocks after req's pool hits (at least one token left to compute);
        returns how many it staged. Their hashes continue req's chain."""
        bs, tokens = self._block_size, req.token_ids
        first, last = req.num_hashed, (len(tokens) - 1) // bs
        if first >= last:
            return 0
        hashes, parent = [], req.last_hash
        for i in range(first, last):
            parent = self._prefix.hash(parent, tokens[i * bs:(i + 1) * bs])
            hashes.append(parent)
        num_staged = self._tier.fetch(tokens, req.extra_key, first, hashes)
        assert 0 <= num_staged <= len(hashes)
        self._counters["disk_cache_hit_tokens"] += num_staged * bs
        return num_staged

    def _commit_staged(self, req: KVRequest, num_staged: int) -> None:
        """The first num_staged new blocks hold the tier's staged blocks: committed now (the step copies them
        in before its graph runs), not computed, so not stored again."""
        first = req.num_hashed
        self._register(req, first + num_staged, store=False)
        self._loads.extend(KVLoad(req.block_ids[i], self._prefix.block_hash[req.block_ids[i]])
                           for i in range(first, first + num_staged))

    def take_transfers(self) -> tuple[list[KVLoad], list[KVStore], list[tuple[bytes, int]]]:
        """The tier transfers recorded since the last call: blocks to load before the step, blocks to store
        after it, and the (hash, depth) of pool hits (ms_atb/core/kv_tier.py)."""
        out = self._loads, self._stores, self._used
        self._loads, self._stores, self._used = [], [], []
        return out

    def append_token(self, request_id: str, token_id: int) -> None:
        try:
            req = self._requests[request_id]
        except KeyError:
            raise ValueError(f"unknown request {request_id!r}") from None
        tokens = req.token_ids
        if len(tokens) % self._block_size:
            tokens.append(token_id)
            return
        self._grow(request_id, req)
        tokens.append(token_id)

    def commit(self, request_id: str, num_tokens: int) -> None:
        req = self._get(request_id)
        if not 0 <= num_tokens <= len(req.token_ids):
            raise ValueError(f"request {request_id!r}: num_tokens must be in "
                             f"[0, {len(req.token_ids)}], got {num_tokens}")
        if self._caching:
            self._register(req, num_tokens // self._block_size, store=self._tier is not None)

    def _register(self, req: KVRequest, num_blocks: int, store: bool) -> None:
        """Registers req's full blocks up to num_blocks in the prefix cache; store: also keep each in the tier."""
        bs = self._block_size
        for i in range(req.num_hashed, num_blocks):
            chunk = req.token_ids[i * bs:(i + 1) * bs]
            h = self._prefix.hash(req.last_hash, chunk)
            # a copy of a cached content is registered too: it outlives evictions of the other copies
            block = req.block_ids[i]
            self._prefix.register(block, h, chunk, req.block_ids[i - 1] if i else None, req.root_chain)
            if store:
                self._stores.append(KVStore(block, h, req.token_ids, (i + 1) * bs, req.extra_key))
            req.last_hash = h
            req.num_hashed = i + 1

    def free(self, request_id: str) -> None:
        req = self._get(request_id)
        del self._requests[request_id]
        table = req.block_ids
        self._place.drop(req)
        clean = []
        for b in reversed(table):  # tail first: within a request, tail blocks are evicted first
            self._ref_counts[b] -= 1
            if self._ref_counts[b] == 0 and not self._prefix.release(b):   # a cached block stays until evicted
                clean.append(b)
        self._place.release(clean)

    def block_table(self, request_id: str) -> list[int]:
        return list(self._get(request_id).block_ids)

    def stats(self) -> dict:
        c = self._counters
        multi, follow = c["multi_block_allocations"], c["follow_blocks"]
        return {
            "usage": (self._num_blocks - self.num_free_blocks) / self._num_blocks,
            "prefix_cache_queries": c["prefix_cache_queries"],
            "prefix_cache_hits": c["prefix_cache_hits"],
            "disk_cache_hit_tokens": c["disk_cache_hit_tokens"],
            "evictions": c["evictions"],
            "allocation_contiguity": c["contiguous_allocations"] / multi if multi else 1.0,
            "contiguity": c["contiguous_follow_blocks"] / follow if follow else 1.0,
            "num_requests": len(self._requests),
            "num_free_blocks": self.num_free_blocks,
            "num_cached_free_blocks": len(self._prefix),
        }

    def _get(self, request_id: str) -> KVRequest:
        try:
            return self._requests[request_id]
        except KeyError:
            raise ValueError(f"unknown request {request_id!r}") from None

    def _evict_for(self, num_new: int) -> None:
        for _ in range(num_new - self._place.num_clean):
            self._counters["evictions"] += 1
            self._place.release([self._prefix.evict_oldest()])

    def _take_new(self, req: KVRequest, num_new: int) -> list[int]:
        new_ids = self._place.new_blocks(req, num_new)
        for b in new_ids:
            assert self._ref_counts[b] == 0
            self._ref_counts[b] = 1
        req.block_ids.extend(new_ids)
        return new_ids

    def _grow(self, request_id: str, req: KVRequest) -> None:
        if self.num_free_blocks == 0:
            raise NoFreeBlocksError(f"request {request_id!r} needs a block, none free")
        self._evict_for(1)
        table = req.block_ids
        last = table[-1]
        block = self._place.next_block(req)
        assert self._ref_counts[block] == 0
        self._ref_counts[block] = 1
        table.append(block)
        c = self._counters
        c["follow_blocks"] += 1
        c["contiguous_follow_blocks"] += block == last + 1


def _ascending_run(ids: list[int]) -> bool:
    return all(ids[i] == ids[i - 1] + 1 for i in range(1, len(ids)))
