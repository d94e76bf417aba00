"""The one reader of GGUF files (llama.cpp's format, v2 and v3, little-endian): metadata and tensor index.

Both the weights (gguf_reader.py) and the vocabulary (ms_atb/text/gguf_vocab.py) read GGUF through
this class. Rules it enforces, each broken one a ValueError that names the file and what is wrong:
  1. every count, length and offset fits in the bytes the file has: nothing is allocated or looped over
     for more items than the remaining bytes could hold;
  2. keys and tensor names are UTF-8 and unique; value types are GGUF's (0-12); arrays nest at most
     _MAX_DEPTH deep;
  3. general.alignment, when present, is an unsigned integer power of two;
  4. a tensor has 1-4 dims, each >= 1, a GGML type the `gguf` package knows, whole blocks per row, an
     offset aligned to general.alignment, and ends inside the file;
  5. typed getters (`get_int`, `get_str`...) refuse a value of another type, naming the key.
Metadata arrays are indexed, not decoded, until asked for (`get_array`): the embedded default's 49k-token
vocabulary costs nothing to the weights' reader. A file is parsed once per process while its header bytes stay
the same: a build opens it several times (config, tokenizer, shapes, weights), and skipping a 49k-string array
costs about 0.3 s of CPU; a later open hashes the header (about 2 ms) and reuses the index when it matches.
"""
from __future__ import annotations

import hashlib
import math
import os
import struct

import numpy as np

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}
_INT_TYPES = {0, 1, 2, 3, 4, 5, 10, 11}
_UINT_TYPES = {0, 2, 4, 10}
_STRING, _ARRAY = 8, 9
_MAX_DEPTH = 2                   # an array of arrays of scalars at most
_MAX_DIMS = 4                    # GGML_MAX_DIMS
_MIN_KV_BYTES = 8 + 4 + 1        # key length, value type, the smallest value
_MIN_TENSOR_BYTES = 8 + 4 + 8 + 4 + 8
_MEMO_FILES = 4                  # parsed headers kept per process
# realpath -> (file size, header digest, header bytes, version, fields, tensors)
_parsed: dict[str, tuple] = {}


def _digest(header) -> bytes:
    return hashlib.blake2b(header, digest_size=16).digest()


class _Malformed(ValueError):
    """What is wrong with the file; GGUFFile prefixes the file's path."""


class GGUFArray:
    """A metadata array, indexed but not decoded: `item_type` (a GGUF value type), `count`, byte `offset`."""
    __slots__ = ("item_type", "count", "offset")

    def __init__(self, item_type: int, count: int, offset: int):
        self.item_type, self.count, self.offset = item_type, count, offset

    def __len__(self) -> int:
        return self.count


class GGUFFile:
    """A GGUF file's metadata (`fields`: key -> scalar, str or GGUFArray) and tensor index
    (`tensors`: name -> (numpy-order shape, GGML type, absolute byte offset)), memory-mapped."""

    def __init__(self, path: str):
        self.path = str(path)
        try:
            self._mm = np.memmap(self.path, np.uint8, "r")
        except (OSError, ValueError) as e:    # a directory, no permission, an empty file
            raise ValueError(f"{self.path}: not a readable GGUF file ({e})") from None
        self._buf, self._pos = memoryview(self._mm), 0
        key = os.path.realpath(self.path)
        known = _parsed.get(key)
        if known is not None and known[0] == len(self._mm) and known[1] == _digest(self._buf[:known[2]]):
            self.version, self.fields, self.tensors = known[3:]      # shared, never mutated
            return
        try:
            self._parse()
        except _Malformed as e:
            raise ValueError(f"{self.path}: not a readable GGUF file ({e})") from None
        header = self._pos
        _parsed.pop(key, None)
        while len(_parsed) >= _MEMO_FILES:
            _parsed.pop(next(iter(_parsed)))
        _parsed[key] = (len(self._mm), _digest(self._buf[:header]), header, self.version, self.fields,
                        self.tensors)

    # ------------------------------------------------------------ parsing

    def _parse(self):
        if len(self._mm) < 24 or bytes(self._buf[:4]) != b"GGUF":
            raise _Malformed("no GGUF header (a GGUF file starts with the bytes 'GGUF')")
        self._pos = 4
        self.version = self._read("<I", "the version")
        if self.version not in (2, 3):
            raise _Malformed(f"GGUF version {self.version} is not supported (allowed: 2, 3)")
        n_tensors, n_kv = self._read("<Q", "the tensor count"), self._read("<Q", "the metadata count")
        self._fits(n_kv, _MIN_KV_BYTES, "metadata entries")
        self.fields = {}
        for _ in range(n_kv):
            key = self._read_str("a metadata key", strict=True)
            if key in self.fields:
                raise _Malformed(f"metadata key {key!r} appears twice")
            vtype = self._read("<I", f"the type of {key}")
            self.fields[key] = self._read_value(vtype, key, 0)
        self._fits(n_tensors, _MIN_TENSOR_BYTES, "tensor descriptions")
        infos = []
        for _ in range(n_tensors):
            name = self._read_str("a tensor name", strict=True)
            n_dims = self._read("<I", f"the dims of tensor {name}")
            if not 1 <= n_dims <= _MAX_DIMS:
                raise _Malformed(f"tensor {name} has {n_dims} dims (allowed: 1 to {_MAX_DIMS})")
            dims = [self._read("<Q", f"the dims of tensor {name}") for _ in range(n_dims)]  # innermost first
            qtype, offset = self._read("<I", f"the type of tensor {name}"), self._read("<Q", f"tensor {name}")
            infos.append((name, dims, qtype, offset))
        align = self._alignment()
        data_start = -(-self._pos // align) * align
        self.tensors = {}
        for name, dims, qtype, offset in infos:
            if name in self.tensors:
                raise _Malformed(f"tensor {name} appears twice")
            if min(dims) < 1:
                raise _Malformed(f"tensor {name} has a dim of {min(dims)} (dims must be >= 1)")
            if offset % align:
                raise _Malformed(f"tensor {name} starts at offset {offset}, not a multiple of the "
                                 f"alignment {align}")
            shape, start = tuple(reversed(dims)), data_start + offset                # numpy order
            end = start + self._nbytes(name, shape, qtype)
            if end > len(self._mm):
                raise _Malformed(f"tensor {name} ends at byte {end}, past the end of the file "
                                 f"({len(self._mm)} bytes): the file is truncated")
            self.tensors[name] = (shape, qtype, start)

    def _alignment(self) -> int:
        align = self.fields.get("general.alignment", 32)
        if type(align) is not int or align < 1 or align & (align - 1):
            raise _Malformed(f"general.alignment is {align!r}; it must be a power of two (default 32)")
        return align

    @staticmethod
    def _nbytes(name: str, shape: tuple, qtype: int) -> int:
        import gguf
        try:
            block, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(qtype)]
        except (ValueError, KeyError):
            raise _Malformed(f"tensor {name} has type {qtype}, which no GGML type has") from None
        if shape[-1] % block:
            raise _Malformed(f"tensor {name} has rows of {shape[-1]} values, not whole blocks of {block} "
                             f"(type {gguf.GGMLQuantizationType(qtype).name})")
        return math.prod(shape[:-1]) * (shape[-1] // block * nbytes)

    def _fits(self, count: int, min_bytes: int, what: str):
        left = len(self._mm) - self._pos
        if count * min_bytes > left:
            raise _Malformed(f"{count} {what} cannot fit in the {left} bytes left at byte {self._pos}")

    def _read(self, fmt: str, what: str):
        size = struct.calcsize(fmt)
        if self._pos + size > len(self._mm):
            raise _Malformed(f"the file ends at byte {len(self._mm)}, inside {what}: it is truncated")
        v = struct.unpack_from(fmt, self._buf, self._pos)[0]
        self._pos += size
        return v

    def _read_str(self, what: str, strict: bool = False) -> str:
        n = self._read("<Q", what)
        if self._pos + n > len(self._mm):
            raise _Malformed(f"{what} of {n} bytes at byte {self._pos} runs past the end of the file "
                             f"({len(self._mm)} bytes)")
        raw = bytes(self._buf[self._pos:self._pos + n])
        self._pos += n
        try:
            return raw.decode("utf-8", errors="strict" if strict else "replace")
        except UnicodeDecodeError:
            raise _Malformed(f"{what} at byte {self._pos - n} is not UTF-8") from None

    def _read_value(self, vtype: int, key: str, depth: int):
        if vtype in _SCALARS:
            return self._read(_SCALARS[vtype], f"the value of {key}")
        if vtype == _STRING:
            return self._read_str(f"the value of {key}")
        if vtype != _ARRAY:
            raise _Malformed(f"metadata {key} has value type {vtype}, which GGUF does not define (0-12)")
        if depth >= _MAX_DEPTH:
            raise _Malformed(f"metadata {key} nests arrays deeper than {_MAX_DEPTH}")
        itype, n = self._read("<I", f"the item type of {key}"), self._read("<Q", f"the length of {key}")
        array = GGUFArray(itype, n, self._pos)
        if itype in _SCALARS:
            size = struct.calcsize(_SCALARS[itype])
            self._fits(n, size, f"items of {key}")
            self._pos += n * size
        elif itype == _STRING:
            self._fits(n, 8, f"strings of {key}")
            end = len(self._mm)
            for _ in range(n):                        # skipped here; decoded by get_array
                if self._pos + 8 > end:
                    raise _Malformed(f"the file ends inside {key}: it is truncated")
                self._pos += 8 + struct.unpack_from("<Q", self._buf, self._pos)[0]
                if self._pos > end:
                    raise _Malformed(f"a string of {key} runs past the end of the file ({end} bytes)")
        elif itype == _ARRAY:
            self._fits(n, 12, f"arrays of {key}")
            for _ in range(n):
                self._read_value(_ARRAY, key, depth + 1)
        else:
            raise _Malformed(f"metadata {key} is an array of type {itype}, which GGUF does not define (0-12)")
        return array

    # ------------------------------------------------------------ typed access

    def _bad(self, key: str, want: str, value) -> ValueError:
        got = f"an array of {len(value)}" if isinstance(value, GGUFArray) else repr(value)
        return ValueError(f"{self.path}: metadata {key} must be {want}, got {got}")

    def get_int(self, key: str, default=None, minimum: int | None = None):
        v = self.fields.get(key)
        if v is None:
            return default
        if type(v) is not int or (minimum is not None and v < minimum):
            raise self._bad(key, "an integer" + ("" if minimum is None else f" >= {minimum}"), v)
        return v

    def get_float(self, key: str, default=None):
        v = self.fields.get(key)
        if v is None:
            return default
        if type(v) not in (int, float) or not math.isfinite(v):
            raise self._bad(key, "a finite number", v)
        return v

    def get_bool(self, key: str, default=None):
        v = self.fields.get(key)
        if v is None:
            return default
        if type(v) is not bool and v not in (0, 1):
            raise self._bad(key, "true or false", v)
        return bool(v)

    def get_str(self, key: str, default=None):
        v = self.fields.get(key)
        if v is None:
            return default
        if type(v) is not str:
            raise self._bad(key, "a string", v)
        return v

    def get_array(self, key: str, kind: str, default=None) -> list | None:
        """The array `key` decoded: kind "str" (strings), "int" (integers) or "number" (ints or floats)."""
        v = self.fields.get(key)
        if v is None:
            return default
        ok = {"str": {_STRING}, "int": _INT_TYPES, "number": set(_SCALARS) - {7}}[kind]
        if not isinstance(v, GGUFArray) or v.item_type not in ok:
            raise self._bad(key, f"an array of {kind}s", v)
        if v.item_type != _STRING:
            return np.frombuffer(self._buf, _SCALARS[v.item_type], v.count, v.offset).tolist()
        out, pos, buf = [], v.offset, self._buf
        for _ in range(v.count):
            n = struct.unpack_from("<Q", buf, pos)[0]
            out.append(bytes(buf[pos + 8:pos + 8 + n]).decode("utf-8", errors="replace"))
            pos += 8 + n
        return out

    # ------------------------------------------------------------ tensors

    def shape(self, name: str) -> tuple:
        return self.tensors[name][0]

    def raw(self, name: str) -> tuple:
        """(rows as stored: a [..., bytes_per_row] uint8 view for quantized types, qtype)."""
        import gguf
        shape, qtype, start = self.tensors[name]
        qtype = gguf.GGMLQuantizationType(qtype)
        block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
        row_bytes = shape[-1] // block * nbytes
        n_rows = math.prod(shape[:-1])
        data = self._mm[start:start + n_rows * row_bytes].reshape(shape[:-1] + (row_bytes,))
        return data, qtype
