"""ModelRunner on random:tiny-llama with hand-built steps: the shared tiny engine's runner (conftest.py; 64-token
cap, 8 sequences, 96 blocks of 16, max_model_len 512), driven directly."""
import time
from types import SimpleNamespace

import numpy as np
import pytest

import numpy_llama as nl
from ms_atb.worker.model_runner import kv_cache_bytes_per_block, token_buckets
from ms_atb.models.weights import iter_weights

BS = 16


def make_step(seqs):
    """seqs: list of (request id, block table, context_len, new tokens)."""
    step = SimpleNamespace(request_ids=[], token_ids=[], positions=[], slot_mapping=[], block_tables=[],
                           context_lens=[], query_start_loc=[0])
    for rid, table, ctx, toks in seqs:
        step.request_ids.append(rid)
        step.token_ids += toks
        step.positions += list(range(ctx - len(toks), ctx))
        step.slot_mapping += [table[p // BS] * BS + p % BS for p in range(ctx - len(toks), ctx)]
        step.block_tables.append(table)
        step.context_lens.append(ctx)
        step.query_start_loc.append(step.query_start_loc[-1] + len(toks))
    return step


@pytest.fixture(scope="module")
def runner(tiny_engine):
    """Its KV cache is dropped afterwards (the steps here write blocks the engine's scheduler does not know)."""
    yield tiny_engine.runner
    tiny_engine.reset_scheduler()


@pytest.fixture(scope="module")
def weights(runner):
    return dict(iter_weights(runner.model_path, runner.model_config))


def test_token_buckets():
    assert token_buckets(24) == [1, 2, 4, 8, 16, 24]
    assert token_buckets(16) == [1, 2, 4, 8, 16]
    assert token_buckets(1) == [1]
    assert token_buckets(64) == [1, 2, 4, 8, 16, 32, 64]
    assert token_buckets(200) == [1, 2, 4, 8, 16, 32, 64, 128, 192, 200]
    assert token_buckets(512) == [1, 2, 4, 8, 16, 32, 64, 128, 192, 256, 320, 384, 448, 512]
    assert token_buckets(2048)[-9:] == [512, 640, 768, 896, 1024, 1280, 1536, 1792, 2048]
    for cap in (1, 7, 64, 100, 513, 4096, 8192):  # sorted, distinct, end at the cap, pad above 64 by <= 25%
        b = token_buckets(cap)
        assert b == sorted(set(b)) and b[-1] == cap and len(b) <= 7 + 4 * max(0, (cap // 64).bit_length())
        assert all(hi - lo <= max(64, lo // 4) for lo, hi in zip(b, b[1:]) if lo >= 64)


def test_kv_cache_bytes_per_block(runner):
    c = runner.model_config  # 2 layers, 2 KV heads, head_dim 16
    assert kv_cache_bytes_per_block(c, 16, "float32") == 2 * 2 * 16 * 2 * 16 * 4
    assert kv_cache_bytes_per_block(c, 16, "float16", tp_size=2) == 2 * 2 * 16 * 1 * 16 * 2


def test_prepare_pads_to_the_bucket(runner):
    step = make_step([("a", [3, 7], 20, list(range(1, 11))), ("b", [9], 3, [7, 8, 9])])
    (ids, pos, slots, tables, lens, qsl), num_seqs = runner.prepare(step)
    assert num_seqs == 2 and len(ids) == 16 and tables.shape == (8, 32)  # T 13 -> bucket 16, B -> min(16, 8)
    assert list(slots) == ([3 * 16 + p for p in range(10, 16)] + [7 * 16 + p for p in range(4)] + [144, 145, 146]
                           + [-1] * 3)
    step = make_step([("a", [3, 7], 20, list(range(1, 6)))])
    (ids, pos, slots, tables, lens, qsl), _ = runner.prepare(step)       # T 5 -> bucket 8, B -> min(8, 8)
    assert list(slots[5:]) == [-1] * 3 and list(ids[5:]) == [0] * 3
    assert list(lens) == [20] + [0] * 7 and list(qsl) == [0] + [5] * 8
    assert tables.tolist() == [[3, 7] + [0] * 30] + [[0] * 32] * 7     # 512 / 16 blocks a row


def test_step_errors(runner):
    with pytest.raises(ValueError, match="above max_num_batched_tokens 64"):
        runner.prepare(make_step([("a", [0, 1, 2, 3, 4], 65, list(range(65)))]))
    with pytest.raises(ValueError, match="above max_num_seqs 8"):
        runner.prepare(make_step([(str(i), [i], 1, [1]) for i in range(9)]))
    with pytest.raises(ValueError, match="block table 0 has 33 blocks"):
        runner.prepare(make_step([("a", list(range(33)), 1, [1])]))


def test_warmup_compiles_every_bucket_then_steps_match_numpy(runner, weights):
    stats = runner.warmup()
    assert stats["graphs"] == len(runner.buckets) == 7 and stats["seconds"] > 0
    rng = np.random.default_rng(0)
    a, b = list(rng.integers(0, 512, 18)), list(rng.integers(0, 512, 5))
    ta, tb = [11, 2], [6]
    compiled, compile_seconds, executing = set(runner.compiled), runner.compile_seconds, 0.0

    def execute(step):
        nonlocal executing
        start = time.perf_counter()
        out = runner.execute(step)
        executing += time.perf_counter() - start
        return out

    logits = execute(make_step([("a", ta, 18, a), ("b", tb, 5, b)]))  # T 23 -> bucket 32
    for _ in range(3):
        assert logits.shape == (2, 512) and logits.dtype == np.float32
        for row, toks in zip(logits, (a, b)):
            assert np.abs(row - nl.forward(weights, runner.model_config, toks)[-1]).max() < 1e-4
        a.append(int(np.argmax(logits[0])))
        b.append(int(np.argmax(logits[1])))
        logits = execute(make_step([("a", ta, len(a), a[-1:]), ("b", tb, len(b), b[-1:])]))
    # No compilation after warmup: the four steps together take less than the quickest of this runner's graph
    # compiles (whenever they ran: another test may have needed the buckets first; timed in this process, so a
    # loaded host slows both sides).
    assert runner.compiled == compiled and runner.compile_seconds == compile_seconds
    quickest = min(seconds for _, seconds in runner.graph_log)
    assert executing < quickest, (executing, runner.graph_log)
