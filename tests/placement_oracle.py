"""The scanning form of the kept contiguous placement: the oracle its indexed decisions are tested against.

ContiguousPlacement (ms_atb/core/placement.py) answers each question from FreeRanges' indexes in
O(log n); ScanningPlacement answers the same questions by scanning the free ranges and the request's
table (O(ranges) per call), in the form the policy was measured in. It overrides every decision but
place_prompt, which both share; tests/test_placement_variants.py checks that both place every block alike.
"""
from __future__ import annotations

from ms_atb.core.placement import ContiguousPlacement

FIT_SLACK = 4          # near fits: sizes in [best fit, best fit + 4]
LEFT_ROOM_DIVISOR = 4  # the live request before a new prompt keeps 1/4 of its expected growth


class ScanningPlacement(ContiguousPlacement):
    def best_fit(self, num_new):
        """Among the near fits, ranges nobody grows into first, then the lowest address."""
        ranges = self.ranges
        found = [(end - start, start) for start, end in ranges.ranges() if end - start >= num_new]
        if not found:
            return None
        best = min(size for size, _ in found)
        near = [start for size, start in found if size <= best + FIT_SLACK]
        return min(near, key=lambda s: (ranges.is_tail(s - 1), s))

    def first_block_in(self, start, num_new):
        """After a live tail, the neighbour keeps 1/4 of its expected growth, at most half the range's slack."""
        ranges = self.ranges
        slack = ranges.end_of(start) - start - num_new
        if not ranges.is_tail(start - 1):
            return start
        room = self.growth_blocks(ranges.owner_of(start - 1)) // LEFT_ROOM_DIVISOR
        return min(start + min(room, slack), start + slack // 2)

    def scatter(self, num_new):
        """One piece of the second largest range, then the lowest ranges, the largest last."""
        ranges = self.ranges
        by_size = sorted(ranges.ranges(), key=lambda r: (r[0] - r[1], r[0]))   # largest, then lowest
        order = [start for start, _ in by_size[1:2]]
        order += sorted(start for start, _ in by_size[2:]) + [by_size[0][0]]
        new_ids = []
        for start in order:
            n = min(ranges.end_of(start) - start, num_new - len(new_ids))
            if n <= 0:
                break
            new_ids.extend(range(start, start + n))
            ranges.carve(start, start, start + n)
        return new_ids

    def grow_target(self, req):
        """last + 1; else home (scanning the table); else the jump-fill hole, its top block for a request
        short of its end; else the lowest orphan, else the lowest range."""
        ranges = self.ranges
        table = req.block_ids
        follow = table[-1] + 1
        if ranges.end_of(follow) is not None:
            return follow, follow
        for i, b in enumerate(table):
            if ranges.owner_of(b) is not req:
                continue
            if i + 1 < len(table) and table[i + 1] != b + 1 and ranges.end_of(b + 1) is not None:
                return b + 1, b + 1
            below = ranges.start_ending_at(b)
            if (i == 0 or table[i - 1] != b - 1) and below is not None and not ranges.is_tail(below - 1):
                return below, b - 1
        cap = max(1, self.growth_blocks(req) * 0.5)
        small = [s for s, e in ranges.ranges() if e - s <= cap and not ranges.is_tail(s - 1)]
        if small:
            start = min(small)
            size = ranges.end_of(start) - start
            if req.max_len is not None:
                worst = -(-max(0, req.max_len - len(req.token_ids)) // self.block_size)
                if worst <= req.num_prompt_blocks:
                    return start, start + size - 1
            return start, start
        start = ranges.orphans.lowest()
        if start is None:
            start = ranges.lowest_start()
        return start, start
