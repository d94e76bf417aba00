"""PrefixCache: which blocks hold which committed content, and which free ones may be reused.

The BlockManager owns one and decides when blocks enter and leave it; this class keeps the
bookkeeping: a chained hash, the tokens and the chain of every registered block, every copy of
each content (one content may sit in several blocks: the same outputs, or a prompt computed
without a cache lookup), and the cached blocks no request holds, least recently freed first.

Sharing is exact: a hash only finds candidates. A cached block is a hit only if its tokens compare
equal and its parent chain is the one the request matched so far (the very block it matched, or a
copy whose chain of tokens compares equal; none for a first block), so a colliding hash costs a miss,
never another prefix's KV. The hashes are keyed with a random secret of each PrefixCache (or the key of a
KV tier that several processes share, ms_atb/core/kv_tier.py), so that collisions cannot be crafted offline.
Pure Python, O(1) per block (a collision costs a scan of its copies).

The root of a chain. A first block's parent hash is None, unless the cache has a `root` (the identity of
the KV bytes, mixed in when a tier outside the process keeps blocks) or the request has an extra key (what
else its KV depends on besides its tokens, e.g. an adapter's name): then it is the keyed hash of both, and
the extra key also heads the block's chain, so requests of different extra keys never share a block, even
when every hash collides.
"""
from __future__ import annotations

import hashlib
import os
import struct
from collections import OrderedDict

# a block's chain: (parent's chain or None for a first block, its tokens); chains of live and cached
# blocks keep their ancestors' chains alive, so a chain is compared by value even after an eviction
Chain = tuple


def hash_block(parent: bytes | None, token_ids, key: bytes) -> bytes:
    """Chained, keyed 128-bit hash of one full block: BLAKE2b(parent hash + token ids) under key."""
    data = struct.pack(f"<{len(token_ids)}q", *token_ids)
    return hashlib.blake2b((parent or b"") + data, digest_size=16, key=key).digest()


def root_data(root: bytes, extra_key: str | None) -> bytes:
    """What a chain's root hashes: a tag, the cache's root and the request's extra key (None and "" differ)."""
    extra = b"-" if extra_key is None else b"+" + extra_key.encode()
    return b"ms_atb.root\0" + struct.pack("<I", len(root)) + root + extra


def _same_chain(a: Chain | None, b: Chain | None) -> bool:
    while a is not b:
        if a is None or b is None or a[1] != b[1]:
            return False
        a, b = a[0], b[0]
    return True


class PrefixCache:
    def __init__(self, num_blocks: int, key: bytes | None = None, root: bytes = b""):
        """key: the hashes' key (None: a random one of this cache); root: mixed into every chain's root."""
        self._key = os.urandom(16) if key is None else bytes(key)
        self._root = bytes(root)
        self.block_hash: list[bytes | None] = [None] * num_blocks
        self.block_tokens: list[tuple | None] = [None] * num_blocks
        self.block_chain: list[Chain | None] = [None] * num_blocks
        # hash -> the blocks holding that content, live ones first as far as release() can tell
        self.copies: dict[bytes, dict[int, None]] = {}
        self.lru: OrderedDict[int, None] = OrderedDict()   # cached blocks no request holds, oldest first

    def __len__(self) -> int:
        """Cached blocks that no request holds (reusable, or evictable)."""
        return len(self.lru)

    def hash(self, parent: bytes | None, token_ids) -> bytes:
        """The keyed hash of a full block whose parent block hashed to parent (None: a first block)."""
        return hash_block(parent, token_ids, self._key)

    def root(self, extra_key: str | None = None) -> tuple[bytes | None, Chain | None]:
        """The parent hash and the chain a request's first block hangs from (module docstring)."""
        if not self._root and extra_key is None:
            return None, None
        chain = None if extra_key is None else (None, ("extra_key", extra_key))
        return hash_block(root_data(self._root, extra_key), (), self._key), chain

    def lookup(self, token_ids, block_size: int, extra_key: str | None = None
               ) -> tuple[list[int], list[bytes]]:
        """The cached blocks of the longest run of whole leading blocks of token_ids, and their hashes.
        At least one token is left out. A copy right after the previous hit is taken first (contiguity),
        else the first copy (a live one when there is one); each is checked by its tokens and its chain."""
        hits, hashes = [], []
        parent, chain = self.root(extra_key)
        for i in range((len(token_ids) - 1) // block_size):
            chunk = tuple(token_ids[i * block_size:(i + 1) * block_size])
            parent = self.hash(parent, chunk)
            copies = self.copies.get(parent)
            if copies is None:
                break
            block = self._match(copies, hits[-1] + 1 if hits else -1, chain, chunk)
            if block is None:
                break
            hits.append(block)
            hashes.append(parent)
            chain = self.block_chain[block]
        return hits, hashes

    def _match(self, copies: dict[int, None], near: int, chain: Chain | None, chunk: tuple) -> int | None:
        """The copy that holds chunk after chain: near if it does, else the first that does."""
        if near in copies and self._holds(near, chain, chunk):
            return near
        for block in copies:
            if self._holds(block, chain, chunk):
                return block
        return None

    def _holds(self, block: int, chain: Chain | None, chunk: tuple) -> bool:
        own = self.block_chain[block]
        return own[1] == chunk and _same_chain(own[0], chain)

    def register(self, block: int, h: bytes, tokens, parent: int | None, root_chain: Chain | None = None) -> None:
        """block holds the committed content h (tokens), after the registered block parent (None: it is
        a request's first block, hanging from root_chain): later lookups may find it. A block keeps the
        first content it was registered with until it is evicted."""
        if self.block_hash[block] is None:
            parent_chain = root_chain if parent is None else self.block_chain[parent]
            assert parent is None or parent_chain is not None, "a block is registered after its parent"
            tokens = tuple(tokens)
            self.copies.setdefault(h, {})[block] = None
            self.block_hash[block] = h
            self.block_tokens[block] = tokens
            self.block_chain[block] = (parent_chain, tokens)

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
        self.block_chain[block] = None
        return block
