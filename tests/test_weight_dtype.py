"""model.weight_dtype: config validation, which linears a GGUF keeps quantized (and which it converts), a
tiny GGUF model whose quantized-as-stored logits equal the numpy Llama's over its float32 dequantisation,
int8 quantized on load, and the memory budget counting the bytes the model holds."""
import mindspore as ms
import numpy as np
import pytest

import numpy_llama as nl
from ms_atb import memory_budget
from ms_atb.config import EngineConfig
from ms_atb.formats import loader
from ms_atb.formats.llama_config import LlamaConfig
from ms_atb.formats.weight_formats import linear_activations, weight_formats
from ms_atb.models.llama import LlamaForCausalLM
from ms_atb.models.weights import iter_weights

BS, NB, T_PAD = 4, 32, 16
TOKENS = [3, 200, 17, 45, 99, 1, 250, 64, 8, 120, 33]
# Stored types of layer 1's linears in the file below (layer 0: all Q4_1); q/k/v mixed: re-quantized to Q8_0.
LAYER1 = {"self_attn.q_proj": "Q4_0", "self_attn.k_proj": "Q4_0", "self_attn.v_proj": "Q8_0",
          "self_attn.o_proj": "Q4_0", "mlp.gate_proj": "Q8_0", "mlp.up_proj": "Q8_0", "mlp.down_proj": "Q4_1"}


def tiny_config(**kw):
    base = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rope_theta=10000.0,
                tie_word_embeddings=True, rope_interleaved=True, bos_token_id=1, eos_token_id=2)
    return LlamaConfig(**{**base, **kw})


def write_gguf(path, config, weights, types) -> dict:
    """A GGUF file of `weights` (HF names) stored as types[name] (a GGML type name; F32 when absent);
    returns the float32 weights it holds (the gguf package's dequantisation)."""
    import gguf
    from gguf import quants
    layer_names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                   "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                   "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
                   "post_attention_layernorm": "ffn_norm"}
    to_gguf = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    for i in range(config.num_hidden_layers):
        to_gguf.update({f"model.layers.{i}.{hf}.weight": f"blk.{i}.{g}.weight" for hf, g in layer_names.items()})
    w = gguf.GGUFWriter(str(path), "llama")
    for add, value in ((w.add_context_length, config.max_position_embeddings), (w.add_embedding_length, 64),
                       (w.add_block_count, config.num_hidden_layers), (w.add_feed_forward_length, 128),
                       (w.add_head_count, 4), (w.add_head_count_kv, 2), (w.add_layer_norm_rms_eps, 1e-5),
                       (w.add_rope_freq_base, 10000.0), (w.add_rope_dimension_count, 16), (w.add_bos_token_id, 1),
                       (w.add_eos_token_id, 2)):
        add(value)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(config.vocab_size)])
    held = {}
    for name, a in weights.items():
        if name in types:
            qtype = gguf.GGMLQuantizationType[types[name]]
            q = quants.quantize(a, qtype)
            w.add_tensor(to_gguf[name], q, raw_dtype=qtype)
            held[name] = quants.dequantize(q, qtype).astype(np.float32)
        else:
            w.add_tensor(to_gguf[name], a)
            held[name] = a
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return held


@pytest.fixture(scope="module")
def gguf_model(tmp_path_factory):
    """(path, config, float32 weights the file holds)."""
    config = tiny_config()
    weights = nl.random_weights(config, seed=3)
    types = {"model.embed_tokens.weight": "Q8_0"}
    for hf in LAYER1:
        types[f"model.layers.0.{hf}.weight"] = "Q4_1"
        types[f"model.layers.1.{hf}.weight"] = LAYER1[hf]
    path = tmp_path_factory.mktemp("gguf") / "m.gguf"
    return str(path), config, write_gguf(path, config, weights, types)


def logits(model, tokens):
    """One prefill of `tokens` (one sequence, padded to T_PAD) -> logits [vocab] of its last token."""
    n = len(tokens)
    ids, pos = np.zeros(T_PAD, np.int32), np.zeros(T_PAD, np.int32)
    slots = np.full(T_PAD, -1, np.int32)
    ids[:n], pos[:n], slots[:n] = tokens, np.arange(n), np.arange(n) + BS   # blocks 1.. in order
    table = np.arange(1, NB, dtype=np.int32)[None, :8]
    args = (ids, pos, slots, table, np.array([n], np.int32), np.array([0, n], np.int32))
    return model(*(ms.Tensor(a) for a in args)).asnumpy()[0]


def held_bytes(model) -> int:
    return sum(p.size * np.dtype(ms.dtype_to_nptype(p.dtype)).itemsize for p in model.get_parameters()
               if "cache" not in p.name)


def test_config_validates_weight_dtype():
    assert EngineConfig.load("random:tiny-llama").model.weight_dtype == "auto"
    with pytest.raises(ValueError, match=r"model.weight_dtype must be one of \['auto', 'float32', 'int8'\], got 'int4'"):
        EngineConfig.load("random:tiny-llama", weight_dtype="int4")
    with pytest.raises(ValueError, match="runs on the CPU only"):
        EngineConfig.load("random:tiny-llama", weight_dtype="int8", device="npu")
    assert EngineConfig.load("random:tiny-llama", weight_dtype="int8", dtype="float16").model.dtype == "float16"
    EngineConfig.load("random:tiny-llama", weight_dtype="auto", device="npu")    # auto: the weights in model.dtype


def test_gguf_formats_kept_and_converted(gguf_model):
    path, config, _ = gguf_model
    formats, notes = weight_formats(path, config, "auto")
    assert formats["model.layers.0.self_attn.k_proj.weight"] == "q4_1"
    assert formats["model.layers.0.mlp.down_proj.weight"] == "q4_1"
    assert formats["model.layers.1.self_attn.q_proj.weight"] == "q8_0"          # q4_0 + q8_0: converted
    assert formats["model.layers.1.self_attn.o_proj.weight"] == "q4_0"
    assert formats["model.layers.1.mlp.up_proj.weight"] == "q8_0"
    assert formats["lm_head.weight"] == "q8_0"                                  # tied: the embedding's type
    assert formats["model.embed_tokens.weight"] == "q8_0"                       # gathered from lm_head's blocks
    assert any("q4_0+q8_0 converted to q8_0" in n for n in notes), notes
    assert "embedding: q8_0, rows dequantised as they are gathered (from the tied lm_head's blocks)" in notes
    assert weight_formats(path, config, "float32") == ({}, [])
    assert weight_formats(path, config, "auto", device="npu") == ({}, [])      # the NPU: weights in model.dtype
    assert weight_formats("random:tiny-llama", loader.load_config("random:tiny-llama"), "auto") == ({}, [])
    with pytest.raises(ValueError, match="weight_dtype must be one of"):
        weight_formats(path, config, "q4")


def test_quantized_as_stored_equals_float32_dequantisation(gguf_model):
    """Every linear but layer 1's q/k/v (converted) multiplies the stored blocks: the logits equal the numpy
    Llama's over the file's float32 dequantisation up to float32 rounding; the converted linears move them
    by Q8_0's rounding only. The model holds the bytes the memory budget counts."""
    ms.set_context(mode=ms.GRAPH_MODE)
    path, config, held = gguf_model
    formats, _ = weight_formats(path, config, "auto")
    model = LlamaForCausalLM(config, NB, BS, weight_formats=formats)
    model.load_weights(iter_weights(path, config, formats=formats))
    assert model.layers[0].mlp.gate_up_proj.weight.dtype == ms.int8
    got = logits(model, TOKENS)
    # The reference multiplies layer 1's q/k/v as the model holds them: Q8_0 of the dequantised values.
    import gguf
    from gguf import quants
    ref_weights = dict(held)
    for x in "qkv":
        name = f"model.layers.1.self_attn.{x}_proj.weight"
        q8 = gguf.GGMLQuantizationType.Q8_0
        ref_weights[name] = quants.dequantize(quants.quantize(held[name], q8), q8).astype(np.float32)
    ref = nl.forward(ref_weights, config, TOKENS)[-1]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    stored = nl.forward(held, config, TOKENS)[-1]
    assert np.abs(got - stored).max() < 0.02 * np.abs(stored).max()
    assert memory_budget.weight_bytes(config, 1, 4, True, formats) == held_bytes(model)
    float_model = LlamaForCausalLM(config, NB, BS)
    assert memory_budget.weight_bytes(config, 1, 4, True) == held_bytes(float_model)
    assert held_bytes(model) < held_bytes(float_model) * 0.75


def test_int8_quantized_on_load():
    """A float checkpoint with weight_dtype int8: every linear per-output-channel int8, near the float logits."""
    ms.set_context(mode=ms.GRAPH_MODE)
    config = tiny_config(tie_word_embeddings=False, hidden_size=48, intermediate_size=100)  # K % 32 != 0
    weights = nl.random_weights(config, seed=4)
    formats, notes = weight_formats("random:tiny-llama", config, "int8")
    assert set(formats.values()) == {"int8"} and "lm_head.weight" in formats and "int8" in notes[0]
    model = LlamaForCausalLM(config, NB, BS, weight_formats=formats)
    model.load_weights(weights.items())
    assert model.lm_head.weight.dtype == ms.int8
    got, ref = logits(model, TOKENS), nl.forward(weights, config, TOKENS)[-1]
    assert np.abs(got - ref).max() < 0.02 * np.abs(ref).max()
    assert int(np.argmax(got)) == int(np.argmax(ref))
    assert memory_budget.weight_bytes(config, 1, 4, True, formats) == held_bytes(model)


def test_a_float16_model_keeps_its_linears_quantized_on_the_cpu(gguf_model):
    """float16 on the CPU: the linears hold the stored blocks (the norms float16; the embedding gathered from the
    tied lm_head's blocks, cast to float16) and multiply float32 casts of the activations; the logits follow the
    float32 model's up to the float16 rounding of the activations between the linears."""
    dtype = ms.float16
    ms.set_context(mode=ms.GRAPH_MODE)
    path, config, held = gguf_model
    formats, _ = weight_formats(path, config, "auto")
    model = LlamaForCausalLM(config, NB, BS, dtype=dtype, weight_formats=formats)
    model.load_weights(iter_weights(path, config, formats=formats))
    assert model.layers[0].mlp.gate_up_proj.weight.dtype == ms.int8 and model.norm.weight.dtype == dtype
    assert model.embed_tokens is None and model.embed_fmt == "q8_0"
    full = LlamaForCausalLM(config, NB, BS, weight_formats=formats)
    full.load_weights(iter_weights(path, config, formats=formats))
    got, ref = logits(model, TOKENS), logits(full, TOKENS)
    assert np.abs(got - ref).max() < 0.05 * np.abs(ref).max()
    assert int(np.argmax(got)) == int(np.argmax(ref))
    assert memory_budget.weight_bytes(config, 1, 2, True, formats) == held_bytes(model)


@pytest.mark.slow
def test_smollm2_q4_1_as_stored_greedy_equals_float32(smollm2_llm):
    """The embedded SmolLM2 GGUF: Q4_1 blocks as stored (the shared engine: configs/smollm2_135m.yaml, auto, with
    float32 activations and cache) against their float32 dequantisation: greedy tokens equal on at least 3 of 4
    prompts x 24 tokens."""
    import os
    from ms_atb import LLM, SamplingParams
    from engine_helpers import ROOT, with_buckets
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
               "The three primary colors are"]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    ref = [o.outputs[0].token_ids for o in smollm2_llm.generate(prompts, params, use_tqdm=False)]
    assert set(smollm2_llm.weight_formats.values()) == {"q4_1", "q8_0"}
    dense = with_buckets(LLM(os.path.join(ROOT, "configs", "smollm2_135m.yaml"), weight_dtype="float32",
                             cache_dtype="float32", max_num_batched_tokens=128, max_num_seqs=8, max_model_len=512, num_blocks=160,
                             precompile=False), [8, 128])
    assert dense.weight_formats == {}
    got = [o.outputs[0].token_ids for o in dense.generate(prompts, params, use_tqdm=False)]
    assert all(len(g) == 24 for g in got)
    assert sum(g == r for g, r in zip(got, ref)) >= 3, (got, ref)


def test_config_validates_activation_dtype(gguf_model):
    """model.activation_dtype int8 needs quantized linears on the CPU in float32, refused before any work."""
    path = gguf_model[0]
    assert EngineConfig.load("random:tiny-llama").model.activation_dtype == "auto"
    assert EngineConfig.load(path, activation_dtype="int8").model.activation_dtype == "int8"     # GGUF, auto
    assert EngineConfig.load(path, activation_dtype="float32").model.activation_dtype == "float32"
    EngineConfig.load("random:tiny-llama", weight_dtype="int8", activation_dtype="int8")
    with pytest.raises(ValueError, match=r"model.activation_dtype must be one of \['auto', 'float32', 'int8'\], "
                                         r"got 'int4'"):
        EngineConfig.load(path, activation_dtype="int4")
    with pytest.raises(ValueError, match=r"'int8' runs on the CPU only .*use 'float32'"):
        EngineConfig.load(path, activation_dtype="int8", device="npu")
    with pytest.raises(ValueError, match=r"model.dtype is 'float16'"):
        EngineConfig.load(path, activation_dtype="int8", dtype="float16")
    with pytest.raises(ValueError, match=r"weight_dtype 'float32' keeps none"):
        EngineConfig.load(path, activation_dtype="int8", weight_dtype="float32")
    with pytest.raises(ValueError, match=r"'auto' keeps them only for a GGUF .* model.path is 'random:tiny-llama'"):
        EngineConfig.load("random:tiny-llama", activation_dtype="int8")


def test_auto_activations_are_int8_for_quantized_linears_in_float32(gguf_model):
    """activation_dtype auto: int8 into the linears kept quantized of a float32 model, float32 otherwise (float
    weights, a float16 model, no quantized linear); never an error where int8 would be one."""
    path, config, _ = gguf_model
    quantized, _ = weight_formats(path, config, "auto")
    assert quantized and linear_activations("auto", quantized, "float32") == "int8"
    assert linear_activations("auto", quantized, "float16") == "float32"
    assert linear_activations("auto", {}, "float32") == "float32"
    assert linear_activations("float32", quantized, "float32") == "float32"
    assert weight_formats(path, config, "auto", activation_dtype="auto")[1][-1].startswith("activations: int8")
    assert not weight_formats(path, config, "auto", activation_dtype="auto", model_dtype="float16")[1][-1].startswith(
        "activations")
    for overrides in ({}, {"weight_dtype": "float32"}, {"dtype": "float16"}, {"device": "npu"}):
        EngineConfig.load(path, **overrides)                     # auto everywhere: no error
    EngineConfig.load("random:tiny-llama")


def greedy(model, tokens, steps):
    """Greedy tokens of `steps` prefills, each of the sequence so far (at most T_PAD tokens)."""
    out = list(tokens)
    for _ in range(steps):
        out.append(int(np.argmax(logits(model, out))))
    return out[len(tokens):]


def test_int8_activations_on_the_gguf_model(gguf_model):
    """activation_dtype int8 on the GGUF model (Q4_1, Q4_0 and Q8_0 linears, a Q8_0 lm_head): the linears take the
    dot layout and kernel, the memory the budget counts is unchanged, the logits stay within 3% of the float32
    activations' and greedy decoding agrees on most tokens."""
    ms.set_context(mode=ms.GRAPH_MODE)
    path, config, _ = gguf_model
    formats, notes = weight_formats(path, config, "auto", activation_dtype="int8")
    assert notes[-1] == "activations: int8 (per row and block of 32) into the 9 quantized linears"
    models = {}
    for act in ("float32", "int8"):
        models[act] = LlamaForCausalLM(config, NB, BS, weight_formats=formats, activation_dtype=act)
        models[act].load_weights(iter_weights(path, config, formats=formats))
    dot = models["int8"].layers[0].mlp.down_proj
    assert dot.activations == "int8" and dot.quant_matmul.activations == "int8"
    assert dot.weight.dtype == ms.uint8 and models["float32"].layers[0].mlp.down_proj.weight.dtype == ms.int8
    assert not np.array_equal(dot.weight.asnumpy(), models["float32"].layers[0].mlp.down_proj.weight.asnumpy())
    assert held_bytes(models["int8"]) == held_bytes(models["float32"]) == memory_budget.weight_bytes(
        config, 1, 4, True, formats)
    got, ref = logits(models["int8"], TOKENS), logits(models["float32"], TOKENS)
    assert 0 < np.abs(got - ref).max() < 0.03 * np.abs(ref).max()
    a, b = greedy(models["int8"], TOKENS[:4], 8), greedy(models["float32"], TOKENS[:4], 8)
    assert sum(x == y for x, y in zip(a, b)) >= 6, (a, b)


def test_int8_activations_with_int8_weights_and_float_linears():
    """weight_dtype int8 (K % 32 != 0: partial blocks) with int8 activations stays near the float logits; a float
    linear (no format) keeps float32 activations."""
    ms.set_context(mode=ms.GRAPH_MODE)
    config = tiny_config(tie_word_embeddings=False, hidden_size=48, intermediate_size=100)
    weights = nl.random_weights(config, seed=4)
    formats, notes = weight_formats("random:tiny-llama", config, "int8", activation_dtype="int8")
    formats.pop("lm_head.weight")
    model = LlamaForCausalLM(config, NB, BS, weight_formats=formats, activation_dtype="int8")
    model.load_weights(weights.items())
    assert model.layers[1].self_attn.o_proj.activations == "int8"
    assert model.layers[1].mlp.down_proj.weight.dtype == ms.uint8
    assert model.lm_head.activations == "float32" and model.lm_head.quant_matmul is None
    got, ref = logits(model, TOKENS), nl.forward(weights, config, TOKENS)[-1]
    assert np.abs(got - ref).max() < 0.03 * np.abs(ref).max()
    assert int(np.argmax(got)) == int(np.argmax(ref))


def test_engine_generates_with_int8_activations(tiny_llm):
    """The engine with weight_dtype int8 and activation_dtype int8 generates; greedy tokens agree with the shared
    float32 engine's on most positions (int8 weights and activations move the tiny random model's logits a little;
    decode batches of 3 rows take the small-batch items, the 40-token prompt a row block)."""
    from ms_atb import LLM, SamplingParams
    from engine_helpers import TINY_BUILD, TINY_CONFIG
    llm = LLM(TINY_CONFIG, weight_dtype="int8", **{**TINY_BUILD, "activation_dtype": "int8"})
    assert set(llm.weight_formats.values()) == {"int8"}
    prompts = [[1, 2, 3, 4, 5], list(range(100, 140)), [7, 300, 9]]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    got = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    ref = [o.token_ids for o in tiny_llm.generate(prompts, params, use_tqdm=False)]
    same = sum(a == b for g, r in zip(got, ref) for a, b in zip(g, r))
    assert all(len(g) == 12 for g in got) and same >= 29, (got, ref)
    # Compiled graphs name the kernels: an on-disk graph of float32 activations is never reused for int8.
    assert llm.runner.graph_key_parts()["activation_dtype"] == "int8"
    assert tiny_llm.runner.graph_key_parts()["activation_dtype"] == "float32"


def test_an_engine_build_chooses_weight_formats_and_checks_max_model_len_once(monkeypatch):
    """LLM(...) decides the linears' formats and checks max_model_len against the model once, and its model runner
    builds the model with those formats."""
    from ms_atb import LLM
    from ms_atb.formats import weight_formats as formats_module
    from ms_atb.worker import model_runner
    from engine_helpers import TINY_BUILD, TINY_CONFIG
    calls = {"formats": 0, "max_model_len": 0}

    def counted(fn, key):
        def call(*args, **kwargs):
            calls[key] += 1
            return fn(*args, **kwargs)
        return call
    monkeypatch.setattr(formats_module, "weight_formats", counted(formats_module.weight_formats, "formats"))
    monkeypatch.setattr(model_runner, "weight_formats", formats_module.weight_formats)
    monkeypatch.setattr(LlamaConfig, "check_max_model_len",
                        counted(LlamaConfig.check_max_model_len, "max_model_len"))
    llm = LLM(TINY_CONFIG, weight_dtype="int8", **TINY_BUILD)
    assert calls == {"formats": 1, "max_model_len": 1}
    assert llm.runner.weight_formats is llm.weight_formats and set(llm.weight_formats.values()) == {"int8"}
    assert llm.runner.model.lm_head.fmt == "int8"
