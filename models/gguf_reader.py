"""GGUF files (llama.cpp's format) as a Llama config and HF-named tensors, through the `gguf` package.

GGUF lists a tensor's dims innermost first (`[in, out]` for a linear); the reader's `data` is the
numpy array of the rows, `[out, bytes_per_row]` for quantized types, and `gguf.quants.dequantize`
turns it into the HF layout `[out, in]`. The q/k projection rows stay in GGUF's permuted order
(llama.cpp's convert script reorders each head's rows for interleaved RoPE), which is what
`rope_interleaved=True` expects.
"""
import re
import struct
from typing import Iterator

import numpy as np

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
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.(\w+)\.weight$")


def hf_name(gguf_name: str) -> str | None:
    """HF name of a GGUF tensor name, None when it is not a Llama weight."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _BLOCK_RE.match(gguf_name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.weight"
    return None


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class GGUFFile:
    """A GGUF file's metadata and memory-mapped tensors.

    Parses the header itself: the `gguf` package's reader builds a numpy view per vocabulary
    entry and took ~13 s on the embedded default's 49k-token vocabulary; this takes well under
    a second. Array values are kept as their length only (`fields[key] == ("array", n)`), except
    short numeric ones.
    """

    def __init__(self, path: str):
        self.path = path
        try:
            self._mm = np.memmap(path, np.uint8, "r")
            self._parse()
        except (ValueError, IndexError, struct.error, UnicodeDecodeError) as e:
            raise ValueError(f"{path}: not a readable GGUF file ({e})") from None

    def _parse(self):
        self._buf, self._pos = memoryview(self._mm), 4
        if bytes(self._buf[:4]) != b"GGUF":
            raise ValueError("bad magic")
        version = self._read("<I")
        if version < 2:
            raise ValueError(f"GGUF version {version} is too old")
        n_tensors, n_kv = self._read("<Q"), self._read("<Q")
        self.fields = {}
        for _ in range(n_kv):
            key = self._read_str()
            self.fields[key] = self._read_value(self._read("<I"))
        infos = []
        for _ in range(n_tensors):
            name = self._read_str()
            dims = [self._read("<Q") for _ in range(self._read("<I"))]  # innermost first
            infos.append((name, dims, self._read("<I"), self._read("<Q")))
        align = int(self.fields.get("general.alignment", 32))
        data_start = -(-self._pos // align) * align
        self.tensors = {}
        for name, dims, qtype, offset in infos:
            shape, start = tuple(reversed(dims)), data_start + offset                # numpy order
            end = start + self._nbytes(name, shape, qtype)
            if end > len(self._mm):
                raise ValueError(f"tensor {name} ends at byte {end}, past the end of the file "
                                 f"({len(self._mm)} bytes): the file is truncated")
            self.tensors[name] = (shape, qtype, start)

    @staticmethod
    def _nbytes(name: str, shape: tuple, qtype: int) -> int:
        import gguf
        try:
            block, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(qtype)]
        except (ValueError, KeyError):
            raise ValueError(f"tensor {name} has type {qtype}, which no GGML type has") from None
        rows = int(np.prod(shape[:-1], dtype=np.int64)) if shape else 1
        return rows * (shape[-1] // block * nbytes if shape else nbytes)

    def _read(self, fmt: str):
        v = struct.unpack_from(fmt, self._buf, self._pos)[0]
        self._pos += struct.calcsize(fmt)
        return v

    def _read_str(self) -> str:
        n = self._read("<Q")
        s = bytes(self._buf[self._pos:self._pos + n]).decode("utf-8")
        self._pos += n
        return s

    def _read_value(self, vtype: int):
        if vtype in _SCALARS:
            return self._read(_SCALARS[vtype])
        if vtype == _STRING:
            return self._read_str()
        if vtype != _ARRAY:
            raise ValueError(f"unknown metadata value type {vtype}")
        itype, n = self._read("<I"), self._read("<Q")
        if itype == _STRING:
            for _ in range(n):
                self._pos += 8 + struct.unpack_from("<Q", self._buf, self._pos)[0]
            return ("array", n)
        if itype not in _SCALARS:
            raise ValueError(f"unsupported array item type {itype}")
        size = struct.calcsize(_SCALARS[itype])
        values = (np.frombuffer(self._buf, _SCALARS[itype], n, self._pos).tolist() if n <= 64
                  else ("array", n))
        self._pos += n * size
        return values

    def shape(self, name: str) -> tuple:
        return self.tensors[name][0]

    def raw(self, name: str) -> tuple:
        """(rows as stored: a [..., bytes_per_row] uint8 view for quantized types, qtype)."""
        import gguf
        shape, qtype, start = self.tensors[name]
        qtype = gguf.GGMLQuantizationType(qtype)
        block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
        row_bytes = shape[-1] // block * nbytes
        n_rows = int(np.prod(shape[:-1], dtype=np.int64))
        data = self._mm[start:start + n_rows * row_bytes].reshape(shape[:-1] + (row_bytes,))
        return data, qtype


def open_reader(path: str) -> GGUFFile:
    return GGUFFile(path)


def _field(reader, key: str, default=None):
    v = reader.fields.get(key)
    return default if v is None else v


def _f32(v) -> float:
    """The shortest decimal of a float32 value: 1e-05, not 9.999999747378752e-06."""
    return float(repr(np.float32(v)))


def config_dict(path: str) -> dict:
    """LlamaConfig keyword arguments from a GGUF file's metadata (no tensor data is read)."""
    r = open_reader(path)
    arch = _field(r, "general.architecture")
    if arch != "llama":
        raise ValueError(f"{path}: GGUF architecture {arch!r} is not supported (only 'llama')")

    def need(key):
        v = _field(r, f"llama.{key}")
        if v is None:
            raise ValueError(f"{path}: GGUF metadata key 'llama.{key}' is missing")
        return v

    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    head_dim = int(_field(r, "llama.attention.key_length", hidden // heads))
    rope_dim = int(_field(r, "llama.rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise ValueError(f"{path}: partial rotary (rope.dimension_count {rope_dim} != head_dim "
                         f"{head_dim}) is not supported")
    names = list(r.tensors)
    if "rope_freqs.weight" in names:
        raise ValueError(f"{path}: a rope_freqs.weight tensor (Llama-3.1-style rope scaling baked into "
                         f"the file) is not supported; use the HF checkpoint of this model")
    tokens = r.fields.get("tokenizer.ggml.tokens")
    vocab = tokens[1] if isinstance(tokens, tuple) else int(need("vocab_size"))
    scaling = None
    kind = _field(r, "llama.rope.scaling.type")
    if kind not in (None, "none"):
        scaling = {"rope_type": kind, "factor": float(need("rope.scaling.factor"))}
        orig = _field(r, "llama.rope.scaling.original_context_length")
        if orig is not None:
            scaling["original_max_position_embeddings"] = int(orig)
    bos, eos = _field(r, "tokenizer.ggml.bos_token_id"), _field(r, "tokenizer.ggml.eos_token_id")
    return dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=int(need("feed_forward_length")),
        num_hidden_layers=int(need("block_count")),
        num_attention_heads=heads,
        num_key_value_heads=int(_field(r, "llama.attention.head_count_kv", heads)),
        head_dim=head_dim,
        rms_norm_eps=_f32(need("attention.layer_norm_rms_epsilon")),
        rope_theta=_f32(_field(r, "llama.rope.freq_base", 10000.0)),
        rope_scaling=scaling,
        max_position_embeddings=int(need("context_length")),
        tie_word_embeddings="output.weight" not in names,
        rope_interleaved=True,
        bos_token_id=None if bos is None else int(bos),
        eos_token_id=None if eos is None else int(eos),
    )


def tensor_shapes(path: str) -> dict:
    """{hf_name: HF-layout shape} of the file's tensors; unknown GGUF names map to themselves."""
    r = open_reader(path)
    return {hf_name(n) or n: r.shape(n) for n in r.tensors}


def iter_tensors(path: str, names, slices: dict) -> Iterator[tuple[str, np.ndarray]]:
    """(hf_name, float32 array) for each HF name in `names`, sliced by `slices[name]`, one at a time.

    Rows and block-aligned column ranges are cut from the stored bytes before dequantising, so
    a rank dequantises only its share of column- and row-parallel weights.
    """
    import gguf
    from gguf import quants
    r = open_reader(path)
    by_name = {hf_name(n): n for n in r.tensors}
    for name in names:
        data, qtype = r.raw(by_name[name])  # [out, bytes_per_row] (quantized) or [out, in]
        sl = slices[name]
        if data.ndim == 2:
            data, sl = data[sl[0]], (slice(None), sl[1])
            block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
            start, stop, _ = sl[1].indices(data.shape[1] // nbytes * block)
            if start % block == 0 and stop % block == 0:
                data = data[:, start // block * nbytes:stop // block * nbytes]  # [rows, bytes of cols]
                sl = (slice(None), slice(None))
        try:
            w = quants.dequantize(np.asarray(data), qtype)  # [rows, in] float32
        except NotImplementedError:
            raise ValueError(f"{path}: tensor {by_name[name]} has type {qtype.name}, which the gguf "
                             f"package cannot dequantise") from None
        yield name, np.asarray(w[sl], dtype=np.float32)
