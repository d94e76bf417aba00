"""GGUF files (llama.cpp's format) as a Llama config and HF-named tensors, through the `gguf` package.

GGUF lists a tensor's dims innermost first (`[in, out]` for a linear); the reader's `data` is the
numpy array of the rows, `[out, bytes_per_row]` for quantized types, and `gguf.quants.dequantize`
turns it into the HF layout `[out, in]`. The q/k projection rows stay in GGUF's permuted order
(llama.cpp's convert script reorders each head's rows for interleaved RoPE) for the llama
architecture, which is what `rope_interleaved=True` expects; qwen2 and qwen3 files keep HF's
rotate-half order. Metadata keys carry the architecture's prefix (`qwen2.block_count`).
Weights kept quantized (`keep`) come as GGUFBlocks: the stored rows of Q8_0, Q4_0 or Q4_1 blocks, untouched;
other quantized types asked for as Q8_0 are dequantised and re-quantized to Q8_0 (8 bits: no worse).
"""
import ctypes
import functools
import mmap
import re
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from ms_atb.formats import families
from ms_atb.formats.gguf_file import GGUFArray, GGUFFile

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
}
_BIAS_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj"}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")


# Bytes of a block of 32 values of each GGUF type the CPU kernels multiply as stored (ops/quant_matmul.cc, whose
# packing reads rows of these blocks); the same sizes as gguf.GGML_QUANT_SIZES.
GGUF_BLOCK_BYTES = {"q8_0": 34, "q4_0": 18, "q4_1": 20}
KEPT_TYPES = tuple(GGUF_BLOCK_BYTES)        # GGUF block types multiplied as stored
FLOAT_TYPES = ("f32", "f16", "bf16", "f64")


@dataclass(frozen=True)
class GGUFBlocks:
    """A linear weight kept quantized: rows [out, in / 32 * block bytes] uint8 of GGUF blocks of `fmt`
    (one of KEPT_TYPES); shape: its HF layout [out, in]."""
    rows: np.ndarray
    fmt: str
    shape: tuple

    def release(self) -> None:
        """The rows are read: drop their pages from this process (release)."""
        release(self.rows)

    def dequantize(self) -> np.ndarray:
        """[out, in] float32."""
        import gguf
        from gguf import quants
        qtype = gguf.GGMLQuantizationType[self.fmt.upper()]
        return np.asarray(quants.dequantize(self.rows, qtype), np.float32).reshape(self.shape)


def release(array: np.ndarray) -> None:
    """Drops the pages of `array`, a view of a GGUF file's read-only mapping, from this process's memory once it
    has been read (converted into the model's own layout): they stay in the OS's page cache, and a later read maps
    them again, so the file does not count twice in the process's memory while a model loads. Any other array:
    nothing (only a shared read-only file mapping may be dropped and read again unchanged)."""
    base = array
    while base is not None and not isinstance(base, np.memmap):
        base = base.base
    if base is None or base.mode != "r" or array.nbytes == 0:
        return
    page = mmap.PAGESIZE
    start = array.ctypes.data // page * page
    end = array.ctypes.data + array.nbytes
    _libc().madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), _MADV_DONTNEED)


_MADV_DONTNEED = 4


@functools.lru_cache(maxsize=1)
def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return libc


def stored_types(path: str) -> dict:
    """{hf_name: GGML type name, lower case ('q4_1', 'f32', 'q6_k'...)} of the file's tensors."""
    import gguf
    r = open_reader(path)
    return {hf_name(n) or n: gguf.GGMLQuantizationType(q).name.lower() for n, (_, q, _) in r.tensors.items()}


def hf_name(gguf_name: str) -> str | None:
    """HF name of a GGUF tensor name, None when it is not a Llama weight."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _BLOCK_RE.match(gguf_name)
    names = _LAYER_NAMES if m and m.group(3) == "weight" else _BIAS_NAMES
    if m and m.group(2) in names:
        return f"model.layers.{m.group(1)}.{names[m.group(2)]}.{m.group(3)}"
    return None


def open_reader(path: str) -> GGUFFile:
    return GGUFFile(path)


def _f32(v) -> float:
    """The shortest decimal of a float32 value: 1e-05, not 9.999999747378752e-06."""
    with np.errstate(over="ignore"):             # out of float32's range: inf, refused by LlamaConfig
        return float(repr(np.float32(v)))


def config_dict(path: str) -> dict:
    """LlamaConfig keyword arguments from a GGUF file's metadata (no tensor data is read)."""
    r = open_reader(path)
    try:
        arch = families.gguf_prefix(r.get_str("general.architecture"))
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None

    def need(key, get=r.get_int, **kw):
        v = get(f"{arch}.{key}", **kw)
        if v is None:
            raise ValueError(f"{path}: GGUF metadata key '{arch}.{key}' is missing")
        return v

    hidden, heads = need("embedding_length", minimum=1), need("attention.head_count", minimum=1)
    head_dim = r.get_int(f"{arch}.attention.key_length", hidden // heads, minimum=1)
    rope_dim = r.get_int(f"{arch}.rope.dimension_count", head_dim)
    if rope_dim != head_dim:
        raise ValueError(f"{path}: partial rotary (rope.dimension_count {rope_dim} != head_dim "
                         f"{head_dim}) is not supported")
    names = list(r.tensors)
    layers = need("block_count", minimum=1)
    if layers > len(names):
        raise ValueError(f"{path}: {arch}.block_count is {layers}, but the file holds only {len(names)} "
                         f"tensors")
    vocab, scaling = _vocab_size(r, path, need), _rope_scaling(r, arch, path, need)
    return dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=need("feed_forward_length", minimum=1),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=r.get_int(f"{arch}.attention.head_count_kv", heads, minimum=1),
        head_dim=head_dim,
        rms_norm_eps=_f32(need("attention.layer_norm_rms_epsilon", r.get_float)),
        rope_theta=_f32(r.get_float(f"{arch}.rope.freq_base", 10000.0)),
        rope_scaling=scaling,
        max_position_embeddings=need("context_length", minimum=1),
        tie_word_embeddings="output.weight" not in names,
        rope_interleaved=arch == "llama",
        attention_bias="blk.0.attn_q.bias" in names,
        qk_norm="blk.0.attn_q_norm.weight" in names,
        bos_token_id=_token_id(r, "bos", vocab, path),
        eos_token_id=_token_id(r, "eos", vocab, path),
    )


def _token_id(r: GGUFFile, name: str, vocab: int, path: str) -> int | None:
    """tokenizer.ggml.<name>_token_id, which must name a token of the vocabulary."""
    i = r.get_int(f"tokenizer.ggml.{name}_token_id")
    if i is not None and not 0 <= i < vocab:
        raise ValueError(f"{path}: tokenizer.ggml.{name}_token_id {i} is outside the vocabulary [0, {vocab})")
    return i


def _vocab_size(r: GGUFFile, path: str, need) -> int:
    """The vocabulary's token count, else {arch}.vocab_size."""
    tokens = r.fields.get("tokenizer.ggml.tokens")
    if tokens is not None and not isinstance(tokens, GGUFArray):
        raise ValueError(f"{path}: metadata tokenizer.ggml.tokens must be an array, got {tokens!r}")
    return len(tokens) if tokens is not None else need("vocab_size", minimum=1)


def _rope_scaling(r: GGUFFile, arch: str, path: str, need) -> dict | None:
    """LlamaConfig.rope_scaling from {arch}.rope.scaling.* or from a rope_freqs.weight tensor; None: neither."""
    scaling = None
    kind = r.get_str(f"{arch}.rope.scaling.type")
    if kind not in (None, "none"):
        scaling = {"rope_type": kind, "factor": float(need("rope.scaling.factor", r.get_float))}
        orig = r.get_int(f"{arch}.rope.scaling.original_context_length", minimum=1)
        if orig is not None:
            scaling["original_max_position_embeddings"] = orig
    if "rope_freqs.weight" in r.tensors:        # llama3 scaling as llama.cpp bakes it: a divisor per frequency
        if scaling is not None:
            raise ValueError(f"{path}: both {arch}.rope.scaling.type and a rope_freqs.weight tensor; "
                             f"allowed: one of them")
        from gguf import quants
        data, qtype = r.raw("rope_freqs.weight")
        factors = np.asarray(quants.dequantize(np.asarray(data), qtype), np.float64).reshape(-1)
        scaling = {"rope_type": "freq_factors", "factors": [float(f) for f in factors]}
    return scaling


def tensor_shapes(path: str) -> dict:
    """{hf_name: HF-layout shape} of the file's tensors; unknown GGUF names map to themselves."""
    r = open_reader(path)
    return {hf_name(n) or n: r.shape(n) for n in r.tensors if n != "rope_freqs.weight"}  # that one: config


def iter_tensors(path: str, names, slices: dict, keep: dict | None = None) -> Iterator[tuple[str, object]]:
    """(hf_name, float32 array) for each HF name in `names`, sliced by `slices[name]`, one at a time;
    (hf_name, GGUFBlocks) for the names in `keep` ({hf_name: one of KEPT_TYPES}).

    Rows and block-aligned column ranges are cut from the stored bytes before dequantising, so
    a rank dequantises only its share of column- and row-parallel weights.
    """
    import gguf
    from gguf import quants
    keep = keep or {}
    r = open_reader(path)
    by_name = {hf_name(n): n for n in r.tensors}
    for name in names:
        data, qtype = r.raw(by_name[name])  # [out, bytes_per_row] (quantized) or [out, in]
        sl = slices[name]
        cut = False
        if data.ndim == 2:
            data, sl = data[sl[0]], (slice(None), sl[1])
            block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
            start, stop, _ = sl[1].indices(data.shape[1] // nbytes * block)
            if start % block == 0 and stop % block == 0:
                data = data[:, start // block * nbytes:stop // block * nbytes]  # [rows, bytes of cols]
                sl, cut = (slice(None), slice(None)), True
        if name in keep and keep[name] == qtype.name.lower() and cut:
            rows = np.ascontiguousarray(data)  # [out, blocks bytes], as stored
            yield name, GGUFBlocks(rows, keep[name], (rows.shape[0], rows.shape[1] // nbytes * block))
            continue
        try:
            w = quants.dequantize(np.asarray(data), qtype)  # [rows, in] float32
        except NotImplementedError:
            raise ValueError(f"{path}: tensor {by_name[name]} has type {qtype.name}, which the gguf "
                             f"package cannot dequantise") from None
        w = np.asarray(w[sl], dtype=np.float32)
        if name in keep:       # another type, or a cut across blocks: re-quantized to the kept format
            fmt = keep[name]
            if w.shape[1] % 32:
                raise ValueError(f"{path}: tensor {by_name[name]} has rows of {w.shape[1]} values on this rank; "
                                 f"{fmt} blocks need a multiple of 32: set model.weight_dtype float32")
            w = GGUFBlocks(quants.quantize(w, gguf.GGMLQuantizationType[fmt.upper()]), fmt, w.shape)
        yield name, w
