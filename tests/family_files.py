"""Other file formats of the family fixtures (tests/data/families/), written from their safetensors weights:
a GGUF file as llama.cpp's converter writes it (names, q/k row permutation for the llama architecture, float16
linears), and a MindSpore .ckpt under MindFormers' parameter names (research/qwen2*/convert_weight.py)."""
import json
import os

import numpy as np

_GGUF_LAYER = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
               "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
               "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
               "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
               "self_attn.v_proj.bias": "attn_v.bias", "self_attn.q_norm.weight": "attn_q_norm.weight",
               "self_attn.k_norm.weight": "attn_k_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
               "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight"}
_GGUF_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                "lm_head.weight": "output.weight"}
# MindFormers' HF -> MindSpore renames (research/qwen2_5/convert_weight.py name_replace).
_MF_LAYER = {"self_attn.q_proj": "attention.wq", "self_attn.k_proj": "attention.wk",
             "self_attn.v_proj": "attention.wv", "self_attn.o_proj": "attention.wo",
             "mlp.gate_proj": "feed_forward.w1", "mlp.down_proj": "feed_forward.w2", "mlp.up_proj": "feed_forward.w3",
             "input_layernorm": "attention_norm", "post_attention_layernorm": "ffn_norm"}
_MF_GLOBAL = {"model.embed_tokens.weight": "model.tok_embeddings.embedding_weight",
              "model.norm.weight": "model.norm_out.weight", "lm_head.weight": "lm_head.weight"}


def read_family(folder: str) -> tuple[dict, dict]:
    """(config.json dict, {HF name: float32 array}) of a family fixture."""
    from safetensors.numpy import load_file
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    return config, {n: a.astype(np.float32) for n, a in load_file(os.path.join(folder, "model.safetensors")).items()}


def byte_vocab(vocab_size: int) -> dict:
    """A gpt2-style GGUF vocabulary as scripts/make_family_fixtures.py writes it: ids 0-254 are bytes (GPT-2's
    byte alphabet), id 255 the one merge "AB" (byte-level BPE needs a merge), then unused [PAD] tokens."""
    from ms_atb.text.gguf_vocab import byte_to_unicode
    table = byte_to_unicode()
    tokens = [table[b] for b in range(255)] + [table[65] + table[66]]
    tokens = tokens[:vocab_size] + [f"[PAD{i}]" for i in range(vocab_size - len(tokens))]
    return dict(tokens=tokens, merges=[f"{table[65]} {table[66]}"], types=[1] * len(tokens), pre="default")


def write_gguf(folder: str, path: str, arch: str, vocab: dict | None = None) -> None:
    """The fixture in `folder` as a GGUF of architecture `arch`. `vocab`: tokens, merges, types, pre and
    optionally bos, eos, chat_template (default: byte_vocab)."""
    import gguf
    c, weights = read_family(folder)
    rope = c.get("rope_parameters") or {"rope_theta": c.get("rope_theta", 10000.0)}
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    vocab = vocab or byte_vocab(c["vocab_size"])
    w = gguf.GGUFWriter(path, arch)
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_block_count(c["num_hidden_layers"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_rope_dimension_count(head_dim)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(vocab["pre"])
    w.add_token_list(vocab["tokens"])
    w.add_token_types(vocab["types"])
    w.add_token_merges(vocab["merges"])
    w.add_bos_token_id(vocab.get("bos", c["bos_token_id"]))
    w.add_eos_token_id(vocab.get("eos", c["eos_token_id"]))
    if vocab.get("chat_template"):
        w.add_add_bos_token(False)
        w.add_chat_template(vocab["chat_template"])
    names = dict(_GGUF_GLOBAL)
    for i in range(c["num_hidden_layers"]):
        names.update({f"model.layers.{i}.{k}": f"blk.{i}.{v}" for k, v in _GGUF_LAYER.items()})
    for name, a in weights.items():
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            # llama.cpp's convert_hf_to_gguf permute(): each head's rows from rotate-half to interleaved order
            heads = c["num_attention_heads"] if "q_proj" in name else c["num_key_value_heads"]
            a = a.reshape(heads, 2, a.shape[0] // heads // 2, a.shape[1]).swapaxes(1, 2).reshape(a.shape)
        w.add_tensor(names[name], a.astype(np.float16) if a.ndim == 2 else a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def mindformers_name(hf: str) -> str:
    """MindFormers' name of an HF Llama / Qwen2 tensor name."""
    if hf in _MF_GLOBAL:
        return _MF_GLOBAL[hf]
    layer, rest = hf[len("model.layers."):].split(".", 1)
    module, kind = rest.rsplit(".", 1)
    return f"model.layers.{layer}.{_MF_LAYER[module]}.{kind}"


def write_mindformers_ckpt(folder: str, path: str, fused: bool = False) -> dict:
    """The fixture as a MindSpore .ckpt under MindFormers names; `fused`: q/k/v weights and biases as one
    `attention.w_qkv` tensor ([q; k; v] rows) and gate/up as `feed_forward.w_gate_hidden`, as MindFormers'
    qkv_concat conversion up to 1.4.0-beta1 writes them. Returns the HF-named weights written."""
    import mindspore as ms
    c, weights = read_family(folder)
    stored = {mindformers_name(n): a for n, a in weights.items()}
    if fused:
        for i in range(c["num_hidden_layers"]):
            p = f"model.layers.{i}."
            for kind in ("weight", "bias"):
                if p + f"attention.wq.{kind}" in stored:
                    stored[p + f"attention.w_qkv.{kind}"] = np.concatenate(
                        [stored.pop(p + f"attention.w{x}.{kind}") for x in "qkv"])
            stored[p + "feed_forward.w_gate_hidden.weight"] = np.concatenate(
                [stored.pop(p + "feed_forward.w1.weight"), stored.pop(p + "feed_forward.w3.weight")])
    ms.save_checkpoint([{"name": n, "data": ms.Tensor(a)} for n, a in stored.items()], path)
    return weights
