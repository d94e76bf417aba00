"""LlamaForCausalLM on tiny random models vs the independent numpy Llama (tests/numpy_llama.py)."""
import mindspore as ms
import numpy as np
import pytest

import numpy_llama as nl
from ms_atb.models.llama import LlamaConfig, LlamaForCausalLM, rope_tables

BS, NB, MAXB, T_PAD, B_PAD = 4, 64, 12, 32, 3  # one static shape for every call: one graph per model


def tiny_config(**kw):
    base = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rope_theta=10000.0)
    return LlamaConfig(**{**base, **kw})


class Harness:
    """A model with one static input shape; seqs: list of (block table, context_len, new tokens, positions)."""

    def __init__(self, config, seed=0):
        ms.set_context(mode=ms.GRAPH_MODE)
        self.config, self.weights = config, nl.random_weights(config, seed)
        self.model = LlamaForCausalLM(config, NB, BS)
        self.model.load_weights(self.weights.items())

    def step(self, seqs):
        ids, pos, slots = np.zeros(T_PAD, np.int32), np.zeros(T_PAD, np.int32), np.full(T_PAD, -1, np.int32)
        tables, lens = np.zeros((B_PAD, MAXB), np.int32), np.zeros(B_PAD, np.int32)
        qsl, t = [0], 0
        for b, (table, ctx, toks) in enumerate(seqs):
            n = len(toks)
            ids[t:t + n] = toks
            pos[t:t + n] = np.arange(ctx - n, ctx)
            slots[t:t + n] = [table[p // BS] * BS + p % BS for p in range(ctx - n, ctx)]
            tables[b, :len(table)], lens[b] = table, ctx
            t += n
            qsl.append(t)
        qsl += [t] * (B_PAD - len(seqs))
        out = self.model(*(ms.Tensor(a) for a in (ids, pos, slots, tables, lens, np.array(qsl, np.int32))))
        return out.asnumpy()[:len(seqs)]


@pytest.fixture(scope="module")
def harness():
    return Harness(tiny_config())


def ref_last(h, tokens):
    return nl.forward(h.weights, h.config, tokens)[-1]


def test_prompt_and_16_decode_steps_match_numpy(harness):
    rng = np.random.default_rng(1)
    table = [41, 3, 17, 60, 8, 22, 35]  # scattered on purpose
    tokens = list(rng.integers(0, 256, 11))
    logits = harness.step([(table, 11, tokens)])[0]
    ref = nl.forward(harness.weights, harness.config, tokens)
    assert np.abs(logits - ref[-1]).max() < 1e-4
    for _ in range(16):
        tokens.append(int(np.argmax(logits)))
        logits = harness.step([(table, len(tokens), tokens[-1:])])[0]
        assert np.abs(logits - ref_last(harness, tokens)).max() < 1e-4


def test_prefill_over_cached_prefix_equals_full_prefill(harness):
    tokens = list(np.random.default_rng(2).integers(0, 256, 14))
    full = harness.step([([5, 6, 7, 9], 14, tokens)])[0]
    # A second sequence shares the two committed prefix blocks and computes only the rest.
    cached = harness.step([([5, 6, 50, 51], 14, tokens[8:])])[0]
    np.testing.assert_allclose(cached, full, atol=1e-5)
    assert np.abs(full - ref_last(harness, tokens)).max() < 1e-4


def test_three_chunks_equal_one_chunk(harness):
    tokens = list(np.random.default_rng(3).integers(0, 256, 15))
    one = harness.step([([10, 11, 12, 13], 15, tokens)])[0]
    table = [20, 14, 31, 2]
    harness.step([(table, 5, tokens[:5])])
    harness.step([(table, 10, tokens[5:10])])
    chunked = harness.step([(table, 15, tokens[10:])])[0]
    np.testing.assert_allclose(chunked, one, atol=1e-5)


def test_mixed_batch_gives_each_sequence_its_own_logits(harness):
    rng = np.random.default_rng(4)
    a, b, c = (list(rng.integers(0, 256, n)) for n in (9, 13, 6))
    ta, tb, tc = [1, 15, 40], [23, 24, 25, 26], [44, 45]
    harness.step([(ta, 8, a[:8])])  # a's first 8 tokens are cached; a decodes its 9th in the mixed step
    mixed = harness.step([(ta, 9, a[8:]), (tb, 13, b), (tc, 6, c)])
    alone = [harness.step([(ta, 9, a[8:])])[0], harness.step([(tb, 13, b)])[0], harness.step([(tc, 6, c)])[0]]
    for got, want, toks in zip(mixed, alone, (a, b, c)):
        np.testing.assert_array_equal(got, want)  # bit-identical: attention runs per sequence
        assert np.abs(got - ref_last(harness, toks)).max() < 1e-4


def test_padding_rows_do_not_write_the_cache(harness):
    before = [p.asnumpy().copy() for p in harness.model.key_caches]
    harness.step([])  # every token is padding (slot -1), every sequence padded
    for p, old in zip(harness.model.key_caches, before):
        np.testing.assert_array_equal(p.asnumpy(), old)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("scaling", [None, {"rope_type": "linear", "factor": 4.0}, {"type": "dynamic", "factor": 2.0},
                                     {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
                                     {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}])
def test_rope_tables_match_numpy(scaling, interleaved):
    config = tiny_config(rope_scaling=scaling, rope_interleaved=interleaved, rope_theta=500000.0)
    cos, sin, perm = rope_tables(config)
    x = np.random.default_rng(5).standard_normal((200, 3, 16))
    pos = np.arange(200)
    ours = x * cos[pos, None, :] + x[..., perm] * sin[pos, None, :]
    freqs, scale = nl.inv_freq(16, config.rope_theta, scaling, config.max_position_embeddings)
    np.testing.assert_allclose(ours, nl.apply_rope(x, pos, freqs, scale, interleaved), atol=1e-5)


def test_llama3_interleaved_tied_model_matches_numpy():
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}
    h = Harness(tiny_config(rope_scaling=scaling, rope_interleaved=True, tie_word_embeddings=True), seed=7)
    tokens = list(np.random.default_rng(6).integers(0, 256, 30))
    logits = h.step([([3, 1, 4, 15, 9, 2, 6, 5], 30, tokens)])[0]
    assert np.abs(logits - ref_last(h, tokens)).max() < 1e-4


def test_load_weights_errors():
    config = tiny_config(num_hidden_layers=1)
    model = LlamaForCausalLM(config, 4, BS)
    weights = nl.random_weights(config)
    missing = {k: v for k, v in weights.items() if k != "model.layers.0.mlp.up_proj.weight"}
    with pytest.raises(ValueError, match=r"missing tensor 'model\.layers\.0\.mlp\.up_proj\.weight'.*\(128, 64\)"):
        model.load_weights(missing.items())
    with pytest.raises(ValueError, match=r"unexpected tensor 'model\.layers\.1\.mlp\.up_proj\.weight'"):
        model.load_weights([*weights.items(), ("model.layers.1.mlp.up_proj.weight", np.zeros((128, 64)))])
    bad = dict(weights, **{"model.layers.0.self_attn.k_proj.weight": np.zeros((64, 64), np.float32)})
    with pytest.raises(ValueError, match=r"k_proj\.weight'.*expected shape \(32, 64\), found \(64, 64\)"):
        model.load_weights(bad.items())


def test_shard_rules():
    from ms_atb.formats.sharding import shard_slice, shard_spec, validate_tp
    c = tiny_config()  # 4 heads, 2 KV heads, head_dim 16, intermediate 128
    k = "model.layers.1.self_attn.k_proj.weight"
    assert shard_spec(k, c, 2) == 0 and shard_spec("model.layers.0.mlp.down_proj.weight", c, 2) == 1
    assert shard_spec("model.embed_tokens.weight", c, 2) is None and shard_spec(k, c, 1) is None
    assert shard_slice(k, (32, 64), c, 2, 1) == (slice(16, 32), slice(None))
    assert shard_slice("model.layers.0.self_attn.o_proj.weight", (64, 64), c, 2, 1) == (slice(None), slice(32, 64))
    # tp 4 > 2 KV heads: ranks 0,1 share KV head 0, ranks 2,3 KV head 1 (their query heads' group)
    assert [shard_slice(k, (32, 64), c, 4, r)[0] for r in range(4)] == [slice(0, 16)] * 2 + [slice(16, 32)] * 2
    assert shard_slice("model.norm.weight", (64,), c, 4, 3) == (slice(None),)
    for bad in (3, 8):
        with pytest.raises(ValueError, match="tensor_parallel_size"):
            validate_tp(c, bad)
    with pytest.raises(ValueError, match="unknown tensor name"):
        shard_spec("model.layers.0.self_attn.rotary_emb.inv_freq", c, 2)
    with pytest.raises(ValueError, match="expected size 32 on axis 0"):
        shard_slice(k, (64, 64), c, 2, 0)
