"""The placement policies measured for the block manager on the churn benchmark.

Each variant is a ContiguousPlacement subclass (scripts/research/placement_base.py) that changes one
thing of the placement it was measured against, `NearFitBaseline`: the room a new prompt leaves the
live request before it (`left_room_divisor`), which range it takes (`best_fit`), where it goes
(`place_prompt`), which block a growing request takes (`grow_target`), or how a prompt that no range
holds scatters (`scatter`). The chain "orphans first + jump fill", "... + spare the largest", "... +
share small holes", "... + go home" leads to the kept placement (ms_atb/core/placement.py); the last is
the scanning form the kept placement was measured in, and tests/placement_oracle.py keeps that form as
the oracle the kept placement is tested against.
The classic baselines (plain best fit, first fit, the article's largest range) leave no room.
Everything else, the workload included, is scripts/bench_block_manager.py's. Two variants are
oracles: the workload tells the manager how many tokens each request will really generate
(`tell_end`), which no engine knows; they bound what knowing a request's lifetime can buy.
Variants may scan the free ranges (O(ranges) per call): they are experiments, not candidates for
the O(log n) placement. They read the pool only through FreeRanges' public methods.

The variants are run and tabled by scripts/research/placement_variants.py.
"""
from __future__ import annotations

import os
import sys
from bisect import bisect_left

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from placement_base import (NearFitBaseline, fits, growth_blocks, largest, lowest_near_fit,  # noqa: E402
                            max_growth, near_fits, smallest_at_least)
from ms_atb.core.placement import ContiguousPlacement  # noqa: E402


class NoLeftRoom(NearFitBaseline):
    left_room_divisor = 1 << 30


class LeftRoomHalf(NearFitBaseline):
    left_room_divisor = 2


class LeftRoomEighth(NearFitBaseline):
    left_room_divisor = 8


class LeftRoomWhole(NearFitBaseline):
    left_room_divisor = 1


class EndsMatched(NoLeftRoom):
    """No left room; near-best-fit ties go to the range whose neighbours are expected to finish when
    the new request does (so that ranges freed together merge)."""

    def place_prompt(self, req, num_new):
        self._placing = req
        return super().place_prompt(req, num_new)

    def best_fit(self, num_new):
        req, ranges = self._placing, self.ranges
        found = near_fits(ranges, num_new, 2, 8)
        if len(found) < 2 or req.max_len is None:
            return found[0][1] if found else None

        def left(r):
            return max(0, r.max_len - len(r.token_ids)) / 2
        best, best_key = None, None
        for size, start in found:
            score = 0.0
            for b in (start - 1, start + size):
                other = ranges.owner_of(b) if 0 <= b < ranges.num_blocks else None
                if other is not None and other.max_len is not None:
                    score += abs(left(other) - left(req))
            if best_key is None or (score, size) < best_key:
                best, best_key = start, (score, size)
        return best


class PlainBestFit(NoLeftRoom):
    """Best fit, first range found among the smallest; a jump takes the lowest free block."""

    def best_fit(self, num_new):
        return smallest_at_least(self.ranges, num_new)

    def jump_target(self, req):
        start = self.ranges.lowest_start()
        return start, start


class FirstFit(NoLeftRoom):
    def best_fit(self, num_new):
        found = fits(self.ranges, num_new)
        return min(found, key=lambda f: f[1])[1] if found else None


class LargestRange(NoLeftRoom):
    """The article's rule: a new request takes the largest free range."""

    def best_fit(self, num_new):
        big = largest(self.ranges.by_size)
        return big[1] if big and big[0] >= num_new else None


class RoomForOwnGrowth(NearFitBaseline):
    """The smallest range that holds the prompt plus its own expected growth, else the baseline rule."""

    def place_prompt(self, req, num_new):
        start = None if req.block_ids else smallest_at_least(self.ranges, num_new + growth_blocks(self, req))
        if start is None:
            return super().place_prompt(req, num_new)
        self.ranges.carve(start, start, start + num_new)
        return list(range(start, start + num_new))


class GrowFromSmallest(NearFitBaseline):
    """Every growth block from the smallest free range, to use up small holes."""

    def grow_target(self, req):
        by_size = self.ranges.by_size
        start = next(iter(by_size.buckets[by_size.keys[0]]))
        return start, start


class JumpToOrphanEnd(NearFitBaseline):
    """last + 1 when free, else the last block of the lowest range nobody grows into."""

    def grow_target(self, req):
        ranges = self.ranges
        follow = req.block_ids[-1] + 1
        if ranges.end_of(follow) is not None:
            return follow, follow
        start = ranges.orphans.lowest()
        if start is None:
            start = ranges.lowest_start()
        return start, max(start, ranges.end_of(start) - self.blocks_below_end(req))

    def blocks_below_end(self, req):
        return 1


class JumpToTopRoom(JumpToOrphanEnd):
    """As JumpToOrphanEnd, but the request lands its expected growth below the range's end, so it has
    room to grow in place (the range's bottom still stays whole)."""

    def blocks_below_end(self, req):
        return max(1, self.growth_blocks(req))


def near_fit_slack(slack):
    class NearFitSlack(NearFitBaseline):
        def best_fit(self, num_new):
            return lowest_near_fit(self.ranges.by_size, num_new, slack)
    NearFitSlack.__name__ = f"NearFitSlack{slack}"
    return NearFitSlack


class TwoEnded(NearFitBaseline):
    """Large prompts (32+ blocks, half the largest) take the highest-addressed near fit, small ones
    the lowest: size classes kept apart so that large requests free large neighbouring ranges."""

    def best_fit(self, num_new):
        if num_new < 32:
            return super().best_fit(num_new)
        by_size = self.ranges.by_size
        keys = by_size.keys
        i = bisect_left(keys, num_new)
        if i == len(keys):
            return None
        sizes = [k for k in keys[i:] if k <= keys[i] + 2]
        return max(max(by_size.buckets[k]) for k in sizes)


class AlignedInOrphans(NearFitBaseline):
    """A prompt in a range nobody grows into starts at a multiple of 16 blocks when it still fits
    there (buddy-style alignment, so that neighbours freed together merge into aligned ranges)."""

    def place_prompt(self, req, num_new):
        ranges = self.ranges
        start = self.best_fit(num_new) if not req.block_ids else None
        if start is None or ranges.is_tail(start - 1):
            return super().place_prompt(req, num_new)
        lo = -(-start // 16) * 16
        if lo + num_new > ranges.end_of(start):
            lo = start
        ranges.carve(start, lo, lo + num_new)
        return list(range(lo, lo + num_new))


class OrphansFirst(NearFitBaseline):
    """Near fits up to 4 blocks over the best fit, ranges nobody grows into first (they need no room),
    then the lowest address; the left neighbour's room is at most half the range's slack."""

    def best_fit(self, num_new):
        ranges = self.ranges
        found = near_fits(ranges, num_new, 4, 1 << 30)
        return min(found, key=lambda f: (ranges.is_tail(f[1] - 1), f[1]))[1] if found else None

    def first_block_in(self, start, num_new):
        return min(super().first_block_in(start, num_new),
                   start + (self.ranges.end_of(start) - start - num_new) // 2)


class OrphansFirstJumpFill(OrphansFirst):
    """Orphans first, and a blocked growing request jumps to the lowest orphan range of at most half its
    expected growth: it fills a small hole it will use up instead of splitting a large range; else the
    baseline jump. In scanning form; the kept placement's OrphanIndex answers the same in O(log n)."""

    def grow_target(self, req):
        ranges = self.ranges
        follow = req.block_ids[-1] + 1
        if ranges.end_of(follow) is not None:
            return follow, follow
        cap = max(1, self.growth_blocks(req) * 0.5)
        small = [s for s, e in ranges.ranges() if e - s <= cap and not ranges.is_tail(s - 1)]
        start = min(small) if small else ranges.orphans.lowest()
        return (start, start) if start is not None else (ranges.lowest_start(), ranges.lowest_start())


class SpareTheLargest(OrphansFirstJumpFill):
    """Orphans first + jump fill, and a prompt that no range holds scatters sparing the largest range:
    one piece of the next largest, then the lowest ranges, the largest last (it is the likeliest to hold
    a later large prompt). In scanning form."""

    def scatter(self, num_new):
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


class ShareSmallHoles(SpareTheLargest):
    """... + spare the largest, and a jump into a jump-fill hole (an orphan of at most half the expected
    growth) takes the hole's last block when the request's remaining max_tokens fit in as many blocks as
    its prompt: the rest of the hole stays an orphan that every growing request and prompt can fill,
    instead of becoming this request's room. In scanning form."""

    def grow_target(self, req):
        ranges = self.ranges
        start, block = super().grow_target(req)
        if block == req.block_ids[-1] + 1 or ranges.is_tail(start - 1) or req.max_len is None:
            return start, block
        size = ranges.end_of(start) - start
        if size > max(1, self.growth_blocks(req) * 0.5):
            return start, block
        worst = -(-max(0, req.max_len - len(req.token_ids)) // self.block_size)
        return (start, start + size - 1) if worst <= req.num_prompt_blocks else (start, block)


class GrowHome(ShareSmallHoles):
    """... + share small holes, and a blocked growing request first goes home: the first free block, in table
    order, next to a run of consecutive ids of its own table (blocks placed for it), right after the run (the
    start of a free range) or else right below it (the last block of a range nobody grows into, ending there);
    else the jump above. Its blocks stay together and come back as one range when it is freed. In scanning
    form (tests/placement_oracle.py keeps this form as the kept placement's oracle)."""

    def grow_target(self, req):
        ranges = self.ranges
        table = req.block_ids
        if ranges.end_of(table[-1] + 1) is None:
            for i, b in enumerate(table):
                if ranges.owner_of(b) is not req:
                    continue
                if i + 1 < len(table) and table[i + 1] != b + 1 and ranges.end_of(b + 1) is not None:
                    return b + 1, b + 1
                below = ranges.start_ending_at(b)
                if (i == 0 or table[i - 1] != b - 1) and below is not None and not ranges.is_tail(below - 1):
                    return below, b - 1
        return super().grow_target(req)


class FullRoomWhenAmple(NearFitBaseline):
    """The left neighbour gets its whole worst-case growth as room when the range also holds the prompt
    and the prompt's own worst case; otherwise the baseline room."""

    def place_prompt(self, req, num_new):
        self._placing = req
        return super().place_prompt(req, num_new)

    def first_block_in(self, start, num_new):
        ranges = self.ranges
        if ranges.is_tail(start - 1):
            room, size = max_growth(self, ranges.owner_of(start - 1)), ranges.end_of(start) - start
            if size >= room + num_new + max_growth(self, self._placing, num_new):
                return start + room
        return super().first_block_in(start, num_new)


class ScatterSmallestFirst(NearFitBaseline):
    """With no fitting range, scatter from the smallest ranges up."""

    def place_prompt(self, req, num_new):
        ranges = self.ranges
        follow = req.block_ids[-1] + 1 if req.block_ids else -1
        follow_end = ranges.end_of(follow)
        if largest(ranges.by_size)[0] >= num_new or (follow_end if follow_end is not None else follow) - follow >= num_new:
            return super().place_prompt(req, num_new)
        new_ids = []
        while len(new_ids) < num_new:
            size = ranges.by_size.keys[0]
            start = next(iter(ranges.by_size.buckets[size]))
            n = min(size, num_new - len(new_ids))
            new_ids.extend(range(start, start + n))
            ranges.carve(start, start, start + n)
        return new_ids


class TwoZones(NearFitBaseline):
    """Prompts packed from the bottom (near best fit among ranges nobody grows into, at the range's start,
    no room); a blocked growing request jumps into a growth arena at the top: the highest such range,
    a quarter of its expected growth below the range's end, which is its room."""

    def place_prompt(self, req, num_new):
        ranges = self.ranges
        found = [f for f in fits(ranges, num_new) if not ranges.is_tail(f[1] - 1)] if not req.block_ids else []
        if not found:
            return super().place_prompt(req, num_new)
        best = min(size for size, _ in found)
        start = min(start for size, start in found if size <= best + 2)
        ranges.carve(start, start, start + num_new)
        return list(range(start, start + num_new))

    def grow_target(self, req):
        ranges = self.ranges
        follow = req.block_ids[-1] + 1
        if ranges.end_of(follow) is not None:
            return follow, follow
        orphans = [(start, end) for start, end in ranges.ranges() if not ranges.is_tail(start - 1)]
        if not orphans:
            return ranges.lowest_start(), ranges.lowest_start()
        start, end = max(orphans)
        return start, max(start, end - 1 - self.growth_blocks(req) // 4)


class OracleExactFootprint(NearFitBaseline):
    """Oracle: a prompt goes where it and its real growth fit, never into a live neighbour's real growth."""

    def place_prompt(self, req, num_new):
        if req.block_ids:
            return super().place_prompt(req, num_new)
        ranges = self.ranges
        own, best = growth_blocks(self, req), None
        for size, start in fits(ranges, num_new):
            left = ranges.owner_of(start - 1) if start > 0 and ranges.is_tail(start - 1) else None
            keep = growth_blocks(self, left)
            usable = size - keep
            if usable >= num_new + own:
                key, lo = (0, usable - num_new - own, start), start + keep
            elif usable >= num_new:
                key, lo = (1, usable - num_new, start), start + keep
            else:
                key, lo = (2, size - num_new, start), start
            if best is None or key < best[0]:
                best = (key, start, lo)
        if best is None:
            return super().place_prompt(req, num_new)
        _, start, lo = best
        ranges.carve(start, lo, lo + num_new)
        return list(range(lo, lo + num_new))


# name -> (placement class, tell the manager each request's real end)
VARIANTS = {
    "kept policy": (ContiguousPlacement, False),
    "near-fit baseline": (NearFitBaseline, False),
    "ends-matched neighbours": (EndsMatched, False),
    "no left room": (NoLeftRoom, False),
    "left room 1/8": (LeftRoomEighth, False),
    "left room 1/2": (LeftRoomHalf, False),
    "left room 1": (LeftRoomWhole, False),
    "plain best fit": (PlainBestFit, False),
    "first fit": (FirstFit, False),
    "largest range (article)": (LargestRange, False),
    "room for own growth": (RoomForOwnGrowth, False),
    "growth from smallest range": (GrowFromSmallest, False),
    "jump to orphan end": (JumpToOrphanEnd, False),
    "jump to top room": (JumpToTopRoom, False),
    "near-fit slack 0": (near_fit_slack(0), False),
    "near-fit slack 8": (near_fit_slack(8), False),
    "two-ended (large high)": (TwoEnded, False),
    "aligned in orphans (16)": (AlignedInOrphans, False),
    "scatter smallest first": (ScatterSmallestFirst, False),
    "orphans first (slack 4)": (OrphansFirst, False),
    "orphans first + jump fill": (OrphansFirstJumpFill, False),
    "orphans first + jump fill + spare the largest": (SpareTheLargest, False),
    "... + spare the largest + share small holes": (ShareSmallHoles, False),
    "... + share small holes + go home": (GrowHome, False),
    "full room when the range is ample": (FullRoomWhenAmple, False),
    "two zones: prompts low and growth high": (TwoZones, False),
    "oracle: near-fit baseline": (NearFitBaseline, True),
    "oracle: ends-matched neighbours": (EndsMatched, True),
    "oracle: exact footprint": (OracleExactFootprint, True),
}
