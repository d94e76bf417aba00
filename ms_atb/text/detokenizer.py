"""IncrementalDetokenizer: generated token ids -> text, one piece per token, never half a UTF-8 character.

The pieces join to exactly tokenizer.decode(generated ids) (special tokens skipped), once `flush()` has
returned whatever bytes an unfinished last character left behind.
"""
from __future__ import annotations

import codecs


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_ids=None, skip_special_tokens: bool = True):
        # prompt_ids: accepted for the engine's convenience; the output text is that of the generated ids alone.
        self._tok = tokenizer
        self._skip_special = skip_special_tokens
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._at_start = tokenizer.strip_leading_space
        self.token_ids: list[int] = []
        self.text = ""                       # everything emitted so far

    def add(self, token_id: int) -> str:
        """The new text since the last call ('' while a character's bytes are incomplete)."""
        token_id = int(token_id)
        self.token_ids.append(token_id)
        if not 0 <= token_id < self._tok.vocab_size:
            raise ValueError(f"token id {token_id} is outside the vocabulary [0, {self._tok.vocab_size})")
        if self._skip_special and self._tok.is_special(token_id):
            return ""
        return self._emit(self._utf8.decode(self._tok.token_bytes(token_id)))

    def flush(self) -> str:
        """At the end of a request: the replacement character for an unfinished byte sequence, if any."""
        return self._emit(self._utf8.decode(b"", final=True))

    def _emit(self, new: str) -> str:
        if self._at_start and new:
            self._at_start = False
            if new.startswith(" "):
                new = new[1:]
        self.text += new
        return new


def find_stop(text: str, stops: list[str], new_len: int) -> int:
    """Index in text where the earliest stop string starts, looking only where the last new_len characters
    could complete one; -1 when none does."""
    best = -1
    for s in stops:
        start = max(0, len(text) - new_len - len(s) + 1)
        i = text.find(s, start)
        if i != -1 and (best == -1 or i < best):
            best = i
    return best
