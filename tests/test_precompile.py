"""context.precompile: each token bucket's graph on first use (the default), or every one at build."""
import numpy as np

from engine_helpers import TINY_CONFIG, tiny_logits
from ms_atb import LLM, SamplingParams


def _greedy_reference(prompt, n):
    tokens = list(prompt)
    for _ in range(n):
        tokens.append(int(np.argmax(tiny_logits(tokens)[-1])))
    return tokens[len(prompt):]


def test_a_lazy_engine_compiles_only_the_buckets_it_uses_and_answers_the_same():
    llm = LLM(TINY_CONFIG, max_num_batched_tokens=64, max_num_seqs=4, num_blocks=32, precompile=False)
    assert llm.runner.compiled == set() and llm.runner.warmup_stats is None
    prompt = [5, 6, 7, 8, 9]
    out = llm.generate([prompt], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True), use_tqdm=False)
    assert out[0].token_ids == _greedy_reference(prompt, 4)
    used = set(llm.runner.compiled)
    assert used == {1, 8} and used < set(llm.runner.buckets)      # the 5-token prefill pads to 8; decode is 1
    assert llm.stats()["num_output_tokens"] == 4
