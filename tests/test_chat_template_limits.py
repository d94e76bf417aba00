"""A model's chat template is untrusted code: its output and its running time are bounded, and a
template past a bound is one refused request, not a hung or exhausted job."""
import time

import pytest

from ms_atb.text.tokenizer import ByteTokenizer

CONV = [{"role": "user", "content": "hi"}]


def _tok(template: str):
    tok = ByteTokenizer(300)
    tok.chat_template = template
    return tok


@pytest.mark.parametrize("template", [
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{% for i in range(100000) %}{% for j in range(100000) %}{% set x = i + j %}{% endfor %}{% endfor %}",
    "{% for c in 'a' * 100000 %}{% for d in 'b' * 100000 %}{% endfor %}{% endfor %}",
    "{% for i in range(100000) %}{% for j in range(100000) %}{{ '' }}{% endfor %}{% endfor %}",
])
def test_a_slow_template_is_stopped_within_the_time_bound(template):
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"ran past the limit of 2 s"):
        _tok(template).apply_chat_template(CONV)
    assert time.monotonic() - start < 6


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


def test_the_tokenizer_goes_on_after_a_refused_template():
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
