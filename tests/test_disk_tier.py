"""The KV disk tier's files (ms_atb/worker/disk_tier.py): blocks kept by one tier are found by another on the
same directory; every kind of damage is a miss with a one-line warning and the file is removed; entries appear
atomically; several writers and the budget hold across processes; the directory must be the user's own.
A numpy array plays the pool; the engine-level tests are in tests/test_disk_tier_engine.py."""
import os
import shutil
import stat
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from ms_atb.core.block_manager import BlockManager
from ms_atb.worker.disk_tier import DiskTier, read_key

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BS, BLOCK_BYTES, IDENTITY = 4, 1000, b"i" * 16


class ArrayPool:
    """KVPool's interface over one uint8 array [num_blocks, BLOCK_BYTES]."""

    def __init__(self, num_blocks=16, seed=0):
        self.blocks = np.random.default_rng(seed).integers(0, 256, (num_blocks, BLOCK_BYTES), dtype=np.uint8)
        self.block_bytes = BLOCK_BYTES

    def read(self, ids):
        return self.blocks[ids].copy()

    def write(self, block, data):
        self.blocks[block] = data


def open_tier(path, budget=1 << 30, identity=IDENTITY, **kw):
    return DiskTier(str(path), budget, identity, BS, BLOCK_BYTES, **kw)


def keep(tier, tokens, pool, extra_key=None):
    """A request of `tokens` computed into pool's blocks 0, 1, ... and its full blocks written to the tier."""
    bm = BlockManager(pool.blocks.shape[0], BS, enable_prefix_caching=True, tier=tier)
    bm.allocate("r", tokens, extra_key=extra_key)
    bm.commit("r", len(tokens))
    _, stores, _ = bm.take_transfers()
    tier.store_from(pool, stores)
    tier.flush()
    return bm.block_table("r"), stores


def find(tier, tokens, extra_key=None):
    """(tokens cached, pool after the loads): a fresh manager and pool on `tier` admitting `tokens`."""
    bm = BlockManager(16, BS, enable_prefix_caching=True, tier=tier)
    pool = ArrayPool(seed=1)
    cached = bm.allocate("r", tokens, extra_key=extra_key)
    loads, _, _ = bm.take_transfers()
    tier.load_into(pool, loads)
    return cached, pool, bm.block_table("r")


def files(path):
    return sorted((path / "blocks").iterdir())


PROMPT = list(range(100, 100 + 4 * BS + 1))       # 4 full blocks and one token


def test_blocks_kept_by_one_tier_load_into_another_pool(tmp_path):
    pool = ArrayPool()
    table, stores = keep(open_tier(tmp_path), PROMPT, pool)
    assert len(files(tmp_path)) == 4
    cached, other, new_table = find(open_tier(tmp_path), PROMPT)
    assert cached == 4 * BS
    for old, new in zip(table[:4], new_table[:4]):
        assert np.array_equal(other.blocks[new], pool.blocks[old])
    assert open_tier(tmp_path).stats()["disk_cache_written_blocks"] == 0
    assert {f.name for f in files(tmp_path)} == {f"{s.hash.hex()}.kv" for s in stores}


def test_a_block_already_kept_is_not_written_again(tmp_path):
    keep(open_tier(tmp_path), PROMPT, ArrayPool())
    tier = open_tier(tmp_path)
    keep(tier, PROMPT[:2 * BS + 1] + [7] * BS, ArrayPool(seed=3))   # blocks 0 and 1 read, block 2 new
    assert tier.stats()["disk_cache_written_blocks"] == 1 and len(files(tmp_path)) == 5
    bm = BlockManager(16, BS, enable_prefix_caching=True, tier=tier)
    bm.allocate("r", PROMPT, cache_lookup=False)              # computed again (as for prompt logprobs)
    bm.commit("r", len(PROMPT))
    tier.store_from(ArrayPool(seed=4), bm.take_transfers()[1])
    tier.flush()
    assert tier.stats()["disk_cache_written_blocks"] == 1 and len(files(tmp_path)) == 5


def test_another_identity_extra_key_or_prefix_misses_and_removes_nothing(tmp_path, capfd):
    keep(open_tier(tmp_path), PROMPT, ArrayPool(), extra_key="adapter-a")
    assert find(open_tier(tmp_path, identity=b"j" * 16), PROMPT, "adapter-a")[0] == 0
    assert find(open_tier(tmp_path), PROMPT, "adapter-b")[0] == 0
    assert find(open_tier(tmp_path), PROMPT)[0] == 0
    assert find(open_tier(tmp_path), [1] + PROMPT[1:], "adapter-a")[0] == 0
    assert find(open_tier(tmp_path), PROMPT[:2 * BS] + [5] + PROMPT[2 * BS + 1:], "adapter-a")[0] == 2 * BS
    assert len(files(tmp_path)) == 4 and capfd.readouterr().err == ""
    assert find(open_tier(tmp_path), PROMPT, "adapter-a")[0] == 4 * BS


def _flip(offset_from):
    def damage(path):
        data = bytearray(path.read_bytes())
        data[offset_from(len(data))] ^= 0x40
        path.write_bytes(bytes(data))
    return damage


DAMAGE = {
    "truncated": lambda path: os.truncate(path, path.stat().st_size - 10),
    "cut to nothing": lambda path: os.truncate(path, 0),
    "grown": lambda path: path.write_bytes(path.read_bytes() + b"\0"),
    "data byte flipped": _flip(lambda n: n - 1 - BLOCK_BYTES // 2),
    "header byte flipped": _flip(lambda n: 60),
    "token byte flipped": _flip(lambda n: n - BLOCK_BYTES - 16 - 3),
    "magic flipped": _flip(lambda n: 0),
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_every_kind_of_damage_misses_warns_in_one_line_and_removes_the_file(tmp_path, capfd, kind):
    _, stores = keep(open_tier(tmp_path), PROMPT, ArrayPool())
    third = tmp_path / "blocks" / f"{stores[2].hash.hex()}.kv"
    DAMAGE[kind](third)
    capfd.readouterr()
    tier = open_tier(tmp_path)
    assert find(tier, PROMPT)[0] == 2 * BS                    # blocks 0 and 1 load, block 2 is computed
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and str(third) in err and "Traceback" not in err, err
    assert not third.exists() and tier.stats()["disk_cache_damaged_blocks"] == 1
    assert find(open_tier(tmp_path), PROMPT)[0] == 2 * BS     # a plain miss now, no second warning
    assert capfd.readouterr().err == ""


def test_a_file_from_another_directory_is_refused(tmp_path, capfd):
    a, b = tmp_path / "a", tmp_path / "b"
    _, stores_a = keep(open_tier(a), PROMPT, ArrayPool())
    _, stores_b = keep(open_tier(b), PROMPT, ArrayPool())
    assert stores_a[0].hash != stores_b[0].hash              # each directory's key names its blocks
    first_b = b / "blocks" / f"{stores_b[0].hash.hex()}.kv"
    shutil.copy(a / "blocks" / f"{stores_a[0].hash.hex()}.kv", first_b)    # a's block 0 where b's lies
    capfd.readouterr()
    assert find(open_tier(b), PROMPT)[0] == 0
    err = capfd.readouterr().err
    assert "another directory's key" in err and err.count("\n") == 1 and not first_b.exists()


def test_a_directory_others_may_write_is_refused_naming_it(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o775)
    with pytest.raises(ValueError, match=f"kv_cache.disk_cache_dir '{shared}' is writable by group or others"):
        open_tier(shared)
    blocks = tmp_path / "mine" / "blocks"
    blocks.mkdir(parents=True)
    blocks.chmod(0o777)
    with pytest.raises(ValueError, match="blocks' is writable by group or others"):
        open_tier(tmp_path / "mine")
    fresh = tmp_path / "fresh"
    open_tier(fresh)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o700 and stat.S_IMODE((fresh / "key").stat().st_mode) == 0o600


def test_a_key_that_ms_atb_did_not_write_is_refused(tmp_path):
    open_tier(tmp_path)
    (tmp_path / "key").write_bytes(b"short")
    with pytest.raises(ValueError, match="not a key ms_atb wrote"):
        read_key(tmp_path)


_WRITER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    import test_disk_tier as t
    tier = t.open_tier({path!r}, budget={budget})
    for i in range({n}):
        t.keep(tier, [{start} + i] * (4 * t.BS + 1), t.ArrayPool(seed=i))
    print(tier.stats()["disk_cache_written_blocks"])
""")


def _writers(path, jobs, budget=1 << 30):
    """Runs one process per (start, n) at once, each keeping n prompts of 4 blocks; their written counts."""
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER.format(tests=os.path.join(ROOT, "tests"), path=str(path),
                                                                    budget=budget, n=n, start=start)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for start, n in jobs]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
    return [int(out.split()[-1]) for out, _ in outs]


@pytest.mark.slow
def test_two_writers_at_once_leave_sound_files_and_no_temporaries(tmp_path):
    written = _writers(tmp_path, [(0, 6), (3, 6)])          # prompts 3..5 written by both
    assert sum(written) >= 9 * 4 and len(files(tmp_path)) == 9 * 4
    assert all(f.suffix == ".kv" for f in files(tmp_path))
    tier = open_tier(tmp_path)
    for start in range(9):
        assert find(tier, [start] * (4 * BS + 1))[0] == 4 * BS
    assert tier.stats()["disk_cache_damaged_blocks"] == 0


@pytest.mark.slow
def test_the_budget_holds_across_processes_least_recently_used_first(tmp_path):
    _, stores = keep(open_tier(tmp_path / "probe"), [0] * (4 * BS + 1), ArrayPool())
    prompt_bytes = sum(f.stat().st_size for f in files(tmp_path / "probe"))
    budget = prompt_bytes * 5 // 2                            # 2.5 prompts of 4 blocks
    path = tmp_path / "t"
    _writers(path, [(0, 2)], budget)                          # prompts 0 and 1
    assert find(open_tier(path, budget), [0] * (4 * BS + 1))[0] == 4 * BS     # prompt 0 read: used last
    _writers(path, [(10, 1), (20, 1)], budget)                # two processes at once, 8 more blocks
    assert sum(f.stat().st_size for f in files(path)) <= budget
    assert int((path / "usage").read_text()) == sum(f.stat().st_size for f in files(path))
    tier = open_tier(path, budget)
    assert find(tier, [1] * (4 * BS + 1))[0] == 0             # prompt 1, the least recently used, went first
    assert BS <= find(tier, [0] * (4 * BS + 1))[0] < 4 * BS   # then prompt 0's tail, before its head
    assert [find(tier, [p] * (4 * BS + 1))[0] for p in (10, 20)] == [4 * BS, 4 * BS]


def test_a_full_queue_drops_blocks_instead_of_waiting(tmp_path):
    import fcntl
    tier = open_tier(tmp_path, max_pending_bytes=2 * BLOCK_BYTES)
    bm = BlockManager(16, BS, enable_prefix_caching=True, tier=tier)
    bm.allocate("r", PROMPT)
    bm.commit("r", len(PROMPT))
    with open(tmp_path / "lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)                    # the writer waits for the lock; the step does not
        tier.store_from(ArrayPool(), bm.take_transfers()[1])
        assert tier.stats()["disk_cache_dropped_blocks"] == 2
    tier.flush()
    assert tier.stats()["disk_cache_written_blocks"] == 2 and len(files(tmp_path)) == 2
