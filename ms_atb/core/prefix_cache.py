"""PrefixCache: which blocks hold which committed content, and which free ones may be reused.

The BlockManager owns one and decides when blocks enter and leave it; this class keeps the
bookkeeping: a chained hash and the tokens of every registered block, every copy of each
content (one content may sit in several blocks: the same outputs, or a prompt computed
without a cache lookup), and the cached blocks no request holds, least recently freed first.
Pure Python, O(1) per block.
"""
from __future__ import annotations

import struct
from collections import OrderedDict

import xxhash


def hash_block(parent: bytes | None, token_ids) -> bytes:
    """Chained 128-bit hash of one full block: xxh3_128(parent hash + token ids)."""
    data = struct.pack(f"<{len(token_ids)}q", *token_ids)
    return xxhash.xxh3_128_digest((parent or b"") + data)


class PrefixCache:
    def __init__(self, num_blocks: int):
        self.block_hash: list[bytes | None] = [None] * num_blocks
        self.block_tokens: list[tuple | None] = [None] * num_blocks
        # hash -> the blocks holding that content, live ones first as far as release() can tell
        self.copies: dict[bytes, dict[int, None]] = {}
        self.lru: OrderedDict[int, None] = OrderedDict()   # cached blocks no request holds, oldest first

    def __len__(self) -> int:
        """Cached blocks that no request holds (reusable, or evictable)."""
        return len(self.lru)

    def lookup(self, token_ids, block_size: int) -> tuple[list[int], list[bytes]]:
        """The cached blocks of the longest run of whole leading blocks of token_ids, and their hashes.
        At least one token is left out. A copy right after the previous hit is taken first (contiguity),
        else the first copy (a live one when there is one); a hit is confirmed by comparing tokens."""
        hits, hashes, parent = [], [], None
        for i in range((len(token_ids) - 1) // block_size):
            chunk = token_ids[i * block_size:(i + 1) * block_size]
            parent = hash_block(parent, chunk)
            copies = self.copies.get(parent)
            if copies is None:
                break
            block = hits[-1] + 1 if hits and hits[-1] + 1 in copies else next(iter(copies))
            if self.block_tokens[block] != tuple(chunk):
                break
            hits.append(block)
            hashes.append(parent)
        return hits, hashes

    def register(self, block: int, h: bytes, tokens) -> None:
        """block holds the committed content h (tokens): later lookups may find it. A block keeps the
        first content it was registered with until it is evicted."""
        if self.block_hash[block] is None:
            self.copies.setdefault(h, {})[block] = None
            self.block_hash[block] = h
            self.block_tokens[block] = tuple(tokens)

    def release(self, block: int) -> bool:
        """No request holds block any more. True if it is cached (it joins the LRU queue, behind
        the live copies of its content); False if it holds nothing reusable."""
        h = self.block_hash[block]
        if h is None:
            return False
        self.lru[block] = None
        copies = self.copies[h]
        if len(copies) > 1:
            del copies[block]
            copies[block] = None
        return True

    def revive(self, block: int) -> None:
        """A hit takes the free cached block back: it leaves the LRU queue."""
        del self.lru[block]

    def evict_oldest(self) -> int:
        """Forgets the least recently freed cached block and returns it (now clean)."""
        block, _ = self.lru.popitem(last=False)
        h = self.block_hash[block]
        copies = self.copies[h]
        del copies[block]
        if not copies:
            del self.copies[h]
        self.block_hash[block] = None
        self.block_tokens[block] = None
        return block
