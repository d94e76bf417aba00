"""The Llama-shaped families one LlamaForCausalLM serves, and how each one's config sets its options.

  family   config.json model_type / architectures      GGUF general.architecture   options
  llama    llama / LlamaForCausalLM                    llama                       (Llama 2, Llama 3.x)
  mistral  mistral / MistralForCausalLM                llama (llama.cpp's own)     sliding_window
  qwen2    qwen2 / Qwen2ForCausalLM                    qwen2                       attention_bias
  qwen3    qwen3 / Qwen3ForCausalLM                    qwen3                       qk_norm, explicit head_dim

Rules: an unknown family is a ValueError listing these, raised from the config alone (before any
weight is read); a config option the cell does not implement (an o_proj bias, Qwen's per-layer
sliding window, an MLP bias) is refused by name rather than ignored.
"""

HF_MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                  "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
GGUF_ARCHITECTURES = ("llama", "qwen2", "qwen3")
_REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")


def hf_model_type(d: dict) -> str:
    """The family of a config.json dict: model_type, else its architectures entry; llama when neither."""
    archs = d.get("architectures")
    if archs is not None and (not isinstance(archs, list) or not all(isinstance(a, str) for a in archs)):
        raise ValueError(f"config.json architectures must be a list of strings, got {archs!r}")
    model_type = d.get("model_type")
    if model_type is None and archs:
        by_arch = {v: k for k, v in HF_MODEL_TYPES.items()}
        known = [by_arch[a] for a in archs if a in by_arch]
        if not known:
            raise ValueError(f"config.json architectures {archs} are not supported; allowed: "
                             f"{sorted(by_arch)}")
        model_type = known[0]
    model_type = model_type or "llama"
    if model_type not in HF_MODEL_TYPES:
        raise ValueError(f"config.json model_type {model_type!r} is not supported; allowed: "
                         f"{sorted(HF_MODEL_TYPES)}")
    others = [a for a in archs or () if a in HF_MODEL_TYPES.values() and a != HF_MODEL_TYPES[model_type]]
    if others and HF_MODEL_TYPES[model_type] not in archs:     # unknown names (LLaMAForCausalLM) pass
        raise ValueError(f"config.json architectures {archs} do not match model_type {model_type!r} "
                         f"(expected {HF_MODEL_TYPES[model_type]!r})")
    return model_type


def hf_config_dict(d: dict) -> dict:
    """A config.json dict made LlamaConfig.from_hf_dict's input: the family's options set, what the
    cell cannot run refused with the key's name."""
    model_type = hf_model_type(d)
    act = d.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ValueError(f"config.json hidden_act {act!r} is not supported (Llama's SwiGLU: silu)")
    if d.get("mlp_bias"):
        raise ValueError("config.json mlp_bias=true is not supported (MLPs without biases only)")
    d = dict(d)
    if model_type == "qwen2":
        d["attention_bias"] = True             # Qwen2 always has q/k/v biases (and none on o_proj)
    elif d.get("attention_bias"):               # Llama's and Qwen3's attention_bias puts one on o_proj too
        raise ValueError(f"config.json attention_bias=true is not supported for model_type {model_type!r} "
                         f"(it adds an o_proj bias); allowed: false")
    else:
        d["attention_bias"] = False
    d["qk_norm"] = model_type == "qwen3"
    if model_type in ("qwen2", "qwen3"):
        if d.get("use_sliding_window"):
            raise ValueError("config.json use_sliding_window=true is not supported (Qwen's per-layer "
                             "window); allowed: false")
        d["sliding_window"] = None             # the window is off unless use_sliding_window
    elif model_type == "llama":
        d["sliding_window"] = None
    params = d.pop("rope_parameters", None)  # transformers >= 5 keeps rope_theta and scaling here
    if params:
        d.setdefault("rope_theta", params.get("rope_theta", 10000.0))
        if params.get("rope_type", "default") != "default":
            d.setdefault("rope_scaling", {k: v for k, v in params.items() if k != "rope_theta"})
    missing = [k for k in _REQUIRED if k not in d]
    if missing:
        raise ValueError(f"config.json lacks {missing}")
    if d.get("rope_scaling") is not None and not isinstance(d["rope_scaling"], dict):
        raise ValueError(f"config.json rope_scaling must be null or an object, got {d['rope_scaling']!r}")
    if d.get("rope_scaling") and d["rope_scaling"].get("rope_type",
                                                       d["rope_scaling"].get("type")) == "default":
        d["rope_scaling"] = None
    if isinstance(d.get("rope_scaling"), dict) and d["rope_scaling"].get(
            "rope_type", d["rope_scaling"].get("type")) == "llama3":
        need = [k for k in ("factor", "low_freq_factor", "high_freq_factor",
                            "original_max_position_embeddings") if k not in d["rope_scaling"]]
        if need:
            raise ValueError(f"config.json rope_scaling of type llama3 lacks {need}")
    return d


def gguf_prefix(arch) -> str:
    """The metadata key prefix of a GGUF architecture; ValueError for an unsupported one."""
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(f"GGUF architecture {arch!r} is not supported; allowed: {list(GGUF_ARCHITECTURES)}")
    return arch
