"""The op_host tiling of the AscendC kernels (ops/ascendc/op_host/ms_atb_plan.h, compiled for the CPU), as
ms_atb.ops.ascendc_tiling returns it: every shape of the kernel tests fits the assumed Atlas 800I A2 unified
buffer (and, for prefill on the Cube unit, its L1 / L0A / L0B / L0C), shapes too large for one pass are tiled,
not refused, and a context too long for the cores it would occupy is split across more."""
import pytest

from ms_atb.ops import ascendc_tiling
from test_ascendc_kernels import CONFIGS, LONG, MIXED

UB_CAPACITY = 192 * 1024   # per vector core
VECTOR_CORES, CUBE_CORES = 40, 20
L1, L0A, L0B, L0C = 512 * 1024, 64 * 1024, 64 * 1024, 128 * 1024   # per AI core


def align(n):
    return -(-n // 32) * 32


def attention_plan(h, kvh, d, bs, seqs, dtype="float16", cache_dtype=None):
    return ascendc_tiling("paged_attention", num_tokens=max(1, sum(q for _, q in seqs)), num_heads=h,
                          num_kv_heads=kvh, head_dim=d, block_size=bs, num_seqs=len(seqs),
                          max_context=max(c for c, _ in seqs), dtype=dtype, cache_dtype=cache_dtype or dtype)


def check_buffers(plan, d, elem=2, cache_elem=2):
    """The buffers are the sizes the kernel's InitBuffers take for the plan's tiles, and add up to ub_bytes (and,
    with the Cube, to l1_bytes / l0a_bytes / l0b_bytes / l0c_bytes) within the capacities."""
    rows, span = plan["q_tile"] * plan["head_tile"], plan["span"]
    vector = not plan["cube"]   # the Cube launch reads Q, K and V into L1, not the unified buffer ...
    reads_cache = vector or cache_elem == 1   # ... but its AIVs widen int8 rows for it
    assert plan["out_bytes"] == align(rows * d * elem) and plan["q_bytes"] == vector * plan["out_bytes"]
    assert plan["kv_bytes"] == reads_cache * align(span * d * cache_elem)
    assert plan["kv_f32_bytes"] == reads_cache * align(span * d * 4)
    assert plan["rows_f32_bytes"] == align(rows * d * 4) and plan["scores_bytes"] == align(rows * span * 4)
    assert plan["p_bytes"] == (align(rows * span * elem) if plan["cube"] else 0)
    assert plan["stage_bytes"] == (align(span * d * 2) if cache_elem == 1 else 0)
    total = (plan["q_bytes"] + 4 * plan["kv_bytes"] + plan["out_bytes"] + 2 * plan["rows_f32_bytes"]
             + 2 * plan["kv_f32_bytes"] + plan["scores_bytes"] + 4 * plan["stats_bytes"] + 2 * plan["work_bytes"]
             + plan["p_bytes"] + plan["stage_bytes"])
    assert total == plan["ub_bytes"] <= plan["ub_capacity"] == UB_CAPACITY
    assert (plan["l1_capacity"], plan["l0a_capacity"], plan["l0b_capacity"], plan["l0c_capacity"]) == (L1, L0A, L0B, L0C)
    if plan["cube"]:
        m = plan["rows_pad"]
        assert m % 16 == 0 and rows <= m < rows + 16
        assert plan["l1_bytes"] == m * d * elem + 2 * span * d * elem + m * span * elem <= L1
        assert plan["l0a_bytes"] == m * d * elem + m * span * elem <= L0A
        assert plan["l0b_bytes"] == 2 * span * d * elem <= L0B
        assert plan["l0c_bytes"] == m * span * 4 + m * d * 4 <= L0C
    else:
        assert plan["l1_bytes"] == plan["l0a_bytes"] == plan["l0b_bytes"] == plan["l0c_bytes"] == plan["rows_pad"] == 0
    assert plan["cores"] == (CUBE_CORES if plan["cube"] else VECTOR_CORES) and plan["vector_cores"] == VECTOR_CORES
    assert 1 <= plan["block_dim"] <= plan["cores"]
    assert plan["block_dim"] == min(plan["cores"], plan["base_items"] * plan["kv_splits"])
    assert plan["kv_splits"] == 1 or plan["base_items"] * plan["kv_splits"] <= plan["cores"]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_grid_shape_fits_the_unified_buffer(name, dtype):
    h, kvh, d, bs, _ = CONFIGS[name]
    for seqs in (MIXED, LONG, [(1, 1)], [(2048, 1)] * 8, [(2048, 512)]):
        seqs = [s for s in seqs if s[1]]
        plan = attention_plan(h, kvh, d, bs, seqs, dtype)
        check_buffers(plan, d)
        assert (h // kvh) % plan["head_tile"] == 0 and plan["span"] % 16 == 0
        assert plan["cube"] == (sum(q for _, q in seqs) > len(seqs))   # prefill chunks: the Cube
        if d % 32 == 0:
            quant = attention_plan(h, kvh, d, bs, seqs, dtype, "int8")
            check_buffers(quant, d, cache_elem=1)
            assert quant["cube"] == plan["cube"]   # int8 rows reach the Cube widened by the AIVs
            widened = 2 * align(quant["span"] * d * 2) if quant["cube"] else 0   # K and V [span, D] in 16 bits
            exchange = align(quant["rows_pad"] * quant["span"] * 4) + align(quant["rows_pad"] * quant["span"] * 2)
            assert quant["ws_core_bytes"] == (exchange + align(quant["rows_pad"] * d * 4) + widened if quant["cube"]
                                              else 0)


def test_decode_takes_one_query_per_item_and_prefill_tiles_queries():
    decode = attention_plan(32, 8, 128, 128, [(2048, 1)] * 4)
    assert (decode["q_tile"], decode["head_tile"], decode["block_dim"]) == (1, 4, 32)   # 4 sequences x 8 KV heads
    assert decode["kv_splits"] == 1 and decode["cube"] == 0 and decode["workspace_bytes"] == 0
    prefill = attention_plan(32, 8, 128, 128, [(2048, 2048)])
    assert prefill["q_tile"] == 16 and prefill["cube"] == 1 and prefill["block_dim"] == CUBE_CORES
    assert prefill["rows_pad"] == 64 and prefill["workspace_bytes"] == CUBE_CORES * prefill["ws_core_bytes"]


def test_one_sequence_splits_its_context_over_the_idle_cores():
    """1 sequence x 8 KV heads = 8 decode items for 40 vector cores: each context is cut into 5 parts of whole
    spans, one partial result (rows x D floats, max, sum) each in the workspace."""
    plan = attention_plan(32, 8, 128, 128, [(32768, 1)])
    assert (plan["base_items"], plan["kv_splits"], plan["block_dim"]) == (8, 5, 40)
    assert plan["partial_bytes"] == align(4 * 128 * 4) + 2 * plan["stats_bytes"]
    assert plan["workspace_bytes"] == 8 * 5 * plan["partial_bytes"]
    short = attention_plan(32, 8, 128, 16, [(48, 1)])   # one span: nothing to split
    assert short["kv_splits"] == 1 and short["block_dim"] == 8


def test_a_shape_too_large_for_one_pass_is_tiled_not_refused():
    # 64 query heads on one KV head with head_dim 256: on the vector unit (decode) even one query of the whole
    # group does not fit; on the Cube (prefill) it does, with a shorter span (L0B holds K and V of 64 tokens)
    shape = dict(num_heads=64, num_kv_heads=1, head_dim=256, block_size=128, max_context=32768, dtype="bfloat16")
    decode = ascendc_tiling("paged_attention", num_tokens=2, num_seqs=2, **shape)
    check_buffers(decode, 256)
    assert decode["head_tile"] < 64 and not decode["cube"]
    prefill = ascendc_tiling("paged_attention", num_tokens=8192, num_seqs=2, **shape)
    check_buffers(prefill, 256)
    assert prefill["cube"] and prefill["span"] == 64 and prefill["l0b_bytes"] == 2 * 64 * 256 * 2
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
    ("reshape_and_cache", dict(num_tokens=1, num_kv_heads=1, head_dim=16, dtype="float16", cache_dtype="int8"),
     r"no tiling .*head_dim \* element bytes % 32"),
    ("reshape_and_cache", dict(num_tokens=1, num_kv_heads=1, head_dim=16, dtype="float16", cache_dtype="bfloat16"),
     r"cache_dtype must be dtype \('float16'\) or 'int8', got 'bfloat16'"),
])
def test_bad_tiling_questions_are_value_errors(op, keywords, match):
    with pytest.raises(ValueError, match=match):
        ascendc_tiling(op, **keywords)
