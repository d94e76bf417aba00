"""Quality of each model.weight_dtype (and activation_dtype) against float32 weights, on SmolLM2-135M.

The embedded GGUF stores Q4_1 blocks: `float32` multiplies their float32 dequantisation (the reference),
`auto` the Q4_1 blocks as stored (lm_head: the tied embedding's Q8_0 blocks), `int8` per-output-channel int8
re-quantized on load from the dequantised values; `auto+a8` and `int8+a8` the same weights with
model.activation_dtype int8 (the quantized linears' inputs quantized per row and block of 32); each with a
float32 KV cache. `default` is the engine as shipped: every setting auto (Q4_1 as stored, int8 activations, a
float16 KV cache on the CPU). Measured as scripts/eval_kv_dtype.py does for the KV cache:
1. perplexity on scripts/data/kv_eval_text.txt, teacher-forced through prompt log-probabilities;
2. greedy agreement with float32 on the chat prompts of examples/demo_prompts.jsonl (--max-tokens each).

    .venv/bin/python scripts/eval_weight_dtype.py [--dtypes float32,auto,int8,auto+a8,int8+a8,default] [--chunk 128]
Each dtype's result is saved as it completes (out/eval_weight_dtype.<dtype>.json); --table-only tabulates them.
"""
import argparse
import gc
import json
import os

from eval_kv_dtype import ROOT, TEXT, eval_inputs, first_difference, host_line, measure

DTYPES = ("float32", "auto", "int8", "auto+a8", "int8+a8", "default")   # +a8: activation_dtype int8


def measure_weight_dtype(args, variant, ids, conversations) -> dict:
    if variant == "default":
        weight_dtype, engine = "auto", {}
    else:
        weight_dtype, _, a8 = variant.partition("+")
        engine = dict(weight_dtype=weight_dtype, activation_dtype="int8" if a8 else "float32", cache_dtype="float32")
    result = measure(args, ids, conversations, **engine)
    llm = result.pop("llm")
    result.update(weight_dtype=weight_dtype, formats=sorted(set(llm.weight_formats.values())) or ["float32"])
    del llm
    gc.collect()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "smollm2_135m.yaml"))
    ap.add_argument("--dtypes", default=",".join(DTYPES), help=f"among {DTYPES}; float32 is the reference")
    ap.add_argument("--chunk", type=int, default=128, help="max_num_batched_tokens: prefill tokens a step")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--max-model-len", type=int, default=3072)
    ap.add_argument("--memory-budget", default="256MiB")
    ap.add_argument("--out", default=os.path.join(ROOT, "out"), help="folder of the per-dtype results")
    ap.add_argument("--table-only", action="store_true", help="tabulate saved results")
    args = ap.parse_args()
    dtypes = args.dtypes.split(",")
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        ap.error(f"--dtypes: {bad[0]!r} is not one of {DTYPES}")
    os.makedirs(args.out, exist_ok=True)

    ids, conversations = eval_inputs(args.config)
    print(f"{host_line()}; activations float32 (+a8: int8)")
    print(f"text: {os.path.relpath(TEXT, ROOT)}, {len(ids)} tokens, prefill chunks of {args.chunk}; greedy: "
          f"{len(conversations)} chat prompts x {args.max_tokens} tokens (ignore_eos)\n", flush=True)
    for d in ([] if args.table_only else dtypes):
        r = measure_weight_dtype(args, d, ids, conversations)
        r["text_tokens"], r["config"] = len(ids), vars(args)
        with open(os.path.join(args.out, f"eval_weight_dtype.{d}.json"), "w") as f:
            json.dump(r, f)
        print(f"  {d} ({', '.join(r['formats'])}): perplexity {r['perplexity']:.4f} ({r['seconds']:.0f} s)",
              flush=True)
    results = {}
    for d in DTYPES:
        path = os.path.join(args.out, f"eval_weight_dtype.{d}.json")
        if os.path.exists(path):
            with open(path) as f:
                results[d] = json.load(f)
    if "float32" not in results or len(results) < 2:
        return
    ref = results["float32"]
    print("\n| weight_dtype (+a8: int8 activations) | linears held as | perplexity | vs float32 | identical greedy outputs | "
          "mean tokens before first difference |")
    print("|---|---|---|---|---|---|")
    for d, r in results.items():
        same = [first_difference(a, b) for a, b in zip(r["greedy"], ref["greedy"])]
        identical = sum(a == b for a, b in zip(r["greedy"], ref["greedy"]))
        print(f"| {d} | {', '.join(r['formats'])} | {r['perplexity']:.4f} | "
              f"{(r['perplexity'] / ref['perplexity'] - 1) * 100:+.3f}% | {identical} of {len(same)} | "
              f"{sum(same) / len(same):.1f} of {args.max_tokens} |")
    print(f"\nresults: {args.out}/eval_weight_dtype.<dtype>.json")


if __name__ == "__main__":
    main()
