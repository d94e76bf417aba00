"""MindSpore checkpoints with MindFormers' Llama and Qwen2 parameter names, and MindFormers YAML configs.
The file itself is MindSpore's serialisation, read by MindSpore (models/weights.py); this module maps and
slices the tensors it holds.

MindFormers names (its HF -> MindSpore conversion, the same for Llama and for Qwen2 / Qwen2.5, which
MindFormers runs as LlamaForCausalLM with `qkv_has_bias: True`) and their HF equivalents:
  model.tok_embeddings.embedding_weight        model.embed_tokens.weight
  model.layers.N.attention.wq/wk/wv/wo.weight  model.layers.N.self_attn.q/k/v/o_proj.weight
  model.layers.N.attention.wq/wk/wv.bias       model.layers.N.self_attn.q/k/v_proj.bias (Qwen2)
  model.layers.N.feed_forward.w1/w3/w2.weight  model.layers.N.mlp.gate/up/down_proj.weight
  model.layers.N.attention_norm.weight         model.layers.N.input_layernorm.weight
  model.layers.N.ffn_norm.weight               model.layers.N.post_attention_layernorm.weight
  model.norm_out.weight                        model.norm.weight
  lm_head.weight                               lm_head.weight
plus the fused `attention.w_qkv` weight and bias ([q; k; v] rows) and `feed_forward.w_gate_hidden`
([gate; up] rows) of `qkv_concat: True` checkpoints, which are split. That is the fused layout MindFormers
wrote up to 1.4.0-beta1; from 1.4.0-beta2 its conversion interleaves the rows (Megatron's order: q/k/v per
KV head group, gate/up row by row) under the same names, which a file does not record, so such fused files
are not read correctly: convert them without qkv_concat. Linears are [out, in] as in HF, and q/k rows are in
HF's rotate-half order (MindFormers permutes Meta checkpoints into it), so rope_interleaved=False. Optimizer
state and training counters in the file are ignored.
"""
import math
import re

import numpy as np

_LAYER = {
    "attention.wq": "self_attn.q_proj", "attention.wk": "self_attn.k_proj",
    "attention.wv": "self_attn.v_proj", "attention.wo": "self_attn.o_proj",
    "feed_forward.w1": "mlp.gate_proj", "feed_forward.w3": "mlp.up_proj",
    "feed_forward.w2": "mlp.down_proj",
    "attention_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}
_GLOBAL = {"model.tok_embeddings.embedding_weight": "model.embed_tokens.weight",
           "model.norm_out.weight": "model.norm.weight"}
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.([\w.]+?)\.(weight|bias)$")
_FUSED = {"attention.w_qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
          "feed_forward.w_gate_hidden": ("mlp.gate_proj", "mlp.up_proj")}
_TRAINING = ("adam_m.", "adam_v.", "accu_grads.", "moments.", "global_step", "learning_rate",
             "scale_sense", "epoch_num", "step_num", "loss_scale", "current_iterator_step",
             "last_overflow_iterator_step")


def hf_name(mf_name: str) -> str | None:
    """HF name of a (non-fused) MindFormers Llama / Qwen2 name; None for other names."""
    if mf_name in _GLOBAL:
        return _GLOBAL[mf_name]
    m = _LAYER_RE.match(mf_name)
    if m and m.group(2) in _LAYER:
        return f"model.layers.{m.group(1)}.{_LAYER[m.group(2)]}.{m.group(3)}"
    return None


def _fused_parts(name: str, config) -> list | None:
    """[(hf_name, row_start, row_stop)] of a fused MindFormers tensor, None if `name` is not one."""
    m = _LAYER_RE.match(name)
    if not m or m.group(2) not in _FUSED:
        return None
    c = config
    if m.group(2) == "attention.w_qkv":
        q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        sizes = (q, kv, kv)
    else:
        sizes = (c.intermediate_size, c.intermediate_size)
    bounds = np.cumsum((0,) + sizes)
    return [(f"model.layers.{m.group(1)}.{part}.{m.group(3)}", int(a), int(b))
            for part, a, b in zip(_FUSED[m.group(2)], bounds[:-1], bounds[1:])]


def is_training_state(name: str) -> bool:
    """True for optimizer state and training counters, which a reader skips."""
    return name.startswith(_TRAINING)


def iter_ckpt(path: str, params: dict, to_numpy, config, check_shapes, slices: dict):
    """(hf_name, float32 array) of a .ckpt's tensors, sliced. params: {stored name: tensor} as MindSpore read
    the file (models/weights.py), emptied as tensors are yielded so each is freed; to_numpy(tensor): its values
    as a float32 array."""
    table, shapes = {}, {}  # hf_name -> (stored name, rows or None); hf_name -> shape
    for name, p in params.items():
        parts = _fused_parts(name, config)
        if parts is not None:
            if p.shape[0] != parts[-1][2]:
                raise ValueError(f"{path}: tensor {name} has shape {tuple(p.shape)}, expected "
                                 f"{(parts[-1][2],) + tuple(p.shape[1:])} (fused rows)")
            for hf, a, b in parts:
                table[hf], shapes[hf] = (name, (a, b)), (b - a,) + tuple(p.shape[1:])
        else:
            hf = hf_name(name) or name
            table[hf], shapes[hf] = (name, None), tuple(p.shape)
    check_shapes(shapes, config, path)
    fused_left = {}
    for hf, sl in slices.items():
        stored, rows = table[hf]
        w = to_numpy(params[stored])
        if rows is not None:
            w = w[rows[0]:rows[1]]
            fused_left[stored] = fused_left.get(stored, len(_fused_parts(stored, config))) - 1
            if fused_left[stored] == 0:
                del params[stored]
        else:
            del params[stored]
        yield hf, np.ascontiguousarray(w[sl], dtype=np.float32)


def yaml_config(path: str) -> dict:
    """LlamaConfig keyword arguments from a MindFormers YAML's `model.model_config` section; a file
    that is not YAML, or a value of the wrong kind, is a ValueError naming the file."""
    import yaml
    try:
        return _yaml_config(path, yaml)
    except ValueError as e:
        raise e if path in str(e) else ValueError(f"{path}: {e}") from None
    except (yaml.YAMLError, UnicodeDecodeError, TypeError, AttributeError, ZeroDivisionError) as e:
        raise ValueError(f"{path}: not a usable MindFormers YAML ({type(e).__name__}: {e})") from None


def _yaml_config(path: str, yaml) -> dict:
    with open(path, encoding="utf-8") as f:
        doc = yaml.safe_load(f)
    mc = ((doc if isinstance(doc, dict) else {}).get("model") or {}).get("model_config")
    if not isinstance(mc, dict):
        raise ValueError(f"{path}: no model.model_config section (a MindFormers YAML is expected)")

    def need(key):
        if mc.get(key) is None:
            raise ValueError(f"{path}: model.model_config.{key} is missing")
        return mc[key]

    hidden, heads = int(need("hidden_size")), int(need("num_heads"))
    head_dim = hidden // heads
    intermediate = mc.get("intermediate_size")
    if intermediate is None:  # Meta's rule, which MindFormers follows
        ffn = int(2 * 4 * hidden / 3)
        if mc.get("ffn_dim_multiplier") is not None:
            ffn = int(mc["ffn_dim_multiplier"] * ffn)
        multiple = int(mc.get("multiple_of", 256))
        intermediate = multiple * math.ceil(ffn / multiple)
    theta = float(mc.get("theta", 10000.0))
    method, factor = str(mc.get("extend_method", "None")), mc.get("scaling_factor", 1.0)
    scaling = None
    if method == "PI":
        scaling = {"rope_type": "linear", "factor": float(factor)}
    elif method == "NTK":
        theta *= float(factor)
    elif method in ("LINEAR", "LLAMA3", "YARN") and isinstance(factor, dict):
        scaling = {"rope_type": method.lower(), **factor}
    elif method != "None":
        raise ValueError(f"{path}: extend_method {method!r} not supported; allowed: None, PI, NTK, "
                         f"LINEAR, LLAMA3, YARN (the last three with a scaling_factor mapping)")
    max_pos = mc.get("max_position_embedding") or mc.get("seq_length") or 2048
    return dict(
        vocab_size=int(need("vocab_size")),
        hidden_size=hidden,
        intermediate_size=int(intermediate),
        num_hidden_layers=int(need("num_layers")),
        num_attention_heads=heads,
        num_key_value_heads=int(mc.get("n_kv_heads") or heads),
        head_dim=head_dim,
        rms_norm_eps=float(mc.get("rms_norm_eps", 1e-5)),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=int(max(max_pos, mc.get("seq_length") or 0)),
        tie_word_embeddings=bool(mc.get("tie_word_embeddings", False)),
        rope_interleaved=False,
        attention_bias=bool(mc.get("qkv_has_bias", False)),    # Qwen2 / Qwen2.5 as MindFormers configures them
        bos_token_id=mc.get("bos_token_id", 1),
        eos_token_id=mc.get("eos_token_id", 2),
    )
