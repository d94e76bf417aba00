"""FreeRanges: the clean blocks of a contiguous pool as maximal ranges of consecutive ids, and their indexes.

SizeIndex holds every free range by size; OrphanIndex holds the ranges no live request grows
into ("orphans": the block before them is not a live request's last block), by size and by a
min-tree over sizes, so that "the lowest orphan of at most k blocks" costs O(log n) too.
FreeRanges keeps the ranges, those indexes, a lazy heap of range starts, the live requests'
last blocks ("tails"), which request each held block was placed for, and each request's
"homes" (free blocks next to runs of its own blocks). Every call costs O(log n) in the number
of blocks (amortised); nothing scans the pool.
"""
from __future__ import annotations

from bisect import bisect_left, insort
from heapq import heapify, heappop, heappush

from ms_atb.core.kv_request import KVRequest


class SizeIndex:
    """Range starts bucketed by a size key; keys kept sorted (few distinct sizes).

    Each bucket keeps its starts in a dict (membership, insertion order) and in a lazy
    min-heap (the lowest start; entries of removed starts are dropped when they surface).
    """

    def __init__(self):
        self.buckets: dict[int, dict[int, None]] = {}
        self.heaps: dict[int, list[int]] = {}
        self.keys: list[int] = []

    def add(self, key: int, start: int) -> None:
        bucket = self.buckets.get(key)
        if bucket is None:
            self.buckets[key] = {start: None}
            self.heaps[key] = [start]
            insort(self.keys, key)
            return
        bucket[start] = None
        heap = self.heaps[key]
        heappush(heap, start)
        if len(heap) > 2 * len(bucket) + 16:  # drop stale entries; amortised O(1)
            self.heaps[key] = sorted(bucket)

    def remove(self, key: int, start: int) -> None:
        bucket = self.buckets[key]
        del bucket[start]
        if not bucket:
            del self.buckets[key]
            del self.heaps[key]
            del self.keys[bisect_left(self.keys, key)]

    def best_fit(self, key: int) -> int | None:
        """The smallest size >= key; None if no range is that large."""
        i = bisect_left(self.keys, key)
        return self.keys[i] if i < len(self.keys) else None

    def lowest_between(self, lo: int, hi: int) -> int | None:
        """The lowest start among ranges of sizes in [lo, hi]; None if there is none."""
        keys, lowest = self.keys, None
        i = bisect_left(keys, lo)
        while i < len(keys) and keys[i] <= hi:
            start = self.lowest_start(keys[i])
            if lowest is None or start < lowest:
                lowest = start
            i += 1
        return lowest

    def lowest_start(self, key: int) -> int:
        heap, bucket = self.heaps[key], self.buckets[key]
        while heap[0] not in bucket:
            heappop(heap)
        return heap[0]


class OrphanIndex:
    """The free ranges nobody grows into: start -> size, a SizeIndex, and a min-tree over sizes
    (leaf k: the lowest orphan start of size k)."""

    def __init__(self, max_size: int):
        self.size_of: dict[int, int] = {}
        self.by_size = SizeIndex()
        self._width = 1 << max(0, max_size).bit_length()      # leaves for sizes 0 .. width - 1
        self._tree = [_NONE] * (2 * self._width)              # [2 * width] min over children

    def add(self, start: int, size: int) -> None:
        self.size_of[start] = size
        self.by_size.add(size, start)
        if start < self._tree[self._width + size]:
            self._set_leaf(size, start)

    def discard(self, start: int) -> None:
        size = self.size_of.pop(start, None)
        if size is None:
            return
        self.by_size.remove(size, start)
        if self._tree[self._width + size] == start:
            bucket = self.by_size.buckets.get(size)
            self._set_leaf(size, _NONE if bucket is None else self.by_size.lowest_start(size))

    def lowest(self) -> int | None:
        """The lowest orphan start; None if there is none."""
        return self.lowest_at_most(self._width)

    def lowest_at_most(self, cap: int) -> int | None:
        """The lowest start among orphans of at most cap blocks; None if there is none."""
        tree, lo, hi = self._tree, self._width + 1, self._width + min(cap, self._width - 1) + 1
        best = _NONE
        while lo < hi:                                         # min over leaves [1, cap]
            if lo & 1:
                best = min(best, tree[lo])
                lo += 1
            if hi & 1:
                hi -= 1
                best = min(best, tree[hi])
            lo >>= 1
            hi >>= 1
        return None if best == _NONE else best

    def _set_leaf(self, size: int, start: int) -> None:
        tree = self._tree
        i = self._width + size
        tree[i] = start
        i >>= 1
        while i:
            low = min(tree[2 * i], tree[2 * i + 1])
            if tree[i] == low:          # unchanged here: unchanged above
                return
            tree[i] = low
            i >>= 1


_NONE = 1 << 62   # an empty leaf of the min-tree: above every block id


class FreeRanges:
    """The clean ranges [start, end) of a pool of num_blocks blocks, and who holds the others.

    Invariants (who may touch what):
    1. Only FreeRanges writes its fields and a KVRequest's homes / homes_cap; a placement reads them
       through the methods below and changes them only through carve, release, claim, grow_into,
       drop, remove_range and insert_range.
    2. Ranges are maximal: no range starts where another ends (release merges neighbours). by_size,
       orphans and the heap of starts list exactly the current ranges (the heaps may hold stale
       entries, dropped when they surface). Callers never mutate by_size or orphans.
    3. A range is in orphans exactly when the block before it is not in the tails.
    4. The tails are the last blocks of the live requests' tables: claim sets one, grow_into moves
       one, drop removes one.
    5. owner_of(b) is the request b was placed for, while that request lives (None otherwise: free
       blocks, and blocks shared by prefix hits after their first owner ends); position_of(b) is b's
       index in that owner's table. Both are set by claim and grow_into, cleared by drop.
    6. A request's homes is a lazy heap: insert_range, claim and grow_into push an entry when a free
       range appears beside a run of its own blocks; home() checks entries as they surface.
    7. remove_range / insert_range set a range aside and put it back within one placement decision
       (a scatter that spares a range); blocks leave the clean pool only by carve and come back only
       by release, so num_clean counts them.
    """

    def __init__(self, num_blocks: int):
        self._num_blocks = num_blocks
        self._num_clean = num_blocks
        self._starts: dict[int, int] = {}
        self._ends: dict[int, int] = {}
        self.by_size = SizeIndex()                      # every range, by size
        self.orphans = OrphanIndex(num_blocks)          # the ranges after no live request's last block
        self._start_heap: list[int] = []                # range starts, may hold stale ones
        self._tails: set[int] = set()                   # last block of every live request
        self._owner: list[KVRequest | None] = [None] * num_blocks
        self._pos: list[int] = [0] * num_blocks         # a block's place in its owner's table
        self.insert_range(0, num_blocks)

    # ---- reads ------------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    @property
    def num_clean(self) -> int:
        return self._num_clean

    def end_of(self, start: int) -> int | None:
        """The end of the range that begins at start; None if no range begins there."""
        return self._starts.get(start)

    def start_ending_at(self, end: int) -> int | None:
        """The start of the range that ends at end (exclusive); None if no range ends there."""
        return self._ends.get(end)

    def ranges(self):
        """(start, end) of every range, in no particular order; not to be iterated across a change."""
        return self._starts.items()

    def is_tail(self, block: int) -> bool:
        return block in self._tails

    def tails(self) -> frozenset[int]:
        return frozenset(self._tails)

    def owner_of(self, block: int) -> KVRequest | None:
        return self._owner[block]

    def position_of(self, block: int) -> int:
        return self._pos[block]

    def lowest_start(self) -> int:
        """The lowest range start; the pool must have a clean block."""
        heap, starts = self._start_heap, self._starts
        while heap[0] not in starts:
            heappop(heap)
        return heap[0]

    def home(self, req: KVRequest) -> tuple[int, int] | None:
        """(range start, block): the first free block, in table order, next to a run of consecutive ids in
        req's table (its own blocks: placed for it, not prefix hits): right after the run (the start of a
        free range, which becomes req's room), else right below it (the last block of an orphan ending
        there); None if there is none. O(log n) amortised."""
        homes = req.homes
        while homes:
            found = self._home_at(req, *homes[0])
            if found is not None:
                return found
            heappop(homes)
        return None

    # ---- changes --------------------------------------------------------------------------
    def carve(self, start: int, lo: int, hi: int) -> None:
        """Take the clean blocks [lo, hi) out of the range that begins at start."""
        end = self.remove_range(start)
        assert start <= lo < hi <= end
        if start < lo:
            self.insert_range(start, lo)
        if hi < end:
            self.insert_range(hi, end)
        self._num_clean -= hi - lo

    def release(self, blocks: list[int]) -> None:
        """Return refcount-0 uncached blocks to the clean ranges, merging them with their neighbours."""
        self._num_clean += len(blocks)
        i, n = 0, len(blocks)
        while i < n:  # free passes a table tail first: one merge per descending run of ids, not per block
            j = i + 1
            while j < n and blocks[j] == blocks[j - 1] - 1:
                j += 1
            start, end = blocks[j - 1], blocks[i] + 1
            i = j
            if start in self._ends:
                start = self._ends[start]
                self.remove_range(start)
            if end in self._starts:
                end = self.remove_range(end)
            self.insert_range(start, end)

    def claim(self, req: KVRequest, blocks: list[int]) -> None:
        """blocks, just carved, extend req's table (not yet appended to it); the last becomes its tail."""
        owner, pos, starts, ends = self._owner, self._pos, self._starts, self._ends
        for i, b in enumerate(blocks, len(req.block_ids)):
            owner[b] = req
            pos[b] = i
            if b in ends or b + 1 in starts:
                self._homes_beside(b)
        self._tails.add(blocks[-1])
        self.orphans.discard(blocks[-1] + 1)

    def grow_into(self, req: KVRequest, start: int, block: int) -> None:
        """req (non-empty table) takes the clean block `block` of the range that begins at start: it becomes
        req's tail, the rest of the range after it req's room."""
        last = req.block_ids[-1]
        self._tails.discard(last)
        if block != last + 1:
            end = self._starts.get(last + 1)
            if end is not None:                     # the range after the old tail is nobody's room now
                self.orphans.add(last + 1, end - last - 1)
        self._tails.add(block)          # before the carve: the rest of the range is block's room
        self._owner[block] = req        # and the range left below block is a home of req
        self._pos[block] = len(req.block_ids)
        self.carve(start, block, block + 1)

    def drop(self, req: KVRequest) -> None:
        """req ends (before its blocks are released): its tail goes, and it owns nothing."""
        table = req.block_ids
        last = table[-1]
        self._tails.discard(last)
        end = self._starts.get(last + 1)
        if end is not None:
            self.orphans.add(last + 1, end - last - 1)
        owner = self._owner
        for b in table:
            if owner[b] is req:         # a block shared by prefix hits outlives its owner
                owner[b] = None

    def remove_range(self, start: int) -> int:
        """Take the range that begins at start out of every index; returns its end (see invariant 7)."""
        end = self._starts.pop(start)
        del self._ends[end]
        self.by_size.remove(end - start, start)
        self.orphans.discard(start)
        return end

    def insert_range(self, start: int, end: int) -> None:
        """Add [start, end) as a range; its neighbours must be held (see invariant 7)."""
        self._starts[start] = end
        self._ends[end] = start
        self.by_size.add(end - start, start)
        heap = self._start_heap
        heappush(heap, start)
        if len(heap) > 2 * len(self._starts) + 64:  # drop stale starts; amortised O(1)
            self._start_heap = sorted(self._starts)
        if start - 1 not in self._tails:
            self.orphans.add(start, end - start)
            owner = self._owner
            if start and owner[start - 1] is not None:   # the range continues a run of that owner's table
                self._add_home(start - 1, 0, start)
            if end < self._num_blocks and owner[end] is not None:   # an orphan right below a run of that owner's
                self._add_home(end, 1, end - 1)
        # (a range after a live request's tail is that request's room: no home for either neighbour)

    # ---- homes ------------------------------------------------------------------------------
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

    def _home_at(self, req: KVRequest, pos: int, kind: int, block: int) -> tuple[int, int] | None:
        """(range start, block) if the home entry still holds, else None."""
        neighbour = block - 1 if kind == 0 else block + 1
        if self._owner[neighbour] is not req or self._pos[neighbour] != pos:
            return None
        if kind == 0:
            return (block, block) if block in self._starts else None
        start = self._ends.get(neighbour)
        return (start, block) if start is not None and start - 1 not in self._tails else None
