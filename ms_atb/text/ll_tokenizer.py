"""The llguidance tokenizer of one of our tokenizers: the same bytes per token id, whichever file they came from
(an HF tokenizer.json, a sentencepiece model, a GGUF vocabulary, or the byte tokenizer of a random: model).

Rules:
  1. A token's bytes are those the detokenizer joins, so a grammar constrains exactly the output's text.
  2. A special token's bytes start with 0xFF, which no UTF-8 text holds: no JSON Schema, regex or choice can
     spell one. (A Lark grammar may still name one; the engine clears them from every mask.)
  3. One token past the vocabulary, id END = vocab_size, is llguidance's end of sequence: its bit in a mask
     says that the grammar may end here, and the engine turns it into the request's own stop tokens.
"""
from __future__ import annotations

import llguidance


class _Vocabulary:
    """What llguidance.TokenizerWrapper reads: tokens (bytes per id), eos_token_id, bos_token_id, the special
    ids, and a call that encodes text."""

    def __init__(self, tokenizer):
        n = tokenizer.vocab_size
        self._tokenizer = tokenizer
        self.tokens = [b"\xff" + (tokenizer.token_bytes(i) or f"<[{i}]>".encode()) if tokenizer.is_special(i)
                       else tokenizer.token_bytes(i) for i in range(n)] + [b"\xff<end>"]
        self.eos_token_id = n
        self.bos_token_id = None
        self.special_token_ids = [i for i in range(n) if tokenizer.is_special(i)] + [n]

    def __call__(self, text) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._tokenizer.encode(text, add_special_tokens=False)


def ll_tokenizer(tokenizer) -> llguidance.LLTokenizer:
    """tokenizer's vocabulary for llguidance, END = tokenizer.vocab_size its end of sequence (rule 3)."""
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Vocabulary(tokenizer)))
