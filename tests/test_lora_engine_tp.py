"""LoRA under tensor parallelism: 2 ranks under msrun, adapters split as their base weights (q/k/v and gate/up by
output rows, o and down by input columns), give the greedy tokens of one rank for a batch mixing adapters and the
base model, with fewer slots than adapters."""
import json
import os

import pytest

from ms_atb import LLM, LoRARequest, SamplingParams
from engine_helpers import EXACT
from test_lora_batch import tiny_config
from test_tensor_parallel import TINY, logs, msrun, read_rank
from scripts_import import load_script

fixtures = load_script("make_lora_fixtures")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "lora_tp_worker.py")
OVERRIDES = {"max_num_batched_tokens": 32, "max_num_seqs": 8, "num_blocks": 32, "precompile": False,
             "enable_lora": True, "max_loras": 2, "max_lora_rank": 16, **EXACT}
PROMPTS = [[5, 6, 7, 8, 9, 10], [40, 41, 42], [100, 3, 200, 17, 9], [7, 7, 7, 7], [300, 301], [9, 8, 7, 6, 5]]
CHOICE = [0, 1, None, 2, 0, None]
MAX_TOKENS = 10


@pytest.mark.slow
def test_tp2_with_adapters_gives_the_tokens_of_tp1(tmp_path):
    config = tiny_config()
    adapters = [[name, i + 1, fixtures.write_adapter(str(tmp_path / name), config, name, 0.6)]
                for i, name in enumerate(fixtures.ADAPTERS)]
    llm = LLM(TINY, **OVERRIDES)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    requests = [LoRARequest(*a) for a in adapters]
    want = [o.token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False,
                                              lora_request=[None if c is None else requests[c] for c in CHOICE])]
    base = [o.token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    assert all((w != b) == (c is not None) for w, b, c in zip(want, base, CHOICE))     # the adapters act
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"config": TINY, "overrides": dict(OVERRIDES, tensor_parallel_size=2),
                                "prompts": PROMPTS, "max_tokens": MAX_TOKENS, "adapters": adapters,
                                "choice": CHOICE}))
    log_dir, out_dir = tmp_path / "log", tmp_path / "out"
    out_dir.mkdir()
    run = msrun(2, [WORKER, str(spec), str(out_dir)], log_dir)
    assert run.returncode == 0, f"{run.stdout[-2000:]}\n{logs(log_dir)}"
    for r in (0, 1):
        result = read_rank(out_dir, r, log_dir)
        assert result["rank"] == r and result["token_ids"] == want, f"rank {r} differs from tensor_parallel_size 1"
