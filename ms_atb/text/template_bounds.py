"""The size bounds of a chat template's work (ms_atb/text/chat_template.py), checked before the work is done.

A template's operation that would make a string, list or padding past MAX_OUTPUT_CHARS, or an integer past
MAX_INT_BITS bits, is refused with a ChatTemplateLimitError before it allocates: the render's time bound is
checked between the template's lines, so one operation (`7 ** 30000000`: seconds; `'{0}' * 999` formatted
with a 1 MiB string: a gigabyte) must be stopped before it runs. Sizes are upper bounds computed from
the operands: lengths, counts of fields, tabs or newlines, and widths.
"""
from __future__ import annotations

import math
import re
import string

MAX_OUTPUT_CHARS = 1 << 20
MAX_INT_BITS = 1 << 16
_PERCENT_FIELD = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?[a-zA-Z%]")  # width, precision


class ChatTemplateError(ValueError):
    """A chat template that did not compile or render; the message names the chat template."""


class ChatTemplateLimitError(ChatTemplateError):
    """A template went past MAX_OUTPUT_CHARS, MAX_INT_BITS or the time bound."""


def too_big(what: str) -> ChatTemplateLimitError:
    return ChatTemplateLimitError(f"the chat template {what}, past the limit of {MAX_OUTPUT_CHARS} characters "
                                  f"of output")


def _size(x) -> int | None:
    return len(x) if isinstance(x, (str, list, tuple)) else None


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def check_ints(args, kwargs) -> None:
    """Any int argument of a call or filter above MAX_OUTPUT_CHARS (a width, a count) is refused."""
    for a in list(args) + list(kwargs.values()):
        if _is_int(a) and a > MAX_OUTPUT_CHARS:
            raise too_big(f"passed {a} to a call")


def check_binop(op: str, left, right) -> None:
    """`left op right` for the operators jinja2 lets the sandbox intercept: *, **, +, %."""
    if op == "*":
        n = right if _size(left) is not None else left
        size = _size(left) if _size(left) is not None else _size(right)
        if size is not None and _is_int(n) and size * n > MAX_OUTPUT_CHARS:
            raise too_big(f"made a sequence of {size} x {n} items")
        _check_int_result(op, left, right)
    elif op == "**":
        _check_int_result(op, left, right)
    elif op == "+":
        if _size(left) is not None and _size(right) is not None \
                and _size(left) + _size(right) > MAX_OUTPUT_CHARS:
            raise too_big("joined two sequences")
    elif op == "%" and isinstance(left, str):
        values = right if isinstance(right, tuple) else right.values() if isinstance(right, dict) else (right,)
        check_format(left, "%", values)


def _check_int_result(op: str, left, right) -> None:
    if not (_is_int(left) and _is_int(right)):
        return
    if op == "*":
        bits = left.bit_length() + right.bit_length()
    elif right <= 0 or abs(left) < 2:
        return                                   # a float, or 0 / 1 / -1
    else:
        bits = int(right * math.log2(abs(left))) + 1
    if bits > MAX_INT_BITS:
        raise ChatTemplateLimitError(f"the chat template computed an integer of about {bits} bits, past the limit "
                                     f"of {MAX_INT_BITS} bits")


def check_format(fmt: str, style: str, values) -> None:
    """fmt formatted with `values`, "%" style (`%` and the `format` filter) or "{}" style (str.format): no field
    wider than MAX_OUTPUT_CHARS, and at most MAX_OUTPUT_CHARS in all, each field counted at its width or the
    longest value's str(), whichever is larger."""
    values, widest = list(values), 0
    if style == "%":
        fields = [[w for w in field if w] for field in _PERCENT_FIELD.findall(fmt.replace("%%", ""))]
    else:
        specs = [spec or "" for _, name, spec, _ in string.Formatter().parse(fmt) if name is not None]
        fields = [re.findall(r"\d+", spec) for spec in specs]
        if any("{" in spec for spec in specs):       # a width given as an argument: `{:{}}`
            widest = max([0, *(v for v in values if _is_int(v))])
    for widths in fields:
        for width in widths:
            if width == "*" or int(width) > MAX_OUTPUT_CHARS:
                raise too_big(f"formatted a field of width {width}")
        widest = max([widest, *map(int, widths)])
    longest = max((len(str(v)) for v in values), default=0)
    size = len(fmt) + len(fields) * max(widest, longest)
    if size > MAX_OUTPUT_CHARS:
        raise too_big(f"formatted {len(fields)} fields into about {size} characters")


def check_str_method(s: str, name: str, args: tuple, kwargs: dict) -> None:
    """str methods whose result may be many times their operands: replace and expandtabs."""
    if name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        check_replace(s, args[0], args[1], args[2] if len(args) > 2 else kwargs.get("count", -1))
    elif name == "expandtabs":
        tabsize = args[0] if args else kwargs.get("tabsize", 8)
        if _is_int(tabsize):
            _check_size(len(s) + s.count("\t") * max(tabsize, 0), "expanded tabs")


def check_replace(s: str, old: str, new: str, count=-1) -> None:
    n = s.count(old) if old else len(s) + 1
    if _is_int(count) and count >= 0:
        n = min(n, count)
    _check_size(len(s) + n * (len(new) - len(old)), "replaced")


def check_indent(s: str, width) -> None:
    pad = width if _is_int(width) else len(str(width))
    _check_size(len(s) + (s.count("\n") + 1) * max(pad, 0), "indented")


def _check_size(size: int, what: str) -> None:
    if size > MAX_OUTPUT_CHARS:
        raise too_big(f"{what} into a string of {size} characters")


def joined(strings: list, sep: str = "") -> str:
    """sep.join(strings) unless it would pass MAX_OUTPUT_CHARS."""
    total = sum(map(len, strings)) + len(sep) * max(len(strings) - 1, 0)
    if total > MAX_OUTPUT_CHARS:
        raise too_big(f"joined strings of {total} characters")
    return sep.join(strings)
