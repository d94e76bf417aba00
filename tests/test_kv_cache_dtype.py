"""kv_cache.cache_dtype: the config leaf, the sizing arithmetic (values plus int8 scales), and the engine on the
tiny model with an int8 cache: greedy tokens against the float32 numpy model, a prefix-cache hit against
recomputing, a block's scales moving with it through sharing, eviction and preemption."""
import os

import numpy as np
import pytest

from ms_atb import LLM, SamplingParams
from ms_atb.config import EngineConfig, resolve_cache_dtype
from ms_atb.models.llama import LlamaConfig
from ms_atb.worker.model_runner import kv_cache_bytes_per_block
from engine_helpers import tiny_logits, with_buckets

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "tiny_llama.yaml")
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
# SmolLM2-135M's shape: 30 layers, 3 KV heads of 64
SMOLLM2 = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, head_dim=64)


@pytest.mark.parametrize("value, match", [
    ("fp8", r"kv_cache.cache_dtype must be one of \['auto', 'float32', 'float16', 'bfloat16', 'int8'\], "
            r"got 'fp8'"),
    ("float64", r"kv_cache.cache_dtype must be one of .*got 'float64'"),
    (8, "kv_cache.cache_dtype must be a string, got 8"),
])
def test_cache_dtype_validation(value, match):
    with pytest.raises(ValueError, match=match):
        EngineConfig.load(TINY, cache_dtype=value)


def test_auto_is_float16_on_the_cpu_and_the_model_dtype_elsewhere():
    """float32 keeps float32 rows (the bit-exact choice); auto halves them on the CPU."""
    assert EngineConfig.load(TINY, cache_dtype="float32").kv_cache.cache_dtype == "float32"
    assert resolve_cache_dtype("auto", "float32", "cpu") == "float16"
    assert resolve_cache_dtype("auto", "float32", "npu:1") == "float32"
    assert resolve_cache_dtype("auto", "bfloat16", "npu") == "bfloat16"
    assert resolve_cache_dtype("float32", "float32", "cpu") == "float32"
    assert LLM.prepare(TINY, num_blocks=8).stats()["cache_dtype"] == "float16"


def test_cache_dtype_other_than_the_model_dtype_is_cpu_only():
    with pytest.raises(ValueError, match="kv_cache.cache_dtype 'int8' runs on the CPU only"):
        EngineConfig.load(TINY, cache_dtype="int8", device="npu")
    assert EngineConfig.load(TINY, cache_dtype="auto", device="npu").kv_cache.cache_dtype == "auto"
    assert EngineConfig.load(TINY).kv_cache.cache_dtype == "auto"


def test_bytes_per_block_count_values_and_scales():
    per_row = {"float32": 64 * 4, "float16": 64 * 2, "bfloat16": 64 * 2, "int8": 64 + 4}   # one (token, KV head)
    for cache_dtype, row in per_row.items():
        assert kv_cache_bytes_per_block(SMOLLM2, 16, "float32", 1, cache_dtype) == 2 * 30 * 16 * 3 * row
    assert kv_cache_bytes_per_block(SMOLLM2, 16, "float16", 1, "auto") == 2 * 30 * 16 * 3 * 128
    assert kv_cache_bytes_per_block(SMOLLM2, 16, "float32", 1, "auto") == 2 * 30 * 16 * 3 * 128      # the CPU
    assert kv_cache_bytes_per_block(SMOLLM2, 16, "float32", 1, "auto", device="npu") == 2 * 30 * 16 * 3 * 256
    assert kv_cache_bytes_per_block(SMOLLM2, 16, "float32") == 2 * 30 * 16 * 3 * 256    # None: the model's dtype
    assert kv_cache_bytes_per_block(SMOLLM2, 16, "float32", 3, "int8") == 2 * 30 * 16 * 1 * 68   # one KV head a rank


@pytest.mark.parametrize("budget", [2**30, 100 * 2**20, 7 * 10**6])
def test_int8_holds_3_5x_the_tokens_of_float32_and_1_8x_those_of_float16(budget):
    tokens = {d: budget // kv_cache_bytes_per_block(SMOLLM2, 16, "float32", 1, d) * 16
              for d in ("float32", "float16", "int8")}
    assert tokens["int8"] >= 3.5 * tokens["float32"] and tokens["int8"] >= 1.8 * tokens["float16"]


def test_the_budget_sizes_the_pool_by_the_cache_dtype(capsys):
    f32 = LLM.prepare(TINY, num_blocks="auto", memory_budget="1MiB", cache_dtype="float32")
    i8 = LLM.prepare(TINY, num_blocks="auto", memory_budget="1MiB", cache_dtype="int8")
    # tiny model: 2 layers, 2 KV heads of 16 -> 4 * 16 * 2 * 16 * (4 | 1 + 4 / 16) bytes a block
    assert f32.kv_bytes_per_block == 2 * 2 * 16 * 2 * 16 * 4 and i8.kv_bytes_per_block == 2 * 2 * 16 * 2 * 20
    assert f32.num_blocks == 2**20 // 8192 and i8.num_blocks == 2**20 // 2560
    assert "KV cache (int8 + float32 scales): memory_budget 1048576 bytes / 2560 bytes per block" in \
        capsys.readouterr().out
    stats = i8.stats()
    assert (stats["cache_dtype"], stats["bytes_per_block"], stats["num_blocks"]) == ("int8", 2560, 409)
    assert f32.stats()["cache_dtype"] == "float32"


@pytest.fixture(scope="module")
def llm():
    return with_buckets(LLM(TINY, max_num_batched_tokens=64, max_num_seqs=8, num_blocks=48, cache_dtype="int8",
                            precompile=False), [64])      # one graph: every step padded to 64 tokens


def numpy_greedy(prompt, n):
    tokens = list(prompt)
    for _ in range(n):
        tokens.append(int(np.argmax(tiny_logits(tokens)[-1])))
    return tokens[len(prompt):]


def prompts_with_shared_prefix(n, prefix_len=40, seed=0):
    rng = np.random.default_rng(seed)
    prefix = rng.integers(0, 500, prefix_len).tolist()
    return [prefix + rng.integers(0, 500, int(rng.integers(1, 30))).tolist() for _ in range(n)]


def test_int8_cache_parameters_and_greedy_tokens(llm):
    model = llm.runner.model
    assert str(model.key_caches[0].dtype) == "Int8" and tuple(model.key_scale_caches[0].shape) == (48, 16, 2)
    prompts = [[1, 2, 3, 4, 5], list(range(100, 170))]     # the 70-token prompt is chunked
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == numpy_greedy(prompt, 12)


def cached_blocks(llm, tokens):
    """The blocks of the prefix cache holding `tokens` (whole blocks), found through the block manager."""
    bm = llm.scheduler.block_manager
    hit = bm.allocate("probe", list(tokens) + [0])
    table = bm.block_table("probe")[:hit // bm.block_size]
    bm.free("probe")
    return table


def block_contents(llm, blocks):
    """(int8 K values, K scales) of layer 0 in these blocks: [n, BS, KVH, D], [n, BS, KVH]."""
    m = llm.runner.model
    return m.key_caches[0].asnumpy()[blocks], m.key_scale_caches[0].asnumpy()[blocks]


def test_a_prefix_hit_gives_the_tokens_of_recomputing(llm):
    prompts = prompts_with_shared_prefix(6)
    llm.reset_scheduler(enable_prefix_caching=True)
    cached = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert all(o.num_cached_tokens == 32 for o in cached[1:])      # two whole 16-token blocks
    llm.reset_scheduler(enable_prefix_caching=False)
    plain = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert all(o.num_cached_tokens == 0 for o in plain)
    assert [o.token_ids for o in cached] == [o.token_ids for o in plain]
    llm.reset_scheduler(enable_prefix_caching=True)


def test_scales_follow_their_block_through_sharing_and_eviction(llm):
    """A prompt's cached blocks hold its int8 values and their scales; evicted and recomputed into other blocks,
    both are written again, equal, at the new blocks' slots."""
    llm.reset_scheduler(enable_prefix_caching=True)
    prompt = list(range(200, 248))                                   # three whole blocks
    first = llm.generate([prompt], GREEDY, use_tqdm=False)[0]
    blocks = cached_blocks(llm, prompt)
    assert len(blocks) == 3
    values, scales = block_contents(llm, blocks)
    assert (scales > 0).all() and np.abs(values).max() == 127     # every row written, each at full scale
    # shared: a second request hits the first two blocks (the last token is always computed) and reads them
    again = llm.generate([prompt], GREEDY, use_tqdm=False)[0]
    assert again.num_cached_tokens == 32 and again.token_ids == first.token_ids
    # evicted: other prompts fill the whole pool, the prompt's blocks are reused for other contents
    fillers = [[(7 * i + 3 * j) % 500 + 1 for j in range(140)] for i in range(6)]
    llm.generate(fillers, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True), use_tqdm=False)
    assert llm.stats()["evictions"] > 0
    old_values, old_scales = block_contents(llm, blocks)
    assert not (np.array_equal(old_values, values) and np.array_equal(old_scales, scales))
    recomputed = llm.generate([prompt], GREEDY, use_tqdm=False)[0]
    assert recomputed.num_cached_tokens < 32 and recomputed.token_ids == first.token_ids
    new_blocks = cached_blocks(llm, prompt)
    new_values, new_scales = block_contents(llm, new_blocks)
    np.testing.assert_array_equal(new_values, values)
    np.testing.assert_allclose(new_scales, scales, rtol=1e-6)


def test_preemption_under_int8_gives_identical_tokens(llm):
    prompts = prompts_with_shared_prefix(8, seed=1)
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    llm.reset_scheduler(num_blocks=48)
    roomy = llm.generate(prompts, params, use_tqdm=False)
    assert llm.stats()["num_preemptions"] == 0
    llm.reset_scheduler(num_blocks=10)
    tight = llm.generate(prompts, params, use_tqdm=False)
    assert llm.stats()["num_preemptions"] > 0
    assert [o.token_ids for o in tight] == [o.token_ids for o in roomy]
    llm.reset_scheduler(num_blocks=48)
