"""Tokenizers: HF tokenizer.json, sentencepiece tokenizer.model, GGUF-embedded vocabularies, and bytes.

Every tokenizer decodes the same way: the bytes of the kept tokens joined, read as UTF-8 (invalid bytes
become U+FFFD), minus one leading space for sentencepiece-style vocabularies that prefix one. The
incremental detokenizer relies on exactly this (`token_bytes`, `is_special`, `strip_leading_space`).
"""
from __future__ import annotations

import json
import os
import re
from functools import cached_property
from typing import Callable

from ms_atb.text.chat_template import compile_chat_template, render_chat_template
from ms_atb.text.gguf_vocab import byte_level_token_bytes, spm_token_bytes

# End-of-turn tokens that stop generation when the chat template uses them.
_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|eom_id|>")
_FALLBACK_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                      "{% if add_generation_prompt %}assistant: {% endif %}")
_BYTE_PIECE = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")


class Tokenizer:
    def __init__(self, encode_text: Callable[[str], list[int]], token_bytes: list[bytes], special_ids: set[int],
                 bos_token_id: int | None, eos_token_id: int | None, add_bos: bool, chat_template: str | None,
                 strip_leading_space: bool = False, token_to_id: Callable[[str], int | None] | None = None):
        self._encode_text = encode_text
        self._token_bytes = token_bytes
        self._special_ids = frozenset(special_ids)
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.add_bos = add_bos
        self.chat_template = chat_template
        self.strip_leading_space = strip_leading_space
        self._token_to_id = token_to_id or (lambda s: None)

    @property
    def vocab_size(self) -> int:
        return len(self._token_bytes)

    @property
    def bos_token(self) -> str | None:
        return None if self.bos_token_id is None else self._token_bytes[self.bos_token_id].decode("utf-8", "replace")

    @property
    def eos_token(self) -> str | None:
        return None if self.eos_token_id is None else self._token_bytes[self.eos_token_id].decode("utf-8", "replace")

    @cached_property
    def stop_token_ids(self) -> set[int]:
        ids = set() if self.eos_token_id is None else {self.eos_token_id}
        for tok in _END_OF_TURN:
            if self.chat_template and tok in self.chat_template:
                i = self._token_to_id(tok)
                if i is not None:
                    ids.add(i)
        return ids

    def pad_to(self, vocab_size: int) -> None:
        """Ids from the tokenizer's vocabulary size up to vocab_size (a model's padded embedding rows) become
        special tokens of no text, so that a model sampling one never breaks decoding."""
        n = len(self._token_bytes)
        if vocab_size > n:
            self._token_bytes = self._token_bytes + [b""] * (vocab_size - n)
            self._special_ids = self._special_ids | frozenset(range(n, vocab_size))

    def token_to_id(self, token: str) -> int | None:
        return self._token_to_id(token)

    def token_bytes(self, token_id: int) -> bytes:
        return self._token_bytes[token_id]

    @cached_property
    def ids_by_bytes(self) -> dict[bytes, tuple[int, ...]]:
        """The bytes of every token that is not special (and not empty) -> the ids that spell them."""
        out: dict[bytes, list[int]] = {}
        for i, b in enumerate(self._token_bytes):
            if b and i not in self._special_ids:
                out.setdefault(b, []).append(i)
        return {b: tuple(ids) for b, ids in out.items()}

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise ValueError(f"encode takes a str, got {type(text).__name__}")
        ids = list(self._encode_text(text))
        if add_special_tokens and self.add_bos and self.bos_token_id is not None:
            ids.insert(0, self.bos_token_id)
        return ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        n = self.vocab_size
        parts = []
        for i in ids:
            i = int(i)
            if not 0 <= i < n:
                raise ValueError(f"token id {i} is outside the vocabulary [0, {n})")
            if skip_special_tokens and i in self._special_ids:
                continue
            parts.append(self._token_bytes[i])
        text = b"".join(parts).decode("utf-8", errors="replace")
        if self.strip_leading_space and text.startswith(" "):
            text = text[1:]
        return text

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        if not isinstance(messages, (list, tuple)) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages):
            raise ValueError("a conversation must be a non-empty list of {'role': str, 'content': str} dicts")
        if not isinstance(add_generation_prompt, bool):
            raise ValueError(f"add_generation_prompt must be a bool, got {add_generation_prompt!r}")
        # any failure of the template is a ValueError naming the chat template (ms_atb/text/chat_template.py)
        return render_chat_template(self._compiled_template, messages=list(messages),
                                    add_generation_prompt=add_generation_prompt,
                                    bos_token=self.bos_token or "", eos_token=self.eos_token or "")

    @cached_property
    def _compiled_template(self):
        if self.chat_template is not None and not isinstance(self.chat_template, str):
            raise ValueError(f"the chat template must be a string, got {type(self.chat_template).__name__}")
        return compile_chat_template(self.chat_template or _FALLBACK_TEMPLATE)


class ByteTokenizer(Tokenizer):
    """For random-weight models: ids 0..255 are bytes; the last id (if >= 256) is EOS."""

    def __init__(self, vocab_size: int):
        if not isinstance(vocab_size, int) or vocab_size < 256:
            raise ValueError(f"ByteTokenizer needs vocab_size >= 256, got {vocab_size!r}")
        eos = vocab_size - 1 if vocab_size > 256 else None
        super().__init__(encode_text=lambda t: list(t.encode("utf-8")),
                         token_bytes=[bytes([i]) for i in range(256)] + [b""] * (vocab_size - 256),
                         special_ids=set(range(256, vocab_size)), bos_token_id=None, eos_token_id=eos,
                         add_bos=False, chat_template=None)


def load_tokenizer(path: str, vocab_size: int | None = None) -> Tokenizer | None:
    """A tokenizer for a model path: HF directory, .gguf file, another file (a MindSpore .ckpt: the tokenizer files
    in its directory) or `random:` (bytes; vocab_size from the model). None when there are no tokenizer files."""
    path = str(path)
    if path.startswith("random:"):
        if vocab_size is None:
            from ms_atb.formats.loader import load_config
            vocab_size = load_config(path).vocab_size
        return ByteTokenizer(vocab_size)
    if os.path.isdir(path):
        return _load_hf_dir(path)
    if os.path.isfile(path):
        with open(path, "rb") as f:
            if f.read(4) == b"GGUF":
                return _load_gguf(path)
        return _load_hf_dir(os.path.dirname(os.path.abspath(path)))     # a .ckpt: the tokenizer files beside it
    raise ValueError(f"no tokenizer for {path!r}: expected an HF directory, a .gguf file or random:<preset>")


def _load_gguf(path: str) -> Tokenizer:
    from ms_atb.text.gguf_vocab import build_byte_level, build_spm, read_gguf_vocab
    vocab = read_gguf_vocab(path)
    if vocab.model not in ("gpt2", "llama"):
        raise ValueError(f"{path}: GGUF tokenizer model {vocab.model!r} is not supported (allowed: gpt2, llama)")
    try:
        backend, token_bytes, special = (build_byte_level if vocab.model == "gpt2" else build_spm)(vocab)
    except Exception as e:      # the tokenizers package raises a bare Exception for a vocabulary it refuses
        raise ValueError(f"{path}: the GGUF vocabulary cannot be built ({type(e).__name__}: {e})") from None
    strip = vocab.model == "llama" and vocab.add_space_prefix
    return Tokenizer(lambda t: backend.encode(t, add_special_tokens=False).ids, token_bytes, special,
                     vocab.bos_token_id, vocab.eos_token_id, vocab.add_bos_token, vocab.chat_template,
                     strip_leading_space=strip, token_to_id=backend.token_to_id)


def _token_content(value) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _read_hf_config(path: str) -> dict:
    from ms_atb.formats.loader import read_json_object
    cfg_path = os.path.join(path, "tokenizer_config.json")
    cfg = read_json_object(cfg_path, "the tokenizer") if os.path.isfile(cfg_path) else {}
    template = cfg.get("chat_template")
    if isinstance(template, list):       # named templates: take the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    jinja_path = os.path.join(path, "chat_template.jinja")
    if template is None and os.path.isfile(jinja_path):
        with open(jinja_path, encoding="utf-8") as f:
            template = f.read()
    cfg["chat_template"] = template
    return cfg


def _load_hf_dir(path: str) -> Tokenizer | None:
    cfg = _read_hf_config(path)
    if os.path.isfile(os.path.join(path, "tokenizer.json")):
        return _load_tokenizer_json(path, cfg)
    if os.path.isfile(os.path.join(path, "tokenizer.model")):
        return _load_sentencepiece(path, cfg)
    return None


def _decoder_kinds(decoder: dict | None) -> set[str]:
    if not decoder:
        return set()
    if decoder.get("type") == "Sequence":
        return set().union(*(_decoder_kinds(d) for d in decoder.get("decoders", [])))
    kind = decoder.get("type")
    if kind == "Metaspace" and decoder.get("prepend_scheme", "always") != "never" \
            and decoder.get("add_prefix_space", True):
        return {"Metaspace", "Strip"}
    return {kind}


def _load_tokenizer_json(path: str, cfg: dict) -> Tokenizer:
    from tokenizers import Tokenizer as HFTokenizer
    file = os.path.join(path, "tokenizer.json")
    try:
        backend = HFTokenizer.from_file(file)
        with open(file, encoding="utf-8") as f:
            kinds = _decoder_kinds(json.load(f).get("decoder"))
    except Exception as e:          # the tokenizers package raises a bare Exception for a bad file
        raise ValueError(f"{file}: not a readable tokenizer.json ({e})") from None
    n = backend.get_vocab_size(with_added_tokens=True)
    pieces = [backend.id_to_token(i) or "" for i in range(n)]
    added = backend.get_added_tokens_decoder()               # {id: AddedToken}
    if "ByteLevel" in kinds:
        token_bytes = byte_level_token_bytes(pieces)
    elif kinds & {"Metaspace", "ByteFallback", "Replace"}:
        byte_ids = {i for i, p in enumerate(pieces) if _BYTE_PIECE.match(p)} if "ByteFallback" in kinds else set()
        token_bytes = spm_token_bytes(pieces, byte_ids)
    else:   # other decoders (WordPiece...): each token's own decoding, joined
        token_bytes = [backend.decode([i], skip_special_tokens=False).encode("utf-8") for i in range(n)]
    for i, tok in added.items():
        token_bytes[i] = tok.content.encode("utf-8")
    special = {i for i, tok in added.items() if tok.special}
    bos_id, eos_id, add_bos = _special_ids_from_config(cfg, backend.token_to_id)
    if "add_bos_token" not in cfg:       # as the post-processor does it
        with_special = backend.encode("a", add_special_tokens=True).ids
        without = backend.encode("a", add_special_tokens=False).ids
        add_bos = len(with_special) > len(without) and with_special[0] != without[0]
        if add_bos and bos_id is None:
            bos_id = with_special[0]
    return Tokenizer(lambda t: backend.encode(t, add_special_tokens=False).ids, token_bytes, special,
                     bos_id, eos_id, add_bos, cfg.get("chat_template"),
                     strip_leading_space="Strip" in kinds, token_to_id=backend.token_to_id)


def _special_ids_from_config(cfg: dict, token_to_id) -> tuple[int | None, int | None, bool]:
    bos, eos = _token_content(cfg.get("bos_token")), _token_content(cfg.get("eos_token"))
    bos_id = token_to_id(bos) if bos else None
    eos_id = token_to_id(eos) if eos else None
    return bos_id, eos_id, bool(cfg.get("add_bos_token", False))


def _load_sentencepiece(path: str, cfg: dict) -> Tokenizer:
    import sentencepiece as spm
    file = os.path.join(path, "tokenizer.model")
    try:
        sp = spm.SentencePieceProcessor(model_file=file)
    except Exception as e:          # sentencepiece raises RuntimeError/OSError for a bad file
        raise ValueError(f"{file}: not a readable sentencepiece model ({e})") from None
    n = sp.get_piece_size()
    pieces = [sp.id_to_piece(i) for i in range(n)]
    special = {i for i in range(n) if sp.is_control(i) or sp.is_unknown(i)}
    token_bytes = spm_token_bytes(pieces, {i for i in range(n) if sp.is_byte(i)})
    extra: dict[str, int] = {}                               # special / added tokens by text
    for key, tok in (cfg.get("added_tokens_decoder") or {}).items():
        i, content = int(key), _token_content(tok)
        if content is None:
            continue
        extra[content] = i
        while len(token_bytes) <= i:
            token_bytes.append(b"")
        token_bytes[i] = content.encode("utf-8")
        if not isinstance(tok, dict) or tok.get("special", True):
            special.add(i)
    for i in special:
        if i < n and sp.is_control(i):
            extra.setdefault(pieces[i], i)
    piece_ids = {p: i for i, p in enumerate(pieces)}

    def token_to_id(s: str) -> int | None:
        return extra.get(s, piece_ids.get(s))

    split = re.compile("(" + "|".join(re.escape(s) for s in sorted(extra, key=len, reverse=True)) + ")") \
        if extra else None

    def encode_text(text: str) -> list[int]:
        if split is None:
            return sp.encode(text)
        ids: list[int] = []
        for k, part in enumerate(split.split(text)):
            if k % 2:
                ids.append(extra[part])
            elif part:
                ids.extend(sp.encode(part))
        return ids

    bos_id, eos_id, _ = _special_ids_from_config(cfg, token_to_id)
    if bos_id is None and sp.bos_id() >= 0:
        bos_id = sp.bos_id()
    if eos_id is None and sp.eos_id() >= 0:
        eos_id = sp.eos_id()
    add_bos = bool(cfg.get("add_bos_token", True))           # the Llama-2 default
    strip = sp.encode("a", out_type=str)[0].startswith("\u2581")      # the model adds a dummy prefix
    return Tokenizer(encode_text, token_bytes, special, bos_id, eos_id, add_bos, cfg.get("chat_template"),
                     strip_leading_space=strip, token_to_id=token_to_id)
