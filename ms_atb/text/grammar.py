"""Guide: one structured output constraint as an llguidance grammar over a tokenizer's bytes.

Rules:
  1. A grammar constrains the bytes of the output's tokens, as the detokenizer joins them. With vocabularies whose
     decoding drops one leading space (sentencepiece), the output may start with one more space than the text
     shows: a choice is spelled with and without it (a choice that starts with a space only with it), any other
     grammar takes an optional space before its text.
  2. Every tokenization of an allowed text is open, not only the one encode() would give: the model's logits pick
     one (llguidance's "no_forcing"; llguidance would otherwise force the bytes a grammar forces as encode()'s
     tokens, calling back into Python for them).
  3. JSON (a schema or json_object) takes whitespace between its tokens only as one space, or a newline and at
     most 20 spaces or tabs (as llama.cpp's JSON grammars do), so a model cannot pad it without end; a schema's own
     "x-guidance" options override this.
  4. A choice must be spellable with the vocabulary's tokens (special tokens never spell anything): ValueError
     naming the choice otherwise.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import llguidance
from llguidance.gbnf_to_lark import any_to_lark

WHITESPACE = r"(?: |\n[ \t]{0,20})?"        # rule 3: what may stand between two JSON tokens
JSON_OPTIONS = {"whitespace_flexible": True, "whitespace_pattern": WHITESPACE}
ANY_OBJECT = {"type": "object"}             # json_object: any JSON object
NO_FORCING = '%llguidance {"no_forcing": true}\n'     # rule 2, for the whole grammar


@dataclass(frozen=True, eq=False)
class Guide:
    """A request's constraint, compiled once for every request of the same key (the engine's cache)."""
    key: tuple          # (kind, canonical value): StructuredOutputsParams.key
    grammar: str        # the llguidance grammar (its JSON text)

    @property
    def kind(self) -> str:
        return self.key[0]


def make_guide(key: tuple, value, tokenizer) -> Guide:
    """The Guide of a constraint: key = (kind, canonical value) as StructuredOutputsParams.key gives it, value its
    value (a schema dict, a regex, choices, a grammar text). ValueError for a choice that cannot be spelled or a
    grammar in neither Lark nor GBNF syntax; a schema, regex or grammar is checked when compiled against the
    tokenizer (llguidance.LLMatcher.validate_grammar)."""
    kind = key[0]
    if kind == "choice":
        return Guide(key, json.dumps({"grammars": [{"lark_grammar": NO_FORCING + choice_lark(value, tokenizer)}]}))
    if kind in ("json", "json_object"):
        text = llguidance.LLMatcher.grammar_from_json_schema(value if kind == "json" else ANY_OBJECT,
                                                            defaults=JSON_OPTIONS)
        body = json.loads(text)["grammars"][0]
    elif kind == "regex":
        body = json.loads(llguidance.LLMatcher.grammar_from_regex(value))["grammars"][0]
    else:
        try:
            lark = any_to_lark(value)
        except Exception as e:      # the converter's own parse errors are plain Exceptions
            raise ValueError(f"structured outputs grammar: not Lark, and not GBNF either ({e})") from None
        body = {"lark_grammar": lark}
    top = 'start: " "? @body' if tokenizer.strip_leading_space else "start: @body"
    return Guide(key, json.dumps({"grammars": [{"lark_grammar": NO_FORCING + top}, {**body, "name": "body"}]}))


def choice_lark(choices: list[str], tokenizer) -> str:
    """A Lark grammar whose sentences are the spellings of the choices (rules 1 and 4)."""
    ids_by_bytes = tokenizer.ids_by_bytes
    longest = max(map(len, ids_by_bytes), default=0)
    strip = tokenizer.strip_leading_space
    spellings = []
    for choice in choices:
        raw = choice.encode("utf-8")
        options = [b" " + raw] if strip else []
        if not (strip and raw.startswith(b" ")):
            options.append(raw)
        found = [s for s in options if _spellable(s, ids_by_bytes, longest)]
        if not found:
            raise ValueError(f"guided_choice {choice!r} cannot be spelled with this vocabulary's tokens")
        spellings += found
    return "start: " + " | ".join(json.dumps(s.decode("utf-8"), ensure_ascii=False) for s in spellings)


def _spellable(target: bytes, ids_by_bytes: dict, longest: int) -> bool:
    """target is a concatenation of token bytes."""
    n = len(target)
    ok = [False] * (n + 1)              # ok[i]: target[i:] can be spelled
    ok[n] = True
    for i in range(n - 1, -1, -1):
        ok[i] = any(ok[j] and target[i:j] in ids_by_bytes for j in range(i + 1, min(n, i + longest) + 1))
    return ok[0]
