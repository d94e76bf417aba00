"""SampleConstraints: which tokens one sample may take next, and whether its constraint has ended it.

Rules:
  1. Before min_tokens output tokens (and unless ignore_eos) the stop tokens are banned.
  2. A bad word's last token is banned when the output ends with the word's other tokens.
  3. With a structured output constraint (a JSON Schema, JSON object, regex, choice or grammar: the request's
     Guide) only the tokens its grammar allows may follow, and the stop tokens only where the grammar may end
     (the engine's StructuredOutputManager fills that mask). The sample ends ("stop") on the token after which
     the grammar can take nothing more.
The state lives beside the sample in the engine because the masks are needed before the step samples.
"""
from __future__ import annotations

from ms_atb.core.sequence import Sequence
from ms_atb.engine.request import Request


class SampleConstraints:
    __slots__ = ("request", "matcher")

    def __init__(self, request: Request, matcher=None):
        self.request = request
        self.matcher = matcher          # the sample's own llguidance matcher (rule 3), None without a guide

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

    def advance(self, seq: Sequence, token: int) -> bool:
        """Takes the sampled token; True if the grammar can take nothing after it (rule 3)."""
        if self.matcher is None or token in seq.stop_token_ids:
            return False
        self.matcher.consume_token(token)
        return self.matcher.is_stopped()
