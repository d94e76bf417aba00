"""SamplingParams: how one request picks its tokens and when it stops."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass


MAX_LOGPROBS = 20    # the most alternatives logprobs / prompt_logprobs may ask for per token
MAX_N = 64           # the most samples one request may ask for (n): each is a sequence of its own
GREEDY_BELOW = 1e-5   # a temperature under this is greedy, as in vLLM (dividing logits by it would overflow)


def is_int(x) -> bool:
    """A Python int, not a bool: what a SamplingParams field takes (JSON and YAML give these)."""
    return isinstance(x, int) and not isinstance(x, bool)


def is_number(x) -> bool:
    """A Python int or float, not a bool."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _encodable(text: str) -> bool:
    """False for strings UTF-8 cannot encode (lone surrogates such as '\\ud800')."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _token_bias(bias) -> dict[int, float]:
    """{token id: bias}; keys may be digit strings (JSON objects), biases in [-100, 100]."""
    error = f"logit_bias must map token ids (ints >= 0) to numbers in [-100, 100], got {bias!r}"
    if not isinstance(bias, dict):
        raise ValueError(error)
    out = {}
    for key, value in bias.items():
        if isinstance(key, str) and key.isascii() and key.isdigit():
            key = int(key)
        if not is_int(key) or key < 0 or not is_number(value) or not -100 <= value <= 100:
            raise ValueError(error)
        out[key] = float(value)
    return out


@dataclass
class SamplingParams:
    """How one request samples and stops; every field is checked (ValueError naming it and what is allowed).

    Upper bounds: n <= MAX_N = 64 samples per request (each holds KV blocks and a scheduler slot of its
    own); logprobs and prompt_logprobs <= MAX_LOGPROBS = 20 alternatives per token."""
    max_tokens: int | None = 16       # None: as many as max_model_len leaves after the prompt
    temperature: float = 1.0          # 0 (or under GREEDY_BELOW) = greedy
    top_k: int = -1                   # -1 = off
    top_p: float = 1.0                # 1.0 = off
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    repetition_penalty: float = 1.0   # 1.0 = off; > 1 discourages every token of the prompt and output
    presence_penalty: float = 0.0     # subtracted from the logit of every token generated so far
    frequency_penalty: float = 0.0    # times how often each token was generated so far
    logprobs: int | None = None       # None: off; N: each output token's log-probability and the N most likely
    min_tokens: int = 0               # no stop token (EOS, stop_token_ids) is sampled before this many
    min_p: float = 0.0                # 0.0 = off; drops tokens less likely than min_p x the most likely one
    n: int = 1                        # samples of this prompt (RequestOutput.outputs); they share its cached KV
    truncate_prompt_tokens: int | None = None   # None: off; K: keep only the prompt's last K tokens
    logit_bias: dict[int, float] | None = None  # added to those tokens' logits (after the penalties)
    allowed_token_ids: list[int] | None = None  # only these tokens may be sampled
    prompt_logprobs: int | None = None   # None: off; N: each prompt token's log-probability and the N most likely
    skip_special_tokens: bool = True     # leave special tokens (e.g. <|im_start|>) out of the text
    include_stop_str_in_output: bool = False   # keep the stop string that ended the text at its end
    guided_choice: list[str] | None = None     # the output text is exactly one of these strings
    bad_words: list[str] | None = None         # words never generated (their token sequences, as in vLLM)

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Checks every field (ValueError naming it) and normalises them in place; idempotent. The engine
        calls it again for each request, so fields changed after construction are checked too."""
        if not is_int(self.n) or not 1 <= self.n <= MAX_N:
            raise ValueError(f"n must be an int >= 1 and <= MAX_N = {MAX_N} (samples per prompt), got {self.n!r}")
        k = self.truncate_prompt_tokens
        if k is not None and (not is_int(k) or k < 1):
            raise ValueError(f"truncate_prompt_tokens must be None (off) or an int >= 1, got {k!r}")
        if self.max_tokens is not None and (not is_int(self.max_tokens) or self.max_tokens < 1):
            raise ValueError(f"max_tokens must be None (up to max_model_len) or an int >= 1, got {self.max_tokens!r}")
        if not is_number(self.temperature) or not self.temperature >= 0 or self.temperature == float("inf"):
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature!r}")
        self.temperature = float(self.temperature)
        if not is_int(self.top_k) or not (self.top_k == -1 or self.top_k >= 1):   # 0 would keep no token
            raise ValueError(f"top_k must be -1 (off) or an int >= 1, got {self.top_k!r}")
        if not is_number(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be a number in (0, 1], got {self.top_p!r}")
        self.top_p = float(self.top_p)
        if not is_number(self.min_p) or not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be a number in [0, 1] (0 = off), got {self.min_p!r}")
        self.min_p = float(self.min_p)
        if self.seed is not None and (not is_int(self.seed) or self.seed < 0):
            raise ValueError(f"seed must be None or an int >= 0, got {self.seed!r}")
        if self.stop is not None:
            stops = [self.stop] if isinstance(self.stop, str) else self.stop
            if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) and s and _encodable(s)
                                                                for s in stops):
                raise ValueError(f"stop must be a non-empty string or a list of non-empty strings (valid "
                                 f"Unicode), got {self.stop!r}")
            self.stop = list(stops)
        if self.stop_token_ids is not None:
            ids = self.stop_token_ids
            if not isinstance(ids, (list, tuple)) or not all(is_int(t) and t >= 0 for t in ids):
                raise ValueError(f"stop_token_ids must be a list of ints >= 0, got {ids!r}")
            self.stop_token_ids = list(ids)
        for name in ("ignore_eos", "skip_special_tokens", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if not is_int(self.min_tokens) or not 0 <= self.min_tokens <= (self.max_tokens or self.min_tokens):
            raise ValueError(f"min_tokens must be an int in [0, max_tokens = {self.max_tokens}], "
                             f"got {self.min_tokens!r}")
        for name in ("logprobs", "prompt_logprobs"):
            n = getattr(self, name)
            if n is not None and (not is_int(n) or not 0 <= n <= MAX_LOGPROBS):
                raise ValueError(f"{name} must be None (off) or an int in [0, {MAX_LOGPROBS}], got {n!r}")
        if self.logit_bias is not None:
            self.logit_bias = _token_bias(self.logit_bias)
        if self.allowed_token_ids is not None:
            ids = self.allowed_token_ids
            if not isinstance(ids, (list, tuple)) or not ids or not all(is_int(t) and t >= 0 for t in ids):
                raise ValueError(f"allowed_token_ids must be a non-empty list of ints >= 0, got {ids!r}")
            self.allowed_token_ids = sorted(set(ids))
        for name in ("guided_choice", "bad_words"):
            words = getattr(self, name)
            if words is not None:
                if not isinstance(words, (list, tuple)) or not words or not all(
                        isinstance(w, str) and w.strip() and _encodable(w) for w in words):
                    raise ValueError(f"{name} must be a non-empty list of strings that are not blank (valid "
                                     f"Unicode), got {words!r}")
                setattr(self, name, list(dict.fromkeys(words)))
        if self.guided_choice is not None:
            clash = [name for name, on in (("ignore_eos=True", self.ignore_eos), ("min_tokens > 0", self.min_tokens),
                                           ("allowed_token_ids", self.allowed_token_ids is not None)) if on]
            if clash:
                raise ValueError(f"guided_choice ends the request once the text is one of the choices; it cannot "
                                 f"be combined with {', '.join(clash)}")
        rp = self.repetition_penalty
        if not is_number(rp) or not 0 < rp < float("inf"):
            raise ValueError(f"repetition_penalty must be a finite number > 0 (1.0 = off), got {rp!r}")
        self.repetition_penalty = float(rp)
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not is_number(value) or not -2.0 <= value <= 2.0:
                raise ValueError(f"{name} must be a number in [-2, 2] (0 = off), got {value!r}")
            setattr(self, name, float(value))

    @property
    def token_ids_used(self) -> list[int]:
        """Every token id the parameters name (each must be in the vocabulary)."""
        return [*(self.stop_token_ids or ()), *(self.logit_bias or ()), *(self.allowed_token_ids or ())]

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    @property
    def has_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def stop_strings(self) -> list[str]:
        return list(self.stop or [])

    @classmethod
    def from_dict(cls, d: dict) -> "SamplingParams":
        if not isinstance(d, dict):
            raise ValueError(f"sampling parameters must be a mapping, got {type(d).__name__}")
        allowed = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(d) - set(allowed))
        if unknown:
            raise ValueError(f"unknown sampling parameter(s) {unknown}; allowed: {allowed}")
        return cls(**d)
