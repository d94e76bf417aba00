"""Size index of the block manager's free ranges: address-ordered best-fit look-ups in O(log n)."""
from __future__ import annotations

from bisect import bisect_left, insort
from heapq import heappop, heappush


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

    def lowest_near_fit(self, key: int, slack: int) -> int | None:
        """The lowest start among ranges of sizes in [best fit, best fit + slack]; None if none fits."""
        keys = self.keys
        i = bisect_left(keys, key)
        if i == len(keys):
            return None
        top, lowest = keys[i] + slack, None
        while i < len(keys) and keys[i] <= top:
            start = self._lowest_start(keys[i])
            if lowest is None or start < lowest:
                lowest = start
            i += 1
        return lowest

    def _lowest_start(self, key: int) -> int:
        heap, bucket = self.heaps[key], self.buckets[key]
        while heap[0] not in bucket:
            heappop(heap)
        return heap[0]

    def largest(self) -> tuple[int, int] | None:
        if not self.keys:
            return None
        key = self.keys[-1]
        return key, next(iter(self.buckets[key]))
