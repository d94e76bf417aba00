"""ChoiceGuide: a request's output text is exactly one of a list of strings (vLLM's guided_choice).

Works on bytes, like the tokenizers' decoding: the output so far spells a prefix of some choice's bytes,
and a token may follow when its bytes extend that prefix along a choice and what is left of the choice
can still be spelled with the vocabulary. Every tokenization of a choice is open, not only the one
encode() would give. With vocabularies that drop one leading space when decoding (sentencepiece),
a choice may also be spelled with a leading space. The request ends on the token that completes a
choice no longer choice continues; when a longer one does, the stop tokens are allowed as well.
"""
from __future__ import annotations

import numpy as np


class ChoiceGuide:
    def __init__(self, choices: list[str], tokenizer):
        self._ids_by_bytes = tokenizer.ids_by_bytes                 # bytes -> token ids
        self._longest = max(map(len, self._ids_by_bytes), default=0)
        self._spellable: dict[bytes, list[bool]] = {}                # target -> ok[i]: target[i:] can be spelled
        for choice in choices:
            raw = choice.encode("utf-8")
            spellings = [b" " + raw] if tokenizer.strip_leading_space else []
            if not (tokenizer.strip_leading_space and raw.startswith(b" ")):
                spellings.append(raw)
            found = False
            for target in spellings:
                ok = self._suffixes_spellable(target)
                if ok[0]:
                    self._spellable[target] = ok
                    found = True
            if not found:
                raise ValueError(f"guided_choice {choice!r} cannot be spelled with this vocabulary's tokens")
        self._cache: dict[bytes, np.ndarray] = {}

    def next_token_ids(self, prefix: bytes) -> np.ndarray:
        """Ids [K] of the tokens that may follow an output spelling `prefix` (ascending; stop tokens not included)."""
        ids = self._cache.get(prefix)
        if ids is None:
            found: set[int] = set()
            at = len(prefix)
            for target, ok in self._spellable.items():
                if len(target) <= at or not target.startswith(prefix):
                    continue
                for end in range(at + 1, min(len(target), at + self._longest) + 1):
                    if ok[end]:
                        found.update(self._ids_by_bytes.get(target[at:end], ()))
            ids = self._cache[prefix] = np.array(sorted(found), dtype=np.int64)
        return ids

    def is_choice(self, prefix: bytes) -> bool:
        """The output spelling `prefix` is a whole choice."""
        return prefix in self._spellable

    def is_finished(self, prefix: bytes) -> bool:
        """A whole choice that no longer choice continues: the request ends here."""
        return self.is_choice(prefix) and self.next_token_ids(prefix).size == 0

    def _suffixes_spellable(self, target: bytes) -> list[bool]:
        """ok[i]: target[i:] is a concatenation of token bytes (ok[len] is True)."""
        n = len(target)
        ok = [False] * (n + 1)
        ok[n] = True
        for i in range(n - 1, -1, -1):
            ok[i] = any(ok[j] and target[i:j] in self._ids_by_bytes
                        for j in range(i + 1, min(n, i + self._longest) + 1))
        return ok
