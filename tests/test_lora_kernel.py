"""LoraAdd (ops/lora.cc): each row's LoRA delta, rows of several adapters and of none in one call, against numpy;
a row's result the same in any batch, alone or grouped with others of its adapter; bad arguments refused. And the
one-op decoder layer with LoRA gives the 8-op layer's logits bit for bit."""
import ctypes

import numpy as np
import pytest

from ms_atb.ops import build
from ops_reference import lora_add_ref


@pytest.fixture(scope="module")
def lib():
    return ctypes.CDLL(build.kernel_library())


def lora_case(seed, T, K, L, R, segments, none_rate=0.25):
    """Random arguments of LoraAdd: slots in [-1, L), each slot's ranks in [0, R] (A's rows past a rank NaN: the
    kernel must not read them)."""
    rng = np.random.default_rng(seed)
    W, S = sum(w for _, w in segments), len(segments)
    y = rng.standard_normal((T, W)).astype(np.float32)
    x = rng.standard_normal((T, K)).astype(np.float32)
    slots = np.where(rng.random(T) < none_rate, -1, rng.integers(0, L, T)).astype(np.int32)
    a = rng.standard_normal((L, S * R, K)).astype(np.float32)
    b = rng.standard_normal((L, R, W)).astype(np.float32)
    ranks = rng.integers(0, R + 1, (L, 7)).astype(np.int32)
    for slot in range(L):
        column = 0
        for g, (target, width) in enumerate(segments):
            a[slot, g * R + ranks[slot, target]:(g + 1) * R] = np.nan
            b[slot, ranks[slot, target]:, column:column + width] = np.nan
            column += width
    return [y, x, slots, a, b, ranks, np.array(segments, np.int32)]


SHAPES = [  # T, K, L, R, segments (target, width)
    (5, 70, 3, 4, [(0, 40), (1, 17), (2, 17)]),          # a fused q/k/v, widths off the 8-column vectors
    (33, 576, 4, 16, [(3, 576)]),                        # SmolLM2's o_proj at 33 rows
    (1, 16, 1, 1, [(6, 8)]),
    (64, 130, 5, 8, [(4, 200), (5, 200)]),               # gate/up, more rows than a thread's share
]


@pytest.mark.parametrize("T,K,L,R,segments", SHAPES)
def test_lora_add_matches_numpy_and_is_batch_invariant(lib, T, K, L, R, segments):
    args = lora_case(T + K, T, K, L, R, segments)
    out = np.full_like(args[0], np.nan)
    assert build.call_kernel(lib.LoraAdd, args + [out]) == 0
    np.testing.assert_allclose(out, lora_add_ref(*args[:6], segments), rtol=1e-4, atol=1e-4)
    assert np.array_equal(out[args[2] < 0], args[0][args[2] < 0])          # rows of no adapter: y itself
    inplace = args[0].copy()
    assert build.call_kernel(lib.LoraAdd, [inplace] + args[1:] + [inplace]) == 0
    assert np.array_equal(inplace, out)
    for t in range(T):           # each row alone: the same bits as in the batch
        alone = np.zeros((1, out.shape[1]), np.float32)
        row = [args[0][t:t + 1].copy(), args[1][t:t + 1].copy(), args[2][t:t + 1].copy()] + args[3:]
        assert build.call_kernel(lib.LoraAdd, row + [alone]) == 0
        assert np.array_equal(alone[0], out[t]), t


@pytest.mark.parametrize("change, words", [
    (lambda a: a.__setitem__(2, np.array([0, 3, -1, 0, 0], np.int32)), "slot"),       # slot 3 of L = 3
    (lambda a: a.__setitem__(2, np.array([0, -2, 0, 0, 0], np.int32)), "slot"),
    (lambda a: a.__setitem__(5, np.full((3, 7), 5, np.int32)), "rank"),                # above R = 4
    (lambda a: a.__setitem__(6, np.array([[0, 40], [1, 17], [2, 16]], np.int32)), "widths"),
    (lambda a: a.__setitem__(6, np.array([[0, 40], [9, 17], [2, 17]], np.int32)), "target"),
    (lambda a: a.__setitem__(3, np.zeros((3, 11, 70), np.float32)), "lora_a"),
    (lambda a: a.__setitem__(1, np.zeros((5, 70), np.float64)), "float32"),
])
def test_lora_add_refuses_bad_arguments(lib, change, words, capfd):
    args = lora_case(0, 5, 70, 3, 4, [(0, 40), (1, 17), (2, 17)])
    change(args)
    assert build.call_kernel(lib.LoraAdd, args + [np.zeros_like(args[0])]) == 1
    assert words in capfd.readouterr().err


# ---- the decoder layer with LoRA: one op = 8 ops, and numpy with the adapters merged into the weights ----------
def random_adapter(config, rank, targets, seed, layers=None):
    """A LoraAdapter of random float32 weights (deltas about a tenth of the layers' weights)."""
    from ms_atb.formats.peft_adapter import LoraAdapter, target_shape
    rng = np.random.default_rng(seed)
    adapter = LoraAdapter(f"/adapter/{seed}", rank, 2.0, tuple(targets), bytes([seed]))
    for i in range(config.num_hidden_layers) if layers is None else layers:
        for t in targets:
            out, inp = target_shape(config, t)
            adapter.lora_a[(i, t)] = (rng.standard_normal((rank, inp)) * 0.3).astype(np.float32)
            adapter.lora_b[(i, t)] = (rng.standard_normal((out, rank)) * 0.05).astype(np.float32)
    return adapter


def merged(weights: dict, adapter) -> dict:
    """HF-named weights with adapter's scaling * B A added to each projection it adapts."""
    out = dict(weights)
    module = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn"}
    for (i, t), a in adapter.lora_a.items():
        name = f"model.layers.{i}.{module.get(t, 'mlp')}.{t}.weight"
        out[name] = out[name] + adapter.scaling * (adapter.lora_b[(i, t)].astype(np.float64) @ a)
    return out


def test_decoder_layer_with_lora_one_op_is_eight_ops_and_numpy():
    """Two adapters in two slots (rank 4 on every projection; rank 2 on q, v and down, layer 1 only) and a
    sequence of none, prefill then decode: the one-op layer's logits are the 8-op layer's bit for bit, and each
    sequence's first logits are numpy's with its adapter merged into the weights."""
    import numpy_llama as nl
    from ms_atb.models.lora import write_slot
    from test_decoder_layer import pair, tiny_config
    config = tiny_config(tie_word_embeddings=False)
    weights = nl.random_weights(config, seed=7)
    adapters = [random_adapter(config, 4, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                           "down_proj"), 1),
                random_adapter(config, 2, ("q_proj", "v_proj", "down_proj"), 2, layers=[1])]
    one, eight = pair(config, weights, lora=(3, 4))
    for model in (one, eight):
        write_slot(model, 0, adapters[1])        # slot 0 and 2 are written and rewritten: only the last counts
        write_slot(model, 2, adapters[0])
        write_slot(model, 0, adapters[0])
        write_slot(model, 1, adapters[1])
        write_slot(model, 2, None)
    prompts, slots = [[3, 200, 17, 45, 99, 1, 250], [64, 8, 120], [9, 9, 31, 7]], [0, 1, -1]
    tables = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]
    seqs = [(tables[i], len(p), p) for i, p in enumerate(prompts)]
    for step_no in range(4):
        a, b = lora_step(one, seqs, slots), lora_step(eight, seqs, slots)
        assert np.array_equal(a, b), np.abs(a - b).max()
        if step_no == 0:
            for i, p in enumerate(prompts):
                ref = nl.forward(weights if slots[i] < 0 else merged(weights, adapters[slots[i]]), config, p)[-1]
                np.testing.assert_allclose(a[i], ref, rtol=1e-4, atol=1e-3)
            base = nl.forward(weights, config, prompts[0])[-1]
            assert np.abs(a[0] - base).max() > 0.1          # the adapter changes the logits
        nxt = np.argmax(a[:3], -1)
        seqs = [(tables[i], seqs[i][1] + 1, [int(nxt[i])]) for i in range(3)]


def lora_step(model, seqs, lora_slots, t_pad=16, b_pad=4):
    """test_decoder_layer.step with each sequence's LoRA slot: its tokens' slots, padding -1."""
    import mindspore as ms
    from test_decoder_layer import BS, MAXB
    ids, pos, slots = np.zeros(t_pad, np.int32), np.zeros(t_pad, np.int32), np.full(t_pad, -1, np.int32)
    tables, lens, qsl, t = np.zeros((b_pad, MAXB), np.int32), np.zeros(b_pad, np.int32), [0], 0
    token_slots = np.full(t_pad, -1, np.int32)
    for b, (table, ctx, toks) in enumerate(seqs):
        n = len(toks)
        ids[t:t + n], pos[t:t + n] = toks, np.arange(ctx - n, ctx)
        slots[t:t + n] = [table[p // BS] * BS + p % BS for p in range(ctx - n, ctx)]
        tables[b, :len(table)], lens[b] = table, ctx
        token_slots[t:t + n] = lora_slots[b]
        t += n
        qsl.append(t)
    qsl += [t] * (b_pad - len(seqs))
    arrays = (ids, pos, slots, tables, lens, np.array(qsl, np.int32), token_slots)
    return model(*(ms.Tensor(a) for a in arrays)).asnumpy()
