"""SamplingParams: how one request picks its tokens and when it stops."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ms_atb.structured_outputs import StructuredOutputsParams, encodable


MAX_LOGPROBS = 20    # the most alternatives logprobs / prompt_logprobs may ask for per token
MAX_N = 64           # the most samples one request may ask for (n): each is a sequence of its own
GREEDY_BELOW = 1e-5   # a temperature under this is greedy, as in vLLM (dividing logits by it would overflow)


def is_int(x) -> bool:
    """A Python int, not a bool: what a SamplingParams field takes (JSON and YAML give these)."""
    return isinstance(x, int) and not isinstance(x, bool)


def is_number(x) -> bool:
    """A Python int or float, not a bool."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


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


# vLLM's older keywords, each one kind of StructuredOutputsParams.
_LEGACY_KINDS = {"guided_json": "json", "guided_regex": "regex", "guided_grammar": "grammar", "guided_choice": "choice"}
# The fields that give a request a structured output constraint (at most one may be set).
STRUCTURED_FIELDS = ("structured_outputs", *_LEGACY_KINDS)

# The surfaces a field is exposed on besides the Python API (sampling_fields(surface) lists them):
CONFIG = "config"    # a `sampling.*` leaf of the YAML config (and an LLM(...) keyword): the job's defaults
CLI = "cli"          # an `ms-atb-generate --flag` (--max-tokens, ...): defaults for the lines that do not set it
OPENAI = "openai"    # a body field of an OpenAI batch line, on both /v1/chat/completions and /v1/completions
SURFACES = (CONFIG, CLI, OPENAI)
_SAME = object()     # a config default equal to the Python default


def _param(default, doc: str, surfaces: tuple = (), config_default=_SAME):
    """A SamplingParams field: its meaning, the surfaces that expose it, and the default of its `sampling.*`
    leaf where that differs from the Python default."""
    assert set(surfaces) <= set(SURFACES), surfaces
    extra = {} if config_default is _SAME else {"config_default": config_default}
    return field(default=default, metadata={"doc": doc, "surfaces": tuple(surfaces), **extra})


@dataclass
class SamplingParams:
    """How one request samples and stops; every field is checked (ValueError naming it and what is allowed).

    Upper bounds: n <= MAX_N = 64 samples per request (each holds KV blocks and a scheduler slot of its
    own); logprobs and prompt_logprobs <= MAX_LOGPROBS = 20 alternatives per token. Each field's metadata
    holds its meaning ("doc") and the surfaces that expose it ("surfaces"; see sampling_fields)."""
    max_tokens: int | None = _param(
        16, "The most tokens to generate. None: as many as max_model_len and the KV pool leave after the prompt.",
        SURFACES, config_default=64)
    temperature: float = _param(
        1.0, "Divides the logits before sampling; 0 (or under 1e-5, as in vLLM) is greedy.", SURFACES,
        config_default=0.0)
    top_k: int = _param(-1, "Sample among the k most likely tokens; -1 is off (0 is an error).", SURFACES)
    top_p: float = _param(
        1.0, "Sample among the most likely tokens whose probabilities sum to top_p, in (0, 1]; 1.0 is off.", SURFACES)
    seed: int | None = _param(
        None, "The request's own random stream: a seed gives the same tokens whatever else is in the batch. "
              "None: a stream drawn from context.seed and the request's place in the engine's run.", (CLI, OPENAI))
    stop: str | list[str] | None = _param(
        None, "Strings that end the request when the text reaches one (matched on the text, so they end it under "
              "ignore_eos too); the text stops before it unless include_stop_str_in_output.", (OPENAI,))
    stop_token_ids: list[int] | None = _param(
        None, "Token ids that end the request as EOS does (not under ignore_eos).", (OPENAI,))
    ignore_eos: bool = _param(
        False, "Generate exactly max_tokens tokens (fewer only when max_model_len comes first): no stop token, "
               "neither EOS nor stop_token_ids, ends the request (vLLM still stops at stop_token_ids). A stop "
               "string still does.", SURFACES)
    repetition_penalty: float = _param(
        1.0, "Greater than 0, 1.0 is off: divides the positive logits and multiplies the negative ones of every "
             "token in the prompt and the output (as in vLLM).", SURFACES)
    presence_penalty: float = _param(
        0.0, "In [-2, 2], 0 is off: subtracted from the logit of every token generated so far.", SURFACES)
    frequency_penalty: float = _param(
        0.0, "In [-2, 2], 0 is off: subtracted from a token's logit once per time it was generated so far.", SURFACES)
    logprobs: int | None = _param(
        None, "0-20; None is off. RequestOutput.logprobs: for each output token, {token id: log-probability} of "
              "that token and the N most likely ones under the model's distribution (before penalties and "
              "temperature); and cumulative_logprob.")
    min_tokens: int = _param(
        0, "No stop token (EOS, stop_token_ids) is chosen before this many tokens, and stop strings are ignored "
           "until then; at most max_tokens.", SURFACES)
    min_p: float = _param(
        0.0, "In [0, 1], 0 is off: drops the tokens less likely than min_p times the most likely one (after "
             "temperature, before top-k and top-p).", SURFACES)
    n: int = _param(
        1, "Samples of this prompt, 1-64: RequestOutput.outputs holds n CompletionOutputs, which share the "
           "prompt's cached blocks.", SURFACES)
    truncate_prompt_tokens: int | None = _param(
        None, "Keep only the prompt's last K tokens (a BOS at the front is cut with the rest, as in vLLM). None: "
              "a prompt that does not fit max_model_len is rejected.", SURFACES)
    logit_bias: dict[int, float] | None = _param(
        None, "{token id: bias in [-100, 100]} added to those tokens' logits after the penalties (JSON's string "
              "keys are accepted).", (OPENAI,))
    allowed_token_ids: list[int] | None = _param(
        None, "Only these tokens may be chosen (classification-style jobs).", (OPENAI,))
    prompt_logprobs: int | None = _param(
        None, "0-20; None is off. RequestOutput.prompt_logprobs: for each prompt token, its log-probability given "
              "the tokens before it and the N most likely tokens there (None for the first token).")
    skip_special_tokens: bool = _param(
        True, "Leave special tokens such as <|im_start|> out of the text.", (OPENAI,))
    include_stop_str_in_output: bool = _param(
        False, "Keep the stop string that ended the text at its end (a stop token id is never part of the text).",
        (OPENAI,))
    structured_outputs: StructuredOutputsParams | None = _param(
        None, "What the output text must match: StructuredOutputsParams(json=schema | json_object=True | regex=... | "
              "choice=[...] | grammar=lark), exactly one kind (a batch line gives it as an object, e.g. {\"json\": "
              "schema}). The request ends with stop where the constraint is complete; not with ignore_eos, min_tokens "
              "or allowed_token_ids.", (OPENAI,))
    guided_json: str | dict | None = _param(
        None, "A JSON Schema (a dict or its JSON text) the output matches: structured_outputs=StructuredOutputsParams("
              "json=...), in vLLM's older keyword.", (CLI, OPENAI))
    guided_regex: str | None = _param(
        None, "A regular expression the whole output matches: structured_outputs regex, in vLLM's older keyword.",
        (CLI, OPENAI))
    guided_grammar: str | None = _param(
        None, "A grammar in Lark syntax (or GBNF) the output is a sentence of: structured_outputs grammar, in vLLM's "
              "older keyword.", (CLI, OPENAI))
    guided_choice: list[str] | None = _param(
        None, "The output text is exactly one of these strings (vLLM's guided_choice): structured_outputs choice; "
              "not with ignore_eos, min_tokens or allowed_token_ids.", (CLI, OPENAI))
    bad_words: list[str] | None = _param(
        None, "Words never generated: each is encoded alone and after a space, and the last token of such a "
              "sequence is never chosen right after its other tokens (as in vLLM).", (CLI, OPENAI))

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Checks every field (ValueError naming it) and normalises them in place; idempotent. The engine
        calls it again for each request, so fields changed after construction are checked too."""
        self._check_sizes_and_distribution()
        self._check_stops_and_counts()
        self._check_token_rules_and_penalties()
        self._check_structured()

    def _check_sizes_and_distribution(self) -> None:
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

    def _check_stops_and_counts(self) -> None:
        if self.stop is not None:
            stops = [self.stop] if isinstance(self.stop, str) else self.stop
            if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) and s and encodable(s)
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

    def _check_token_rules_and_penalties(self) -> None:
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
                        isinstance(w, str) and w.strip() and encodable(w) for w in words):
                    raise ValueError(f"{name} must be a non-empty list of strings that are not blank (valid "
                                     f"Unicode), got {words!r}")
                setattr(self, name, list(dict.fromkeys(words)))
        rp = self.repetition_penalty
        if not is_number(rp) or not 0 < rp < float("inf"):
            raise ValueError(f"repetition_penalty must be a finite number > 0 (1.0 = off), got {rp!r}")
        self.repetition_penalty = float(rp)
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not is_number(value) or not -2.0 <= value <= 2.0:
                raise ValueError(f"{name} must be a number in [-2, 2] (0 = off), got {value!r}")
            setattr(self, name, float(value))

    def _check_structured(self) -> None:
        """At most one structured output field, each of the right shape, and none of the settings that would keep
        the request from ending where its constraint is complete."""
        so = self.structured_outputs
        if so is not None:
            self.structured_outputs = StructuredOutputsParams.from_dict(so)
            self.structured_outputs.validate()
        for name, kind in _LEGACY_KINDS.items():
            if name != "guided_choice" and getattr(self, name) is not None:   # guided_choice: checked with bad_words
                StructuredOutputsParams(**{kind: getattr(self, name)})
        given = [name for name in STRUCTURED_FIELDS if getattr(self, name) is not None]
        if len(given) > 1:
            raise ValueError(f"a request takes one structured output constraint, got {given}")
        clash = [name for name, on in (("ignore_eos=True", self.ignore_eos), ("min_tokens > 0", self.min_tokens),
                                       ("allowed_token_ids", self.allowed_token_ids is not None)) if on]
        if given and clash:
            what = "is one of the choices" if given[0] == "guided_choice" else "completes its constraint"
            raise ValueError(f"{given[0]} ends the request once the text {what}; it cannot be combined with "
                             f"{', '.join(clash)}")

    @property
    def structured(self) -> StructuredOutputsParams | None:
        """The request's structured output constraint, whichever field gives it; None without one."""
        if self.structured_outputs is not None:
            return self.structured_outputs
        for name, kind in _LEGACY_KINDS.items():
            if getattr(self, name) is not None:
                return StructuredOutputsParams(**{kind: getattr(self, name)})
        return None

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


def sampling_fields(surface: str) -> list[dataclasses.Field]:
    """The SamplingParams fields a surface exposes (CONFIG, CLI or OPENAI), in declaration order. A field's
    metadata: "doc" (its meaning), "surfaces", and "config_default" where the `sampling.*` leaf's default
    differs from the Python default."""
    if surface not in SURFACES:
        raise ValueError(f"surface must be one of {list(SURFACES)}, got {surface!r}")
    return [f for f in dataclasses.fields(SamplingParams) if surface in f.metadata["surfaces"]]
