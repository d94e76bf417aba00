"""Reading ms-atb-generate's input: a prompt file, or standard input (`-`), into BatchItems.

Formats: JSONL (one object a line with "prompt" or "messages", an optional "id" and sampling fields) or
text (one prompt a line; "\\n" in a line is a newline). A file is JSONL when its name ends in .jsonl or
.json; standard input is JSONL when its first non-blank line starts with "{". An "id" keeps its JSON type:
7 and "7" are different ids. A line without one gets the id "line-<N>". The OpenAI batch format
(ms_atb/batch/openai_batch.py) is read too: chosen by --format openai, or found by --format auto.
"""
from __future__ import annotations

import json
import os
import sys

from ms_atb.batch.item import BatchItem
from ms_atb.batch.openai_batch import error_item, is_batch_line, parse_line

FORMATS = ("auto", "ms_atb", "openai")     # --format: "ms_atb" is the text / JSONL format above
STDIN = "-"
STDIN_NAME = "<stdin>"        # how messages name standard input


def read_requests(path: str, skip_invalid: bool = False) -> list[BatchItem]:
    """Lines of our own format -> BatchItems; ValueError naming the line. skip_invalid: a line that is not a
    request becomes an item with its error set instead."""
    return read_input(path, "ms_atb", skip_invalid)[1]


def read_input(path: str, fmt: str = "auto", skip_invalid: bool = False) -> tuple[str, list[BatchItem]]:
    """(the format read, its items). fmt "auto" reads a JSONL input whose first JSON object has a
    "custom_id" as the OpenAI batch format (ms_atb/batch/openai_batch.py: every invalid line is an error item there),
    anything else as our own. Duplicate ids stop the reading in both formats."""
    if fmt not in FORMATS:
        raise ValueError(f"--format must be one of {list(FORMATS)}, got {fmt!r}")
    if path == STDIN:
        lines = sys.stdin.buffer.read().splitlines(keepends=True)
        name, jsonl = STDIN_NAME, _starts_with_object(lines)
    else:
        if not os.path.isfile(path):
            problem = "is a directory, not a file" if os.path.isdir(path) else "not found"
            raise ValueError(f"--input {path!r} {problem}")
        with open(path, "rb") as f:
            lines = f.readlines()
        name, jsonl = path, path.endswith((".jsonl", ".json"))
    openai = fmt == "openai" or fmt == "auto" and jsonl and _first_object_is_batch(lines)
    items = []
    for lineno, raw in enumerate(lines, 1):
        try:
            items.extend(_parse_line(raw, lineno, name, jsonl, openai))
        except ValueError as e:
            if openai:
                items.append(error_item(lineno, str(e), "invalid_json_line"))
                continue
            if not skip_invalid:
                raise
            rid = getattr(e, "request_id", None)
            items.append(BatchItem(f"line-{lineno}" if rid is None else rid, lineno, error=str(e)))
    if not items:
        raise ValueError(f"--input {name!r} holds no prompts")
    seen = {}                     # id -> its line; 7 and "7" are different ids; True is not an id
    key = "custom_id" if openai else "id"
    for item in items:
        if item.id in seen:
            raise ValueError(f"{name}: {key} {json.dumps(item.id)} appears more than once (lines "
                             f"{seen[item.id]} and {item.line}); each request needs its own")
        seen[item.id] = item.line
    return ("openai" if openai else "ms_atb"), items


def _first_object_is_batch(lines: list[bytes]) -> bool:
    """True if the first line that is a JSON object is an OpenAI batch line."""
    for raw in lines:
        try:
            obj = json.loads(raw.removeprefix(b"\xef\xbb\xbf"))
        except ValueError:
            continue
        if isinstance(obj, dict):
            return is_batch_line(obj)
    return False


def _starts_with_object(lines: list[bytes]) -> bool:
    """True if the first non-blank line (a byte order mark aside) starts with "{"."""
    texts = [lines[0].removeprefix(b"\xef\xbb\xbf"), *lines[1:]] if lines else []
    return next((raw.strip() for raw in texts if raw.strip()), b"").startswith(b"{")


def is_id(value) -> bool:
    """A request id: a JSON string or integer (not a bool)."""
    return isinstance(value, (str, int)) and not isinstance(value, bool)


def _parse_line(raw: bytes, lineno: int, path: str, jsonl: bool, openai: bool) -> list[BatchItem]:
    """[] for a blank line, else [one request] (in the OpenAI batch format, possibly an error item)."""
    try:
        line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8").rstrip("\r\n")   # a BOM, CRLF
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}:{lineno}: not valid UTF-8 ({e.reason} at byte {e.start})") from None
    if not line.strip():
        return []
    if openai:
        return [parse_line(line, lineno, path)]
    if not jsonl:
        return [BatchItem(f"line-{lineno}", lineno, prompt=line.replace("\\n", "\n"))]
    try:
        item = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
    if not isinstance(item, dict) or ("prompt" in item) == ("messages" in item):
        error = ValueError(f"{path}:{lineno}: each line needs exactly one of 'prompt' or 'messages'")
        error.request_id = item["id"] if isinstance(item, dict) and is_id(item.get("id")) else None
        raise error
    rid = item.pop("id", f"line-{lineno}")
    if not is_id(rid):
        raise ValueError(f"{path}:{lineno}: 'id' must be a string or an integer, got {json.dumps(rid)}")
    return [BatchItem(rid, lineno, item.pop("prompt", None), item.pop("messages", None), sampling=item)]
