"""WeightCache: a model's weights as the model holds them (re-laid in panels, dequantised, fused), kept on disk
between runs beside the compiled graphs (context.compile_cache, in its `weights/` folder), so a later run
maps them instead of converting the model file again.

- one entry per key, which hashes everything the held weights depend on (graph_cache.cache_key): ms_atb's
  sources, MindSpore's and Python's versions, the model file(s) (path, size, mtime), the model's config, dtype,
  weight formats, device and tensor-parallel rank. Weights computed rather than read (random:<preset> models) are not kept;
- an entry is two files: `<key>.bin`, every weight's bytes back to back (each at a multiple of ALIGN bytes),
  and `<key>.json`, its index (the key, the data's size, and each weight's name, dtype, shape and offset).
  Each is written under a temporary name and renamed into place, the index last, so a reader never sees a
  partial entry; an entry's files are never written in place (published by rename, evicted by unlink);
- a loaded model's weights stay memory-mapped from `<key>.bin` (copy-on-write, so the file is never
  changed): nothing is copied at start, a page is read from the OS's page cache when first used, and the
  processes of one model share those pages. (A file truncated in place under a running engine, by hand,
  would make its next read of a lost page fail: the engine never does that.)
- an entry is used only when its index names exactly the model's weights, with their dtypes and shapes, and
  the data file has the recorded size; any other (torn, stale, foreign) is removed with a warning, and the
  weights are read from the model file and saved afresh;
- the cache's root and its `weights/` folder follow rule 1 of ops/trusted_cache.py (the user's own, closed to
  others' writes; created 0o700). An entry is data read as raw bytes, never code nor a pickle: it is
  size-checked, not hashed (a sha256 over SmolLM2's 204 MiB of held weights costs 0.17 s of CPU, ten times
  what mapping them costs). The data file is opened once, never through a link, and the file mapped is the
  one whose size was checked; temporaries of dead processes are swept (trusted_cache.sweep_dead_temps);
- the folder keeps the MAX_ENTRIES entries used last (an entry's index is touched when it loads).
"""
from __future__ import annotations

import json
import os
import threading
import warnings
from pathlib import Path

import numpy as np

FORMAT = 2                 # bump when the entry layout or the key changes
MAX_ENTRIES = 8
ALIGN = 64                 # each weight starts at a multiple of 64 bytes: aligned for every dtype and vector load
_DTYPES = ("float32", "float16", "int8", "uint8", "int32")    # numpy dtypes an entry may hold


class WeightCache:
    """`cache.load(weights)` fills {name: Parameter} from the entry and says whether it did; after the
    weights were read from the model file, `cache.save(weights)` publishes them.

    `status`: "off" (no root, or weights not read from a file), "missing" (no entry yet), "loaded", "saving"
    (being written: wait()), "saved", or "failed (...)" (an entry that did not load or save; the weights come from
    the model file)."""

    def __init__(self, root: str | None, parts: dict | None):
        """parts: everything the held weights depend on besides ms_atb's and MindSpore's code; None: not
        cacheable (weights computed, not read)."""
        self.folder = self.key = None
        self.status = "off"
        self._writer: threading.Thread | None = None
        if root and parts is not None:
            from ms_atb.ops.trusted_cache import private_dir
            root = private_dir(os.path.expanduser(root), "context.compile_cache")
            self.folder = private_dir(root / "weights", "context.compile_cache")
            self.key = cache_key(parts)
            self.status = "missing"

    @property
    def data_path(self) -> Path:
        return self.folder / f"{self.key}.bin"

    @property
    def index_path(self) -> Path:
        return self.folder / f"{self.key}.json"

    def load(self, weights: dict) -> bool:
        """weights {name: Parameter}: each filled from the entry when it holds exactly them; else False."""
        if self.folder is None:
            return False
        _wait_for(self.key)                     # an entry this process is writing: read it once it is written
        if not self.index_path.is_file():
            return False
        import mindspore as ms
        try:
            with open(self.data_path, "rb", opener=_no_link) as f:
                entries = self._check(weights, os.fstat(f.fileno()).st_size)
                data = np.memmap(f, np.uint8, "c")             # copy-on-write: the file is never written
            for name, dtype, shape, offset, nbytes in entries:
                weights[name].set_data(ms.from_numpy(data[offset:offset + nbytes].view(dtype).reshape(shape)))
            del data
            os.utime(self.index_path)                          # used last: kept by the eviction
        except (OSError, ValueError) as e:
            self._fail("load", e)
            return False
        self.status = "loaded"
        return True

    def _check(self, weights: dict, size: int) -> list:
        """The index's (name, dtype, shape, offset, bytes) list; ValueError when it does not describe these
        weights or the data file's size (`size`) differs."""
        from ms_atb.ops.trusted_cache import read_file
        try:
            index = json.loads(read_file(self.index_path))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"index is not JSON ({e})") from None
        if not isinstance(index, dict) or index.get("key") != self.key or index.get("format") != FORMAT:
            raise ValueError("index of another key or format")
        try:
            entries = [(n, d, tuple(s), o) for n, d, s, o in index["weights"]]
        except (KeyError, TypeError, ValueError):
            raise ValueError("index has no list of [name, dtype, shape, offset] weights") from None
        want = {name: (_dtype_name(p), tuple(p.shape)) for name, p in weights.items()}
        if {n: (d, s) for n, d, s, _ in entries} != want or len(entries) != len(want):
            raise ValueError("index names other weights, dtypes or shapes than the model's")
        if size != index.get("bytes"):
            raise ValueError(f"data file holds {size} bytes, the index records {index.get('bytes')}")
        checked = []
        for name, dtype, shape, offset in entries:
            nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
            if type(offset) is not int or offset < 0 or offset % ALIGN or offset + nbytes > size:
                raise ValueError(f"weight {name} at offset {offset!r} does not lie in the data file")
            checked.append((name, dtype, shape, offset, nbytes))
        return checked

    def save(self, weights: dict) -> None:
        """Publishes weights {name: Parameter} as this key's entry (data, then index: see the module docstring).
        The bytes are written by a thread of its own, so that a start does not wait for the disk (a 7B model's
        entry takes seconds to write): status is "saving" until it is done, the interpreter waits for it before
        it exits, and wait() joins it. It reads the weights' own memory, which nothing writes after a load."""
        if self.folder is None:
            return
        if any(_dtype_name(p) not in _DTYPES for p in weights.values()):
            self.status = "off"                # bfloat16: numpy cannot hold it
            return
        arrays = [(name, np.ascontiguousarray(p.asnumpy())) for name, p in weights.items()]   # views, no copies
        _wait_for(self.key)                     # one writer of an entry at a time in a process
        self.status = "saving"
        self._writer = threading.Thread(target=self._write, args=(arrays,), name="ms_atb weight cache")
        _SAVING[self.key] = self._writer
        self._writer.start()

    def wait(self) -> str:
        """The status once a save under way has finished."""
        if self._writer is not None:
            self._writer.join()
        return self.status

    def _write(self, arrays: list) -> None:
        from ms_atb.ops.trusted_cache import sweep_dead_temps
        sweep_dead_temps(self.folder)
        pid = os.getpid()
        data_tmp, index_tmp = (self.folder / f"{p.name}.tmp-{pid}" for p in (self.data_path, self.index_path))
        entries, offset = [], 0
        try:
            for tmp in (data_tmp, index_tmp):   # a name of this pid left by a dead process: created anew, never
                tmp.unlink(missing_ok=True)     # opened through a link
            with open(data_tmp, "xb") as f:
                for name, array in arrays:
                    f.write(array.data)
                    entries.append([name, str(array.dtype), list(array.shape), offset])
                    offset += array.nbytes
                    pad = -offset % ALIGN
                    f.write(bytes(pad))
                    offset += pad
            with open(index_tmp, "x") as f:
                f.write(json.dumps({"format": FORMAT, "key": self.key, "bytes": offset, "weights": entries}))
            os.replace(data_tmp, self.data_path)
            os.replace(index_tmp, self.index_path)
        except OSError as e:                    # a full or read-only disk: the run goes on without the entry
            self._fail("save", e)
            return
        finally:
            for tmp in (data_tmp, index_tmp):
                tmp.unlink(missing_ok=True)
        self.status = "saved"
        self._evict()

    def _fail(self, what: str, e: Exception) -> None:
        self.status = f"failed ({what}: {e})"
        warnings.warn(f"weight cache entry {self.index_path} could not {what} ({e}); removed, the weights are "
                      f"read from the model file", RuntimeWarning, stacklevel=3)
        for path in (self.index_path, self.data_path):
            path.unlink(missing_ok=True)

    def _evict(self) -> None:
        """Removes the entries past the MAX_ENTRIES used last."""
        indexes = sorted(self.folder.glob("*.json"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
        for index in indexes[MAX_ENTRIES:]:
            index.unlink(missing_ok=True)
            index.with_suffix(".bin").unlink(missing_ok=True)


_SAVING: dict = {}          # key -> the thread writing that entry in this process


def _wait_for(key: str) -> None:
    writer = _SAVING.pop(key, None)
    if writer is not None:
        writer.join()


def cache_key(parts: dict) -> str:
    """The graph cache's key (sources, MindSpore, Python) over parts and this entry layout's FORMAT."""
    from ms_atb.worker import graph_cache
    return graph_cache.cache_key({"weight_cache_format": FORMAT, **parts})


def _no_link(path, flags):
    return os.open(path, flags | os.O_NOFOLLOW)


def _dtype_name(param) -> str:
    """A Parameter's dtype as numpy names it ("float32", "int8"...); "bfloat16" has no numpy dtype."""
    return str(param.dtype).lower()
