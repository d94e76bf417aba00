"""One rank of the family tensor-parallel test: msrun starts it once per rank (tests/test_model_families.py).

python tests/family_tp_worker.py MODEL_DIR OUT_DIR
Writes OUT_DIR/rank{r}.json: the greedy token ids (16 new tokens, no EOS stop) and the top-20
log-probabilities of the first output token, for each prompt of MODEL_DIR/reference.json.
"""
import json
import os
import sys


def main(model_dir: str, out_dir: str) -> int:
    from ms_atb import LLM, SamplingParams
    with open(os.path.join(model_dir, "reference.json")) as f:
        prompts = [p["prompt_ids"] for p in json.load(f)["prompts"]]
    llm = LLM(model_dir, tensor_parallel_size=2, max_num_seqs=4, max_num_batched_tokens=32, num_blocks=64,
              max_model_len=128, precompile=False, activation_dtype="float32", cache_dtype="float32")
    outs = llm.generate(prompts, SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, logprobs=20),
                        use_tqdm=False)
    result = {"rank": llm.rank, "token_ids": [o.token_ids for o in outs],
              "logprobs": [{str(k): v for k, v in o.logprobs[0].items()} for o in outs]}
    with open(os.path.join(out_dir, f"rank{llm.rank}.json"), "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
