"""A structured output constraint driven by hand below the engine: its Guide made and compiled for a tokenizer
by the engine's own StructuredOutputManager, and a fresh matcher walked along a byte prefix to ask what may
follow it."""
import numpy as np

from ms_atb.engine.structured_outputs import StructuredOutputManager
from ms_atb.structured_outputs import StructuredOutputsParams
from ms_atb.text.grammar import make_guide


def spell(prefix: bytes, tokenizer) -> list[int]:
    """Some token ids whose bytes join to prefix (non-special tokens; any tokenization will do: a grammar's state
    depends on the bytes only)."""
    by_bytes = tokenizer.ids_by_bytes
    best = {0: []}                                   # position -> ids spelling prefix[:position]
    for i in range(len(prefix)):
        if i not in best:
            continue
        for j in range(i + 1, len(prefix) + 1):
            ids = by_bytes.get(prefix[i:j])
            if ids and j not in best:
                best[j] = best[i] + [ids[0]]
    assert len(prefix) in best, f"{prefix!r} cannot be spelled"
    return best[len(prefix)]


class GuideWalk:
    """The tokens a constraint allows after a byte prefix. stop: the stop token id the masks may allow."""

    def __init__(self, tokenizer, stop: int | None = None, **constraint):
        self.tokenizer = tokenizer
        self.stop = tokenizer.eos_token_id if stop is None else stop
        structured = StructuredOutputsParams(**constraint)
        self.manager = StructuredOutputManager(tokenizer)
        self.guide = make_guide(structured.key, getattr(structured, structured.kind), tokenizer)
        self.manager.check(self.guide)
        self.compiled = self.manager.compile(self.guide)

    def state(self, prefix: bytes):
        """(allowed ids but the stop token [K], whether the stop token is allowed, whether the grammar is done)."""
        matcher = self.manager.matcher(self.compiled)
        for t in spell(prefix, self.tokenizer):
            assert matcher.consume_token(t), (prefix, t)
        row = self.allowed(matcher)
        ids = np.flatnonzero(row)
        return ids[ids != self.stop], bool(row[self.stop]), matcher.is_stopped()

    def allowed(self, matcher) -> np.ndarray:
        """bool [V]: the tokens the matcher allows next, as the engine's mask says (the stop token where the
        grammar may end)."""
        return np.isfinite(self.manager.fill([matcher], [frozenset({self.stop})]).result()[0])

    def next_token_ids(self, prefix: bytes) -> np.ndarray:
        return self.state(prefix)[0]

    def is_choice(self, prefix: bytes) -> bool:
        """The output may end after prefix."""
        return self.state(prefix)[1]

    def is_finished(self, prefix: bytes) -> bool:
        """The grammar takes nothing after prefix: the request ends there."""
        return self.state(prefix)[2]


def choice_guide(choices, tokenizer) -> GuideWalk:
    return GuideWalk(tokenizer, choice=choices)
