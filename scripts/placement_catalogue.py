"""The placement policies measured for the block manager on the churn benchmark (issue #2).

Each variant is a BlockManager subclass that changes one thing of the policy it was measured
against, the one kept from session 5 to session 10 (`Session5Policy`, in placement_base.py): the
room a new prompt leaves the live request before it (`_left_room_divisor`), which range it takes
(`_best_fit`), where it goes or scatters (`_take_new_contiguous`), or which block a growing request
takes (`_grow`), or how a prompt that no range holds scatters (`_scatter`). "orphans first + jump fill"
became the kept policy in session 11, "... + spare the largest" (its scatter) and "... + share small
holes" (a jump's block) in session 14, and "... + go home" (a jump next to the request's own blocks) in
session 15; the last is the scanning form the kept policy was measured in, and
tests/test_placement_variants.py checks that the two place every block alike.
The classic baselines (plain best fit, first fit, the article's largest range) leave no room.
Everything else, the workload included, is scripts/bench_block_manager.py's. Two variants are
oracles: the workload tells the manager how many tokens each request will really generate
(`tell_end`), which no engine knows; they bound what knowing a request's lifetime can buy.
Variants may scan the free ranges (O(ranges) per call): they are experiments, not candidates for
the O(log n) manager.

The variants are run and tabled by scripts/placement_variants.py.
"""
from __future__ import annotations

import os
import sys
from bisect import bisect_left

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

from placement_base import (Session5Policy, _fits, _growth_blocks, _GrowVariant, _max_growth,  # noqa: E402
                            _near_fits, _smallest_at_least)
from ms_atb.core.block_manager import BlockManager  # noqa: E402


class NoLeftRoom(Session5Policy):
    _left_room_divisor = 1 << 30


class LeftRoomHalf(Session5Policy):
    _left_room_divisor = 2


class LeftRoomEighth(Session5Policy):
    _left_room_divisor = 8


class LeftRoomWhole(Session5Policy):
    _left_room_divisor = 1


class PreviousPolicy(NoLeftRoom):
    """Sessions 1-4: no left room; near-best-fit ties go to the range whose neighbours are expected
    to finish when the new request does (so that ranges freed together merge)."""

    def _take_new_contiguous(self, req, num_new):
        self._placing = req
        return super()._take_new_contiguous(req, num_new)

    def _best_fit(self, num_new):
        req = self._placing
        fits = _near_fits(self, num_new, 2, 8)
        if len(fits) < 2 or req.max_len is None:
            return fits[0][1] if fits else None

        def left(r):
            return max(0, r.max_len - len(r.token_ids)) / 2
        best, best_key = None, None
        for size, start in fits:
            score = 0.0
            for b in (start - 1, start + size):
                other = self._owner[b] if 0 <= b < self._num_blocks else None
                if other is not None and other.max_len is not None:
                    score += abs(left(other) - left(req))
            if best_key is None or (score, size) < best_key:
                best, best_key = start, (score, size)
        return best


class PlainBestFit(NoLeftRoom):
    """Best fit, first range found among the smallest; a jump takes the lowest free block."""

    def _best_fit(self, num_new):
        return _smallest_at_least(self, num_new)

    def _jump_target(self, req):
        start = self._lowest_start()
        return start, start


class FirstFit(NoLeftRoom):
    def _best_fit(self, num_new):
        fits = _fits(self, num_new)
        return min(fits, key=lambda f: f[1])[1] if fits else None


class LargestRange(NoLeftRoom):
    """The article's rule: a new request takes the largest free range."""

    def _best_fit(self, num_new):
        largest = self._by_size.largest()
        return largest[1] if largest and largest[0] >= num_new else None


class RoomForOwnGrowth(Session5Policy):
    """The smallest range that holds the prompt plus its own expected growth, else the kept rule."""

    def _take_new_contiguous(self, req, num_new):
        start = None if req.block_ids else _smallest_at_least(self, num_new + _growth_blocks(self, req))
        if start is None:
            return super()._take_new_contiguous(req, num_new)
        self._carve(start, start, start + num_new)
        return list(range(start, start + num_new))


class GrowFromSmallest(_GrowVariant):
    """Every growth block from the smallest free range, to use up small holes."""

    def _jump(self, req):
        start = next(iter(self._by_size.buckets[self._by_size.keys[0]]))
        return start, start


class JumpToOrphanEnd(_GrowVariant):
    """last + 1 when free, else the last block of the lowest range nobody grows into."""

    def _jump(self, req):
        follow = req.block_ids[-1] + 1
        if follow in self._starts:
            return follow, follow
        start = self._orphans.lowest()
        if start is None:
            start = self._lowest_start()
        return start, max(start, self._starts[start] - self._blocks_below_end(req))

    def _blocks_below_end(self, req):
        return 1


class JumpToTopRoom(JumpToOrphanEnd):
    """As JumpToOrphanEnd, but the request lands its expected growth below the range's end, so it has
    room to grow in place (the range's bottom still stays whole)."""

    def _blocks_below_end(self, req):
        return max(1, self._growth_blocks(req))


def _near_fit_slack(slack):
    class NearFitSlack(Session5Policy):
        def _best_fit(self, num_new):
            return self._by_size.lowest_near_fit(num_new, slack)
    NearFitSlack.__name__ = f"NearFitSlack{slack}"
    return NearFitSlack


class TwoEnded(Session5Policy):
    """Large prompts (32+ blocks, half the largest) take the highest-addressed near fit, small ones
    the lowest: size classes kept apart so that large requests free large neighbouring ranges."""

    def _best_fit(self, num_new):
        if num_new < 32:
            return super()._best_fit(num_new)
        keys = self._by_size.keys
        i = bisect_left(keys, num_new)
        if i == len(keys):
            return None
        sizes = [k for k in keys[i:] if k <= keys[i] + 2]
        return max(max(self._by_size.buckets[k]) for k in sizes)


class AlignedInOrphans(Session5Policy):
    """A prompt in a range nobody grows into starts at a multiple of 16 blocks when it still fits
    there (buddy-style alignment, so that neighbours freed together merge into aligned ranges)."""

    def _take_new_contiguous(self, req, num_new):
        start = self._best_fit(num_new) if not req.block_ids else None
        if start is None or start - 1 in self._tails:
            return super()._take_new_contiguous(req, num_new)
        lo = -(-start // 16) * 16
        if lo + num_new > self._starts[start]:
            lo = start
        self._carve(start, lo, lo + num_new)
        return list(range(lo, lo + num_new))


class OrphansFirst(Session5Policy):
    """Near fits up to 4 blocks over the best fit, ranges nobody grows into first (they need no room),
    then the lowest address; the left neighbour's room is at most half the range's slack."""

    def _best_fit(self, num_new):
        fits = _near_fits(self, num_new, 4, 1 << 30)
        return min(fits, key=lambda f: (f[1] - 1 in self._tails, f[1]))[1] if fits else None

    def _first_block_in(self, start, num_new):
        return min(super()._first_block_in(start, num_new), start + (self._starts[start] - start - num_new) // 2)


class OrphansFirstJumpFill(OrphansFirst, _GrowVariant):
    """Orphans first, and a blocked growing request jumps to the lowest orphan range of at most half its
    expected growth: it fills a small hole it will use up instead of splitting a large range; else the
    kept jump. Session 9, in the form it was measured in (scanning the free ranges); the kept policy
    since session 11, where BlockManager's OrphanIndex answers the same questions in O(log n)."""

    def _jump(self, req):
        follow = req.block_ids[-1] + 1
        if follow in self._starts:
            return follow, follow
        cap = max(1, self._growth_blocks(req) * 0.5)
        small = [s for s, e in self._starts.items() if e - s <= cap and s - 1 not in self._tails]
        start = min(small) if small else self._orphans.lowest()
        return (start, start) if start is not None else (self._lowest_start(), self._lowest_start())


class SpareTheLargest(OrphansFirstJumpFill):
    """Orphans first + jump fill, and a prompt that no range holds scatters sparing the largest range:
    one piece of the next largest, then the lowest ranges, the largest last (it is the likeliest to hold
    a later large prompt). Session 14, in scanning form; the kept policy since then."""

    def _scatter(self, num_new):
        ranges = sorted(self._starts.items(), key=lambda r: (r[0] - r[1], r[0]))   # largest, then lowest
        order = [start for start, _ in ranges[1:2]]
        order += sorted(start for start, _ in ranges[2:]) + [ranges[0][0]]
        new_ids = []
        for start in order:
            n = min(self._starts[start] - start, num_new - len(new_ids))
            if n <= 0:
                break
            new_ids.extend(range(start, start + n))
            self._carve(start, start, start + n)
        return new_ids


class ShareSmallHoles(SpareTheLargest):
    """... + spare the largest, and a jump into a jump-fill hole (an orphan of at most half the expected
    growth) takes the hole's last block when the request's remaining max_tokens fit in as many blocks as
    its prompt: the rest of the hole stays an orphan that every growing request and prompt can fill,
    instead of becoming this request's room. Session 14, in scanning form; the kept policy since then."""

    def _jump(self, req):
        start, block = super()._jump(req)
        if block == req.block_ids[-1] + 1 or start - 1 in self._tails or req.max_len is None:
            return start, block
        size = self._starts[start] - start
        if size > max(1, self._growth_blocks(req) * 0.5):
            return start, block
        worst = -(-max(0, req.max_len - len(req.token_ids)) // self._block_size)
        return (start, start + size - 1) if worst <= req.num_prompt_blocks else (start, block)


class GrowHome(ShareSmallHoles):
    """... + share small holes, and a blocked growing request first goes home: the first free block, in table
    order, next to a run of consecutive ids of its own table (blocks placed for it), right after the run (the
    start of a free range) or else right below it (the last block of a range nobody grows into, ending there);
    else the jump above. Its blocks stay together and come back as one range when it is freed. Session 15 (a
    helper's "HomeJumpBelow"), in scanning form; the kept policy since then."""

    def _jump(self, req):
        table = req.block_ids
        if table[-1] + 1 not in self._starts:
            for i, b in enumerate(table):
                if self._owner[b] is not req:
                    continue
                if i + 1 < len(table) and table[i + 1] != b + 1 and b + 1 in self._starts:
                    return b + 1, b + 1
                if (i == 0 or table[i - 1] != b - 1) and b in self._ends and self._ends[b] - 1 not in self._tails:
                    return self._ends[b], b - 1
        return super()._jump(req)


class FullRoomWhenAmple(Session5Policy):
    """At low load, the left neighbour gets its whole worst-case growth as room when the range also holds
    the prompt and the prompt's own worst case (POOL: when the free pool holds every live request's
    worst case); otherwise the kept room."""
    POOL = False

    def _take_new_contiguous(self, req, num_new):
        self._placing = req
        return super()._take_new_contiguous(req, num_new)

    def _first_block_in(self, start, num_new):
        if start - 1 in self._tails:
            room, size = _max_growth(self, self._owner[start - 1]), self._starts[start] - start
            own = _max_growth(self, self._placing, num_new)
            if self.POOL:
                need = sum(_max_growth(self, r) for r in self._requests.values()) + num_new + own
                ample = need <= self.num_free_blocks and size >= room + num_new
            else:
                ample = size >= room + num_new + own
            if ample:
                return start + room
        return super()._first_block_in(start, num_new)


class ScatterSmallestFirst(Session5Policy):
    """With no fitting range, scatter from the smallest ranges up."""

    def _take_new_contiguous(self, req, num_new):
        follow = req.block_ids[-1] + 1 if req.block_ids else -1
        if self._by_size.largest()[0] >= num_new or self._starts.get(follow, follow) - follow >= num_new:
            return super()._take_new_contiguous(req, num_new)
        new_ids = []
        while len(new_ids) < num_new:
            size = self._by_size.keys[0]
            start = next(iter(self._by_size.buckets[size]))
            n = min(size, num_new - len(new_ids))
            new_ids.extend(range(start, start + n))
            self._carve(start, start, start + n)
        return new_ids


class TwoZones(Session5Policy):
    """Prompts packed from the bottom (near best fit among ranges nobody grows into, at the range's start,
    no room); a blocked growing request jumps into a growth arena at the top: the highest such range,
    a quarter of its expected growth below the range's end, which is its room. Session 10."""

    def _take_new_contiguous(self, req, num_new):
        fits = [f for f in _fits(self, num_new) if f[1] - 1 not in self._tails] if not req.block_ids else []
        if not fits:
            return super()._take_new_contiguous(req, num_new)
        best = min(size for size, _ in fits)
        start = min(start for size, start in fits if size <= best + 2)
        self._carve(start, start, start + num_new)
        return list(range(start, start + num_new))


class TwoZonesGrow(TwoZones, _GrowVariant):
    def _jump(self, req):
        follow = req.block_ids[-1] + 1
        if follow in self._starts:
            return follow, follow
        orphans = [(start, end) for start, end in self._starts.items() if start - 1 not in self._tails]
        if not orphans:
            return self._lowest_start(), self._lowest_start()
        start, end = max(orphans)
        return start, max(start, end - 1 - self._growth_blocks(req) // 4)


class OracleExactFootprint(Session5Policy):
    """Oracle: a prompt goes where it and its real growth fit, never into a live neighbour's real growth."""

    def _take_new_contiguous(self, req, num_new):
        if req.block_ids:
            return super()._take_new_contiguous(req, num_new)
        own, best = _growth_blocks(self, req), None
        for size, start in _fits(self, num_new):
            left = self._owner[start - 1] if start > 0 and start - 1 in self._tails else None
            keep = _growth_blocks(self, left)
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
            return super()._take_new_contiguous(req, num_new)
        _, start, lo = best
        self._carve(start, lo, lo + num_new)
        return list(range(lo, lo + num_new))


# name -> (manager class, tell the manager each request's real end)
VARIANTS = {
    "kept policy": (BlockManager, False),
    "session 5-10 policy": (Session5Policy, False),
    "previous policy (sessions 1-4)": (PreviousPolicy, False),
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
    "near-fit slack 0": (_near_fit_slack(0), False),
    "near-fit slack 8": (_near_fit_slack(8), False),
    "two-ended (large high)": (TwoEnded, False),
    "aligned in orphans (16)": (AlignedInOrphans, False),
    "scatter smallest first": (ScatterSmallestFirst, False),
    "orphans first (slack 4)": (OrphansFirst, False),
    "orphans first + jump fill": (OrphansFirstJumpFill, False),
    "orphans first + jump fill + spare the largest": (SpareTheLargest, False),
    "... + spare the largest + share small holes": (ShareSmallHoles, False),
    "... + share small holes + go home": (GrowHome, False),
    "full room when the range is ample": (FullRoomWhenAmple, False),
    "full room while the pool fits all": (type("FullRoomWhilePoolFits", (FullRoomWhenAmple,), {"POOL": True}), False),
    "two zones: prompts low and growth high": (TwoZonesGrow, False),
    "oracle: session 5-10 policy": (Session5Policy, True),
    "oracle: previous policy": (PreviousPolicy, True),
    "oracle: exact footprint": (OracleExactFootprint, True),
}
