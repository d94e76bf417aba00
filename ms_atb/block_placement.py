"""Size index of the block manager's free ranges: best-fit look-ups in O(log n)."""
from __future__ import annotations

from bisect import bisect_left, insort


class SizeIndex:
    """Range starts bucketed by a size key; keys kept sorted (few distinct sizes)."""

    def __init__(self):
        self.buckets: dict[int, dict[int, None]] = {}
        self.keys: list[int] = []

    def add(self, key: int, start: int) -> None:
        bucket = self.buckets.get(key)
        if bucket is None:
            self.buckets[key] = {start: None}
            insort(self.keys, key)
        else:
            bucket[start] = None

    def remove(self, key: int, start: int) -> None:
        bucket = self.buckets[key]
        del bucket[start]
        if not bucket:
            del self.buckets[key]
            del self.keys[bisect_left(self.keys, key)]

    def smallest_at_least(self, key: int) -> int | None:
        i = bisect_left(self.keys, key)
        return next(iter(self.buckets[self.keys[i]])) if i < len(self.keys) else None

    def near_fits(self, key: int, slack: int, limit: int) -> list[tuple[int, int]]:
        """Up to limit (size, start) pairs, smallest first, of sizes in [best fit, best fit + slack]."""
        keys, out = self.keys, []
        i = bisect_left(keys, key)
        if i == len(keys):
            return out
        top = keys[i] + slack
        while i < len(keys) and keys[i] <= top and len(out) < limit:
            for start in self.buckets[keys[i]]:
                out.append((keys[i], start))
                if len(out) == limit:
                    break
            i += 1
        return out

    def largest(self) -> tuple[int, int] | None:
        if not self.keys:
            return None
        key = self.keys[-1]
        return key, next(iter(self.buckets[key]))
