"""Placement: which clean blocks the block manager gives a request. Two placements share one interface.

The BlockManager owns one placement and calls only its interface (Placement below): new_blocks,
next_block, drop, release and num_clean. The manager keeps reference counts, tables and the prefix
cache; the placement keeps the clean blocks. ScatteredPlacement is a FIFO free list.
ContiguousPlacement decides over a FreeRanges (ms_atb/core/free_ranges.py), through its public
methods only; its decisions are public methods a research placement may override
(scripts/research/). An "orphan" is a free range no live request grows into: the block before it
is not a live request's last block. The contiguous policy (measured in BENCHMARKS.md § Block manager):
- a new prompt continues right after its cached prefix when that range has room, else takes,
  among the ranges at most FIT_SLACK blocks over the best fit, the lowest orphan, else the
  lowest range; when a live request ends right before that range, the prompt starts 1/4 of that
  request's expected growth (from its max_tokens) in, at most half of what the range leaves, so the
  neighbour keeps some room and the rest is the prompt's own room to grow; with no fitting
  range it scatters, sparing the largest range (the likeliest to hold a later large prompt): one
  piece of the next largest, then the lowest ranges, sweeping up small holes, the largest last;
- a growing request takes last + 1 when it is clean; else it goes home: the first free block, in
  table order, next to a run of its own blocks, right after the run or else right below it (the top
  of an orphan ending there), so that its blocks stay together and come back as one range when it
  is freed (growth that scatters a request over one-block holes gets them back as one-block holes);
  else the lowest orphan of at most half its expected growth (a hole it will use up, not a large
  range split), else the lowest orphan, else the lowest clean block: free space drifts upward and
  merges. In such a small hole, a request whose remaining max_tokens (in blocks) are at most its
  prompt's blocks takes the hole's last block, not its first: the rest stays an orphan that every
  growing request (and prompt) can fill, instead of becoming this request's room.
Every decision costs O(log n) in the number of blocks.
"""
from __future__ import annotations

from collections import deque
from typing import Callable, Protocol

from ms_atb.core.free_ranges import FreeRanges
from ms_atb.core.kv_request import KVRequest

PLACEMENTS = ("contiguous", "scattered")   # the allocation values a BlockManager accepts
FIT_SLACK = 4         # a range up to this many blocks over the best fit may be chosen for its address
LEFT_ROOM_DIVISOR = 4  # a new prompt leaves the live request before it 1/4 of its expected growth


class Placement(Protocol):
    """What the BlockManager asks of a placement. The manager has evicted enough cached blocks first:
    num_clean covers every block asked for."""

    @property
    def num_clean(self) -> int: ...

    def new_blocks(self, req: KVRequest, num_new: int) -> list[int]:
        """num_new clean blocks for req's prompt, after the prefix hits already in its table (which the
        manager extends with them afterwards)."""

    def next_block(self, req: KVRequest) -> int:
        """One clean block for req (non-empty table) to grow by (the manager appends it)."""

    def drop(self, req: KVRequest) -> None:
        """req ends; called before its blocks are released."""

    def release(self, blocks: list[int]) -> None:
        """The blocks (no request holds them, none cached) are clean again."""


PlacementFactory = Callable[[int, int], Placement]   # (num_blocks, block_size) -> a placement


class ScatteredPlacement:
    """Clean blocks in a FIFO free list: the first freed is the first taken."""

    def __init__(self, num_blocks: int, block_size: int):
        self._free = deque(range(num_blocks))

    @property
    def num_clean(self) -> int:
        return len(self._free)

    def new_blocks(self, req: KVRequest, num_new: int) -> list[int]:
        return [self._free.popleft() for _ in range(num_new)]

    def next_block(self, req: KVRequest) -> int:
        return self._free.popleft()

    def drop(self, req: KVRequest) -> None:
        pass

    def release(self, blocks: list[int]) -> None:
        self._free.extend(blocks)

    def free_blocks(self) -> list[int]:
        return list(self._free)


class ContiguousPlacement:
    """The contiguous policy above, over self.ranges. Decisions (overridable): place_prompt, best_fit,
    first_block_in, scatter, grow_target, jump_target; each carves only through self.ranges."""

    def __init__(self, num_blocks: int, block_size: int):
        self.ranges = FreeRanges(num_blocks)
        self.block_size = block_size

    @property
    def num_clean(self) -> int:
        return self.ranges.num_clean

    def new_blocks(self, req: KVRequest, num_new: int) -> list[int]:
        new_ids = self.place_prompt(req, num_new)
        self.ranges.claim(req, new_ids)
        return new_ids

    def next_block(self, req: KVRequest) -> int:
        start, block = self.grow_target(req)
        self.ranges.grow_into(req, start, block)
        return block

    def drop(self, req: KVRequest) -> None:
        self.ranges.drop(req)

    def release(self, blocks: list[int]) -> None:
        self.ranges.release(blocks)

    # ---- decisions ------------------------------------------------------------------------
    def place_prompt(self, req: KVRequest, num_new: int) -> list[int]:
        """Carve num_new blocks for req's prompt and return them."""
        ranges = self.ranges
        table = req.block_ids
        start = table[-1] + 1 if table else -1
        lo = start
        end = ranges.end_of(start)
        if not (end is not None and end - start >= num_new):
            start = self.best_fit(num_new)
            lo = None if start is None else self.first_block_in(start, num_new)
        if start is not None:
            ranges.carve(start, lo, lo + num_new)
            return list(range(lo, lo + num_new))
        return self.scatter(num_new)

    def scatter(self, num_new: int) -> list[int]:
        """No range fits: spare the largest range (the likeliest to hold a later large prompt); one
        piece of the next largest, then the lowest ranges; the largest only once all else is used up."""
        ranges, by_size = self.ranges, self.ranges.by_size
        spare = by_size.lowest_start(by_size.keys[-1])
        spare_end = ranges.remove_range(spare)   # out of every index while the others are swept
        new_ids = []
        while len(new_ids) < num_new and by_size.keys:
            s = ranges.lowest_start() if new_ids else by_size.lowest_start(by_size.keys[-1])
            n = min(ranges.end_of(s) - s, num_new - len(new_ids))
            new_ids.extend(range(s, s + n))
            ranges.carve(s, s, s + n)
        ranges.insert_range(spare, spare_end)
        if len(new_ids) < num_new:
            n = num_new - len(new_ids)
            new_ids.extend(range(spare, spare + n))
            ranges.carve(spare, spare, spare + n)
        return new_ids

    def first_block_in(self, start: int, num_new: int) -> int:
        """Where num_new blocks go in the range at start: after a live request's tail, 1/4 of its
        expected growth in (at most half of what the range leaves), so that it keeps room; else
        at the start."""
        ranges = self.ranges
        if not ranges.is_tail(start - 1):
            return start
        room = self.growth_blocks(ranges.owner_of(start - 1)) // LEFT_ROOM_DIVISOR
        return start + min(room, (ranges.end_of(start) - start - num_new) // 2)

    def best_fit(self, num_new: int) -> int | None:
        """Among the ranges at most FIT_SLACK blocks over the best fit, the lowest orphan (it needs
        no room for a neighbour), else the lowest range; None if no range fits."""
        by_size = self.ranges.by_size
        size = by_size.best_fit(num_new)
        if size is None:
            return None
        start = self.ranges.orphans.by_size.lowest_between(size, size + FIT_SLACK)
        return by_size.lowest_between(size, size + FIT_SLACK) if start is None else start

    def growth_blocks(self, req: KVRequest) -> int:
        """Blocks req is expected to append still: half its remaining max_tokens, in blocks."""
        if req.max_len is None:
            return 0
        expected = len(req.token_ids) + max(0, req.max_len - len(req.token_ids)) // 2
        return max(0, -(-expected // self.block_size) - len(req.block_ids))

    def grow_target(self, req: KVRequest) -> tuple[int, int]:
        """(range start, block) for a growing request: last + 1 when it is clean, else jump_target."""
        block = req.block_ids[-1] + 1
        if self.ranges.end_of(block) is not None:
            return block, block
        return self.jump_target(req)

    def jump_target(self, req: KVRequest) -> tuple[int, int]:
        """Where a request whose next block is held goes: home (FreeRanges.home), next to one of its own
        earlier runs of blocks, so that its blocks stay together and come back as one range when it is
        freed; else the lowest orphan of at most half its expected growth (a hole it will use up, not a
        large range split), else the lowest orphan, else the lowest range, each at its first block. In
        the small hole, a request whose remaining max_tokens fit in as many blocks as its prompt takes the
        last block instead: the rest stays an orphan (not this request's room) that every growing request
        and prompt can fill."""
        ranges = self.ranges
        home = ranges.home(req)
        if home is not None:
            return home
        orphans = ranges.orphans
        start = orphans.lowest_at_most(max(1, self.growth_blocks(req) // 2))
        if start is not None:
            if req.max_len is not None and (-(-max(0, req.max_len - len(req.token_ids)) // self.block_size)
                                            <= req.num_prompt_blocks):
                return start, start + orphans.size_of[start] - 1
            return start, start
        start = orphans.lowest()
        if start is None:
            start = ranges.lowest_start()
        return start, start


def make_placement(allocation: str, num_blocks: int, block_size: int) -> Placement:
    if allocation not in PLACEMENTS:
        raise ValueError(f"allocation must be one of {PLACEMENTS}, got {allocation!r}")
    cls = ContiguousPlacement if allocation == "contiguous" else ScatteredPlacement
    return cls(num_blocks, block_size)
