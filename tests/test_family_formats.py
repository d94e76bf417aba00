"""The family fixtures (tests/data/families/) in the other weight formats, written here from their safetensors:
Mistral as llama.cpp writes it to GGUF (architecture llama, q/k rows permuted for interleaved RoPE), and Qwen2
as a MindSpore .ckpt under MindFormers' names (q/k/v biases as attention.wq/wk/wv.bias, or fused into
attention.w_qkv) with a MindFormers YAML (`qkv_has_bias: True`). Each loads the fixture's weights exactly and
gives HF's greedy tokens (reference.json)."""
import json
import os

import numpy as np
import pytest

from ms_atb import LLM, SamplingParams
from engine_helpers import EXACT, with_buckets
from ms_atb.formats.loader import load_config
from ms_atb.models.weights import iter_weights

from family_files import read_family, write_gguf, write_mindformers_ckpt

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "families")
SETTINGS = dict(max_num_seqs=4, max_num_batched_tokens=32, num_blocks=64, max_model_len=128, precompile=False,
                **EXACT)
LOGPROB_TOL = 1e-3          # as tests/test_model_families.py: float32 compute on the same float16 weights
QWEN2_YAML = """\
model:
  model_config:
    type: LlamaConfig
    seq_length: 512
    hidden_size: 64
    num_layers: 2
    num_heads: 4
    n_kv_heads: 2
    vocab_size: 256
    intermediate_size: 128
    max_position_embedding: 512
    qkv_has_bias: True
    rms_norm_eps: 1.0e-6
    theta: 1000000.0
    tie_word_embeddings: True
    bos_token_id: 1
    eos_token_id: [2]
    qkv_concat: {fused}
  arch:
    type: LlamaForCausalLM
"""


def _reference(family):
    with open(os.path.join(DATA, family, "reference.json")) as f:
        return json.load(f)["prompts"]


def _check_reference_tokens(llm, family):
    ref = _reference(family)
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, logprobs=5)
    outs = llm.generate([p["prompt_ids"] for p in ref], params, use_tqdm=False)
    for out, p in zip(outs, ref):
        assert out.token_ids == p["greedy_ids"]
        logits = np.asarray(p["last_logits"], np.float64)
        ref_lp = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
        assert max(abs(lp - ref_lp[t]) for t, lp in out.logprobs[0].items()) < LOGPROB_TOL


@pytest.fixture(scope="module")
def mistral_gguf(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("gguf") / "mistral.gguf")
    write_gguf(os.path.join(DATA, "mistral"), path, "llama")
    return path


def test_mistral_gguf_reads_as_llama_with_permuted_qk_rows(mistral_gguf):
    c, hf = load_config(mistral_gguf), load_config(os.path.join(DATA, "mistral"))
    assert c.rope_interleaved and not hf.rope_interleaved          # llama.cpp permutes llama's q/k rows
    for field in ("vocab_size", "hidden_size", "num_key_value_heads", "head_dim", "rope_theta", "rms_norm_eps",
                  "tie_word_embeddings", "attention_bias", "qk_norm"):
        assert getattr(c, field) == getattr(hf, field), field
    assert c.sliding_window is None       # llama.cpp's llama architecture has no window key
    _, want = read_family(os.path.join(DATA, "mistral"))
    got = dict(iter_weights(mistral_gguf, c))
    assert sorted(got) == sorted(want)
    for name, w in got.items():
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = c.num_attention_heads if "q_proj" in name else c.num_key_value_heads
            # interleaved -> rotate-half: each head's rows (0, 2, 4, ..., 1, 3, 5, ...)
            w = w.reshape(heads, c.head_dim // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)
            assert not np.array_equal(got[name], want[name])
        np.testing.assert_array_equal(w, want[name], err_msg=name)


def test_mistral_gguf_gives_hf_tokens(mistral_gguf):
    _check_reference_tokens(with_buckets(LLM(mistral_gguf, **SETTINGS), [32]), "mistral")     # one graph


@pytest.mark.parametrize("fused", [False, True])
def test_qwen2_mindformers_ckpt_loads_the_biases(tmp_path, fused):
    path = str(tmp_path / "qwen2.ckpt")
    want = write_mindformers_ckpt(os.path.join(DATA, "qwen2"), path, fused=fused)
    (tmp_path / "qwen2.yaml").write_text(QWEN2_YAML.format(fused=fused))
    c, hf = load_config(path), load_config(os.path.join(DATA, "qwen2"))
    for field in ("attention_bias", "tie_word_embeddings", "rope_theta", "rms_norm_eps", "head_dim",
                  "num_key_value_heads", "rope_interleaved", "qk_norm"):
        assert getattr(c, field) == getattr(hf, field), field
    got = dict(iter_weights(path, c))
    assert sorted(got) == sorted(want) and sum(n.endswith("_proj.bias") for n in got) == 6
    for name, w in got.items():
        np.testing.assert_array_equal(w, want[name], err_msg=name)
    halves = [dict(iter_weights(path, c, 2, r)) for r in range(2)]       # biases split with their columns
    for name in [n for n in want if n.endswith("_proj.bias")]:
        np.testing.assert_array_equal(np.concatenate([h[name] for h in halves]), want[name])


def test_qwen2_mindformers_ckpt_gives_hf_tokens(tmp_path):
    path = str(tmp_path / "qwen2.ckpt")
    write_mindformers_ckpt(os.path.join(DATA, "qwen2"), path)
    (tmp_path / "qwen2.yaml").write_text(QWEN2_YAML.format(fused=False))
    llm = with_buckets(LLM(str(tmp_path), **SETTINGS), [32])      # the folder holding the .ckpt and its YAML
    assert llm.stop_token_ids == {2}
    _check_reference_tokens(llm, "qwen2")
    by_file = LLM.prepare(path, **SETTINGS)    # the .ckpt file itself: no tokenizer files beside it
    assert by_file.tokenizer is None and by_file.model_config.attention_bias


def test_mindformers_biases_without_qkv_has_bias_are_refused(tmp_path):
    path = str(tmp_path / "qwen2.ckpt")
    write_mindformers_ckpt(os.path.join(DATA, "qwen2"), path, fused=True)
    (tmp_path / "qwen2.yaml").write_text(QWEN2_YAML.format(fused=True).replace("    qkv_has_bias: True\n", ""))
    with pytest.raises(ValueError, match=r"qwen2.ckpt: unexpected tensor model.layers.0.self_attn.k_proj.bias "
                                         r"\(shape \(32,\)\)"):
        next(iter_weights(path, load_config(path)))
    import mindspore as ms
    ms.save_checkpoint([{"name": "model.layers.0.attention.w_qkv.bias", "data": ms.Tensor(np.zeros(100, np.float32))}],
                       path)
    with pytest.raises(ValueError, match=r"tensor model.layers.0.attention.w_qkv.bias has shape \(100,\), "
                                         r"expected \(128,\) \(fused rows\)"):
        next(iter_weights(path, load_config(path)))
