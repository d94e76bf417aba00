"""DecoderLayer: a decoder layer as one op on the CPU fused path gives the logits and KV caches of the same layer
run as its 8 kernels, bit for bit: float32 weights (output widths off the 16-column panels), GGUF blocks with
float32 and int8 activations, int8 weights, float32 and int8 KV caches; prefill then decode with padding rows."""
import mindspore as ms
import numpy as np
import pytest

import numpy_llama as nl
from ms_atb.formats.llama_config import LlamaConfig
from ms_atb.formats.weight_formats import weight_formats
from ms_atb.models.llama import LlamaForCausalLM
from ms_atb.models.weights import iter_weights
from ms_atb.ops import build
from ms_atb.ops.decoder_layer import LINEAR_KERNELS, DecoderLayer, linear_kind
from test_weight_dtype import write_gguf

BS, NB, MAXB, T_PAD, B_PAD = 4, 32, 8, 16, 3   # one static shape: one graph per model


def tiny_config(**kw):
    base = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rope_theta=10000.0,
                tie_word_embeddings=True, rope_interleaved=True, bos_token_id=1, eos_token_id=2)
    return LlamaConfig(**{**base, **kw})


def pair(config, weights, **kw):
    """(one op per layer, 8 kernels per layer): two models of the same weights."""
    ms.set_context(mode=ms.GRAPH_MODE)
    models = []
    for one_op in (True, False):
        model = LlamaForCausalLM(config, NB, BS, **kw)
        for layer in model.layers:
            assert layer.one_op, "the CPU fused path runs each layer as one op"
            layer.one_op = one_op
        model.load_weights(weights() if callable(weights) else weights.items())
        models.append(model)
    return models


def step(model, seqs):
    """seqs: (block table, context length, new tokens) each; T_PAD and B_PAD rows, the rest padding."""
    ids, pos, slots = np.zeros(T_PAD, np.int32), np.zeros(T_PAD, np.int32), np.full(T_PAD, -1, np.int32)
    tables, lens, qsl, t = np.zeros((B_PAD, MAXB), np.int32), np.zeros(B_PAD, np.int32), [0], 0
    for b, (table, ctx, toks) in enumerate(seqs):
        n = len(toks)
        ids[t:t + n], pos[t:t + n] = toks, np.arange(ctx - n, ctx)
        slots[t:t + n] = [table[p // BS] * BS + p % BS for p in range(ctx - n, ctx)]
        tables[b, :len(table)], lens[b] = table, ctx
        t += n
        qsl.append(t)
    qsl += [t] * (B_PAD - len(seqs))
    return model(*(ms.Tensor(a) for a in (ids, pos, slots, tables, lens, np.array(qsl, np.int32)))).asnumpy()


def assert_same_run(one, eight, steps=4):
    """A prefill of two prompts (7 and 3 tokens, padding rows after them), then `steps` greedy decode steps of
    both: every step's logits and, at the end, every cache equal between the two models."""
    tables = [[1, 2, 3, 4], [5, 6, 7, 8]]
    prompts = [[3, 200, 17, 45, 99, 1, 250], [64, 8, 120]]
    seqs = [(tables[i], len(p), p) for i, p in enumerate(prompts)]
    lengths = [len(p) for p in prompts]
    for _ in range(steps + 1):
        a, b = step(one, seqs), step(eight, seqs)
        assert np.array_equal(a, b), np.abs(a - b).max()
        assert np.abs(a[:2]).max() > 0
        nxt = np.argmax(a[:2], -1)
        lengths = [n + 1 for n in lengths]
        seqs = [(tables[i], lengths[i], [int(nxt[i])]) for i in range(2)]
    for name in ("key_caches", "value_caches", "key_scale_caches", "value_scale_caches"):
        for x, y in zip(getattr(one, name) or (), getattr(eight, name) or ()):
            assert np.array_equal(x.asnumpy(), y.asnumpy()), name
            assert np.abs(x.asnumpy().astype(np.float32)).max() > 0, name


def test_float32_weights_off_the_panels_and_gqa():
    """float32 weights, 3 layers, 5 heads over 1 KV head of 8: qkv 56, o 40, gate_up 72 columns, none a multiple
    of 16 (the kernel drops the last panel's padding)."""
    config = tiny_config(hidden_size=40, intermediate_size=36, num_hidden_layers=3, num_attention_heads=5,
                         num_key_value_heads=1, head_dim=8, tie_word_embeddings=False)
    assert_same_run(*pair(config, nl.random_weights(config, seed=5)))


@pytest.mark.parametrize("cache", [None, ms.int8])
def test_int8_weights_with_int8_activations(cache):
    """weight_dtype int8 (K % 32 != 0) with int8 activations (QuantDotInt8), float32 and int8 KV caches."""
    config = tiny_config(hidden_size=48, intermediate_size=100, tie_word_embeddings=False)
    formats, _ = weight_formats("random:tiny-llama", config, "int8", activation_dtype="int8")
    assert_same_run(*pair(config, nl.random_weights(config, seed=4), weight_formats=formats,
                          activation_dtype="int8", cache_dtype=cache))


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    """A GGUF model whose layers hold Q4_1, Q4_0 and Q8_0 linears (and mixed q/k/v re-quantized to Q8_0)."""
    config = tiny_config()
    layer1 = {"self_attn.q_proj": "Q4_0", "self_attn.k_proj": "Q4_0", "self_attn.v_proj": "Q8_0",
              "self_attn.o_proj": "Q4_0", "mlp.gate_proj": "Q8_0", "mlp.up_proj": "Q8_0", "mlp.down_proj": "Q4_1"}
    types = {"model.embed_tokens.weight": "Q8_0"}
    for hf, t in layer1.items():
        types[f"model.layers.0.{hf}.weight"] = "Q4_1"
        types[f"model.layers.1.{hf}.weight"] = t
    path = tmp_path_factory.mktemp("gguf") / "m.gguf"
    write_gguf(path, config, nl.random_weights(config, seed=3), types)
    return str(path), config


@pytest.mark.parametrize("activations,cache", [("float32", None), ("int8", None), ("int8", ms.int8)])
def test_gguf_blocks(gguf_path, activations, cache):
    path, config = gguf_path
    formats, _ = weight_formats(path, config, "auto", activation_dtype=activations)
    assert {formats[f"model.layers.1.{n}.weight"] for n in ("self_attn.o_proj", "mlp.down_proj")} == {"q4_0", "q4_1"}
    assert_same_run(*pair(config, lambda: iter_weights(path, config, formats=formats), weight_formats=formats,
                          activation_dtype=activations, cache_dtype=cache))


def test_only_on_the_cpu_fused_path_with_one_rank():
    """A qkv bias, qk-norm or float16 keep one op per part; so does one_op=False."""
    ms.set_context(mode=ms.GRAPH_MODE)
    for kw, one_op in (({}, True), ({"attention_bias": True}, False), ({"qk_norm": True}, False)):
        model = LlamaForCausalLM(tiny_config(num_hidden_layers=1, **kw), NB, BS)
        assert model.layers[0].one_op == one_op, kw
    assert not LlamaForCausalLM(tiny_config(num_hidden_layers=1), NB, BS, ms.float16).layers[0].one_op


def test_bad_linear_kind_is_refused():
    """An unknown weight format or activation dtype: ValueError naming the allowed ones; a plan naming an unknown
    kernel: the kernel refuses it (status 1) before any work."""
    assert [linear_kind(f, "int8") for f in ("float32", "q8_0", "int8")] == [0, 5, 8]
    assert LINEAR_KERNELS[linear_kind("q4_1", "float32")] == "QuantMatMulQ4_1Rows"
    with pytest.raises(ValueError, match="weight format 'q5_k'.*allowed"):
        DecoderLayer(1e-5, 0.25, ("float32", "q5_k", "float32", "float32"), (64, 32, 128, 32))
    with pytest.raises(ValueError, match="activations 'int4'.*allowed"):
        DecoderLayer(1e-5, 0.25, ("q8_0",) * 4, (64, 32, 128, 32), "int4")
    with pytest.raises(ValueError, match="4 linears"):
        DecoderLayer(1e-5, 0.25, ("float32",) * 3, (64, 32, 128))
    import ctypes
    lib = ctypes.CDLL(build.kernel_library())
    T, E, D, KVH, inter = 2, 32, 8, 1, 16
    f = np.float32
    h = np.ones((T, E), f)
    w = [np.zeros((-(-n // 16), k, 16), f) for k, n in ((E, 32 + 2 * KVH * D), (32, E), (E, 2 * inter),
                                                         (inter, E))]

    def status(plan):
        arrays = [h, h, np.ones(E, f), np.ones(E, f), np.array([1e-5], f), *w, np.array(plan, np.int32),
                  np.ones((T, D), f), np.zeros((T, D), f), np.arange(D, dtype=np.int32),
                  np.zeros((4, 4, KVH, D), f), np.zeros((4, 4, KVH, D), f), np.array([0, 1], np.int32),
                  np.array([[0]], np.int32), np.array([2], np.int32), np.array([0, 2], np.int32),
                  np.array([0.35], f), np.array([T], np.int32), np.zeros((T, E), f), np.zeros((T, E), f)]
        return build.call_kernel(lib.DecoderLayer, arrays)

    widths = [32 + 2 * KVH * D, E, 2 * inter, E]
    assert status([0] * 4 + widths) == 0
    assert status([0, 9, 0, 0] + widths) == 1
    assert status([0, -1, 0, 0] + widths) == 1
    assert status([0] * 4 + [widths[0] + 16] + widths[1:]) == 1
