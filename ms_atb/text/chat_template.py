"""Chat templates (jinja2, as HF writes them) rendered in a sandbox with bounds on output and time.

A template comes with the model, so it is untrusted code. It runs in jinja2's
ImmutableSandboxedEnvironment (no attribute access to internals, no mutation of arguments) with:
  - at most MAX_OUTPUT_CHARS (1 MiB) of rendered text, and no single string, list or padding made
    inside the template beyond that: `*`, `+`, `%` and `~` on strings and sequences, `join` (the filter
    and str.join), formatting (`%`, the `format` filter, str.format: the fields' widths and sizes),
    `replace` (filter and method), str.expandtabs, the `indent` filter, and any int argument of a call
    or filter above the bound, are refused before they allocate (template_bounds.py); the other filters'
    results are checked once made;
  - no integer of more than MAX_INT_BITS bits made by `*` or `**`, refused before it is computed: one
    such operation (`7 ** 30000000`) runs for seconds without reaching a line the time bound can see;
  - at most MAX_RENDER_S (2 s) of rendering, checked at every line the template's code runs (its
    loops included, even empty ones) through a trace hook confined to the template's own frames;
  - range() of at most jinja2's sandbox limit (100,000 items).
Past a bound the render stops with a ValueError naming the bound; the engine and its other requests
go on. Every failure of a template, to compile or to render, is a ChatTemplateError (a ValueError)
whose message names the chat template.
"""
from __future__ import annotations

import json
import sys
import time
from datetime import datetime

from ms_atb.text.template_bounds import (MAX_INT_BITS, MAX_OUTPUT_CHARS, ChatTemplateError, ChatTemplateLimitError,
                                         check_binop, check_format, check_indent, check_ints, check_replace,
                                         check_str_method, joined, too_big)

MAX_RENDER_S = 2.0
__all__ = ["MAX_INT_BITS", "MAX_OUTPUT_CHARS", "MAX_RENDER_S", "ChatTemplateError", "ChatTemplateLimitError",
           "compile_chat_template", "render_chat_template"]


def _environment():
    from jinja2.compiler import CodeGenerator
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class LimitedCodeGenerator(CodeGenerator):
        def visit_Concat(self, node, frame):    # `a ~ b ~ c`, as jinja2 writes it, through environment.concat
            escape = "context.eval_ctx.autoescape" if frame.eval_ctx.volatile else str(frame.eval_ctx.autoescape)
            self.write("environment.concat((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write(f"), {escape})")

    class LimitedEnvironment(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(["*", "+", "%", "**"])
        code_generator_class = LimitedCodeGenerator

        def call_binop(self, context, op, left, right):
            check_binop(op, left, right)
            return super().call_binop(context, op, left, right)

        def call(self, __context, __obj, *args, **kwargs):
            check_ints(args, kwargs)
            owner, name = getattr(__obj, "__self__", None), getattr(__obj, "__name__", None)
            if isinstance(owner, str) and name == "join" and len(args) == 1 and not kwargs:
                args = (list(args[0]),)          # str.join: bounded before it joins
                if all(isinstance(x, str) for x in args[0]):
                    return joined(args[0], owner)
            elif isinstance(owner, str):
                check_str_method(owner, name, args, kwargs)
            return super().call(__context, __obj, *args, **kwargs)

        def wrap_str_format(self, value):
            wrapped = super().wrap_str_format(value)
            if wrapped is None:
                return None

            def bounded(*args, **kwargs):       # str.format / format_map, bounded before they format
                values = list(args[0].values()) if value.__name__ == "format_map" and args \
                    and isinstance(args[0], dict) else [*args, *kwargs.values()]
                check_format(value.__self__, "{}", values)
                return wrapped(*args, **kwargs)
            return bounded

        @staticmethod
        def concat(parts: tuple, escape: bool) -> str:
            from jinja2.runtime import markup_join
            joined([str(p) for p in parts])
            return markup_join(parts) if escape else "".join(map(str, parts))

    return LimitedEnvironment


def _limited_filter(fn, check=None):
    """Filter fn with its int arguments bounded, check(value, *args, **kwargs) run first, its result's size
    checked once made."""
    def wrapped(*args, **kwargs):
        check_ints(args[1:], kwargs)
        if check is not None:
            check(*args, **kwargs)
        out = fn(*args, **kwargs)
        if isinstance(out, (str, list, tuple)) and len(out) > MAX_OUTPUT_CHARS:
            raise too_big("made a string")
        return out
    for attr in ("jinja_pass_arg", "jinja_async_variant"):     # jinja2's markers on its own filters
        if hasattr(fn, attr):
            setattr(wrapped, attr, getattr(fn, attr))
    return wrapped


def _join_filter():
    """jinja2's `join` filter (without autoescape), bounded before it joins."""
    from jinja2 import pass_environment
    from jinja2.filters import make_attrgetter

    @pass_environment
    def join(environment, value, d: str = "", attribute=None) -> str:
        if attribute is not None:        # the sandbox's own item and attribute lookup
            value = map(make_attrgetter(environment, attribute), value)
        return joined([str(x) for x in value], str(d))
    return join


def _filters(env) -> dict:
    """jinja2's filters, each bounded (_limited_filter), and those whose result may be many times their operands
    checked before they run."""
    def format_check(value, *args, **kwargs):
        check_format(str(value), "%", [*args, *kwargs.values()])

    def replace_check(eval_ctx, s, old, new, count=None):
        check_replace(str(s), str(old), str(new), -1 if count is None else count)

    def indent_check(s, width=4, *args, **kwargs):
        check_indent(str(s), width)

    checks = {"format": format_check, "replace": replace_check, "indent": indent_check}
    filters = {name: _limited_filter(fn, checks.get(name)) for name, fn in env.filters.items()}
    filters["join"] = _join_filter()
    filters["tojson"] = _limited_filter(lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent))
    return filters


def compile_chat_template(source: str):
    """The compiled template; ChatTemplateError if it is not valid jinja2 (or too deep to compile)."""
    def raise_exception(message):
        raise ChatTemplateError(f"chat template: {message}")

    # HF's settings: {% break %} / {% continue %} (loop controls) are allowed in templates
    env = _environment()(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters = _filters(env)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except Exception as e:               # jinja2's TemplateSyntaxError, or Python's RecursionError / SyntaxError
        raise ChatTemplateError(f"invalid chat template: {type(e).__name__}: {e}") from None


def render_chat_template(template, **context) -> str:
    """template.render(**context) within MAX_OUTPUT_CHARS, MAX_INT_BITS and MAX_RENDER_S; any failure is a
    ChatTemplateError naming the chat template (ChatTemplateLimitError past a bound)."""
    try:
        return _render(template, context)
    except ChatTemplateError:              # a bound or raise_exception(): already names the chat template
        raise
    except Exception as e:                 # jinja2's UndefinedError, the template's own arithmetic, ...
        raise ChatTemplateError(f"the chat template failed on this conversation ({type(e).__name__}: {e})") \
            from None


def _render(template, context: dict) -> str:
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
                raise too_big(f"rendered {total} characters")
            parts.append(chunk)
        return "".join(parts)
    finally:
        sys.settrace(previous)
