"""IdIndex: a set of item ids in a flat 24 bytes each, so a million-line job's ids cost 24 MB, not a Python set.

Rules:
  1. An id is kept as the 128-bit BLAKE2b digest of its JSON text (7 and "7" differ) and one integer the caller
     chooses (a line number, a file offset), in insertion order. Two ids collide with probability ~2^-128 per pair.
  2. Lookups need freeze() after the last add(); freeze() sorts once and keeps the first insertion of a digest
     as the one found.
"""
from __future__ import annotations

import hashlib
import json
from array import array

_DIGEST = "S16"


def id_digest(item_id) -> bytes:
    """The 16-byte digest of an id (a string, an int, or a ("line", N) tuple)."""
    text = json.dumps(item_id, ensure_ascii=True)          # ASCII: a lone surrogate is escaped, never encoded
    return hashlib.blake2b(text.encode("ascii"), digest_size=16).digest()


class IdIndex:
    def __init__(self):
        self._digests = bytearray()
        self._where = array("q")
        self._sorted = None       # numpy [N] S16, ascending (numpy is imported only here: the command starts fast)
        self._order = None        # numpy [N] int64: insertion index of each sorted digest

    def __len__(self) -> int:
        return len(self._where)

    def add(self, item_id, where: int) -> None:
        assert self._sorted is None, "add() after freeze()"
        self._digests += id_digest(item_id)
        self._where.append(where)

    def freeze(self) -> tuple[int, int] | None:
        """Sorts the index; returns the `where` of the first repeated id and of its repeat (by the repeat's
        insertion order), or None when every id is distinct."""
        import numpy as np
        digests = np.frombuffer(bytes(self._digests), dtype=_DIGEST)            # [N]
        order = np.argsort(digests, kind="stable")                                 # [N]
        self._sorted, self._order = digests[order], order
        same = np.flatnonzero(self._sorted[1:] == self._sorted[:-1])             # [D] later copy at same + 1
        if same.size == 0:
            return None
        repeat = same[np.argmin(order[same + 1])]         # the repeat inserted first
        return self._where[order[repeat]], self._where[order[repeat + 1]]

    def find(self, item_id) -> int | None:
        """The `where` of the id's first insertion, or None."""
        k = self.ordinal(item_id)
        return None if k is None else self._where[k]

    def ordinal(self, item_id) -> int | None:
        """The insertion index of the id's first insertion, or None."""
        i = self._position(item_id)
        return None if i is None else int(self._order[i])

    def where(self, ordinal: int) -> int:
        return self._where[ordinal]

    def firsts(self):
        """numpy bool [N]: True for each entry that is its id's first insertion."""
        import numpy as np
        if self._sorted is None:
            self.freeze()
        first = np.ones(len(self), dtype=bool)
        repeat = np.flatnonzero(self._sorted[1:] == self._sorted[:-1]) + 1      # sorted positions of later copies
        first[self._order[repeat]] = False
        return first

    def __contains__(self, item_id) -> bool:
        return self._position(item_id) is not None

    def _position(self, item_id) -> int | None:
        if self._sorted is None:
            self.freeze()
        import numpy as np
        key = np.array([id_digest(item_id)], dtype=_DIGEST)
        i = int(np.searchsorted(self._sorted, key)[0])
        return i if i < len(self._sorted) and self._sorted[i:i + 1] == key else None

    def positions(self):
        """Insertion indices [N] in sorted-digest order (for callers that walk the index)."""
        if self._sorted is None:
            self.freeze()
        return self._order
