"""Paged KV blocks: reference counts, exact prefix caching, contiguous-first placement.

Free blocks are of two kinds. Clean blocks (never cached, or evicted) live in maximal
ranges of consecutive ids, indexed by start, end, size (sorted distinct sizes) and by
address (a lazy min-heap of starts). Cached free blocks (committed, refcount 0) sit in the
PrefixCache's LRU queue; they are evicted into the clean ranges only when the clean blocks
cannot cover an allocation, so the cache is never traded for contiguity.

Placement (contiguous allocation) is the PlacementPolicy mixin of ms_atb/core/placement.py.
Each live request keeps a lazy heap of "homes", free blocks next to runs of its own blocks, pushed
as free ranges appear beside them (_add_home) and checked when it is popped.
Every call costs O(log n) in the number of blocks (amortised); nothing scans the pool.
"""
from __future__ import annotations

import numbers
from collections import deque
from heapq import heapify, heappop, heappush

from ms_atb.core.free_ranges import OrphanIndex, SizeIndex
from ms_atb.core.placement import PlacementPolicy
from ms_atb.core.prefix_cache import PrefixCache, hash_block

_ALLOCATIONS = ("contiguous", "scattered")


class NoFreeBlocksError(RuntimeError):
    """Not enough free blocks; the manager's state is unchanged."""


class _Request:
    __slots__ = ("block_ids", "token_ids", "num_hashed", "last_hash", "max_len", "num_prompt_blocks", "homes",
                 "homes_cap")

    def __init__(self, token_ids: list[int], max_tokens: int | None = None):
        self.block_ids: list[int] = []
        self.num_prompt_blocks = 0   # blocks of the table once allocate() placed the prompt
        self.max_len = None if max_tokens is None else len(token_ids) + max_tokens
        self.token_ids = token_ids
        self.num_hashed = 0          # leading full blocks already visited by commit / hits
        self.last_hash: bytes | None = None
        # (table position, 0 | 1, block): free blocks next to a run of this request's own blocks, 0 right after
        # the run, 1 right below it (contiguous allocation; a lazy heap: PlacementPolicy._home checks each entry)
        self.homes: list[tuple[int, int, int]] = []
        self.homes_cap = 16          # entries past which the stale ones are dropped


class BlockManager(PlacementPolicy):
    def __init__(self, num_blocks: int, block_size: int = 16,
                 enable_prefix_caching: bool = False, allocation: str = "contiguous"):
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
            if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        num_blocks, block_size = int(num_blocks), int(block_size)
        if allocation not in _ALLOCATIONS:
            raise ValueError(f"allocation must be one of {_ALLOCATIONS}, got {allocation!r}")
        self._num_blocks = num_blocks
        self._block_size = block_size
        self._caching = bool(enable_prefix_caching)
        self._contiguous = allocation == "contiguous"
        self._ref_counts = [0] * num_blocks
        self._prefix = PrefixCache(num_blocks)
        self._requests: dict[str, _Request] = {}
        self._num_clean = num_blocks
        # contiguous: clean ranges [start, end) and their indexes; scattered: a free list
        self._starts: dict[int, int] = {}
        self._ends: dict[int, int] = {}
        self._by_size = SizeIndex()
        self._start_heap: list[int] = []                   # range starts, may hold stale ones
        self._orphans = OrphanIndex(num_blocks if self._contiguous else 0)
        self._tails: set[int] = set()                      # last block of every live request
        self._owner: list[_Request | None] = [None] * num_blocks if self._contiguous else []
        self._pos: list[int] = [0] * num_blocks if self._contiguous else []   # a block's place in its owner's table
        self._free_list: deque[int] = deque()
        if self._contiguous:
            self._insert_range(0, num_blocks)
        else:
            self._free_list.extend(range(num_blocks))
        self._counters = dict(prefix_cache_queries=0, prefix_cache_hits=0, evictions=0,
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
    def num_free_blocks(self) -> int:
        return self._num_clean + len(self._prefix)

    @property
    def num_cached_free_blocks(self) -> int:
        return len(self._prefix)

    def allocate(self, request_id: str, token_ids: list[int], max_tokens: int | None = None,
                 cache_lookup: bool = True) -> int:
        # cache_lookup=False: no hits (the caller computes every prompt token, e.g. for prompt logprobs)
        if request_id in self._requests:
            raise ValueError(f"request {request_id!r} already holds blocks; free it first")
        if len(token_ids) == 0:
            raise ValueError(f"request {request_id!r}: token_ids must not be empty")
        if max_tokens is not None and max_tokens < 0:
            raise ValueError(f"request {request_id!r}: max_tokens must be >= 0, got {max_tokens}")
        bs = self._block_size
        num_tokens = len(token_ids)
        hits, hashes = (self._prefix.lookup(token_ids, bs) if self._caching and cache_lookup
                        else ([], []))
        num_new = -(-num_tokens // bs) - len(hits)
        assert num_new >= 1  # the block holding the last prompt token is always private
        revived = sum(1 for b in hits if self._ref_counts[b] == 0)
        if num_new > self.num_free_blocks - revived:
            raise NoFreeBlocksError(
                f"request {request_id!r} needs {num_new} new blocks, "
                f"{self.num_free_blocks - revived} free")
        req = _Request(list(token_ids), max_tokens)
        for b in hits:
            if self._ref_counts[b] == 0:
                self._prefix.revive(b)
            self._ref_counts[b] += 1
        req.block_ids.extend(hits)
        if hits:
            req.num_hashed, req.last_hash = len(hits), hashes[len(hits) - 1]
        self._evict_for(num_new)
        new_ids = self._take_new(req, num_new)
        req.num_prompt_blocks = len(req.block_ids)
        if self._contiguous:
            self._set_tail(req.block_ids[-1])
        self._requests[request_id] = req
        c = self._counters
        if self._caching and cache_lookup:
            c["prefix_cache_queries"] += num_tokens
            c["prefix_cache_hits"] += len(hits) * bs
        if num_new >= 2:
            c["multi_block_allocations"] += 1
            if new_ids[-1] - new_ids[0] == num_new - 1 and _ascending_run(new_ids):
                c["contiguous_allocations"] += 1
        table = req.block_ids
        c["follow_blocks"] += len(table) - 1
        c["contiguous_follow_blocks"] += sum(1 for i in range(1, len(table))
                                             if table[i] == table[i - 1] + 1)
        return len(hits) * bs

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
        if not self._caching:
            return
        bs = self._block_size
        for i in range(req.num_hashed, num_tokens // bs):
            chunk = req.token_ids[i * bs:(i + 1) * bs]
            h = hash_block(req.last_hash, chunk)
            # a copy of a cached content is registered too: it outlives evictions of the other copies
            self._prefix.register(req.block_ids[i], h, chunk)
            req.last_hash = h
            req.num_hashed = i + 1

    def free(self, request_id: str) -> None:
        req = self._get(request_id)
        del self._requests[request_id]
        table = req.block_ids
        self._untail(table[-1])
        clean = []
        for b in reversed(table):  # tail first: within a request, tail blocks are evicted first
            self._ref_counts[b] -= 1
            if self._contiguous and self._owner[b] is req:   # a block shared by prefix hits outlives its owner
                self._owner[b] = None
            if self._ref_counts[b] == 0 and not self._prefix.release(b):   # a cached block stays until evicted
                clean.append(b)
        self._release_clean(clean)

    def block_table(self, request_id: str) -> list[int]:
        return list(self._get(request_id).block_ids)

    def stats(self) -> dict:
        c = self._counters
        multi, follow = c["multi_block_allocations"], c["follow_blocks"]
        return {
            "usage": (self._num_blocks - self.num_free_blocks) / self._num_blocks,
            "prefix_cache_queries": c["prefix_cache_queries"],
            "prefix_cache_hits": c["prefix_cache_hits"],
            "evictions": c["evictions"],
            "allocation_contiguity": c["contiguous_allocations"] / multi if multi else 1.0,
            "contiguity": c["contiguous_follow_blocks"] / follow if follow else 1.0,
            "num_requests": len(self._requests),
            "num_free_blocks": self.num_free_blocks,
            "num_cached_free_blocks": len(self._prefix),
        }

    def _get(self, request_id: str) -> _Request:
        try:
            return self._requests[request_id]
        except KeyError:
            raise ValueError(f"unknown request {request_id!r}") from None

    def _evict_for(self, num_new: int) -> None:
        for _ in range(num_new - self._num_clean):
            self._counters["evictions"] += 1
            self._release_clean([self._prefix.evict_oldest()])

    # ---- placement ----------------------------------------------------------------
    def _take_new(self, req: _Request, num_new: int) -> list[int]:
        if not self._contiguous:
            new_ids = [self._free_list.popleft() for _ in range(num_new)]
            self._num_clean -= num_new
        else:
            new_ids = self._take_new_contiguous(req, num_new)
            owner, pos, starts, ends = self._owner, self._pos, self._starts, self._ends
            for i, b in enumerate(new_ids, len(req.block_ids)):
                owner[b] = req
                pos[b] = i
                if b in ends or b + 1 in starts:
                    self._homes_beside(b)
        for b in new_ids:
            assert self._ref_counts[b] == 0
            self._ref_counts[b] = 1
        req.block_ids.extend(new_ids)
        return new_ids

    def _grow(self, request_id: str, req: _Request) -> None:
        if self.num_free_blocks == 0:
            raise NoFreeBlocksError(f"request {request_id!r} needs a block, none free")
        self._evict_for(1)
        table = req.block_ids
        last = table[-1]
        if not self._contiguous:
            block = self._free_list.popleft()
            self._num_clean -= 1
        else:
            block = start = last + 1
            if block not in self._starts:   # jump; the block after last is held: no room left there
                start, block = self._jump_target(req)
            self._tails.discard(last)
            self._tails.add(block)          # before the carve: the rest of the range is block's room
            self._owner[block] = req        # and the range left below block is a home of req
            self._pos[block] = len(table)
            self._carve(start, block, block + 1)
        assert self._ref_counts[block] == 0
        self._ref_counts[block] = 1
        table.append(block)
        c = self._counters
        c["follow_blocks"] += 1
        c["contiguous_follow_blocks"] += block == last + 1

    def _lowest_start(self) -> int:
        heap, starts = self._start_heap, self._starts
        while heap[0] not in starts:
            heappop(heap)
        return heap[0]

    def _set_tail(self, block: int) -> None:
        """block becomes a live request's last block: the range after it is that request's room."""
        self._tails.add(block)
        self._orphans.discard(block + 1)

    def _untail(self, block: int) -> None:
        """block stops being a live request's last block: the range after it is nobody's room."""
        if self._contiguous:
            self._tails.discard(block)
            end = self._starts.get(block + 1)
            if end is not None:
                self._orphans.add(block + 1, end - block - 1)

    # ---- free ranges ----------------------------------------------------------------
    def _insert_range(self, start: int, end: int) -> None:
        self._starts[start] = end
        self._ends[end] = start
        self._by_size.add(end - start, start)
        heap = self._start_heap
        heappush(heap, start)
        if len(heap) > 2 * len(self._starts) + 64:  # drop stale starts; amortised O(1)
            self._start_heap = sorted(self._starts)
        if start - 1 not in self._tails:
            self._orphans.add(start, end - start)
            owner = self._owner
            if start and owner[start - 1] is not None:   # the range continues a run of that owner's table
                self._add_home(start - 1, 0, start)
            if end < self._num_blocks and owner[end] is not None:   # an orphan right below a run of that owner's
                self._add_home(end, 1, end - 1)
        # (a range after a live request's tail is that request's room: no home for either neighbour)

    def _homes_beside(self, b: int) -> None:
        """b was just given to its owner, after the carve that left free ranges beside it: their homes."""
        start = self._ends.get(b)
        if start is not None and start - 1 not in self._tails:
            self._add_home(b, 1, b - 1)
        if b + 1 in self._starts and b not in self._tails:
            self._add_home(b, 0, b + 1)

    def _add_home(self, neighbour: int, kind: int, block: int) -> None:
        owner = self._owner[neighbour]
        homes = owner.homes
        heappush(homes, (self._pos[neighbour], kind, block))
        if len(homes) > owner.homes_cap:   # drop stale entries; amortised O(1) per push
            homes[:] = [h for h in homes if self._home_at(owner, *h) is not None]
            heapify(homes)
            owner.homes_cap = 2 * len(homes) + 16

    def _remove_range(self, start: int) -> int:
        end = self._starts.pop(start)
        del self._ends[end]
        self._by_size.remove(end - start, start)
        self._orphans.discard(start)
        return end

    def _carve(self, start: int, lo: int, hi: int) -> None:
        """Take the clean blocks [lo, hi) out of the range that begins at start."""
        end = self._remove_range(start)
        assert start <= lo < hi <= end
        if start < lo:
            self._insert_range(start, lo)
        if hi < end:
            self._insert_range(hi, end)
        self._num_clean -= hi - lo

    def _release_clean(self, blocks: list[int]) -> None:
        """Return refcount-0 uncached blocks to the clean pool."""
        self._num_clean += len(blocks)
        if not self._contiguous:
            self._free_list.extend(blocks)
            return
        i, n = 0, len(blocks)
        while i < n:  # free passes a table tail first: one merge per descending run of ids, not per block
            j = i + 1
            while j < n and blocks[j] == blocks[j - 1] - 1:
                j += 1
            start, end = blocks[j - 1], blocks[i] + 1
            i = j
            if start in self._ends:
                start = self._ends[start]
                self._remove_range(start)
            if end in self._starts:
                end = self._remove_range(end)
            self._insert_range(start, end)


def _ascending_run(ids: list[int]) -> bool:
    return all(ids[i] == ids[i - 1] + 1 for i in range(1, len(ids)))
