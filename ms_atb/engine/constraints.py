"""SampleConstraints: which tokens one sample may take next, and whether its constraint has ended it.

Rules:
  1. Before min_tokens output tokens (and unless ignore_eos) the stop tokens are banned.
  2. A bad word's last token is banned when the output ends with the word's other tokens.
  3. With guided choice only tokens that keep the output's bytes on the way to a choice are allowed; when the
     output is a whole choice that a longer one continues, the stop tokens are allowed too. The sample ends
     ("stop") on the token that completes a choice no longer choice continues.
The state lives beside the sample in the engine because the masks are needed before the step samples.
"""
from __future__ import annotations

import numpy as np

from ms_atb.core.sequence import Sequence
from ms_atb.engine.request import Request


class SampleConstraints:
    __slots__ = ("request", "spelled", "_token_bytes")

    def __init__(self, request: Request, token_bytes):
        self.request = request
        self.spelled = b""              # the output's bytes so far, for a guided choice
        self._token_bytes = token_bytes  # token id -> its bytes (the tokenizer's), or None without one

    def banned(self, seq: Sequence) -> list[int] | None:
        """Token ids the sample may not take next (rules 1 and 2), or None."""
        p = self.request.params
        out = list(seq.stop_token_ids) if seq.num_output_tokens < p.min_tokens and not p.ignore_eos else []
        tokens = seq.token_ids                            # only the output's tail is compared: no copy of it
        for word in self.request.bad_words_ids:
            k = len(word) - 1
            if k <= seq.num_output_tokens and tuple(tokens[len(tokens) - k:]) == word[:-1]:
                out.append(word[-1])
        return out or None

    def allowed(self, seq: Sequence) -> np.ndarray | None:
        """The only token ids the sample may take next (rule 3), or None."""
        guide = self.request.guide
        if guide is None:
            return None
        ids = guide.next_token_ids(self.spelled)
        if guide.is_choice(self.spelled):           # a whole choice that a longer one continues
            ids = np.union1d(ids, np.fromiter(seq.stop_token_ids, np.int64))
        return ids

    def advance(self, seq: Sequence, token: int) -> bool:
        """Takes the sampled token; True if it completes a choice that no longer choice continues."""
        guide = self.request.guide
        if guide is None or token in seq.stop_token_ids:
            return False
        self.spelled += self._token_bytes(token)
        return guide.is_finished(self.spelled)
