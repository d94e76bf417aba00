"""The KV disk tier in the engine (kv_cache.disk_cache_dir) on the tiny model: blocks computed by one engine are
read back by a later one, in another process too, and the greedy tokens are those of recomputing; an engine whose
KV bytes would differ (model, dtype, cache dtype, block size, tensor-parallel layout) finds nothing; an int8
block comes back with its scales; a tight pool that preempts reads evicted blocks back and still gives the same
tokens; a directory others may write is refused before the build."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from ms_atb import LLM, SamplingParams
from ms_atb.config import EngineConfig
from engine_helpers import TINY_BUILD, TINY_CONFIG, with_buckets

GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)


def prompts(n=6, prefix_len=70, seed=0):
    rng = np.random.default_rng(seed)
    prefix = rng.integers(0, 500, prefix_len).tolist()
    return [prefix + rng.integers(0, 500, int(rng.integers(5, 40))).tolist() for _ in range(n)]


def engine(disk=None, **keywords):
    """A fresh tiny engine (with a tier in `disk`) that runs every step in one graph, its largest bucket: these
    tests build about twenty engines, and a graph per bucket met would be most of their time."""
    settings = {**TINY_BUILD, **keywords}
    if disk is not None:
        settings["disk_cache_dir"] = str(disk)
    llm = LLM(TINY_CONFIG, **settings)
    return with_buckets(llm, [llm.runner.max_num_batched_tokens])


def run(llm, batch, params=GREEDY):
    outs = llm.generate(batch, params, use_tqdm=False)
    llm.flush_disk_cache()
    return [o.token_ids for o in outs], [o.num_cached_tokens for o in outs], llm.stats()


def prefill_computed(batch, cached):
    return sum(len(p) - c for p, c in zip(batch, cached))


@pytest.fixture(scope="module")
def plain():
    """The tiny engine without a tier: the reference tokens."""
    return engine()


def test_a_later_engine_reads_the_blocks_and_gives_the_same_tokens(tmp_path, plain):
    batch = prompts()
    reference = run(plain, batch)[0]
    tokens, cached, stats = run(engine(tmp_path), batch)
    assert tokens == reference and stats["disk_cache_hit_tokens"] == 0 and stats["disk_cache_written_blocks"] > 0
    first = prefill_computed(batch, cached)
    tokens, cached, stats = run(engine(tmp_path), batch)
    assert tokens == reference
    assert stats["disk_cache_hit_tokens"] > 0 and stats["disk_cache_written_blocks"] == 0
    # every prompt's whole blocks come from the pool or the tier: only each prompt's last partial block is computed
    assert cached == [(len(p) - 1) // 16 * 16 for p in batch]
    assert prefill_computed(batch, cached) < first / 3


_PROCESS = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {tests!r})
    from test_disk_tier_engine import engine, prompts, run
    tokens, cached, stats = run(engine({disk!r}), prompts(seed=5))
    print(json.dumps([tokens, cached, stats["disk_cache_hit_tokens"], stats["disk_cache_written_blocks"]]))
""")


@pytest.mark.slow
def test_hits_across_processes(tmp_path, plain):
    def process():
        code = _PROCESS.format(tests=os.path.dirname(os.path.abspath(__file__)), disk=str(tmp_path))
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                              env={**os.environ, "MS_ATB_QUIET": "1"})
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])
    reference = run(plain, prompts(seed=5))[0]
    tokens, _, hits, written = process()                     # its pending writes reach the disk at exit
    assert tokens == reference and hits == 0 and written > 0
    tokens, cached, hits, written = process()
    assert tokens == reference and hits > 0 and written == 0
    assert cached == [(len(p) - 1) // 16 * 16 for p in prompts(seed=5)]


@pytest.mark.parametrize("change", [dict(model_path="random:tiny-llama?seed=1"),
                                    pytest.param(dict(dtype="float16"), marks=pytest.mark.slow),
                                    dict(cache_dtype="float16"), dict(cache_dtype="int8"), dict(block_size=8)],
                         ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_an_engine_whose_kv_would_differ_finds_nothing(tmp_path, change):
    batch = prompts(seed=1)
    run(engine(tmp_path), batch)
    keywords = {("path" if k == "model_path" else k): v for k, v in change.items()}
    tokens, _, stats = run(engine(tmp_path, **keywords), batch)
    assert stats["disk_cache_hit_tokens"] == 0 and stats["disk_cache_written_blocks"] > 0
    assert tokens == run(engine(**keywords), batch)[0]        # its own tokens, not the first engine's


def test_the_tensor_parallel_layout_is_part_of_the_identity(tmp_path):
    runner = engine(tmp_path).runner
    identities = set()
    for tp_size, tp_rank in ((1, 0), (2, 0), (2, 1), (4, 0)):
        runner.tp_size, runner.tp_rank = tp_size, tp_rank
        identities.add(runner.kv_identity())
    assert len(identities) == 4


def test_int8_blocks_come_back_with_their_scales(tmp_path):
    batch = prompts(seed=2)
    first = engine(tmp_path, cache_dtype="int8")
    reference = run(first, batch)[0]
    second = engine(tmp_path, cache_dtype="int8")
    tokens, cached, stats = run(second, batch)
    assert tokens == reference and stats["disk_cache_hit_tokens"] >= 64
    # the first prompt's leading blocks hold the same values and scales in both pools
    for name in ("key_caches", "value_caches", "key_scale_caches", "value_scale_caches"):
        for a, b in zip(getattr(first.runner.model, name), getattr(second.runner.model, name)):
            assert np.array_equal(_rows_of(first, a, batch[0]), _rows_of(second, b, batch[0])), name


def _rows_of(llm, cache, prompt):
    """The cache rows [64, ...] of prompt's first 4 blocks in llm's pool, found through its prefix cache."""
    bm = llm.scheduler.block_manager
    bm.allocate("probe", prompt)
    table = bm.block_table("probe")[:4]
    bm.free("probe")
    return cache.asnumpy()[table].reshape(64, -1)


def test_a_tight_pool_preempts_reads_back_evicted_blocks_and_gives_the_same_tokens(tmp_path, plain):
    batch = prompts(n=8, seed=3)
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    reference = run(plain, batch, params)[0]
    tight = engine(tmp_path, num_blocks=14)
    tokens, _, stats = run(tight, batch, params)
    assert stats["num_preemptions"] > 0 and stats["evictions"] > 0 and stats["disk_cache_hit_tokens"] > 0
    assert tokens == reference


def test_a_directory_others_may_write_is_refused_before_the_build(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(ValueError, match=f"kv_cache.disk_cache_dir '{shared}' is writable by group or others"):
        LLM.prepare(TINY_CONFIG, disk_cache_dir=str(shared))


@pytest.mark.parametrize("keywords, match", [
    (dict(enable_prefix_caching=False), "kv_cache.disk_cache_dir needs kv_cache.enable_prefix_caching: true"),
    (dict(device="npu"), "kv_cache.disk_cache_dir runs on the CPU only"),
    (dict(disk_cache_bytes="lots"), "kv_cache.disk_cache_bytes must be a byte count"),
    (dict(disk_cache_bytes=0), "kv_cache.disk_cache_bytes must be positive"),
])
def test_bad_disk_cache_settings_name_the_key(tmp_path, keywords, match):
    with pytest.raises(ValueError, match=match):
        EngineConfig.load(TINY_CONFIG, disk_cache_dir=str(tmp_path), **keywords)
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="kv_cache.disk_cache_dir must be a directory"):
        EngineConfig.load(TINY_CONFIG, disk_cache_dir=str(tmp_path / "file"))


def test_stats_without_a_tier_say_zero(plain):
    run(plain, prompts(n=2))
    stats = plain.stats()
    assert stats["disk_cache_hit_tokens"] == 0 and stats["disk_cache_written_blocks"] == 0
