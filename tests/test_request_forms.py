"""The forms a request may take beyond text and token ids: vLLM's prompt dicts, and max_tokens=None
(as many tokens as max_model_len and the KV pool leave)."""
import pytest

from ms_atb import SamplingParams
from engine_helpers import scheduler_settings

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


@pytest.fixture
def llm(tiny_llm):
    return tiny_llm         # conftest.py: one tiny engine for the whole run (max_model_len 512), reset per test


def test_prompt_dicts_are_text_or_token_ids(llm):
    plain = llm.generate(["hello", [7, 8, 9]], GREEDY, use_tqdm=False)
    dicts = llm.generate([{"prompt": "hello"}, {"prompt_token_ids": [7, 8, 9]}], GREEDY, use_tqdm=False)
    assert [o.token_ids for o in dicts] == [o.token_ids for o in plain]
    assert dicts[0].prompt == "hello" and dicts[1].prompt is None
    alone = llm.generate({"prompt_token_ids": [7, 8, 9]}, GREEDY, use_tqdm=False)    # one dict: one prompt
    assert len(alone) == 1 and alone[0].token_ids == plain[1].token_ids


@pytest.mark.parametrize("prompt, match", [
    ({"text": "hi"}, r"request 1: a dict prompt has exactly one key, 'prompt' \(text\) or 'prompt_token_ids', "
                     r"got \['text'\]"),
    ({"prompt": "hi", "prompt_token_ids": [1]}, "exactly one key"),
    ({"prompt": [1, 2]}, "'prompt' must be a string"),
    ({"prompt_token_ids": "hi"}, "'prompt_token_ids' must be token ids"),
    ({"prompt_token_ids": []}, "the prompt is empty"),
])
def test_bad_prompt_dicts(llm, prompt, match):
    with pytest.raises(ValueError, match=match):
        llm.generate([[1, 2], prompt], GREEDY, use_tqdm=False)
    assert not llm.scheduler.has_unfinished()


def test_max_tokens_none_runs_to_max_model_len(llm):
    params = SamplingParams(max_tokens=None, temperature=0.0, ignore_eos=True)
    outs = llm.generate([list(range(1, 501)), [1, 2, 3]], [params, GREEDY], use_tqdm=False)
    assert len(outs[0].token_ids) == 12 and outs[0].finish_reason == "length"      # 500 + 12 = 512
    with pytest.raises(ValueError, match=r"request 0: the prompt \(512 tokens\) leaves no room"):
        llm.generate([[5] * 512], params, use_tqdm=False)
    with pytest.raises(ValueError, match=r"request 0: min_tokens must be .* max_tokens = 12"):
        llm.generate([list(range(1, 501))], SamplingParams(max_tokens=None, min_tokens=13), use_tqdm=False)


def test_max_tokens_none_stays_within_the_kv_pool(llm):
    params = SamplingParams(max_tokens=None, temperature=0.0, ignore_eos=True)
    with scheduler_settings(llm, num_blocks=20) as small:                  # 320 token slots
        out = small.generate([list(range(1, 301))], params, use_tqdm=False)[0]
    assert len(out.token_ids) == 21            # the last sampled token needs no slot: 300 + 21 - 1 = 320
