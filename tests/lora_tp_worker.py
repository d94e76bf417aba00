"""One rank of the LoRA tensor-parallel test: msrun starts it once per rank (tests/test_lora_engine_tp.py).

python tests/lora_tp_worker.py SPEC.json OUT_DIR
SPEC: {"config": yaml path, "overrides": {LLM keywords}, "prompts": [[ids]], "max_tokens": n,
"adapters": [[name, id, path]], "choice": [index into adapters, or null: the base model] per prompt}.
Writes OUT_DIR/rank{r}.json: {"rank", "token_ids"}.
"""
import json
import os
import sys


def main(spec_path: str, out_dir: str) -> int:
    with open(spec_path) as f:
        spec = json.load(f)
    from ms_atb import LLM, LoRARequest, SamplingParams
    llm = LLM(spec["config"], **spec["overrides"])
    adapters = [LoRARequest(*a) for a in spec["adapters"]]
    params = SamplingParams(max_tokens=spec["max_tokens"], temperature=0.0, ignore_eos=True)
    outs = llm.generate(spec["prompts"], params, use_tqdm=False,
                        lora_request=[None if c is None else adapters[c] for c in spec["choice"]])
    with open(os.path.join(out_dir, f"rank{llm.rank}.json"), "w") as f:
        json.dump({"rank": llm.rank, "token_ids": [o.token_ids for o in outs]}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
