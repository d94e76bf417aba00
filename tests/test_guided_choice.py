"""guided_choice (the output text is one of a list of strings) and bad_words: the choice's grammar on hand-made
vocabularies (walked by tests/guide_helpers.py through the engine's StructuredOutputManager), then generate() on
the tiny random Llama against the numpy model with the same rules written out byte by byte."""

import numpy as np
import pytest

from ms_atb import SamplingParams
from ms_atb.text.tokenizer import Tokenizer
from engine_helpers import scheduler_settings, tiny_logits
from guide_helpers import choice_guide as ChoiceGuide

EOS = 511                                     # the tiny model's byte tokenizer: ids 0-255 are bytes


def vocab_tokenizer(pieces, strip_leading_space=False):
    """A tokenizer whose token i has bytes pieces[i]; the last id is a special EOS named like a piece."""
    token_bytes = [p.encode() for p in pieces] + [b"a"]
    return Tokenizer(encode_text=lambda t: [], token_bytes=token_bytes, special_ids={len(pieces)},
                     bos_token_id=None, eos_token_id=len(pieces), add_bos=False, chat_template=None,
                     strip_leading_space=strip_leading_space)


def ids(guide, prefix):
    return guide.next_token_ids(prefix).tolist()


# ---- the guide ----------------------------------------------------------------------------------
def test_every_tokenization_of_a_choice_is_open():
    tok = vocab_tokenizer(["a", "b", "c", "ab", "abc", "bc", "x"])
    guide = ChoiceGuide(["abc"], tok)
    assert ids(guide, b"") == [0, 3, 4]               # a, ab, abc: never the special id 7 spelling "a"
    assert ids(guide, b"a") == [1, 5] and ids(guide, b"ab") == [2]
    assert ids(guide, b"abc") == [] and guide.is_finished(b"abc") and not guide.is_choice(b"ab")


def test_no_token_leads_into_a_dead_end():
    tok = vocab_tokenizer(["a", "ad", "b"])           # no "d": after "a" the choice "ad" cannot be finished
    guide = ChoiceGuide(["ad", "ab"], tok)
    assert ids(guide, b"") == [0, 1]                  # "a" (towards "ab") and "ad"
    assert ids(guide, b"a") == [2]
    with pytest.raises(ValueError, match="guided_choice 'd' cannot be spelled"):
        ChoiceGuide(["ab", "d"], tok)


def test_a_choice_that_a_longer_one_continues():
    tok = vocab_tokenizer(["d", "o", "g", "e", "dog"])
    guide = ChoiceGuide(["dog", "doge"], tok)
    assert guide.is_choice(b"dog") and not guide.is_finished(b"dog") and ids(guide, b"dog") == [3]
    assert guide.is_finished(b"doge")


def test_sentencepiece_style_vocabularies_may_spell_a_leading_space():
    tok = vocab_tokenizer(["yes", " yes", " ", "no"], strip_leading_space=True)
    guide = ChoiceGuide(["yes", " no"], tok)          # decoded text drops one leading space
    assert ids(guide, b"") == [0, 1, 2]               # "yes", " yes", " " (then "yes" or " " "no")
    assert ids(guide, b" ") == [0, 2] and ids(guide, b"  ") == [3]
    assert guide.is_finished(b" yes") and guide.is_finished(b"yes")
    with pytest.raises(ValueError, match="' no' cannot be spelled"):
        ChoiceGuide([" no"], vocab_tokenizer(["no", " no"], strip_leading_space=True))   # needs "  no"


@pytest.mark.parametrize("fields,match", [
    (dict(guided_choice=[]), "guided_choice must be a non-empty list"),
    (dict(guided_choice="yes"), "guided_choice must be a non-empty list"),
    (dict(guided_choice=["yes", " "]), "not blank"),
    (dict(bad_words=["", "x"]), "bad_words must be"),
    (dict(guided_choice=["a"], ignore_eos=True), "cannot be combined with ignore_eos=True"),
    (dict(guided_choice=["a"], min_tokens=1), "min_tokens > 0"),
    (dict(guided_choice=["a"], allowed_token_ids=[1]), "allowed_token_ids"),
])
def test_bad_values_are_rejected(fields, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**fields)


# ---- generate() on the tiny model -----------------------------------------------------------------
@pytest.fixture
def llm(tiny_llm):
    return tiny_llm         # conftest.py: one tiny engine for the whole run, reset for each test


def numpy_guided_greedy(prompt, choices, max_tokens):
    """Greedy among the bytes that keep the output a prefix of a choice (EOS once it is one);
    ends on the byte that completes a choice nothing longer continues."""
    tokens, out = list(prompt), b""
    while len(tokens) - len(prompt) < max_tokens:
        logits = tiny_logits(tokens)[-1]
        allowed = {c[len(out)] for c in choices if c.startswith(out) and len(c) > len(out)}
        if out in choices:
            allowed.add(EOS)
        token = max(sorted(allowed), key=lambda t: logits[t])
        tokens.append(token)
        if token == EOS:
            break
        out += bytes([token])
        if out in choices and not any(len(c) > len(out) and c.startswith(out) for c in choices):
            break
    return tokens[len(prompt):]


def test_greedy_guided_choice_matches_numpy(llm):
    choices = ["cat", "dog", "doge", "bird", "zebra crossing", "z"]
    prompts = [[1, 2, 3], list(range(40, 90)), [200, 7], [9] * 20]
    params = SamplingParams(max_tokens=20, temperature=0.0, guided_choice=choices)
    outs = llm.generate(prompts, params, use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        expected = numpy_guided_greedy(prompt, [c.encode() for c in choices], 20)
        assert out.token_ids == expected
        assert out.text in choices and out.finish_reason == "stop"


def test_requests_with_the_same_choices_share_one_guide(llm):
    params = SamplingParams(guided_choice=["cat", "dog"])
    first, second = (llm.make_request([1, 2], params, i) for i in range(2))
    other = llm.make_request([1, 2], SamplingParams(guided_choice=["dog", "cat"]), 2)
    assert first.guide is second.guide and other.guide is not first.guide


def test_a_choice_cut_by_max_tokens_is_a_length_finish(llm):
    params = SamplingParams(max_tokens=3, temperature=0.0, guided_choice=["zebra crossing"])
    out = llm.generate([[1, 2, 3]], params, use_tqdm=False)[0]
    assert out.text == "zeb" and out.finish_reason == "length"
    exact = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=3, temperature=0.0, guided_choice=["zeb"]),
                         use_tqdm=False)[0]
    assert exact.text == "zeb" and exact.finish_reason == "stop"


def test_sampled_choices_follow_the_model_distribution(llm):
    """One-byte choices: each sample is one draw from the model's softmax over the three bytes."""
    prompt, choices = [5, 6, 7], ["u", "m", "t"]     # the model's three likeliest letters there
    n = 2000                                            # 40 requests of 50 samples (n is at most MAX_N)
    params = [SamplingParams(max_tokens=4, temperature=1.0, seed=11 + i, n=50, guided_choice=choices)
              for i in range(n // 50)]
    samples = [c for out in llm.generate([prompt] * len(params), params, use_tqdm=False) for c in out.outputs]
    texts = [c.text for c in samples]
    assert len(samples) == n
    assert all(c.finish_reason == "stop" and len(c.token_ids) == 1 for c in samples)
    counts = np.array([texts.count(c) for c in choices], dtype=np.float64)
    logits = tiny_logits(prompt)[-1][[ord(c) for c in choices]].astype(np.float64)
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    assert probs.min() > 0.15                           # a test that can tell distributions apart
    expected = probs * n
    assert counts.sum() == n and ((counts - expected) ** 2 / expected).sum() < 13.8   # chi-square, 2 dof, p = 0.001


def test_guided_choice_survives_preemption(llm):
    choices = ["a long answer that spans blocks", "a long answer that stops", "no"]
    prompts = [list(range(i, i + 30)) for i in range(8)]
    params = SamplingParams(max_tokens=40, temperature=0.8, seed=3, guided_choice=choices)
    roomy = llm.generate(prompts, params, use_tqdm=False)
    with scheduler_settings(llm, num_blocks=12) as tight:
        squeezed = tight.generate(prompts, params, use_tqdm=False)
        assert tight.stats()["num_preemptions"] > 0
    assert [o.token_ids for o in squeezed] == [o.token_ids for o in roomy]
    assert all(o.text in choices for o in roomy)


def numpy_greedy_without(prompt, words, n):
    """Greedy, never taking the last token of a word whose other tokens end the output."""
    tokens = list(prompt)
    for _ in range(n):
        logits = tiny_logits(tokens)[-1].copy()
        output = tokens[len(prompt):]
        for w in words:
            if len(w) - 1 <= len(output) and output[len(output) - len(w) + 1:] == w[:-1]:
                logits[w[-1]] = -np.inf
        tokens.append(int(np.argmax(logits)))
    return tokens[len(prompt):]


def test_bad_words_are_never_completed(llm):
    prompts = [list(b"hello"), list(b"abc")]
    plain = llm.generate(prompts, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True), use_tqdm=False)
    printable = [[i for i, t in enumerate(o.token_ids) if 33 <= t < 127] for o in plain]   # ASCII, not space
    pair = next(i for i in printable[0] if i + 1 in printable[0])
    word = bytes(plain[0].token_ids[pair:pair + 2]).decode()      # a 2-byte word the model really writes
    single = chr(plain[1].token_ids[printable[1][0]])             # and a 1-byte one
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, bad_words=[word, single])
    outs = llm.generate(prompts, params, use_tqdm=False)
    words = [list(word.encode()), [32, *word.encode()], [ord(single)], [32, ord(single)]]
    for prompt, out, before in zip(prompts, outs, plain):
        assert out.token_ids == numpy_greedy_without(prompt, words, 12)
        assert out.token_ids != before.token_ids
        assert ord(single) not in out.token_ids


def test_bad_request_names_its_index_and_the_engine_stays_usable(llm):
    params = [SamplingParams(max_tokens=4, temperature=0.0),
              SamplingParams(max_tokens=4, guided_choice=["ok"], stop_token_ids=[EOS + 1])]
    with pytest.raises(ValueError, match=r"request 1: token id 512 .* outside the vocabulary"):
        llm.generate([[1, 2], [3, 4]], params, use_tqdm=False)
    out = llm.generate([[3, 4]], SamplingParams(max_tokens=4, guided_choice=["ok"]), use_tqdm=False)[0]
    assert out.text == "ok"
