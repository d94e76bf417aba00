"""A model's chat template is untrusted code: its output and its running time are bounded, and a
template past a bound is one refused request, not a hung or exhausted job."""
import time

import pytest

from ms_atb.text import chat_template
from ms_atb.text.tokenizer import ByteTokenizer

CONV = [{"role": "user", "content": "hi"}]


def _tok(template: str):
    tok = ByteTokenizer(300)
    tok.chat_template = template
    return tok


SLOW = [
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{% for i in range(100000) %}{% for j in range(100000) %}{% set x = i + j %}{% endfor %}{% endfor %}",
    "{% for c in 'a' * 100000 %}{% for d in 'b' * 100000 %}{% endfor %}{% endfor %}",
    "{% for i in range(100000) %}{% for j in range(100000) %}{{ '' }}{% endfor %}{% endfor %}",
]


@pytest.mark.parametrize("template", SLOW)
def test_a_slow_template_is_stopped_within_the_time_bound(template, monkeypatch):
    # the first template against the default bound, the others against a shorter one (the same check, sooner)
    if template != SLOW[0]:
        monkeypatch.setattr(chat_template, "MAX_RENDER_S", 0.5)
    start = time.monotonic()
    with pytest.raises(ValueError, match=rf"ran past the limit of {chat_template.MAX_RENDER_S:g} s"):
        _tok(template).apply_chat_template(CONV)
    assert time.monotonic() - start < 3 * chat_template.MAX_RENDER_S


@pytest.mark.parametrize("template, match", [
    ("{{ 'a' * 10**9 }}", "made a sequence of 1 x 1000000000 items"),
    ("{{ 10**9 * 'a' }}", "made a sequence"),
    ("{{ [1] * 10**9 }}", "made a sequence"),
    ("{{ 'a'|center(10**9) }}", "passed 1000000000 to a call"),
    ("{{ '%01000000000d' % 1 }}", "formatted a field of width 1000000000"),
    ("{{ 'x'.ljust(10**9) }}", "passed 1000000000 to a call"),
    ("{% set s = 'a' * 1000000 %}{{ s + s }}", "joined two sequences"),
    ("{% for i in range(3000) %}{{ 'a' * 1000 }}{% endfor %}", "rendered 1049000 characters"),
])
def test_a_huge_output_is_refused_before_it_is_made(template, match):
    with pytest.raises(ValueError, match=match + r".*past the limit of 1048576 characters of output"):
        _tok(template).apply_chat_template(CONV)


def test_the_tokenizer_goes_on_after_a_refused_template(monkeypatch):
    monkeypatch.setattr(chat_template, "MAX_RENDER_S", 0.5)
    bad = _tok("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}")
    with pytest.raises(ValueError):
        bad.apply_chat_template(CONV)
    good = _tok("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}")
    assert good.apply_chat_template(CONV) == "<user>hi"
    big = _tok("{{ 'a' * 1000000 }}")
    assert len(big.apply_chat_template(CONV)) == 1000000


def test_filters_and_loops_still_work():
    t = _tok("{% for m in messages %}{{ m['content']|upper|center(6) }}{{ loop.index }}"
             "{{ messages|map(attribute='role')|join(',') }}{{ m|tojson }}{% endfor %}")
    assert t.apply_chat_template(CONV) == '  HI  1user{"role": "user", "content": "hi"}'


@pytest.mark.parametrize("template, match", [
    ("{% set a = 7 ** 30000000 %}", r"computed an integer of about 84220648 bits"),
    ("{% set x = 10 ** 100000 %}ok", r"computed an integer of about 332193 bits"),
    ("{% set a = 2 ** 60000 %}{{ a * a }}", r"computed an integer of about 120002 bits"),
    ("{{ '{:>1000000000}'.format(1) }}", r"formatted a field of width 1000000000"),
    ("{{ '{:.1000000000f}'.format(1.0) }}", r"formatted a field of width 1000000000"),
    ("{{ '%.1000000000f' % 1.0 }}", r"formatted a field of width 1000000000"),
    ("{{ '%1000000000d'|format(1) }}", r"formatted a field of width 1000000000"),
    ("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
     r"joined strings of 2097152 characters"),
    ("{% set s = 'a' * 1000 %}{{ ([s] * 2000)|join }}", r"joined strings of 2000000 characters"),
    ("{% set s = 'a' * 1000 %}{{ '-'.join([s] * 2000) }}", r"joined strings of 2001999 characters"),
    ("{% set s = 'a' * 1000000 %}{{ ('{0}' * 999).format(s) }}", r"formatted 999 fields into about 999002997"),
    ("{% set s = 'a' * 1000000 %}{{ ('%s' * 999) % ((s,) * 999) }}", r"formatted 999 fields into about 999001998"),
    ("{{ '{:{}}{:{}}'.format(1, 1000000, 2, 1000000) }}", r"formatted 2 fields into about 2000010"),
    ("{% set s = 'a' * 1100 %}{{ s.replace('a', s) }}", r"replaced into a string of 1210000 characters"),
    ("{% set s = 'ab' * 1000 %}{{ s|replace('', s) }}", r"replaced into a string of 4004000 characters"),
    ("{% set s = '\t' * 10000 %}{{ s.expandtabs(1000) }}", r"expanded tabs into a string of 10010000"),
    ("{% set s = 'a\n' * 10000 %}{{ s|indent(1000) }}", r"indented into a string of 10021000"),
])
def test_work_inside_one_expression_is_bounded_before_it_is_done(template, match):
    """The time bound is checked between the template's lines: an expression that would take seconds (a
    huge power) or gigabytes (a field width, a doubling join) on its own is refused before it is computed."""
    start = time.process_time()
    with pytest.raises(ValueError, match=r"the chat template " + match + r".*past the limit"):
        _tok(template).apply_chat_template(CONV)
    assert time.process_time() - start < 1


def test_small_arithmetic_joins_and_formats_still_work():
    t = _tok("{{ 2 ** 64 }} {{ (10 ** 30) * 7 }} {{ -3 ** 3 }} {{ 2 ** -1 }} {{ 'ab' ~ 1 ~ 'c' }} "
             "{{ ['x', 'y']|join(',') }} {{ '-'.join(['p', 'q']) }} {{ '{:>4}|{:.2f}'.format('a', 1.5) }} "
             "{{ '%5s|%.3f'|format('b', 2.0) }} {{ '%s%%' % 5 }} {{ 'aXa'.replace('a', 'bb') }} "
             "{{ 'a\nb'|indent(2) }} {{ '{x}'.format_map({'x': 3}) }}")
    assert t.apply_chat_template(CONV) == ("18446744073709551616 7000000000000000000000000000000 -27 0.5 ab1c "
                                           "x,y p-q    a|1.50     b|2.000 5% bbXbb a\n  b 3")


@pytest.mark.parametrize("template", [
    "{{ 10 ** 5000 }}",                                       # an int too long for str(): Python's ValueError
    "{{ 'abc'.index('z') }}",
    "{{ 'a'.split('') }}",
    "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}",     # RecursionError
    "{{ " + "(" * 3000 + "1" + ")" * 3000 + " }}",            # too deep to compile
    "{{ x = }}",
])
def test_every_template_failure_is_a_value_error_naming_the_chat_template(template):
    with pytest.raises(ValueError, match=r"chat template"):
        _tok(template).apply_chat_template(CONV)


def test_the_join_filter_looks_attributes_up_through_the_sandbox():
    t = _tok("{{ messages|join(',', attribute='role') }}|{{ messages|join(attribute='__class__') }}|"
             "{% autoescape true %}{{ '<' ~ 'b' }}{% endautoescape %}")
    assert t.apply_chat_template(CONV) == "user||&lt;b"
