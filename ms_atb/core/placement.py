"""Where the block manager puts a request's blocks under contiguous allocation: the placement policy.

Measured with scripts/bench_block_manager.py and scripts/placement_variants.py (BENCHMARKS.md §
Block manager). An "orphan" is a free range no live request grows into: the block before it is
not a live request's last block.
- a new prompt continues right after its cached prefix when that range has room, else takes,
  among the ranges at most _FIT_SLACK blocks over the best fit, the lowest orphan, else the
  lowest range; when a live request ends right before that range, the prompt starts 1/4 of that
  request's expected growth (from its max_tokens) in, at most half of what the range leaves, so the
  neighbour keeps some room and the rest is the prompt's own room to grow; with no fitting
  range it scatters, sparing the largest range (the likeliest to hold a later large prompt): one
  piece of the next largest, then the lowest ranges, sweeping up small holes, the largest last;
- a growing request takes last + 1 when it is clean; else it goes home: the first free block, in
  table order, next to a run of its own blocks, right after the run or else right below it (the top
  of an orphan ending there), so that its blocks stay together and come back as one range when it
  is freed (session 15: growth had scattered a request over one-block holes, which came back as
  one-block holes); else the lowest orphan of at most half its expected growth (a hole it will use
  up, not a large range split), else the lowest orphan, else the lowest clean block: free space
  drifts upward and merges. In such a small hole, a request whose remaining max_tokens (in blocks)
  are at most its prompt's blocks takes the hole's last block, not its first: the rest stays an
  orphan that every growing request (and prompt) can fill, instead of becoming this request's room.
Every decision costs O(log n) in the number of blocks: the indexes of ms_atb/core/free_ranges.py,
and each request's lazy heap of homes.
"""
from __future__ import annotations

from heapq import heappop
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ms_atb.core.block_manager import _Request as Request

_FIT_SLACK = 4        # a range up to this many blocks over the best fit may be chosen for its address


class PlacementPolicy:
    """Mixed into BlockManager: the decisions, over the manager's free ranges (_starts, _ends, _by_size,
    _orphans, _tails, _owner, _pos, each request's homes), taken with its _carve / _insert_range /
    _remove_range / _lowest_start.
    Subclasses (scripts/placement_catalogue.py) override one decision at a time."""

    _left_room_divisor = 4  # a new prompt leaves the live request before it 1/4 of its expected growth

    def _take_new_contiguous(self, req: Request, num_new: int) -> list[int]:
        table = req.block_ids
        start = table[-1] + 1 if table else -1
        lo = start
        if not (start in self._starts and self._starts[start] - start >= num_new):
            start = self._best_fit(num_new)
            lo = None if start is None else self._first_block_in(start, num_new)
        if start is not None:
            self._carve(start, lo, lo + num_new)
            return list(range(lo, lo + num_new))
        return self._scatter(num_new)

    def _scatter(self, num_new: int) -> list[int]:
        """No range fits: spare the largest range (the likeliest to hold a later large prompt); one
        piece of the next largest, then the lowest ranges; the largest only once all else is used up."""
        by_size = self._by_size
        spare = by_size.lowest_start(by_size.keys[-1])
        spare_end = self._remove_range(spare)   # out of every index while the others are swept
        new_ids = []
        while len(new_ids) < num_new and self._starts:
            s = self._lowest_start() if new_ids else by_size.lowest_start(by_size.keys[-1])
            n = min(self._starts[s] - s, num_new - len(new_ids))
            new_ids.extend(range(s, s + n))
            self._carve(s, s, s + n)
        self._insert_range(spare, spare_end)
        if len(new_ids) < num_new:
            n = num_new - len(new_ids)
            new_ids.extend(range(spare, spare + n))
            self._carve(spare, spare, spare + n)
        return new_ids

    def _first_block_in(self, start: int, num_new: int) -> int:
        """Where num_new blocks go in the range at start: after a live request's tail, 1/4 of its
        expected growth in (at most half of what the range leaves), so that it keeps room; else
        at the start."""
        if start - 1 not in self._tails:
            return start
        room = self._growth_blocks(self._owner[start - 1]) // self._left_room_divisor
        return start + min(room, (self._starts[start] - start - num_new) // 2)

    def _best_fit(self, num_new: int) -> int | None:
        """Among the ranges at most _FIT_SLACK blocks over the best fit, the lowest orphan (it needs
        no room for a neighbour), else the lowest range; None if no range fits."""
        size = self._by_size.best_fit(num_new)
        if size is None:
            return None
        start = self._orphans.by_size.lowest_between(size, size + _FIT_SLACK)
        return self._by_size.lowest_between(size, size + _FIT_SLACK) if start is None else start

    def _growth_blocks(self, req: Request) -> int:
        """Blocks req is expected to append still: half its remaining max_tokens, in blocks."""
        if req.max_len is None:
            return 0
        expected = len(req.token_ids) + max(0, req.max_len - len(req.token_ids)) // 2
        return max(0, -(-expected // self._block_size) - len(req.block_ids))

    def _jump_target(self, req: Request) -> tuple[int, int]:
        """Where a request whose next block is held goes, as (range start, block): home, next to one of its
        own earlier runs of blocks (_home), so that its blocks stay together and come back as one range when
        it is freed; else the lowest orphan of at most half its expected growth (a hole it will use up, not
        a large range split), else the lowest orphan, else the lowest range, each at its first block. In
        the small hole, a request whose remaining max_tokens fit in as many blocks as its prompt takes the
        last block instead: the rest stays an orphan (not this request's room) that every growing request
        and prompt can fill."""
        home = self._home(req)
        if home is not None:
            return home
        start = self._orphans.lowest_at_most(max(1, self._growth_blocks(req) // 2))
        if start is not None:
            if req.max_len is not None and (-(-max(0, req.max_len - len(req.token_ids)) // self._block_size)
                                            <= req.num_prompt_blocks):
                return start, start + self._orphans.size_of[start] - 1
            return start, start
        start = self._orphans.lowest()
        if start is None:
            start = self._lowest_start()
        return start, start

    def _home(self, req: Request) -> tuple[int, int] | None:
        """The first free block, in table order, next to a run of consecutive ids in req's table (its own
        blocks: placed for it, not prefix hits): right after the run (the start of a free range, which
        becomes req's room), else right below it (the last block of an orphan ending there); None if there
        is none. Entries of req.homes are pushed as free ranges appear (BlockManager._add_home) and checked
        here: O(log n) amortised."""
        homes = req.homes
        while homes:
            found = self._home_at(req, *homes[0])
            if found is not None:
                return found
            heappop(homes)
        return None

    def _home_at(self, req: Request, pos: int, kind: int, block: int) -> tuple[int, int] | None:
        """(range start, block) if the home entry still holds, else None."""
        neighbour = block - 1 if kind == 0 else block + 1
        if self._owner[neighbour] is not req or self._pos[neighbour] != pos:
            return None
        if kind == 0:
            return (block, block) if block in self._starts else None
        start = self._ends.get(neighbour)
        return (start, block) if start is not None and start - 1 not in self._tails else None
