"""Quality of each KV cache dtype against a float32 cache, on SmolLM2-135M (the model computes in float32).

1. Perplexity on a fixed English text (scripts/data/kv_eval_text.txt, original prose, ~2,500 tokens),
   teacher-forced through prompt log-probabilities. Prefill is chunked (--chunk tokens a step), so every
   later chunk's attention reads the earlier chunks' K/V from the cache in its stored dtype.
2. Greedy agreement on the chat prompts of examples/demo_prompts.jsonl, --max-tokens tokens each (ignore_eos):
   how many outputs are identical to float32's, and the mean number of tokens before the first difference.

    .venv/bin/python scripts/eval_kv_dtype.py [--dtypes float32,float16,bfloat16,int8] [--chunk 128]
                                              [--activation-dtype float32|int8|auto]
auto is the dtype kv_cache.cache_dtype auto stores on the CPU (float16). --activation-dtype is the quantized
linears' inputs in every run (float32 by default: the cache's effect alone; int8 or auto: beside the default
activations). Each dtype's result is saved as it completes (out/eval_kv_dtype.<dtype>[.a8].json); the table
compares those of --dtypes found there against float32's, so the dtypes may also be measured by separate
processes and tabulated with --table-only:
    for d in float32 float16 bfloat16 int8; do .venv/bin/python scripts/eval_kv_dtype.py --dtypes $d & done; wait
    .venv/bin/python scripts/eval_kv_dtype.py --table-only
"""
import argparse
import gc
import json
import math
import os
import platform
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
TEXT = os.path.join(ROOT, "scripts", "data", "kv_eval_text.txt")
PROMPTS = os.path.join(ROOT, "examples", "demo_prompts.jsonl")
DTYPES = ("float32", "auto", "float16", "bfloat16", "int8")    # kv_cache.cache_dtype values measured


def eval_inputs(config: str) -> tuple[list[int], list]:
    """The scored text's token ids (the config's tokenizer) and the demo chat conversations."""
    from ms_atb.text.tokenizer import load_tokenizer
    from ms_atb.config import EngineConfig
    tok = load_tokenizer(EngineConfig.load(config).model.path)
    with open(TEXT, encoding="utf-8") as f:
        ids = tok.encode(f.read(), add_special_tokens=False)
    with open(PROMPTS, encoding="utf-8") as f:
        conversations = [json.loads(line)["messages"] for line in f if line.strip()]
    return ids, conversations


def host_line() -> str:
    import mindspore
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    return f"{cpu}; Python {platform.python_version()}, MindSpore {mindspore.__version__}"


def first_difference(a, b) -> int:
    """Tokens before the first position where a and b differ (len of the shorter when one is a prefix)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def measure(args, ids, conversations, **engine) -> dict:
    """Perplexity of `ids` (teacher-forced through prompt_logprobs, prefill in chunks of args.chunk) and the greedy
    answers to `conversations`, on an engine built with `engine` (cache_dtype=..., weight_dtype=...); `llm` in
    the result is the engine, for the caller's own fields."""
    from ms_atb import LLM, SamplingParams
    t0 = time.perf_counter()
    llm = LLM(args.config, max_model_len=args.max_model_len, max_num_batched_tokens=args.chunk, max_num_seqs=8,
              memory_budget=args.memory_budget, **engine)
    built = time.perf_counter() - t0
    scored = llm.generate([ids], SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0),
                          use_tqdm=False)[0]
    logps = [entry[token] for entry, token in zip(scored.prompt_logprobs[1:], ids[1:])]
    nll = -sum(logps) / len(logps)
    outs = llm.chat(conversations, SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True),
                    use_tqdm=False)
    return {"llm": llm, "nll": nll, "perplexity": math.exp(nll), "scored_tokens": len(logps),
            "chunks": math.ceil(len(ids) / args.chunk), "greedy": [o.token_ids for o in outs],
            "texts": [o.text for o in outs], "seconds": time.perf_counter() - t0, "build_seconds": built}


def measure_cache_dtype(args, cache_dtype, ids, conversations) -> dict:
    result = measure(args, ids, conversations, cache_dtype=cache_dtype, activation_dtype=args.activation_dtype)
    stats = result.pop("llm").stats()
    result.update(cache_dtype=stats["cache_dtype"], bytes_per_block=stats["bytes_per_block"],
                  num_blocks=stats["num_blocks"])
    gc.collect()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "smollm2_135m.yaml"))
    ap.add_argument("--dtypes", default="float32,float16,bfloat16,int8", help="float32 is the reference")
    ap.add_argument("--activation-dtype", default="float32", choices=["auto", "float32", "int8"],
                    help="model.activation_dtype of every run (the cache's reference runs with the same)")
    ap.add_argument("--chunk", type=int, default=128, help="max_num_batched_tokens: prefill tokens a step")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--max-model-len", type=int, default=3072)
    ap.add_argument("--memory-budget", default="256MiB")
    ap.add_argument("--out", default=os.path.join(ROOT, "out"), help="folder of the per-dtype results")
    ap.add_argument("--table-only", action="store_true", help="tabulate saved results of all four dtypes")
    args = ap.parse_args()
    dtypes = args.dtypes.split(",")
    os.makedirs(args.out, exist_ok=True)

    ids, conversations = eval_inputs(args.config)
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        ap.error(f"--dtypes: {bad[0]!r} is not one of {DTYPES}")
    tag = "" if args.activation_dtype == "float32" else f".a{args.activation_dtype}"
    print(f"{host_line()}; model computes in float32, {args.activation_dtype} activations into its quantized linears")
    print(f"text: {os.path.relpath(TEXT, ROOT)}, {len(ids)} tokens, prefill chunks of {args.chunk} "
          f"({math.ceil(len(ids) / args.chunk)} steps); greedy: {len(conversations)} chat prompts x "
          f"{args.max_tokens} tokens (ignore_eos)\n", flush=True)
    for d in ([] if args.table_only else dtypes):
        r = measure_cache_dtype(args, d, ids, conversations)
        r["text_tokens"], r["config"] = len(ids), vars(args)
        with open(os.path.join(args.out, f"eval_kv_dtype.{d}{tag}.json"), "w") as f:
            json.dump(r, f)
        print(f"  {r['cache_dtype']}: perplexity {r['perplexity']:.4f} ({r['seconds']:.0f} s)", flush=True)
    saved = {d: os.path.join(args.out, f"eval_kv_dtype.{d}{tag}.json") for d in DTYPES}
    results = {}
    for d, path in saved.items():
        if os.path.exists(path):
            with open(path) as f:
                results[d] = json.load(f)
    if "float32" not in results or len(results) < 2:
        return
    dtypes = list(results)
    ref = results["float32"]
    print(f"\n| cache dtype | bytes / block | perplexity | vs {ref['cache_dtype']} | identical greedy outputs | "
          f"mean tokens before first difference |")
    print("|---|---|---|---|---|---|")
    for d in dtypes:
        r = results[d]
        same = [first_difference(a, b) for a, b in zip(r["greedy"], ref["greedy"])]
        r["identical"] = sum(a == b for a, b in zip(r["greedy"], ref["greedy"]))
        r["mean_first_difference"] = sum(same) / len(same)
        r["first_difference"] = same
        print(f"| {r['cache_dtype']} | {r['bytes_per_block']:,} | {r['perplexity']:.4f} | "
              f"{(r['perplexity'] / ref['perplexity'] - 1) * 100:+.3f}% | {r['identical']} of {len(same)} | "
              f"{r['mean_first_difference']:.1f} of {args.max_tokens} |")
    print(f"\nresults: {args.out}/eval_kv_dtype.<dtype>{tag}.json")


if __name__ == "__main__":
    main()
