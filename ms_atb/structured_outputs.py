"""StructuredOutputsParams: what one request's output text must match (vLLM's structured outputs).

Exactly one kind per request: a JSON Schema (`json`, a dict or its JSON text), any JSON object (`json_object`), a
regular expression (`regex`, matching the whole output), a list of strings (`choice`: the output is one of them)
or a context-free grammar (`grammar`, in Lark syntax; llama.cpp's GBNF is accepted too). This class checks the
shape of the fields only: whether a schema, regex or grammar is valid is checked against the tokenizer when the
request is made (ms_atb/engine/input_processor.py), so an invalid one is a ValueError before any work starts.
"""
from __future__ import annotations

import dataclasses
import json as json_module
from dataclasses import dataclass

KINDS = ("json", "json_object", "regex", "choice", "grammar")


def encodable(text: str) -> bool:
    """False for strings UTF-8 cannot encode (lone surrogates such as '\\ud800')."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@dataclass
class StructuredOutputsParams:
    json: dict | str | None = None        # a JSON Schema: a dict, or its JSON text (kept as the dict it parses to)
    json_object: bool | None = None       # True: any JSON object
    regex: str | None = None              # the whole output matches it
    choice: list[str] | None = None       # the output is exactly one of these strings
    grammar: str | None = None            # Lark syntax (or GBNF): the output is a sentence of it

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """ValueError naming what is wrong: not exactly one kind, or a kind's value of the wrong shape.
        Idempotent; a JSON text schema becomes the dict it parses to."""
        given = [k for k in KINDS if getattr(self, k) is not None and getattr(self, k) is not False]
        if len(given) != 1:
            raise ValueError(f"structured outputs take exactly one of {list(KINDS)}, got "
                             f"{given or 'none'}")
        kind = given[0]
        if kind == "json":
            self.json = _schema(self.json)
        elif kind == "json_object":
            if self.json_object is not True:
                raise ValueError(f"structured outputs json_object must be true, got {self.json_object!r}")
        elif kind == "choice":
            words = self.choice
            if not isinstance(words, (list, tuple)) or not words or not all(
                    isinstance(w, str) and w.strip() and encodable(w) for w in words):
                raise ValueError(f"structured outputs choice must be a non-empty list of strings that are not blank "
                                 f"(valid Unicode), got {words!r}")
            self.choice = list(dict.fromkeys(words))
        else:
            text = getattr(self, kind)
            if not isinstance(text, str) or not text.strip() or not encodable(text):
                raise ValueError(f"structured outputs {kind} must be a non-empty string (valid Unicode), got "
                                 f"{text!r}")

    @property
    def kind(self) -> str:
        """Which constraint it is: one of KINDS."""
        return next(k for k in KINDS if getattr(self, k) is not None and getattr(self, k) is not False)

    @property
    def key(self) -> tuple:
        """(kind, canonical value): equal for requests that ask for the same constraint (a schema's key order
        aside), so they share one compiled grammar."""
        kind = self.kind
        value = getattr(self, kind)
        if kind == "json":
            return kind, json_module.dumps(value, sort_keys=True, ensure_ascii=False)
        return kind, tuple(value) if kind == "choice" else value

    @classmethod
    def from_dict(cls, d) -> "StructuredOutputsParams":
        """From a JSON object such as {"json": {...}} (a batch line's structured_outputs); ValueError for an
        unknown key."""
        if isinstance(d, cls):
            return d
        if not isinstance(d, dict):
            raise ValueError(f"structured_outputs must be an object with one of {list(KINDS)}, got {d!r}")
        unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"unknown structured_outputs field(s) {unknown}; allowed: {list(KINDS)}")
        return cls(**d)


def _schema(value) -> dict:
    """A JSON Schema as a dict: value itself, or the object its JSON text holds."""
    if isinstance(value, str):
        try:
            value = json_module.loads(value)
        except json_module.JSONDecodeError as e:
            raise ValueError(f"structured outputs json: a schema given as text must be JSON ({e.msg} at "
                             f"character {e.pos})") from None
    if not isinstance(value, dict):
        raise ValueError(f"structured outputs json must be a JSON Schema object (a dict or its JSON text), got "
                         f"{type(value).__name__}")
    try:
        json_module.dumps(value)
    except (TypeError, ValueError) as e:
        raise ValueError(f"structured outputs json: the schema is not JSON data ({e})") from None
    return value
