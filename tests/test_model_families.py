"""Llama 3, Qwen2, Qwen3 and Mistral: tiny random models made by HF transformers (tests/data/families/,
scripts/make_family_fixtures.py) served by LLM(...) give HF's greedy tokens exactly and its
last-position log-probabilities within LOGPROB_TOL, with prefix caching on and off, chunked prefill
(32-token steps, prompts up to 61 tokens) and a pool small enough to preempt; the GGUF copies give
the same tokens. Each family's engine is built once (module scope) and reset between runs."""
import json
import os
import shutil

import numpy as np
import pytest

from ms_atb import LLM, SamplingParams
from ms_atb.formats.loader import load_config
from engine_helpers import EXACT, with_buckets

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "families")
FAMILIES = ("llama3", "qwen2", "qwen3", "mistral")
GGUF_FAMILIES = ("llama3", "qwen2", "qwen3")
SETTINGS = dict(max_num_seqs=4, max_num_batched_tokens=32, num_blocks=64, max_model_len=128, precompile=False,
                **EXACT)
BUCKETS = [32]           # one graph per engine: every step padded to 32 tokens
# Both sides compute in float32 on the same float16 weights; the engine's kernels sum in another order.
LOGPROB_TOL = 1e-3
TOP = 20


def _reference(family):
    with open(os.path.join(DATA, family, "reference.json")) as f:
        return json.load(f)


def _greedy(n=16, **kw):
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, **kw)


@pytest.fixture(scope="module", params=FAMILIES)
def family_llm(request):
    family = request.param
    llm = with_buckets(LLM(os.path.join(DATA, family), enable_prefix_caching=True, **SETTINGS), BUCKETS)
    return family, llm


def _check_logprobs(out, prompt):
    ref = np.asarray(prompt["last_logits"], np.float64)
    ref_lp = ref - ref.max() - np.log(np.exp(ref - ref.max()).sum())
    got = out.logprobs[0]
    assert len(got) >= TOP
    for token, lp in got.items():
        assert abs(lp - ref_lp[token]) < LOGPROB_TOL, (token, lp, ref_lp[token])
    top = sorted(got, key=got.get, reverse=True)[:TOP]
    assert top[0] == int(np.argmax(ref))


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_greedy_tokens_and_logprobs_match_hf(family_llm, prefix_caching):
    family, llm = family_llm
    ref = _reference(family)["prompts"]
    llm.reset_scheduler(enable_prefix_caching=prefix_caching)
    prompts = [p["prompt_ids"] for p in ref]
    outs = llm.generate(prompts, _greedy(logprobs=TOP), use_tqdm=False)
    for out, p in zip(outs, ref):
        assert out.token_ids == p["greedy_ids"]
        _check_logprobs(out, p)
    # Again over the cached prefixes (prefix caching on: hits), as one batch with a shared prefix.
    shared = [ref[2]["prompt_ids"], ref[2]["prompt_ids"]]
    again = llm.generate(shared, _greedy(), use_tqdm=False)
    assert [o.token_ids for o in again] == [ref[2]["greedy_ids"]] * 2
    if prefix_caching:
        assert llm.stats()["prefix_cache_hits"] > 0


def test_preempting_pool_gives_the_same_tokens(family_llm):
    family, llm = family_llm
    ref = _reference(family)["prompts"]
    # 6 blocks of 16: the 61- and 23-token prompts take them all, and the first one's growth preempts.
    llm.reset_scheduler(num_blocks=6, enable_prefix_caching=False)
    ref = ref[::-1]
    outs = llm.generate([p["prompt_ids"] for p in ref], _greedy(), use_tqdm=False)
    assert [o.token_ids for o in outs] == [p["greedy_ids"] for p in ref]
    assert llm.stats()["num_preemptions"] > 0
    llm.reset_scheduler(num_blocks=64)


def test_generation_config_eos_list_stops(family_llm):
    family, llm = family_llm
    doc = _reference(family)
    stop, greedy = doc["generation_eos"][0], doc["prompts"][0]["greedy_ids"]
    assert set(doc["generation_eos"]) <= llm.stop_token_ids
    out = llm.generate([doc["prompts"][0]["prompt_ids"]], SamplingParams(max_tokens=16, temperature=0.0),
                       use_tqdm=False)[0]
    k = min(greedy.index(t) for t in llm.stop_token_ids if t in greedy)
    assert greedy[k] == stop or greedy.index(stop) > k
    assert out.token_ids == greedy[:k + 1] and out.finish_reason == "stop"


def test_no_tokenizer_files_token_ids_work_and_text_is_refused(family_llm):
    family, llm = family_llm
    assert llm.tokenizer is None
    with pytest.raises(ValueError, match=r"no tokenizer \(no tokenizer.json or tokenizer.model in its directory"):
        llm.generate(["hello"], _greedy(2), use_tqdm=False)


def test_family_options_read_from_config_json():
    c = {f: load_config(os.path.join(DATA, f)) for f in FAMILIES}
    assert c["llama3"].rope_scaling["rope_type"] == "llama3" and c["llama3"].tie_word_embeddings
    assert c["llama3"].rope_scaling["original_max_position_embeddings"] == 32   # prompts run past it
    assert c["qwen2"].attention_bias and not c["qwen2"].qk_norm and c["qwen2"].rope_theta == 1e6
    assert c["qwen2"].tie_word_embeddings and c["qwen2"].sliding_window is None
    assert c["qwen3"].qk_norm and not c["qwen3"].attention_bias and not c["qwen3"].tie_word_embeddings
    assert c["qwen3"].head_dim == 32 != c["qwen3"].hidden_size // c["qwen3"].num_attention_heads
    assert c["mistral"].sliding_window == 128 and not c["mistral"].tie_word_embeddings


def test_mistral_window_refuses_a_longer_max_model_len():
    with pytest.raises(ValueError, match=r"max_model_len 129 exceeds the model's sliding_window 128"):
        LLM.prepare(os.path.join(DATA, "mistral"), **dict(SETTINGS, max_model_len=129))
    assert LLM.prepare(os.path.join(DATA, "mistral"), num_blocks=64).max_model_len == 128


@pytest.mark.slow
@pytest.mark.parametrize("family", GGUF_FAMILIES)
def test_gguf_copy_gives_the_same_tokens(family):
    path = os.path.join(DATA, family + ".gguf")
    c, hf = load_config(path), load_config(os.path.join(DATA, family))
    assert (c.attention_bias, c.qk_norm, c.head_dim) == (hf.attention_bias, hf.qk_norm, hf.head_dim)
    assert c.rope_interleaved == (family == "llama3")      # llama.cpp permutes q/k rows of llama only
    llm = with_buckets(LLM(path, **SETTINGS), BUCKETS)
    ref = _reference(family)["prompts"]
    outs = llm.generate([p["prompt_ids"] for p in ref], _greedy(logprobs=TOP), use_tqdm=False)
    for out, p in zip(outs, ref):
        assert out.token_ids == p["greedy_ids"]
        _check_logprobs(out, p)


@pytest.mark.parametrize("change, match", [
    (dict(model_type="gpt2"), r"model_type 'gpt2' is not supported; allowed: \['llama', 'mistral', 'qwen2', "
                              r"'qwen3'\]"),
    (dict(model_type=None, architectures=["FalconForCausalLM"]), r"architectures \['FalconForCausalLM'\] are "
                                                                  r"not supported"),
    (dict(architectures=["LlamaForCausalLM"]), r"do not match model_type 'qwen2'"),
    (dict(rope_scaling={"rope_type": "longrope", "factor": 2.0}), r"rope_scaling type 'longrope' not supported"),
    (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0}), r"rope_scaling of type llama3 lacks "
                                                                r"\['low_freq_factor'"),
    (dict(use_sliding_window=True), r"use_sliding_window=true is not supported"),
    (dict(num_hidden_layers=None), r"num_hidden_layers"),
])
def test_bad_family_configs_name_the_key(tmp_path, change, match):
    with open(os.path.join(DATA, "qwen2", "config.json")) as f:
        d = json.load(f)
    for k, v in change.items():
        if v is None:
            d.pop(k, None)
        else:
            d[k] = v
    (tmp_path / "config.json").write_text(json.dumps(d))
    (tmp_path / "model.safetensors").write_bytes(b"")     # never read: the config fails first
    with pytest.raises(ValueError, match=match):
        load_config(str(tmp_path))


def test_weights_that_disagree_with_the_config_name_the_tensor(tmp_path):
    from ms_atb.models.weights import iter_weights
    shutil.copytree(os.path.join(DATA, "qwen3"), tmp_path / "m")
    d = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps(dict(d, head_dim=16)))
    with pytest.raises(ValueError, match=r"self_attn.q_proj.weight has shape \(128, 64\), expected \(64, 64\)"):
        list(iter_weights(str(tmp_path / "m"), load_config(str(tmp_path / "m"))))
    (tmp_path / "m" / "config.json").write_text(json.dumps(dict(d, model_type="llama",
                                                                architectures=["LlamaForCausalLM"])))
    with pytest.raises(ValueError, match=r"unexpected tensor model.layers.0.self_attn.k_norm.weight"):
        list(iter_weights(str(tmp_path / "m"), load_config(str(tmp_path / "m"))))


def test_tp2_slices_biases_with_their_columns_and_replicates_qk_norms():
    from ms_atb.models.weights import iter_weights
    for family in ("qwen2", "qwen3"):
        path = os.path.join(DATA, family)
        c = load_config(path)
        full = dict(iter_weights(path, c))
        ranks = [dict(iter_weights(path, c, 2, r)) for r in range(2)]
        for name, w in full.items():
            if name.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias")):
                np.testing.assert_array_equal(np.concatenate([r[name] for r in ranks]), w)
            elif name.endswith(("q_norm.weight", "k_norm.weight")):
                for r in ranks:
                    np.testing.assert_array_equal(r[name], w)
        assert any(n.endswith("bias") for n in full) == (family == "qwen2")
        assert any(n.endswith("q_norm.weight") for n in full) == (family == "qwen3")


def test_unknown_family_fails_before_any_weight_is_read(tmp_path, monkeypatch):
    from ms_atb.models import weights

    def fail(*args, **kwargs):
        raise AssertionError("weights were read before the family was checked")
    monkeypatch.setattr(weights, "iter_weights", fail)
    shutil.copytree(os.path.join(DATA, "qwen2"), tmp_path / "m")
    d = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps(dict(d, model_type="phi3")))
    with pytest.raises(ValueError, match=r"model_type 'phi3' is not supported; allowed: \['llama', 'mistral'"):
        LLM(str(tmp_path / "m"), **SETTINGS)
    import gguf
    w = gguf.GGUFWriter(str(tmp_path / "g.gguf"), "gemma")
    w.add_block_count(2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match=r"GGUF architecture 'gemma' is not supported; allowed: "
                                         r"\['llama', 'qwen2', 'qwen3'\]"):
        LLM(str(tmp_path / "g.gguf"), **SETTINGS)


@pytest.mark.slow
def test_qwen2_under_msrun_tp2_gives_hf_tokens(tmp_path):
    """Two ranks split the q/k/v biases with their columns: both give HF's greedy tokens."""
    from test_tensor_parallel import msrun, logs, read_rank
    out_dir, log_dir = tmp_path / "out", tmp_path / "log"
    out_dir.mkdir()
    worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "family_tp_worker.py")
    run = msrun(2, [worker, os.path.join(DATA, "qwen2"), str(out_dir)], log_dir)
    assert run.returncode == 0, f"{run.stdout[-2000:]}\n{logs(log_dir)}"
    ref = _reference("qwen2")["prompts"]
    for r in (0, 1):
        result = read_rank(out_dir, r, log_dir)
        assert result["token_ids"] == [p["greedy_ids"] for p in ref]
        for lp, p in zip(result["logprobs"], ref):
            logits = np.asarray(p["last_logits"], np.float64)
            ref_lp = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
            assert max(abs(v - ref_lp[int(t)]) for t, v in lp.items()) < LOGPROB_TOL
