"""What every research placement of placement_catalogue.py stands on.

`NearFitBaseline` is the contiguous placement the variants were measured against and that
placement_lookahead.py rolls forward: the lowest range at most 2 blocks over the best fit; after a live
tail, the neighbour keeps 1/4 of its expected growth, as much as the range leaves; a request whose next
block is held jumps to the lowest range nobody grows into; with no fitting range, the largest range
first. Every research placement subclasses ms_atb.core.placement.ContiguousPlacement and overrides its
public decisions (place_prompt, best_fit, first_block_in, scatter, grow_target, jump_target), reading the
pool only through its FreeRanges' public methods. The helpers here scan the free ranges (experiments,
not O(log n)).
"""
from __future__ import annotations

import os
import sys
from bisect import bisect_left

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from ms_atb.core.placement import ContiguousPlacement  # noqa: E402


def fits(ranges, n):
    """(size, start) of every free range of at least n blocks."""
    return [(end - start, start) for start, end in ranges.ranges() if end - start >= n]


def smallest_at_least(ranges, n):
    """Start of the first range (in insertion order) of the smallest size >= n, or None."""
    keys = ranges.by_size.keys
    i = bisect_left(keys, n)
    return next(iter(ranges.by_size.buckets[keys[i]])) if i < len(keys) else None


def near_fits(ranges, n, slack, limit):
    """Up to limit (size, start), smallest sizes first, of sizes in [best fit, best fit + slack]."""
    keys, out = ranges.by_size.keys, []
    i = bisect_left(keys, n)
    while i < len(keys) and keys[i] <= keys[bisect_left(keys, n)] + slack and len(out) < limit:
        out.extend((keys[i], start) for start in list(ranges.by_size.buckets[keys[i]])[:limit - len(out)])
        i += 1
    return out


def lowest_near_fit(by_size, n, slack):
    """The lowest start among ranges of sizes in [best fit, best fit + slack]; None if none fits."""
    size = by_size.best_fit(n)
    return None if size is None else by_size.lowest_between(size, size + slack)


def largest(by_size):
    """(size, start) of the first-inserted range of the largest size; None if there is no range."""
    if not by_size.keys:
        return None
    key = by_size.keys[-1]
    return key, next(iter(by_size.buckets[key]))


def max_growth(placement, req, placed: int = 0) -> int:
    """Blocks req may still append at most (all of its max_tokens), once `placed` more blocks are its."""
    if req is None or req.max_len is None:
        return 0
    return max(0, -(-req.max_len // placement.block_size) - len(req.block_ids) - placed)


def growth_blocks(placement, req) -> int:
    """Blocks the request (None: no request) is expected to append still."""
    return 0 if req is None else placement.growth_blocks(req)


class NearFitBaseline(ContiguousPlacement):
    """The baseline placement (see the module docstring)."""
    left_room_divisor = 4   # a new prompt leaves the live request before it 1/left_room_divisor of its growth

    def best_fit(self, num_new):
        return lowest_near_fit(self.ranges.by_size, num_new, 2)

    def first_block_in(self, start, num_new):
        ranges = self.ranges
        if not ranges.is_tail(start - 1):
            return start
        room = self.growth_blocks(ranges.owner_of(start - 1)) // self.left_room_divisor
        return start + min(room, ranges.end_of(start) - start - num_new)

    def jump_target(self, req):
        start = self.ranges.orphans.lowest()
        start = self.ranges.lowest_start() if start is None else start
        return start, start

    def scatter(self, num_new):
        """No range fits: the largest range first, then the lowest ones."""
        ranges, new_ids = self.ranges, []
        while len(new_ids) < num_new:
            if new_ids:
                s = ranges.lowest_start()
                size = ranges.end_of(s) - s
            else:
                size, s = largest(ranges.by_size)
            n = min(size, num_new - len(new_ids))
            new_ids.extend(range(s, s + n))
            ranges.carve(s, s, s + n)
        return new_ids
