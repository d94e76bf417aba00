"""One KV block as a file of the disk tier (ms_atb/worker/disk_tier.py): its layout, writing one, and reading
one back with every check a block must pass before its bytes enter the pool.

Layout (little-endian):

    magic        8 bytes   b"MSATBKV1"
    fixed        32 bytes  header_bytes u32, data_bytes u64, num_tokens u32, extra_len i32 (-1: no extra key),
                           data_crc32 u32, reserved u64
    identity     16 bytes  what the KV bytes depend on (the tier's hash root)
    block_hash   16 bytes  the block's chained hash (its file's name)
    extra_key    extra_len bytes of UTF-8
    token_ids    int32 [num_tokens]: every token from the prompt's start through the block's end
    mac          16 bytes  BLAKE2b over everything above, keyed with the directory's key
    data         data_bytes: per layer, the block's K then V rows in the caches' layout [BS, KVH, D], then for
                 an int8 cache its K and V scales [BS, KVH] float32

A block is used only when all hold: the file is as long as its header says; the MAC verifies under this
directory's key (a file written under another directory's key, or a damaged header, fails it); the data's
CRC-32 matches (damaged data); identity, hash, extra key and every token equal the ones looked up. The tokens
of the whole prefix make a hit exact whatever the hashes do: a file of another prefix that happens to bear
the name is a plain miss. The CRC guards against damage, not against an adversary: the directory is the
user's own and closed to others (ops/trusted_cache.py), and the MAC ties the header to its key.
"""
from __future__ import annotations

import hashlib
import os
import struct
import zlib

import numpy as np

MAGIC = b"MSATBKV1"
_FIXED = struct.Struct("<IQIiIQ")                 # header_bytes, data_bytes, num_tokens, extra_len, crc, reserved
_IDS = 32                                          # identity + block hash
MAC_BYTES = 16
_PREFIX = len(MAGIC) + _FIXED.size + _IDS


class Damaged(Exception):
    """The file is not a sound block of this directory: the tier removes it."""


def header(identity: bytes, block_hash: bytes, extra_key: str | None, token_ids: np.ndarray, data: np.ndarray,
           key: bytes) -> bytes:
    """Magic, header and MAC of a block whose data is `data` (uint8 [data_bytes]); token_ids int32."""
    extra = b"" if extra_key is None else extra_key.encode()
    tokens = np.ascontiguousarray(token_ids, "<i4").tobytes()
    size = _PREFIX + len(extra) + len(tokens)
    head = b"".join([MAGIC, _FIXED.pack(size, data.nbytes, len(token_ids), -1 if extra_key is None else len(extra),
                                        zlib.crc32(data), 0), identity, block_hash, extra, tokens])
    return head + _mac(head, key)


def write(path, head: bytes, data: np.ndarray) -> None:
    """Writes head + data to path, a new file (FileExistsError if one is there)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        parts = [memoryview(head), memoryview(data).cast("B")]
        while parts:
            done = os.writev(fd, parts)
            while parts and done >= len(parts[0]):
                done -= len(parts[0])
                parts.pop(0)
            if parts:
                parts[0] = parts[0][done:]
    finally:
        os.close(fd)


def read(fd: int, size: int, key: bytes, data_bytes: int) -> tuple[np.ndarray, dict]:
    """The block in open file fd of `size` bytes: (data uint8 [data_bytes], its header's fields), checked for
    soundness (length, MAC, CRC); Damaged otherwise. Whether it is the block looked up is the caller's check."""
    if size < _PREFIX + MAC_BYTES:
        raise Damaged(f"truncated ({size} bytes)")
    buf = np.empty(size, np.uint8)
    view, got = memoryview(buf), 0
    while got < size:
        n = os.readv(fd, [view[got:]])
        if n == 0:
            raise Damaged(f"truncated while read ({got} of {size} bytes)")
        got += n
    raw = buf.data
    if bytes(raw[:len(MAGIC)]) != MAGIC:
        raise Damaged("not a KV block file (bad magic)")
    head_bytes, nbytes, num_tokens, extra_len, crc, _ = _FIXED.unpack_from(raw, len(MAGIC))
    if nbytes != data_bytes or head_bytes + MAC_BYTES + nbytes != size or extra_len < -1 or \
            head_bytes != _PREFIX + max(extra_len, 0) + 4 * num_tokens:
        raise Damaged(f"truncated or damaged ({size} bytes, header says {head_bytes} + {MAC_BYTES} + {nbytes})")
    if _mac(raw[:head_bytes], key) != bytes(raw[head_bytes:head_bytes + MAC_BYTES]):
        raise Damaged("header fails its MAC: damaged, or written under another directory's key")
    data = buf[head_bytes + MAC_BYTES:]
    if zlib.crc32(data) != crc:
        raise Damaged("data fails its CRC-32: damaged")
    at = len(MAGIC) + _FIXED.size
    extra_at = _PREFIX + max(extra_len, 0)
    fields = {"identity": bytes(raw[at:at + 16]), "hash": bytes(raw[at + 16:at + 32]),
              "extra_key": None if extra_len < 0 else bytes(raw[_PREFIX:extra_at]).decode("utf-8", "replace"),
              "token_ids": buf[extra_at:head_bytes].view("<i4")}
    return data, fields


def _mac(head, key: bytes) -> bytes:
    return hashlib.blake2b(head, digest_size=MAC_BYTES, key=key, person=b"ms_atb.kvblock").digest()
