"""scripts/bench_llamacpp_batched.py: prompts go in steps as the scheduler chunks them."""
from scripts_import import load_script

bench = load_script("bench_llamacpp_batched")


def test_prompts_are_chunked_as_the_scheduler_chunks_them():
    # 3 prompts of 300 tokens, steps of 512: the second prompt is split across the first two steps
    assert bench.prefill_steps(3, 300, 512, 32) == [[(0, 0, 300), (1, 0, 212)], [(1, 212, 88), (2, 0, 300)]]
    # a prompt longer than a step spreads over several
    assert bench.prefill_steps(1, 1200, 512, 32) == [[(0, 0, 512)], [(0, 512, 512)], [(0, 1024, 176)]]
    # at most max_num_seqs sequences a step
    assert bench.prefill_steps(4, 8, 512, 2) == [[(0, 0, 8), (1, 0, 8)], [(2, 0, 8), (3, 0, 8)]]
    steps = bench.prefill_steps(32, 128, 512, 32)
    assert len(steps) == 8 and all(sum(n for _, _, n in s) == 512 for s in steps)


def test_a_step_of_pieces_continues_each_sequence_where_its_last_chunk_stopped():
    import numpy as np
    step = bench.make_step([(1, 212, 88), (2, 0, 3)], 40, np.random.default_rng(0))
    assert step.positions == list(range(212, 300)) + [0, 1, 2]
    assert step.context_lens == [300, 3] and step.query_start_loc == [0, 88, 91]
    assert step.slot_mapping[0] == (40 + 212 // 16) * 16 + 212 % 16 and step.slot_mapping[88] == 80 * 16
    assert len(step.block_tables[0]) == 19 and step.block_tables[1] == [80]


def test_the_decode_bound_counts_the_kv_cache_a_step_reads():
    """A step at context 100 of 2 layers x 4 KV heads x 64 dims reads K and V of 100 tokens: float16 2 bytes a
    value, int8 1 and a float32 scale a (token, head) row; the runner's own dtype unless one is named."""
    from types import SimpleNamespace

    import mindspore as ms
    config = SimpleNamespace(num_hidden_layers=2, num_key_value_heads=4, head_dim=64)
    runner = SimpleNamespace(model_config=config, cache_dtype=ms.float16)
    assert bench.step_kv_bytes(runner, 100) == 100 * 2 * 2 * 4 * 64 * 2
    assert bench.step_kv_bytes(runner, 100, "float32") == 100 * 2 * 2 * 4 * 64 * 4
    runner.cache_dtype = ms.int8
    assert bench.step_kv_bytes(runner, 100) == 100 * 2 * 2 * 4 * (64 + 4)
