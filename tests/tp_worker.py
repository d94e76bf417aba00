"""One rank of the tensor-parallel test: msrun starts it once per rank (tests/test_tensor_parallel.py).

python tests/tp_worker.py SPEC.json OUT_DIR
SPEC: {"config": yaml path, "overrides": {LLM keywords}, "prompts": [[ids]], "max_tokens": n,
"guided": {SamplingParams fields}}.
Writes OUT_DIR/rank{r}.json: token ids, stats, the first prompt's prompt_logprobs (N = 2; run after
the others), the first three prompts' tokens under "guided", and what the SPMD checks saw; on a ValueError
(a wrong launch) writes {"error": message} and exits 3.
"""
import json
import os
import sys


def main(spec_path: str, out_dir: str) -> int:
    with open(spec_path) as f:
        spec = json.load(f)
    from ms_atb import LLM, SamplingParams
    from ms_atb.worker.distributed import SpmdCheck, SpmdSampler
    rank_env = os.environ.get("RANK_ID", "0")
    try:
        llm = LLM(spec["config"], **spec["overrides"])
    except ValueError as e:
        _write(out_dir, rank_env, {"error": str(e)})
        return 3
    params = SamplingParams(max_tokens=spec["max_tokens"], temperature=0.0, ignore_eos=True)
    outs = llm.generate(spec["prompts"], params, use_tqdm=False)
    stats = llm.stats()                                # of this run alone
    scored = llm.generate(spec["prompts"][:1], SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=2),
                          use_tqdm=False)[0]
    guided = llm.generate(spec["prompts"][:3], SamplingParams(**spec["guided"]), use_tqdm=False)
    result = {"rank": llm.rank, "token_ids": [o.token_ids for o in outs],
              "guided_token_ids": [o.token_ids for o in guided],
              "prompt_logprobs": [None if d is None else list(d.items()) for d in scored.prompt_logprobs],
              "num_cached_tokens": [o.num_cached_tokens for o in outs], "stats": stats,
              "spmd_checks": llm.sampler.spmd_check.num_checks if isinstance(llm.sampler, SpmdSampler) else 0}
    # A deliberate divergence: every rank must see it, not only the one that differs.
    try:
        SpmdCheck().check([llm.rank], "rank id")
        result["divergence_error"] = None
    except AssertionError as e:
        result["divergence_error"] = str(e)
    _write(out_dir, llm.rank, result)
    return 0


def _write(out_dir, rank, result) -> None:
    path = os.path.join(out_dir, f"rank{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
