"""The op_host tiling of the AscendC kernels (ops/ascendc/op_host/ms_atb_plan.h, compiled for the CPU), as
ms_atb.ops.ascendc_tiling returns it: every shape of the kernel tests fits the assumed Atlas 800I A2 unified
buffer, and shapes too large for one pass are tiled, not refused."""
import pytest

from ms_atb.ops import ascendc_tiling
from test_ascendc_kernels import CONFIGS, LONG, MIXED

UB_CAPACITY = 192 * 1024   # per vector core
VECTOR_CORES = 40


def align(n):
    return -(-n // 32) * 32


def attention_plan(h, kvh, d, bs, seqs, dtype="float16"):
    return ascendc_tiling("paged_attention", num_tokens=max(1, sum(q for _, q in seqs)), num_heads=h,
                          num_kv_heads=kvh, head_dim=d, block_size=bs, num_seqs=len(seqs),
                          max_context=max(c for c, _ in seqs), dtype=dtype)


def check_buffers(plan, d, elem=2):
    """The buffers are the sizes the kernel's InitBuffers take for the plan's tiles, and add up to ub_bytes."""
    rows = plan["q_tile"] * plan["head_tile"]
    assert plan["q_bytes"] == plan["out_bytes"] == align(rows * d * elem)
    assert plan["kv_bytes"] == align(plan["span"] * d * elem) and plan["kv_f32_bytes"] == align(plan["span"] * d * 4)
    assert plan["rows_f32_bytes"] == align(rows * d * 4) and plan["scores_bytes"] == align(rows * plan["span"] * 4)
    total = (plan["q_bytes"] + 4 * plan["kv_bytes"] + plan["out_bytes"] + 2 * plan["rows_f32_bytes"]
             + 2 * plan["kv_f32_bytes"] + plan["scores_bytes"] + 4 * plan["stats_bytes"] + 2 * plan["work_bytes"])
    assert total == plan["ub_bytes"] <= plan["ub_capacity"] == UB_CAPACITY
    assert 1 <= plan["block_dim"] <= plan["vector_cores"] == VECTOR_CORES


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_grid_shape_fits_the_unified_buffer(name, dtype):
    h, kvh, d, bs, _ = CONFIGS[name]
    for seqs in (MIXED, LONG, [(1, 1)], [(2048, 1)] * 8, [(2048, 512)]):
        plan = attention_plan(h, kvh, d, bs, [s for s in seqs if s[1]], dtype)
        check_buffers(plan, d)
        assert (h // kvh) % plan["head_tile"] == 0 and plan["span"] % 16 == 0


def test_decode_takes_one_query_per_item_and_prefill_tiles_queries():
    decode = attention_plan(32, 8, 128, 128, [(2048, 1)] * 4)
    assert (decode["q_tile"], decode["head_tile"], decode["block_dim"]) == (1, 4, 32)   # 4 sequences x 8 KV heads
    prefill = attention_plan(32, 8, 128, 128, [(2048, 2048)])
    assert prefill["q_tile"] == 16 and prefill["block_dim"] == VECTOR_CORES


def test_a_shape_too_large_for_one_pass_is_tiled_not_refused():
    # 64 query heads on one KV head with head_dim 256: even one query of the whole group does not fit
    plan = ascendc_tiling("paged_attention", num_tokens=8192, num_heads=64, num_kv_heads=1, head_dim=256,
                          block_size=128, num_seqs=2, max_context=32768, dtype="bfloat16")
    check_buffers(plan, 256)
    assert plan["head_tile"] < 64 and plan["span"] < 32768
    rows = ascendc_tiling("reshape_and_cache", num_tokens=3, num_kv_heads=64, head_dim=2048, dtype="float16")
    assert rows["chunk_elems"] < 64 * 2048 and (64 * 2048) % rows["chunk_elems"] == 0
    assert rows["ub_bytes"] == 2 * rows["chunk_bytes"] <= UB_CAPACITY and rows["block_dim"] == 3


@pytest.mark.parametrize("op, keywords, match", [
    ("flash", {}, r"op must be one of \['paged_attention', 'reshape_and_cache'\]"),
    ("reshape_and_cache", dict(num_tokens=1, num_kv_heads=1, head_dim=16), r"missing \['dtype'\]"),
    ("reshape_and_cache", dict(num_tokens=1, num_kv_heads=1, head_dim=16, dtype="float32"),
     "dtype must be 'float16' or 'bfloat16'"),
    ("reshape_and_cache", dict(num_tokens=0, num_kv_heads=1, head_dim=16, dtype="float16"),
     "num_tokens must be an integer >= 1"),
    ("reshape_and_cache", dict(num_tokens=1, num_kv_heads=1, head_dim=8, dtype="float16"),
     r"no tiling .*head_dim \* element bytes % 32"),
])
def test_bad_tiling_questions_are_value_errors(op, keywords, match):
    with pytest.raises(ValueError, match=match):
        ascendc_tiling(op, **keywords)
