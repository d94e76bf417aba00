"""StructuredOutputManager: the engine's grammars (llguidance) - checked, compiled and turned into token masks.

Rules:
  1. A guide is checked against the tokenizer when its request is made (check(): ValueError saying what is
     wrong), and compiled once per key for the engine's tokenizer, on a thread of its own (compile()): a slow
     compile holds back only the requests that wait for it. Up to MAX_COMPILED compiled grammars are kept, the
     least recently used dropped first.
  2. Each sample gets its own matcher, a copy of the compiled one: its state follows the sample's own tokens
     (preemption and recompute, prefix-cache hits and n > 1 change nothing about it).
  3. fill() computes the masks of a step's constrained rows on another thread, while the model runs; llguidance
     fills the rows in parallel outside the GIL. In a mask, special tokens are never allowed; where the grammar may
     end, the sample's stop tokens are allowed (and no others end it). A mask is additive (float32, 0 where a token
     is allowed, -inf elsewhere), made on that thread too: the sampler adds it to a row in one vector operation.
"""
from __future__ import annotations

import collections
import concurrent.futures
import logging
import time

import llguidance
import llguidance.numpy as llnp
import numpy as np

from ms_atb.text.grammar import Guide
from ms_atb.text.ll_tokenizer import ll_tokenizer

MAX_COMPILED = 256
MAX_TIMES = 1 << 16           # the timings kept (the latest), for stats
_log = logging.getLogger(__name__)


class StructuredOutputManager:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.vocab_size          # END = vocab_size (ms_atb/text/ll_tokenizer.py)
        self._ll = None                                 # the llguidance tokenizer, made on first use
        self._normal = None                             # bool [V]: not a special token
        self._compiled: collections.OrderedDict[tuple, concurrent.futures.Future] = collections.OrderedDict()
        self._compile_pool = self._mask_pool = self._executor = None
        self.compile_seconds = collections.deque(maxlen=MAX_TIMES)   # each compile's time on its thread
        self.num_compile_hits = 0
        self.mask_seconds = collections.deque(maxlen=MAX_TIMES)      # per step: (rows, seconds filling them)
        self.wait_seconds = collections.deque(maxlen=MAX_TIMES)      # per step: seconds the step waited for them

    @property
    def ll_tokenizer(self) -> llguidance.LLTokenizer:
        if self._ll is None:
            self._ll = ll_tokenizer(self.tokenizer)
            self._normal = np.array([not self.tokenizer.is_special(i) for i in range(self.vocab_size)])
        return self._ll

    def check(self, guide: Guide) -> None:
        """ValueError naming what is wrong with the guide's schema, regex or grammar (rule 1)."""
        error = llguidance.LLMatcher.validate_grammar(guide.grammar, self.ll_tokenizer)
        if error:
            raise ValueError(f"structured outputs {guide.kind}: {_short(error)}")

    def compile(self, guide: Guide) -> concurrent.futures.Future:
        """A future of the guide's compiled matcher (rule 1); done at once when compiled before."""
        found = self._compiled.get(guide.key)
        if found is not None:
            self._compiled.move_to_end(guide.key)
            self.num_compile_hits += 1
            return found
        if self._compile_pool is None:
            self._compile_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ms_atb-grammar")
        future = self._compile_pool.submit(self._compile, guide, self.ll_tokenizer)
        self._compiled[guide.key] = future
        while len(self._compiled) > MAX_COMPILED:
            self._compiled.popitem(last=False)
        return future

    def _compile(self, guide: Guide, tokenizer) -> llguidance.LLMatcher:
        t0 = time.perf_counter()
        matcher = llguidance.LLMatcher(tokenizer, guide.grammar, log_level=0)
        self.compile_seconds.append(time.perf_counter() - t0)
        if matcher.is_error():
            raise ValueError(f"structured outputs {guide.kind}: {_short(matcher.get_error())}")
        return matcher

    @staticmethod
    def matcher(compiled: concurrent.futures.Future) -> llguidance.LLMatcher:
        """A sample's own matcher (rule 2): a copy of the compiled one."""
        return compiled.result().deep_copy()

    def fill(self, matchers: list[llguidance.LLMatcher], stops: list[frozenset[int]]) -> concurrent.futures.Future:
        """A future of the additive masks, float32 [R, V] (0: allowed, -inf: not), of the R matchers' next tokens
        (rule 3); stops[r]: row r's stop tokens."""
        if self._mask_pool is None:
            self._mask_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ms_atb-mask")
            self._executor = llguidance.LLExecutor()
        return self._mask_pool.submit(self._fill, matchers, stops)

    def masks(self, filling: concurrent.futures.Future) -> np.ndarray:
        """fill()'s masks, once filled (the wait is timed: what the model's step did not hide)."""
        t0 = time.perf_counter()
        allowed = filling.result()
        self.wait_seconds.append(time.perf_counter() - t0)
        return allowed

    def _fill(self, matchers, stops) -> np.ndarray:
        t0 = time.perf_counter()
        n = self.vocab_size
        bitmask = llnp.allocate_token_bitmask(len(matchers), n + 1)                   # int32 [R, ceil((V + 1) / 32)]
        llnp.fill_next_token_bitmask_par(self._executor, [(m, r) for r, m in enumerate(matchers)], bitmask)
        bits = np.unpackbits(bitmask.view(np.uint8), axis=1, count=n + 1, bitorder="little").view(bool)  # [R, V + 1]
        allowed = bits[:, :n] & self._normal                                          # [R, V]
        for r in range(len(matchers)):
            if bits[r, n] or not allowed[r].any():      # the grammar may end here (or has nothing left to take)
                allowed[r, list(stops[r])] = True
            if not allowed[r].any():
                _log.warning("a structured output's grammar allows no token and the request has no stop token: "
                             "its next token is not constrained (%s)", matchers[r].get_error() or "no error")
                allowed[r] = True
        masks = np.where(allowed, np.float32(0.0), np.float32(-np.inf))                # [R, V] float32
        self.mask_seconds.append((len(matchers), time.perf_counter() - t0))
        return masks


def _short(error: str, limit: int = 600) -> str:
    """llguidance's message on one line (its lines of carets, which point into the line above, left out), cut to a
    readable length."""
    error = " ".join(line.strip() for line in error.splitlines() if line.strip().strip("^"))
    return error if len(error) <= limit else error[:limit] + " ..."
