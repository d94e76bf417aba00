"""Which linears the model keeps quantized (model.weight_dtype), decided from the checkpoint's metadata
before any weight is read; the GGUF reader (gguf_reader.iter_tensors) then reads those linears' blocks as stored."""
from __future__ import annotations

import collections

from ms_atb.formats import gguf_reader
from ms_atb.formats.llama_config import LlamaConfig
from ms_atb.formats.loader import expected_shapes, model_kind

EMBED = "model.embed_tokens.weight"     # the embedding's HF name: its format is chosen with the linears'


def linear_groups(config: LlamaConfig) -> list[tuple[str, tuple, str]]:
    """(linear, its HF weight names, the tensor it is read from) for every linear of the model, fused
    projections together (one format each); a tied lm_head is read from the embedding."""
    groups = []
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        groups += [(p + "self_attn.qkv_proj", tuple(p + f"self_attn.{x}_proj.weight" for x in "qkv")),
                   (p + "self_attn.o_proj", (p + "self_attn.o_proj.weight",)),
                   (p + "mlp.gate_up_proj", (p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight")),
                   (p + "mlp.down_proj", (p + "mlp.down_proj.weight",))]
    head = "model.embed_tokens.weight" if config.tie_word_embeddings else "lm_head.weight"
    return [(name, parts, parts) for name, parts in groups] + [("lm_head", ("lm_head.weight",), (head,))]


def linear_activations(activation_dtype: str, formats: dict, model_dtype: str = "float32") -> str:
    """model.activation_dtype as the quantized linears take it: "auto" is "int8" (llama.cpp's own choice for
    these weights: docs/design.md, "Defaults") when some linears are kept quantized (formats, on the CPU) and
    the model computes in float32, else "float32"."""
    if activation_dtype != "auto":
        return activation_dtype
    return "int8" if formats and model_dtype == "float32" else "float32"


def weight_formats(path, config: LlamaConfig, weight_dtype: str = "auto", tp_size: int = 1, device: str = "cpu",
                   activation_dtype: str = "float32", model_dtype: str = "float32") -> tuple[dict, list[str]]:
    """({HF weight name: quantized format} of the linears kept quantized, log lines saying what was chosen).

    weight_dtype (model.weight_dtype): "float32": none; "int8": every linear (lm_head too) per-output-channel
    int8; "auto": a GGUF's linears as stored when all their parts are Q8_0, Q4_0 or Q4_1 of one type, as Q8_0
    when they are of other quantized types or mixed (re-quantized on load from the dequantised values), float32
    when a part is a float tensor; other checkpoints: none. Quantized weights need the CPU (our kernels, which
    multiply float32 activations: a half-precision model casts around them); elsewhere none is kept. A tied
    lm_head's format is the embedding's. Under "auto" the embedding of a GGUF is kept quantized too (EMBED's
    entry, _embedding_format: its rows dequantised as they are gathered); otherwise it is float32. activation_dtype
    (model.activation_dtype; "auto" as linear_activations resolves it for model_dtype) changes no format; "int8"
    adds a log line saying which linears take int8 activations (the quantized ones) and which keep float32 (the
    float ones)."""
    formats, notes = _formats(path, config, weight_dtype, tp_size, device)
    if linear_activations(activation_dtype, formats, model_dtype) == "int8":
        groups = linear_groups(config)
        quantized = sum(parts[0] in formats for _, parts, _ in groups)
        notes.append(f"activations: int8 (per row and block of 32) into the {quantized} quantized linears"
                     + (f"; {len(groups) - quantized} float32 linears keep float32 activations"
                        if quantized < len(groups) else ""))
    return formats, notes


def _embedding_format(config: LlamaConfig, formats: dict, stored: str, shape: tuple) -> str | None:
    """The GGUF block format the embedding is kept in, None for float32: a tied embedding is its lm_head's blocks
    when those are a GGUF format; an untied one keeps its stored Q8_0 / Q4_0 / Q4_1 blocks, other quantized types
    as Q8_0 (as a linear would)."""
    if config.tie_word_embeddings:
        head = formats.get("lm_head.weight")
        return head if head in gguf_reader.KEPT_TYPES else None
    if stored in gguf_reader.FLOAT_TYPES or shape[1] % 32:
        return None
    return stored if stored in gguf_reader.KEPT_TYPES else "q8_0"


def _formats(path, config: LlamaConfig, weight_dtype: str, tp_size: int, device: str) -> tuple[dict, list[str]]:
    if weight_dtype not in ("auto", "float32", "int8"):
        raise ValueError(f"weight_dtype must be one of ['auto', 'float32', 'int8'], got {weight_dtype!r}")
    if weight_dtype == "float32" or device != "cpu":
        return {}, []
    groups = linear_groups(config)
    if weight_dtype == "int8":
        return ({n: "int8" for _, parts, _ in groups for n in parts},
                [f"weights: {len(groups)} linears int8 (per output channel, quantized on load); the embedding "
                 f"float32"])
    kind, path = model_kind(path)
    if kind != "gguf":
        return {}, []
    types = gguf_reader.stored_types(path)
    formats, kept, notes = {}, collections.Counter(), []
    converted = collections.Counter()
    shapes = expected_shapes(config)
    for name, parts, sources in groups:
        missing = next((s for s in sources if s not in types), None)
        if missing is not None:
            raise ValueError(f"{path}: tensor {missing} is missing (expected shape {shapes[missing]})")
        src = sorted({types[s] for s in sources})
        row_parallel = name.endswith(("o_proj", "down_proj")) and tp_size > 1
        k = shapes[sources[0]][1] // (tp_size if row_parallel else 1)
        if any(t in gguf_reader.FLOAT_TYPES for t in src) or k % 32:
            kept["float32"] += 1
            continue
        fmt = src[0] if len(src) == 1 and src[0] in gguf_reader.KEPT_TYPES else "q8_0"
        if src != [fmt]:
            converted["+".join(src)] += 1
        kept[fmt] += 1
        formats.update({n: fmt for n in parts})
    notes.append("weights: " + ", ".join(f"{n} linears {fmt}" for fmt, n in sorted(kept.items()))
                 + " (lm_head included; quantized ones multiplied as stored)")
    if EMBED not in types:
        raise ValueError(f"{path}: tensor {EMBED} is missing (expected shape {shapes[EMBED]})")
    embed = _embedding_format(config, formats, types[EMBED], shapes[EMBED])
    if embed is not None:
        formats[EMBED] = embed
        notes.append(f"embedding: {embed}, rows dequantised as they are gathered"
                     + (" (from the tied lm_head's blocks)" if config.tie_word_embeddings else ""))
    for src, n in sorted(converted.items()):
        notes.append(f"weights: {n} linears stored as {src} converted to q8_0 on load (the nearest kept format "
                     f"at least as precise)")
    return formats, notes
