"""ms_atb.ops against the numpy references, inside graph-mode Cells (static and dynamic shapes)."""
import os
import subprocess
import sys
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn, ops

from ms_atb.ops import PagedAttention, ReshapeAndCache, build
from ops_reference import paged_attention_ref, reshape_and_cache_ref

ms.set_context(mode=ms.GRAPH_MODE)

# (num_heads, num_kv_heads, head_dim, block_size, num_blocks): GQA ratios 1, 3, 4; block sizes 16, 32
CONFIGS = {"mha": (4, 4, 16, 16, 300), "gqa3": (9, 3, 64, 16, 300), "gqa4": (8, 2, 32, 32, 160)}


class Attend(nn.Cell):
    """paged_attention alone, over caches held as Parameters."""

    def __init__(self, h, kvh, d, bs, nb, dtype=np.float32):
        super().__init__()
        self.key_cache = Parameter(Tensor(np.zeros((nb, bs, kvh, d), dtype)), name="key_cache")
        self.value_cache = Parameter(Tensor(np.zeros((nb, bs, kvh, d), dtype)), name="value_cache")
        self.pa = PagedAttention(h, kvh, d, d ** -0.5)

    def construct(self, query, block_tables, context_lens, query_start_loc):
        return self.pa(query, self.key_cache, self.value_cache, block_tables, context_lens, query_start_loc)


class Step(nn.Cell):
    """One layer's cache write then attention, as a model does it."""

    def __init__(self, h, kvh, d, bs, nb):
        super().__init__()
        self.key_cache = Parameter(Tensor(np.zeros((nb, bs, kvh, d), np.float32)), name="key_cache")
        self.value_cache = Parameter(Tensor(np.zeros((nb, bs, kvh, d), np.float32)), name="value_cache")
        self.rc = ReshapeAndCache()
        self.pa = PagedAttention(h, kvh, d, d ** -0.5)

    def construct(self, query, key, value, slot_mapping, block_tables, context_lens, query_start_loc):
        done = self.rc(key, value, self.key_cache, self.value_cache, slot_mapping)
        query = ops.depend(query, done)
        return self.pa(query, self.key_cache, self.value_cache, block_tables, context_lens, query_start_loc)


def dynamic(cell, ndims):
    cell.set_inputs(*(Tensor(shape=[None] * n, dtype=dt) for n, dt in ndims))
    return cell


I32 = ms.int32


def attend_cell(name, dtype=np.float32):
    h, kvh, d, bs, nb = CONFIGS[name]
    cell = Attend(h, kvh, d, bs, nb, dtype)
    mdt = ms.float32 if dtype == np.float32 else ms.float16
    return dynamic(cell, [(3, mdt), (2, I32), (1, I32), (1, I32)])


def make_batch(rng, name, seqs, layout, pad_rows=0, seed_tables=None):
    """seqs: (context_len, num_queries) per sequence ((0, 0) = padded sequence) -> numpy inputs."""
    h, kvh, d, bs, nb = CONFIGS[name]
    need = [(c + bs - 1) // bs for c, _ in seqs]
    maxb = max(need) + 1
    ids = np.arange(nb) if layout == "contiguous" else rng.permutation(nb)
    tables = np.full((len(seqs), maxb), -1, np.int32)  # unused columns hold -1: never read
    pos = 0
    for b, n in enumerate(need):
        tables[b, :n] = ids[pos:pos + n]
        pos += n
    assert pos <= nb
    qsl = np.concatenate([[0], np.cumsum([q for _, q in seqs])]).astype(np.int32)
    query = rng.standard_normal((int(qsl[-1]) + pad_rows, h, d)).astype(np.float32)
    lens = np.array([c for c, _ in seqs], np.int32)
    return query, tables, lens, qsl


def run_attend(cell, query, tables, lens, qsl):
    return cell(Tensor(query), Tensor(tables), Tensor(lens), Tensor(qsl)).asnumpy()


def random_caches(rng, cell, dtype=np.float32):
    kc = rng.standard_normal(cell.key_cache.shape).astype(dtype)
    vc = rng.standard_normal(cell.value_cache.shape).astype(dtype)
    cell.key_cache.set_data(Tensor(kc))
    cell.value_cache.set_data(Tensor(vc))
    return kc, vc


MIXED = [(1, 1), (17, 1), (16, 1), (300, 1), (40, 40), (100, 37), (48, 16), (0, 0), (33, 2), (2048, 1)]


@pytest.fixture(scope="module")
def cells():
    return {name: attend_cell(name) for name in CONFIGS}


@pytest.mark.parametrize("layout", ["contiguous", "scattered"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_paged_attention_matches_reference(cells, name, layout):
    rng = np.random.default_rng([list(CONFIGS).index(name), len(layout)])
    cell = cells[name]
    kc, vc = random_caches(rng, cell)
    seqs = MIXED if name == "gqa3" else MIXED[:-1] + [(700, 1)]  # 2048 tokens once is enough
    query, tables, lens, qsl = make_batch(rng, name, seqs, layout, pad_rows=3)
    out = run_attend(cell, query, tables, lens, qsl)
    ref = paged_attention_ref(query, kc, vc, tables, lens, qsl, CONFIGS[name][2] ** -0.5)
    assert np.abs(out - ref).max() <= 1e-5
    assert not out[qsl[-1]:].any()  # padded rows are zero


def test_sequence_result_independent_of_batch(cells):
    rng = np.random.default_rng(1)
    cell = cells["gqa3"]
    random_caches(rng, cell)
    query, tables, lens, qsl = make_batch(rng, "gqa3", [(100, 37)], "scattered")
    alone = run_attend(cell, query, tables, lens, qsl)
    others = make_batch(rng, "gqa3", [(5, 1), (64, 64), (900, 1)], "contiguous")
    # the same sequence placed second, after other sequences, with different table widths
    q2 = np.concatenate([others[0][:1], query, others[0][1:]])
    t2 = np.full((4, 60), -1, np.int32)
    t2[0, :1], t2[2, :4], t2[3, :57] = others[1][0, :1], others[1][1, :4], others[1][2, :57]
    t2[1, :tables.shape[1]] = tables[0]
    lens2 = np.array([5, 100, 64, 900], np.int32)
    qsl2 = np.array([0, 1, 38, 102, 103], np.int32)
    mixed = run_attend(cell, q2, t2, lens2, qsl2)
    assert np.array_equal(mixed[1:38], alone)


def test_a_prompt_rows_result_does_not_depend_on_how_the_prompt_is_chunked(cells):
    """A prompt computed whole, or in chunks of two or more rows (each chunk a sequence over the same blocks, its
    context ending at the chunk's end), gives every row bit for bit the same output: a prefix hit, which computes
    only the rows after it, then gives the tokens of recomputing the whole prompt."""
    rng = np.random.default_rng(7)
    cell = cells["gqa3"]
    random_caches(rng, cell)
    query, tables, lens, qsl = make_batch(rng, "gqa3", [(150, 150)], "scattered")
    whole = run_attend(cell, query, tables, lens, qsl)
    cuts = [0, 2, 5, 40, 72, 74, 148, 150]               # chunks of 2, 3, 35, 32, 2, 74 and 2 rows
    chunked = run_attend(cell, query, np.repeat(tables, len(cuts) - 1, axis=0), np.array(cuts[1:], np.int32),
                         np.array(cuts, np.int32))
    assert np.array_equal(chunked, whole)


def test_float16_caches():
    rng = np.random.default_rng(2)
    cell = attend_cell("gqa4", np.float16)
    kc, vc = random_caches(rng, cell, np.float16)
    query, tables, lens, qsl = make_batch(rng, "gqa4", [(70, 5), (3, 1)], "scattered", pad_rows=1)
    query = query.astype(np.float16)
    out = run_attend(cell, query, tables, lens, qsl)
    assert out.dtype == np.float16
    ref = paged_attention_ref(query, kc, vc, tables, lens, qsl, 32 ** -0.5)
    assert np.abs(out.astype(np.float64) - ref).max() <= 4e-3


def prefill_then_decode(cell, rng, h, kvh, d, bs):
    """A 20-token prompt in blocks [5, 2], then two decode steps; each step writes then attends."""
    table = np.array([[5, 2, 7]], np.int32)
    n = 22
    q = rng.standard_normal((n, h, d)).astype(np.float32)
    k = rng.standard_normal((n, kvh, d)).astype(np.float32)
    v = rng.standard_normal((n, kvh, d)).astype(np.float32)
    slots = np.array([table[0, p // bs] * bs + p % bs for p in range(n)], np.int32)
    kc = np.zeros(cell.key_cache.shape, np.float32)
    vc = np.zeros(cell.value_cache.shape, np.float32)
    for lo, hi in [(0, 20), (20, 21), (21, 22)]:
        # one padding token (slot -1, outside every sequence) rides along in each step
        pad = lambda x: np.concatenate([x[lo:hi], np.ones_like(x[:1])])
        s = np.concatenate([slots[lo:hi], [-1]]).astype(np.int32)
        lens, qsl = np.array([hi], np.int32), np.array([0, hi - lo], np.int32)
        out = cell(*(Tensor(x) for x in (pad(q), pad(k), pad(v), s, table, lens, qsl))).asnumpy()
        kc, vc = reshape_and_cache_ref(pad(k), pad(v), kc, vc, s)
        assert np.array_equal(cell.key_cache.asnumpy(), kc)  # in place; slot -1 skipped
        assert np.array_equal(cell.value_cache.asnumpy(), vc)
        ref = paged_attention_ref(pad(q), kc, vc, table, lens, qsl, d ** -0.5)
        assert np.abs(out - ref).max() <= 1e-5
        assert not out[-1].any()


def test_write_then_attend_static_shapes():
    h, kvh, d, bs = 4, 2, 16, 16
    prefill_then_decode(Step(h, kvh, d, bs, 8), np.random.default_rng(3), h, kvh, d, bs)


def test_write_then_attend_dynamic_shapes():
    h, kvh, d, bs = 8, 2, 32, 16
    cell = dynamic(Step(h, kvh, d, bs, 8), [(3, ms.float32)] * 3 + [(1, I32), (2, I32), (1, I32), (1, I32)])
    prefill_then_decode(cell, np.random.default_rng(4), h, kvh, d, bs)


def test_reshape_and_cache_skips_negative_slots_and_keeps_other_slots():
    rng = np.random.default_rng(5)
    cell = Step(4, 2, 16, 16, 4)
    kc = rng.standard_normal(cell.key_cache.shape).astype(np.float32)
    cell.key_cache.set_data(Tensor(kc))
    cell.value_cache.set_data(Tensor(kc))
    k = rng.standard_normal((3, 2, 16)).astype(np.float32)
    slots = np.array([63, -1, 17], np.int32)
    cell(Tensor(np.zeros((3, 4, 16), np.float32)), Tensor(k), Tensor(k), Tensor(slots),
         Tensor(np.zeros((1, 1), np.int32)), Tensor(np.array([0], np.int32)), Tensor(np.array([0, 0], np.int32)))
    expected, _ = reshape_and_cache_ref(k, k, kc, kc, slots)
    assert np.array_equal(cell.key_cache.asnumpy(), expected)


def test_bad_block_table_is_an_error_not_a_crash(cells):
    cell = cells["mha"]
    query = np.zeros((1, 4, 16), np.float32)
    with pytest.raises(RuntimeError):
        run_attend(cell, query, np.array([[10**6]], np.int32), np.array([1], np.int32), np.array([0, 1], np.int32))


def test_constructor_errors():
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        PagedAttention(4, 3, 16, 0.25)
    with pytest.raises(ValueError, match="device"):
        PagedAttention(4, 2, 16, 0.25, device="gpu")
    with pytest.raises(ValueError, match="device"):
        ReshapeAndCache(device="tpu")


def test_npu_dispatch_builds_mindspore_ops():
    assert type(ReshapeAndCache(device="npu", backend="mindspore").op).__name__ == "ReshapeAndCache"
    assert type(PagedAttention(4, 2, 16, 0.25, device="npu", backend="mindspore").op).__name__ == "PagedAttention"


def test_missing_compiler_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler-xyz")
    with pytest.raises(RuntimeError, match="install g\\+\\+"):
        build.find_compiler()


def test_cache_key_covers_cpu_and_sources(monkeypatch):
    compiler = build.find_compiler()
    key = build.cache_key(compiler)
    assert build.cache_key(compiler) == key
    monkeypatch.setattr(build, "cpu_signature", lambda: "another cpu")
    assert build.cache_key(compiler) != key
    monkeypatch.setattr(build, "FLAGS", build.FLAGS + ("-DX",))
    assert len({key, build.cache_key(compiler)}) == 2


def test_a_damaged_cached_library_is_rebuilt_not_loaded(tmp_path, monkeypatch):
    good = build.kernel_library()
    assert build.is_complete_elf(Path(good))
    data = Path(good).read_bytes()
    monkeypatch.setenv("MS_ATB_KERNEL_CACHE", str(tmp_path))
    target = tmp_path / f"ms_atb_kernels_{build.cache_key(build.find_compiler())}.so"
    built = []
    monkeypatch.setattr(build, "compile_library", lambda t: (built.append(t), Path(t).write_bytes(data)))
    for damaged in (data[:1000], data[:-1], b"garbage", b""):    # torn copies load as SIGBUS or dlopen errors
        target.write_bytes(damaged)
        assert not build.is_complete_elf(target)
        assert build.kernel_library.__wrapped__() == str(target) and built.pop() == target
        assert target.read_bytes() == data
    assert build.kernel_library.__wrapped__() == str(target) and not built       # a whole one is kept


def test_temporary_libraries_of_dead_builds_are_swept(tmp_path, monkeypatch):
    old, fresh = tmp_path / "ms_atb_kernels_x.a1.tmp.so", tmp_path / "ms_atb_kernels_x.b2.tmp.so"
    for f in (old, fresh):
        f.write_bytes(b"half a library")
    os.utime(old, (os.path.getmtime(old) - build.STALE_BUILD_S - 60,) * 2)
    monkeypatch.setattr(build, "find_compiler", lambda: "/bin/false")      # the build itself fails at once
    with pytest.raises(RuntimeError, match="compiling the ms_atb kernels failed"):
        build.compile_library(tmp_path / "ms_atb_kernels_x.so")
    assert not old.exists() and fresh.exists() and sorted(os.listdir(tmp_path)) == [fresh.name]


def test_an_unusable_kernel_cache_is_a_clear_error(tmp_path):
    (tmp_path / "afile").write_text("")
    with pytest.raises(ValueError, match=r"the kernel cache \(MS_ATB_KERNEL_CACHE\) '.*afile/sub' is not a usable "
                                         r"directory"):
        build.compile_library(tmp_path / "afile" / "sub" / "k.so")


# Each process builds one kernel source (seconds, where the whole library takes minutes), after both have
# arrived at the barrier folder argv[1]: both look for the library at once, so both build it.
_RACE = """
import functools, os, sys, time
from pathlib import Path
from ms_atb.ops import build
build.compile_library = functools.partial(build.compile_library, sources=("elementwise.cc",))
barrier = Path(sys.argv[1])
(barrier / str(os.getpid())).touch()
while len(os.listdir(barrier)) < 2:
    time.sleep(0.01)
print(build.kernel_library())
"""


@pytest.mark.slow
def test_racing_processes_share_one_cache(tmp_path):
    cache, barrier = tmp_path / "cache", tmp_path / "barrier"
    barrier.mkdir()
    env = dict(os.environ, MS_ATB_KERNEL_CACHE=str(cache))
    procs = [subprocess.Popen([sys.executable, "-c", _RACE, str(barrier)], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    paths = {p.communicate(timeout=300)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    library = os.path.basename(paths.pop())
    assert not paths and sorted(os.listdir(cache)) == [library, library + ".sha256"]   # and its recorded hash
