"""What every placement variant of scripts/placement_catalogue.py stands on (issue #2).

`Session5Policy` is the block manager's policy from session 5 to session 10, which the variants were
measured against and which scripts/placement_lookahead.py rolls forward; the helpers read the
manager's free ranges by scanning (experiments, not O(log n)); `_GrowVariant` lets a variant choose
the block a growing request takes.
"""
from __future__ import annotations

import os
import sys
from bisect import bisect_left

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from ms_atb.core.block_manager import BlockManager, NoFreeBlocksError  # noqa: E402


def _fits(bm, n):
    """(size, start) of every free range of at least n blocks."""
    return [(end - start, start) for start, end in bm._starts.items() if end - start >= n]


def _smallest_at_least(bm, n):
    """Start of the first range (in insertion order) of the smallest size >= n, or None."""
    keys = bm._by_size.keys
    i = bisect_left(keys, n)
    return next(iter(bm._by_size.buckets[keys[i]])) if i < len(keys) else None


def _near_fits(bm, n, slack, limit):
    """Up to limit (size, start), smallest sizes first, of sizes in [best fit, best fit + slack]."""
    keys, out = bm._by_size.keys, []
    i = bisect_left(keys, n)
    while i < len(keys) and keys[i] <= keys[bisect_left(keys, n)] + slack and len(out) < limit:
        out.extend((keys[i], start) for start in list(bm._by_size.buckets[keys[i]])[:limit - len(out)])
        i += 1
    return out


def _max_growth(bm, req, placed: int = 0) -> int:
    """Blocks req may still append at most (all of its max_tokens), once `placed` more blocks are its."""
    if req is None or req.max_len is None:
        return 0
    return max(0, -(-req.max_len // bm._block_size) - len(req.block_ids) - placed)


def _growth_blocks(bm, req) -> int:
    """Blocks the request (None: no request) is expected to append still."""
    return 0 if req is None else bm._growth_blocks(req)


class Session5Policy(BlockManager):
    """The policy kept from session 5 to session 10: the lowest range at most 2 blocks over the best
    fit; after a live tail, the neighbour keeps 1/4 of its expected growth, as much as the range leaves;
    a jump goes to the lowest range nobody grows into; with no fitting range, the largest range first."""

    def _best_fit(self, num_new):
        return self._by_size.lowest_near_fit(num_new, 2)

    def _first_block_in(self, start, num_new):
        if start - 1 not in self._tails:
            return start
        room = self._growth_blocks(self._owner[start - 1]) // self._left_room_divisor
        return start + min(room, self._starts[start] - start - num_new)

    def _jump_target(self, req):
        start = self._orphans.lowest()
        start = self._lowest_start() if start is None else start
        return start, start

    def _scatter(self, num_new):
        """No range fits: the largest range first, then the lowest ones (the scatter until session 14)."""
        new_ids = []
        while len(new_ids) < num_new:
            if new_ids:
                s = self._lowest_start()
                size = self._starts[s] - s
            else:
                size, s = self._by_size.largest()
            n = min(size, num_new - len(new_ids))
            new_ids.extend(range(s, s + n))
            self._carve(s, s, s + n)
        return new_ids


def _take_one(bm, req, start, block):
    """Give req the clean block `block`, cut from the range that begins at `start`."""
    last = req.block_ids[-1]
    bm._owner[block] = req
    bm._pos[block] = len(req.block_ids)
    bm._carve(start, block, block + 1)
    bm._untail(last)
    bm._set_tail(block)
    bm._ref_counts[block] = 1
    req.block_ids.append(block)
    c = bm._counters
    c["follow_blocks"] += 1
    c["contiguous_follow_blocks"] += block == last + 1


class _GrowVariant(Session5Policy):
    def _grow(self, request_id, req):
        if self.num_free_blocks == 0:
            raise NoFreeBlocksError(f"request {request_id!r} needs a block, none free")
        self._evict_for(1)
        start, block = self._jump(req)
        _take_one(self, req, start, block)
