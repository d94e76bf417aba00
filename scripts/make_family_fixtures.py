"""Writes tests/data/families/: one tiny random model per Llama-shaped family, built with HF transformers.

Run in a venv with torch + transformers + gguf (never needed by the test suite):
    /tmp/hfvenv/bin/python scripts/make_family_fixtures.py [--out tests/data/families]
For each family: <family>/ (config.json, generation_config.json, model.safetensors in float16) and
<family>/reference.json: HF's last-position logits (float32 forward on the float16-rounded weights) and
its greedy continuation (NUM_NEW_TOKENS tokens, no EOS stop) for a few token-id prompts; and, where
llama.cpp has the architecture, <family>.gguf (float16, named and permuted as llama.cpp's converter does).
Weights are drawn so that logits are O(10) apart (HF's 0.02 initializer gives near-ties), biases and
norm weights far from their 0 / 1 defaults, so a loader that drops one fails the comparison.
"""
import argparse
import json
import math
import os

import numpy as np

NUM_NEW_TOKENS = 16
VOCAB = 256
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
              rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2)
FAMILIES = {
    # Llama 3.x: llama3 rope scaling (original context 32, so prompts run past it), tied embeddings.
    "llama3": ("llama", dict(rope_theta=500000.0, tie_word_embeddings=True,
                             rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                           "high_freq_factor": 4.0,
                                           "original_max_position_embeddings": 32})),
    # Qwen2 / 2.5: q/k/v biases (implicit in model_type qwen2), rope_theta 1e6, tied embeddings.
    "qwen2": ("qwen2", dict(rope_theta=1e6, tie_word_embeddings=True, use_sliding_window=False,
                            sliding_window=None)),
    # Qwen3: per-head q/k RMSNorm, head_dim 32 != hidden 64 / 4 heads, untied.
    "qwen3": ("qwen3", dict(rope_theta=1e6, head_dim=32, tie_word_embeddings=False, attention_bias=False,
                            use_sliding_window=False, sliding_window=None)),
    # Mistral: sliding_window 128 (the engine refuses max_model_len above it), untied.
    "mistral": ("mistral", dict(rope_theta=1e6, sliding_window=128, tie_word_embeddings=False)),
}
GGUF_ARCH = {"llama3": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
PROMPT_LENGTHS = (5, 23, 61)
OUT_GAIN = 4.0        # 61 + 16 > 32: past llama3's original context


def build(model_type: str, extra: dict, seed: int):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    config = AutoConfig.for_model(model_type, **COMMON, **extra)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(seed)
    hidden = config.hidden_size
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("embed_tokens.weight") or name == "lm_head.weight":
                # Logits' std ~8; a tied embedding smaller, lest the token's own row dominate the stream
                # (it would then predict itself), and the final norm scaled up to make up for it.
                std = 8.0 / math.sqrt(hidden) * (0.25 if config.tie_word_embeddings else 1.0)
                p.copy_(torch.randn(p.shape, generator=gen) * std)
            elif name == "model.norm.weight" and config.tie_word_embeddings:
                p.copy_(4.0 * (1.0 + 0.3 * torch.randn(p.shape, generator=gen)))
            elif name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            elif p.ndim == 1:                     # RMSNorm weights, q/k norms included
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen))
            else:
                scale = 1.0 / math.sqrt(p.shape[1])
                if name.endswith(("o_proj.weight", "down_proj.weight")):
                    scale *= OUT_GAIN               # the layers, not the token's own embedding, decide
                p.copy_(torch.randn(p.shape, generator=gen) * scale)
            p.copy_(p.half().float())             # the float16 file holds exactly these weights
    return config, model


def reference(model, prompts):
    import torch
    out = []
    with torch.no_grad():
        for ids in prompts:
            seq = list(ids)
            last = None
            for _ in range(NUM_NEW_TOKENS):      # greedy by full forwards: no EOS stop, no cache
                logits = model(torch.tensor([seq])).logits[0, -1].float()
                if last is None:
                    last = logits
                seq.append(int(logits.argmax()))
            top2 = torch.topk(last, 2).values
            out.append({"prompt_ids": list(ids), "last_logits": [round(float(v), 5) for v in last],
                        "top1_margin": round(float(top2[0] - top2[1]), 5),
                        "greedy_ids": seq[len(ids):]})
    return out


def save_gguf(path, arch, config, model):
    import gguf
    w = gguf.GGUFWriter(path, arch)
    c = config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    rope = getattr(c, "rope_parameters", None) or {"rope_theta": c.rope_theta, **(c.rope_scaling or {})}
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_rope_dimension_count(head_dim)
    w.add_bos_token_id(c.bos_token_id)
    w.add_eos_token_id(c.eos_token_id)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    # Byte-level BPE needs a merge: id 255 is the merge of ids 65 and 66 ("AB"), not a byte.
    tokens = _byte_tokens()
    w.add_token_list(tokens[:255] + [tokens[65] + tokens[66]])
    w.add_token_types([1] * VOCAB)
    w.add_token_merges([f"{tokens[65]} {tokens[66]}"])
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    layer = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
             "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
             "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
             "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
             "self_attn.v_proj.bias": "attn_v.bias", "self_attn.q_norm.weight": "attn_q_norm.weight",
             "self_attn.k_norm.weight": "attn_k_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
             "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight"}
    for i in range(c.num_hidden_layers):
        names.update({f"model.layers.{i}.{k}": f"blk.{i}.{v}" for k, v in layer.items()})
    if rope.get("rope_type") == "llama3":        # llama.cpp bakes llama3 scaling into rope_freqs
        w.add_tensor("rope_freqs.weight", _llama3_freq_factors(rope["rope_theta"], head_dim, rope))
    for name, p in model.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        a = p.float().numpy()
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = c.num_attention_heads if "q_proj" in name else c.num_key_value_heads
            a = a.reshape(heads, 2, a.shape[0] // heads // 2, *a.shape[1:]).swapaxes(1, 2).reshape(a.shape)
        w.add_tensor(names[name], a.astype(np.float16) if a.ndim == 2 else a.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _byte_tokens():
    """GPT-2's byte-to-unicode alphabet: token b is byte b."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


def _llama3_freq_factors(base, dim, rs):
    """llama.cpp's rope_freqs for llama3 scaling: inv_freq / factor_i is the scaled frequency."""
    freqs = 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old = rs["original_max_position_embeddings"]
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < old / hi:
            out.append(1.0)
        elif wavelen > old / lo:
            out.append(factor)
        else:
            smooth = (old / wavelen - lo) / (hi - lo)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, np.float32)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data", "families"))
    args = ap.parse_args()
    import torch
    import transformers
    from safetensors.torch import save_file
    torch.set_num_threads(2)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, VOCAB, n).tolist() for n in PROMPT_LENGTHS]
    for seed, (family, (model_type, extra)) in enumerate(FAMILIES.items()):
        config, model = build(model_type, extra, seed)
        folder = os.path.join(args.out, family)
        os.makedirs(folder, exist_ok=True)
        config.save_pretrained(folder)
        state = {k: v.half().contiguous() for k, v in model.state_dict().items()
                 if not (k == "lm_head.weight" and config.tie_word_embeddings)}
        save_file(state, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
        refs = reference(model, prompts)
        # EOS from generation_config.json: the first greedy token of prompt 0 after the first that is new (absent before it) and id 2.
        g = refs[0]["greedy_ids"]
        stop = next(t for k, t in enumerate(g) if k >= 1 and t not in g[:k] and t != 2)
        with open(os.path.join(folder, "generation_config.json"), "w") as f:
            json.dump({"bos_token_id": 1, "eos_token_id": [stop, 2]}, f, indent=1)
        with open(os.path.join(folder, "reference.json"), "w") as f:
            json.dump({"about": "HF transformers float32 on these float16 weights; scripts/make_family_fixtures.py",
                       "transformers": transformers.__version__, "torch": torch.__version__,
                       "generation_eos": [stop, 2], "prompts": refs}, f)
        if family in GGUF_ARCH:
            save_gguf(os.path.join(args.out, family + ".gguf"), GGUF_ARCH[family], config, model)
        print(family, [r["greedy_ids"][:6] for r in refs], "margins", [r["top1_margin"] for r in refs])


if __name__ == "__main__":
    main()
