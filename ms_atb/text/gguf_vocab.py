"""The vocabulary embedded in a GGUF file -> a `tokenizers` backend plus the byte table of every token.

tokenizer.ggml.model "gpt2": byte-level BPE from tokens + merges, pre-tokenised as tokenizer.ggml.pre says.
tokenizer.ggml.model "llama": sentencepiece-style BPE (merges ranked by the merged piece's score, "▁" for
spaces, <0xXX> byte fallback).
"""
from __future__ import annotations

from dataclasses import dataclass

from tokenizers import AddedToken, Regex
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers

from ms_atb.formats.gguf_file import GGUFFile

# llama.cpp token types
TYPE_NORMAL, TYPE_UNKNOWN, TYPE_CONTROL, TYPE_USER_DEFINED, TYPE_UNUSED, TYPE_BYTE = 1, 2, 3, 4, 5, 6

_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# tokenizer.ggml.pre values whose pre-tokeniser splits every digit before the GPT-2 regex
_DIGIT_SPLIT_PRE = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"}


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's printable spelling of the 256 byte values."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


@dataclass
class GGUFVocab:
    model: str                     # "gpt2" | "llama"
    pre: str
    tokens: list[str]
    token_types: list[int]
    scores: list[float] | None
    merges: list[str] | None
    bos_token_id: int | None
    eos_token_id: int | None
    unk_token_id: int | None
    add_bos_token: bool
    add_space_prefix: bool
    chat_template: str | None


def read_gguf_vocab(path: str) -> GGUFVocab:
    """The vocabulary in a GGUF file's metadata; ValueError naming the file for a missing or ill-typed
    entry, lists of unequal lengths, or a special token id outside the vocabulary."""
    f = GGUFFile(path)
    model = f.get_str("tokenizer.ggml.model")
    if model is None:
        raise ValueError(f"{path}: the GGUF file has no embedded tokenizer (tokenizer.ggml.model)")
    tokens = f.get_array("tokenizer.ggml.tokens", "str")
    if not tokens:
        raise ValueError(f"{path}: the GGUF tokenizer has no tokens (tokenizer.ggml.tokens)")
    types = f.get_array("tokenizer.ggml.token_type", "int") or [TYPE_NORMAL] * len(tokens)
    scores = f.get_array("tokenizer.ggml.scores", "number")
    for key, values in (("token_type", types), ("scores", scores)):
        if values is not None and len(values) != len(tokens):
            raise ValueError(f"{path}: tokenizer.ggml.{key} has {len(values)} entries for {len(tokens)} tokens")
    ids = {}
    for name in ("bos", "eos", "unknown"):
        i = f.get_int(f"tokenizer.ggml.{name}_token_id")
        if i is not None and not 0 <= i < len(tokens):
            raise ValueError(f"{path}: tokenizer.ggml.{name}_token_id {i} is outside the vocabulary "
                             f"[0, {len(tokens)})")
        ids[name] = i
    return GGUFVocab(
        model=model, pre=f.get_str("tokenizer.ggml.pre", "default"), tokens=tokens, token_types=types,
        scores=scores, merges=f.get_array("tokenizer.ggml.merges", "str"), bos_token_id=ids["bos"],
        eos_token_id=ids["eos"], unk_token_id=ids["unknown"],
        add_bos_token=f.get_bool("tokenizer.ggml.add_bos_token", model == "llama"),
        add_space_prefix=f.get_bool("tokenizer.ggml.add_space_prefix", model == "llama"),
        chat_template=f.get_str("tokenizer.chat_template"),
    )


def _byte_level_pre_tokenizer(pre: str):
    if pre == "llama-bpe" or pre.startswith("llama3"):
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    if pre == "qwen2":
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    if pre in _DIGIT_SPLIT_PRE:
        return pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def byte_level_token_bytes(tokens: list[str]) -> list[bytes]:
    """Bytes of each byte-level token; a token spelled outside the byte alphabet is taken as UTF-8 text."""
    spelling = byte_to_unicode()
    alphabet = frozenset(spelling.values())
    to_latin1 = {ord(c): b for b, c in spelling.items()}     # str.translate: each letter -> its byte as a char
    return [tok.translate(to_latin1).encode("latin-1") if alphabet.issuperset(tok) else tok.encode("utf-8")
            for tok in tokens]


def spm_token_bytes(tokens: list[str], byte_ids: set[int]) -> list[bytes]:
    out = []
    for i, tok in enumerate(tokens):
        if i in byte_ids:
            out.append(bytes([int(tok[3:-1], 16)]))          # "<0xAB>"
        else:
            out.append(tok.replace("\u2581", " ").encode("utf-8"))
    return out


def _add_typed_tokens(backend: HFTokenizer, vocab: GGUFVocab) -> set[int]:
    """Registers control tokens as special and user-defined ones as added tokens, so that encode matches them
    whole in the text; returns the control ids. A token whose text is not its own vocabulary entry (a
    byte-level entry spelled unlike its text) is left to the model."""
    control = {i for i, kind in enumerate(vocab.token_types) if kind == TYPE_CONTROL}
    special, added = [], []
    for i, (tok, kind) in enumerate(zip(vocab.tokens, vocab.token_types)):
        if kind in (TYPE_CONTROL, TYPE_USER_DEFINED) and backend.token_to_id(tok) == i:
            (special if kind == TYPE_CONTROL else added).append(
                AddedToken(tok, normalized=False, special=kind == TYPE_CONTROL))
    if special:
        backend.add_special_tokens(special)
    if added:
        backend.add_tokens(added)
    return control


def build_byte_level(vocab: GGUFVocab) -> tuple[HFTokenizer, list[bytes], set[int]]:
    if vocab.merges is None:
        raise ValueError("GGUF gpt2 tokenizer without tokenizer.ggml.merges is not supported")
    token_bytes = byte_level_token_bytes(vocab.tokens)
    from_latin1 = {b: c for b, c in byte_to_unicode().items()}   # str.translate: byte as a char -> its letter
    # Tokens stored outside the byte alphabet are re-spelled so that merges can reach them.
    spelled = [tb.decode("latin-1").translate(from_latin1) for tb in token_bytes]
    ids = {tok: i for i, tok in enumerate(spelled)}
    merges = [tuple(m.split(" ", 1)) for m in vocab.merges]
    bpe = models.BPE(ids, merges, fuse_unk=False, ignore_merges=vocab.pre == "llama-bpe")
    backend = HFTokenizer(bpe)
    backend.pre_tokenizer = _byte_level_pre_tokenizer(vocab.pre)
    backend.decoder = decoders.ByteLevel()
    special = _add_typed_tokens(backend, vocab)
    return backend, token_bytes, special


def _spm_merges(vocab: GGUFVocab) -> list[tuple[str, str]]:
    """Merges ranked like sentencepiece BPE: the pair whose merged piece scores highest goes first."""
    ids = {tok: i for i, tok in enumerate(vocab.tokens)}
    scores = vocab.scores or [-float(i) for i in range(len(vocab.tokens))]
    ranked = []
    for i, tok in enumerate(vocab.tokens):
        if vocab.token_types[i] not in (TYPE_NORMAL, TYPE_USER_DEFINED) or len(tok) < 2:
            continue
        for k in range(1, len(tok)):
            left, right = tok[:k], tok[k:]
            if left in ids and right in ids:
                ranked.append((-scores[i], ids[left], ids[right], left, right))
    ranked.sort()
    return [(r[3], r[4]) for r in ranked]


def build_spm(vocab: GGUFVocab) -> tuple[HFTokenizer, list[bytes], set[int]]:
    ids = {tok: i for i, tok in enumerate(vocab.tokens)}
    unk = vocab.tokens[vocab.unk_token_id] if vocab.unk_token_id is not None else None
    bpe = models.BPE(ids, _spm_merges(vocab), unk_token=unk, fuse_unk=True, byte_fallback=True)
    backend = HFTokenizer(bpe)
    # As sentencepiece and llama.cpp: every text segment (between special tokens) gets one "▁" in front,
    # even one that already starts with a space; no splitting before the merges.
    steps = [normalizers.Prepend("\u2581")] if vocab.add_space_prefix else []
    backend.normalizer = normalizers.Sequence(steps + [normalizers.Replace(" ", "\u2581")])
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if vocab.add_space_prefix:
        steps.append(decoders.Strip(" ", 1, 0))
    backend.decoder = decoders.Sequence(steps)
    special = _add_typed_tokens(backend, vocab)
    if vocab.unk_token_id is not None:
        special.add(vocab.unk_token_id)
    byte_ids = {i for i, t in enumerate(vocab.token_types) if t == TYPE_BYTE}
    return backend, spm_token_bytes(vocab.tokens, byte_ids), special
