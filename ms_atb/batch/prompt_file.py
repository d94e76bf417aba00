"""Reading ms-atb-generate's input: a prompt file, or standard input (`-`), into BatchItems, lazily.

Formats: JSONL (one object a line with "prompt" or "messages", an optional "id" and sampling fields) or
text (one prompt a line; "\\n" in a line is a newline). A file is JSONL when its name ends in .jsonl or
.json; standard input is JSONL when its first non-blank line starts with "{". An "id" keeps its JSON type:
7 and "7" are different ids. A line without one gets the id "line-<N>". The OpenAI batch format
(ms_atb/batch/openai_batch.py) is read too: chosen by --format openai, or found by --format auto.

Rules:
  1. The input is read one line at a time, as often as the job needs (a pass to check every line, one to run
     them, one to merge); standard input is first copied to a private temporary file for that.
  2. A line that is not a request raises a ValueError naming it, or, with skip_invalid (and always in the
     OpenAI format), becomes an item with its error set: a line nested too deep or that is not UTF-8 included.
  3. Ids must be distinct (checked by the caller over a whole pass: check_ids).
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from typing import Iterator

from ms_atb.batch import json_line
from ms_atb.batch.id_index import IdIndex
from ms_atb.batch.item import BatchItem
from ms_atb.batch.openai_batch import error_item, is_batch_line, parse_line

FORMATS = ("auto", "ms_atb", "openai")     # --format: "ms_atb" is the text / JSONL format above
STDIN = "-"
STDIN_NAME = "<stdin>"        # how messages name standard input


class InputFile:
    """The input of one job (rule 1). A context manager: close() removes standard input's copy."""

    def __init__(self, path: str, fmt: str = "auto", skip_invalid: bool = False):
        if fmt not in FORMATS:
            raise ValueError(f"--format must be one of {list(FORMATS)}, got {fmt!r}")
        self.skip_invalid = skip_invalid
        self._spool = None
        if path == STDIN:
            self._spool = tempfile.NamedTemporaryFile(prefix="ms_atb_stdin_", suffix=".jsonl", delete=False)
            shutil.copyfileobj(sys.stdin.buffer, self._spool)
            self._spool.close()
            self.path, self.name = self._spool.name, STDIN_NAME
            self.jsonl = _starts_with_object(self.path)
        else:
            if not os.path.isfile(path):
                problem = "is a directory, not a file" if os.path.isdir(path) else "not found"
                raise ValueError(f"--input {path!r} {problem}")
            self.path, self.name, self.jsonl = path, path, path.endswith((".jsonl", ".json"))
        self.openai = fmt == "openai" or fmt == "auto" and self.jsonl and _first_object_is_batch(self.path)
        self.format = "openai" if self.openai else "ms_atb"

    def items(self) -> Iterator[BatchItem]:
        """Every request item, in input order (rule 2)."""
        with open(self.path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                try:
                    item = _parse_line(raw, lineno, self.name, self.jsonl, self.openai)
                except ValueError as e:
                    if self.openai:
                        item = error_item(lineno, str(e), "invalid_json_line")
                    elif not self.skip_invalid:
                        raise
                    else:
                        rid = getattr(e, "request_id", None)
                        item = BatchItem(f"line-{lineno}" if rid is None else rid, lineno, error=str(e))
                if item is not None:
                    yield item

    def check_ids(self, ids: IdIndex) -> None:
        """ids: those of a pass over this input, each with its line; ValueError when the input holds no request or
        one id twice (rule 3)."""
        if not len(ids):
            raise ValueError(f"--input {self.name!r} holds no prompts")
        repeat = ids.freeze()
        if repeat is not None:
            first, second = repeat
            item_id = next(item.id for item in self.items() if item.line == second)
            raise ValueError(f"{self.name}: {'custom_id' if self.openai else 'id'} {json_line.dumps(item_id)} appears "
                             f"more than once (lines {first} and {second}); each request needs its own")

    def close(self) -> None:
        if self._spool is not None:
            os.unlink(self._spool.name)
            self._spool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_requests(path: str, skip_invalid: bool = False) -> list[BatchItem]:
    """Lines of our own format -> BatchItems; ValueError naming the line. skip_invalid: a line that is not a
    request becomes an item with its error set instead."""
    return read_input(path, "ms_atb", skip_invalid)[1]


def read_input(path: str, fmt: str = "auto", skip_invalid: bool = False) -> tuple[str, list[BatchItem]]:
    """(the format read, its items), all in memory (for small inputs; a job streams InputFile). fmt "auto" reads a
    JSONL input whose first JSON object has a "custom_id" as the OpenAI batch format (ms_atb/batch/openai_batch.py:
    every invalid line is an error item there), anything else as our own. Duplicate ids stop the reading in both
    formats."""
    with InputFile(path, fmt, skip_invalid) as source:
        items, ids = list(source.items()), IdIndex()
        for item in items:
            ids.add(item.id, item.line)
        source.check_ids(ids)
        return source.format, items


def _first_object_is_batch(path: str) -> bool:
    """True if the file's first line that is a JSON object is an OpenAI batch line."""
    with open(path, "rb") as f:
        for raw in f:
            try:
                obj = json_line.loads(raw.removeprefix(b"\xef\xbb\xbf").decode("utf-8"))
            except ValueError:
                continue
            if isinstance(obj, dict):
                return is_batch_line(obj)
    return False


def _starts_with_object(path: str) -> bool:
    """True if the file's first non-blank line (a byte order mark aside) starts with "{"."""
    with open(path, "rb") as f:
        for n, raw in enumerate(f):
            raw = (raw.removeprefix(b"\xef\xbb\xbf") if n == 0 else raw).strip()
            if raw:
                return raw.startswith(b"{")
    return False


def is_id(value) -> bool:
    """A request id: a JSON string or integer (not a bool)."""
    return isinstance(value, (str, int)) and not isinstance(value, bool)


def _parse_line(raw: bytes, lineno: int, path: str, jsonl: bool, openai: bool) -> BatchItem | None:
    """None for a blank line, else one request (in the OpenAI batch format, possibly an error item)."""
    try:
        line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8").rstrip("\r\n")   # a BOM, CRLF
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}:{lineno}: not valid UTF-8 ({e.reason} at byte {e.start})") from None
    if not line.strip():
        return None
    if openai:
        return parse_line(line, lineno, path)
    if not jsonl:
        return BatchItem(f"line-{lineno}", lineno, prompt=line.replace("\\n", "\n"))
    try:
        item = json_line.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
    except ValueError as e:
        raise ValueError(f"{path}:{lineno}: not valid here: {e}") from None
    if not isinstance(item, dict) or ("prompt" in item) == ("messages" in item):
        error = ValueError(f"{path}:{lineno}: each line needs exactly one of 'prompt' or 'messages'")
        error.request_id = item["id"] if isinstance(item, dict) and is_id(item.get("id")) else None
        raise error
    rid = item.pop("id", f"line-{lineno}")
    if not is_id(rid):
        raise ValueError(f"{path}:{lineno}: 'id' must be a string or an integer, got {json_line.dumps(rid)}")
    return BatchItem(rid, lineno, item.pop("prompt", None), item.pop("messages", None), sampling=item)
