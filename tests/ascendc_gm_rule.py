"""A source check of the AscendC kernels (ops/ascendc/op_kernel): they reach global memory only through
GlobalTensor.

The CPU implementation of the Ascend C API checks every call a kernel makes through the API; a read or write
through a raw pointer (`*reinterpret_cast<float *>(scale)` on a GM_ADDR argument) is no call, so it is not seen
there. This check reads the sources instead. A GM_ADDR (a function's GM_ADDR parameter, or a local declared
GM_ADDR) may only be
  - the pointer given to a GlobalTensor's SetGlobalBuffer (first argument), cast to `__gm__ T *` or not;
  - a whole argument of a call whose parameter in that place is a GM_ADDR: a function of the kernel sources
    declared so (matched by name and number of arguments), or CANN's GET_TILING_DATA(_WITH_STRUCT) and
    GetUserWorkspace;
and `__gm__` appears only in such a cast, GetPhyAddr (a GlobalTensor's raw pointer) nowhere. Anything else (a
dereference, a cast, arithmetic, indexing, a copy, a test) is a violation, reported as `file:line: what`.
"""
from __future__ import annotations

import re

API_TAKING_GM_ADDR = {"GET_TILING_DATA", "GET_TILING_DATA_WITH_STRUCT", "GetUserWorkspace"}
_DEFINITION = re.compile(r"\b(\w+)\s*\(([^()]*)\)\s*(?:const\s*)?([;{])")
_GM_CAST = re.compile(r"\s*\(\s*__gm__[\w\s:<>,]*\*\s*\)\s*")     # `(__gm__ T *)`, the whole of what it matches
_OPEN, _CLOSE = "([{", ")]}"


def strip(source: str) -> str:
    """source without comments, string and char literals, and line continuations (each character of them a
    space, newlines kept, so offsets and line numbers stay)."""
    blank = lambda m: re.sub(r"[^\n]", " ", m.group(0))      # noqa: E731
    source = re.sub(r"//[^\n]*|/\*.*?\*/|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'", blank, source, flags=re.S)
    return source.replace("\\\n", " \n")


def _params(text: str) -> list[str]:
    return [p.strip() for p in text.split(",")] if text.strip() else []


def signatures(text: str) -> dict:
    """{function name: [(number of parameters, positions of its GM_ADDR parameters)]} over text's declarations."""
    found: dict = {}
    for m in _DEFINITION.finditer(text):
        params = _params(m.group(2))
        gm = {i for i, p in enumerate(params) if re.match(r"GM_ADDR\b", p)}
        if gm:
            found.setdefault(m.group(1), []).append((len(params), gm))
    return found


def _body(text: str, brace: int) -> int:
    """The offset of the brace closing the one at `brace`."""
    depth = 0
    for i in range(brace, len(text)):
        depth += text[i] == "{"
        depth -= text[i] == "}"
        if depth == 0:
            return i
    return len(text)


def _enclosing_call(text: str, at: int):
    """(offset of the '(' of the call whose argument text[at] is in, that argument's index), or None when it is
    in no call of the statement."""
    depth, index = 0, 0
    for i in range(at - 1, -1, -1):
        c = text[i]
        if c in _CLOSE:
            depth += 1
        elif c in _OPEN and depth:
            depth -= 1
        elif c == "(":
            return i, index
        elif c in "{;" or (c in _OPEN and not depth):
            return None
        elif c == "," and not depth:
            index += 1
    return None


def _arity(text: str, open_at: int) -> int:
    depth, commas = 0, 0
    for c in text[open_at + 1:]:
        if c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            if depth == 0:
                break
            depth -= 1
        elif c == "," and depth == 0:
            commas += 1
    return commas + 1


def _argument_start(text: str, open_at: int, at: int) -> int:
    depth = 0
    for i in range(at - 1, open_at, -1):
        c = text[i]
        depth += c in _CLOSE
        depth -= c in _OPEN
        if c == "," and depth == 0:
            return i + 1
    return open_at + 1


def _use_is_allowed(text: str, at: int, end: int, calls: dict) -> bool:
    """Whether the GM_ADDR named at text[at:end] is a whole argument of SetGlobalBuffer (first, cast or not) or of
    a call taking a GM_ADDR in that place."""
    call = _enclosing_call(text, at)
    if call is None or not re.match(r"\s*[,)]", text[end:]):
        return False
    open_at, index = call
    before = text[_argument_start(text, open_at, at):at]
    callee = re.search(r"(\w+)\s*$", text[:open_at])
    callee = callee.group(1) if callee else None
    if callee == "SetGlobalBuffer":
        return index == 0 and (not before.strip() or _GM_CAST.fullmatch(before) is not None)
    if before.strip():
        return False
    if callee in API_TAKING_GM_ADDR:
        return True
    return any(n == _arity(text, open_at) and index in gm for n, gm in calls.get(callee, []))


def _is_set_global_buffer_cast(text: str, at: int, end: int) -> bool:
    """Whether the `__gm__` at text[at:end] opens the cast `(__gm__ T *)` that starts SetGlobalBuffer's first
    argument."""
    cast_open = text.rfind("(", 0, at)
    if cast_open < 0 or text[cast_open + 1:at].strip() or not re.match(r"[\w\s:<>,]*\*\s*\)", text[end:]):
        return False
    call = _enclosing_call(text, cast_open)
    return call is not None and call[1] == 0 and not text[call[0] + 1:cast_open].strip() \
        and re.search(r"\bSetGlobalBuffer\s*$", text[:call[0]]) is not None


def _line(text: str, at: int) -> int:
    return text.count("\n", 0, at) + 1


def gm_addr_uses(sources: dict) -> tuple[int, list[str]]:
    """sources {file name: text}: (how many GM_ADDR uses were checked, the violations as `file:line: what`)."""
    texts = {name: strip(src) for name, src in sources.items()}
    calls: dict = {}
    for text in texts.values():
        for name, sigs in signatures(text).items():
            calls.setdefault(name, []).extend(sigs)
    checked, violations = 0, []
    for file, text in texts.items():
        for m in re.finditer(r"\b__gm__\b", text):
            if not _is_set_global_buffer_cast(text, m.start(), m.end()):
                violations.append(f"{file}:{_line(text, m.start())}: __gm__ outside a cast given to SetGlobalBuffer")
        for m in re.finditer(r"\bGetPhyAddr\b", text):
            violations.append(f"{file}:{_line(text, m.start())}: GetPhyAddr gives a raw global pointer")
        for m in _DEFINITION.finditer(text):
            if m.group(3) != "{":
                continue
            body_end = _body(text, m.end() - 1)
            body = text[m.end():body_end]
            names = {p.split()[-1] for p in _params(m.group(2)) if re.match(r"GM_ADDR\s+\w+$", p)}
            names |= set(re.findall(r"\bGM_ADDR\s+(\w+)\s*[=;]", body))
            for name in sorted(names):
                for use in re.finditer(rf"(?<![\w.])(?<!->)(?<!::)\b{name}\b", text[:body_end]):
                    if use.start() < m.end() or re.search(r"\bGM_ADDR\s*$", text[:use.start()]):
                        continue                 # the parameter list, or a declaration
                    checked += 1
                    if not _use_is_allowed(text, use.start(), use.end(), calls):
                        violations.append(f"{file}:{_line(text, use.start())}: GM_ADDR '{name}' used other than as "
                                          f"SetGlobalBuffer's pointer or an argument taking a GM_ADDR")
    return checked, violations
