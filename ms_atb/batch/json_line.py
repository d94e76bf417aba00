"""One JSON line read and one written, whatever the line holds.

Rules:
  1. A line nested deeper than MAX_DEPTH is refused before it is parsed (so no parser recursion limit is ever
     met), with a ValueError saying so.
  2. JSON may spell strings that are not valid Unicode (a lone surrogate such as "\\udc80"): they are kept as
     read; dumps() writes a line such a string is in with \\u escapes, so it round-trips and never fails to encode.
"""
from __future__ import annotations

import json

MAX_DEPTH = 64        # no input or result line of ours nests deeper than a few levels


def loads(text):
    """The value of one JSON line; ValueError (not a RecursionError) for a line nested deeper than MAX_DEPTH,
    json.JSONDecodeError for one that is not JSON."""
    if text.count("[") + text.count("{") > MAX_DEPTH:     # else it cannot nest deeper (strings' brackets counted)
        _check_depth(text)
    return json.loads(text)


def _check_depth(text: str) -> None:
    depth = 0
    in_string = escaped = False
    for ch in text:                                   # brackets outside strings
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise ValueError(f"nested more than {MAX_DEPTH} levels deep")
        elif ch in "]}":
            depth -= 1


def dumps(value) -> str:
    """One line of JSON, UTF-8 encodable: non-ASCII characters as they are, unless a string holds one UTF-8
    cannot encode (rule 2)."""
    text = json.dumps(value, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value, ensure_ascii=True)
    return text


def is_unicode(text: str) -> bool:
    """False for strings UTF-8 cannot encode (lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
