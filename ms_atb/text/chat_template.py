"""Chat templates (jinja2, as HF writes them) rendered in a sandbox with bounds on output and time.

A template comes with the model, so it is untrusted code. It runs in jinja2's
ImmutableSandboxedEnvironment (no attribute access to internals, no mutation of arguments) with:
  - at most MAX_OUTPUT_CHARS (1 MiB) of rendered text, and no single string, list or padding made
    inside the template beyond that: `*`, `+` and `%` on strings and sequences, and any int argument
    of a call or filter above the bound, are refused before they allocate;
  - at most MAX_RENDER_S (2 s) of rendering, checked at every line the template's code runs (its
    loops included, even empty ones) through a trace hook confined to the template's own frames;
  - range() of at most jinja2's sandbox limit (100,000 items).
Past a bound the render stops with a ValueError naming the bound; the engine and its other requests
go on.
"""
from __future__ import annotations

import json
import re
import sys
import time
from datetime import datetime

MAX_OUTPUT_CHARS = 1 << 20
MAX_RENDER_S = 2.0
_FORMAT_WIDTH = re.compile(r"%[-#0 +]*(\*|\d+)")


class ChatTemplateLimitError(ValueError):
    """A template went past MAX_OUTPUT_CHARS or MAX_RENDER_S."""


def _too_big(what: str) -> ChatTemplateLimitError:
    return ChatTemplateLimitError(f"the chat template {what}, past the limit of {MAX_OUTPUT_CHARS} characters "
                                  f"of output")


def _size(x) -> int | None:
    return len(x) if isinstance(x, (str, list, tuple)) else None


def _check_ints(args, kwargs):
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, int) and not isinstance(a, bool) and a > MAX_OUTPUT_CHARS:
            raise _too_big(f"passed {a} to a call")


def _environment():
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class LimitedEnvironment(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(["*", "+", "%"])

        def call_binop(self, context, op, left, right):
            if op == "*":
                n = right if _size(left) is not None else left
                size = _size(left) if _size(left) is not None else _size(right)
                if size is not None and isinstance(n, int) and size * n > MAX_OUTPUT_CHARS:
                    raise _too_big(f"made a sequence of {size} x {n} items")
            elif op == "+":
                if _size(left) is not None and _size(right) is not None \
                        and _size(left) + _size(right) > MAX_OUTPUT_CHARS:
                    raise _too_big("joined two sequences")
            elif op == "%" and isinstance(left, str):
                for width in _FORMAT_WIDTH.findall(left):
                    if width == "*" or int(width) > MAX_OUTPUT_CHARS:
                        raise _too_big(f"formatted a field of width {width}")
            return super().call_binop(context, op, left, right)

        def call(self, __context, __obj, *args, **kwargs):
            _check_ints(args, kwargs)
            return super().call(__context, __obj, *args, **kwargs)

    return LimitedEnvironment


def _limited_filter(fn):
    def wrapped(*args, **kwargs):
        _check_ints(args[1:], kwargs)
        out = fn(*args, **kwargs)
        if _size(out) is not None and _size(out) > MAX_OUTPUT_CHARS:
            raise _too_big("made a string")
        return out
    for attr in ("jinja_pass_arg", "jinja_async_variant"):     # jinja2's markers on its own filters
        if hasattr(fn, attr):
            setattr(wrapped, attr, getattr(fn, attr))
    return wrapped


def compile_chat_template(source: str):
    """The compiled template; ValueError if it is not valid jinja2."""
    from jinja2.exceptions import TemplateError

    def raise_exception(message):
        raise ValueError(f"chat template: {message}")

    # HF's settings: {% break %} / {% continue %} (loop controls) are allowed in templates
    env = _environment()(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters = {name: _limited_filter(fn) for name, fn in env.filters.items()}
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.filters["tojson"] = _limited_filter(lambda x, indent=None: json.dumps(x, ensure_ascii=False,
                                                                               indent=indent))
    try:
        return env.from_string(source)
    except TemplateError as e:
        raise ValueError(f"invalid chat template: {e}") from e


def render_chat_template(template, **context) -> str:
    """template.render(**context) within MAX_OUTPUT_CHARS and MAX_RENDER_S (ChatTemplateLimitError past
    them); the template's own errors are re-raised as they are."""
    deadline = time.monotonic() + MAX_RENDER_S
    filename = "<template>"           # jinja2's name for the code of a template made from a string

    def local(frame, event, arg):
        if time.monotonic() > deadline:
            raise ChatTemplateLimitError(f"the chat template ran past the limit of {MAX_RENDER_S:g} s")
        return local

    def tracer(frame, event, arg):
        if frame.f_code.co_filename == filename:
            return local(frame, event, arg)
        return None

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        parts, total = [], 0
        for chunk in template.generate(**context):
            total += len(chunk)
            if total > MAX_OUTPUT_CHARS:
                raise _too_big(f"rendered {total} characters")
            parts.append(chunk)
        return "".join(parts)
    finally:
        sys.settrace(previous)

