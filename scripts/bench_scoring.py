"""Scoring (prompt_logprobs) on the embedded default: cost against plain prefill, and the values
against HF transformers on the same weights.

Prompts: the paragraphs below, tokenized, each repeated to fill `--tokens` tokens. ms_atb runs them
with max_tokens=1 three ways after a warm-up that compiles the every-token graphs: plain (prefill
only), prompt_logprobs=0 and prompt_logprobs=5. Prints seconds, prompt tokens/s and each mode's
ratio to plain; then, when the bench venv (.venv-bench, torch + transformers) is there, the largest
difference between ms_atb's and HF's log-probability of each prompt token and both perplexities.

    .venv/bin/python scripts/bench_scoring.py [--tokens 300] [--no-hf]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from bench_throughput import gguf_path  # noqa: E402

TEXTS = [
    "The paged KV cache splits every request's keys and values into blocks of sixteen tokens.",
    "A block manager hands out blocks on demand and returns them when a request finishes.",
    "Requests that share a system prompt can share the blocks that hold its keys and values.",
    "Continuous batching admits new requests as soon as others finish, step by step.",
    "On a small machine, the cost of a model step is mostly the weights read from memory.",
    "Tensor parallelism splits each layer's weights across cards and sums the partial results.",
    "A scheduler that preempts by recompute frees a request's blocks and runs its prompt again.",
    "Offline batch jobs care about throughput more than about the latency of one request.",
]


def hf_worker(gguf: str, prompts_path: str) -> None:
    """In the bench venv: log-probability of each prompt token under HF transformers, one JSON line."""
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf),
                                                 dtype=torch.float32).eval()
    out = []
    with open(prompts_path) as f, torch.inference_mode():
        for ids in json.load(f):
            logits = model(torch.tensor([ids])).logits[0].double()       # [P, V]
            logp = torch.log_softmax(logits, -1)
            out.append([float(logp[k - 1, ids[k]]) for k in range(1, len(ids))])
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=300, help="tokens per prompt")
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--hf-worker", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.hf_worker:
        return hf_worker(*args.hf_worker)
    from ms_atb import LLM, SamplingParams
    llm = LLM(os.path.join(ROOT, "configs", "smollm2_135m.yaml"), precompile=True)   # graphs before the clock
    tok = llm.get_tokenizer()
    prompts = []
    for text in TEXTS:
        ids = tok.encode(text)
        body = tok.encode(" " + text, add_special_tokens=False)
        while len(ids) < args.tokens:
            ids += body
        prompts.append(ids[:args.tokens])
    n = sum(len(p) for p in prompts)
    modes = {"plain": SamplingParams(max_tokens=1, temperature=0.0),
             "prompt_logprobs=0": SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0),
             "prompt_logprobs=5": SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=5)}
    t0 = time.perf_counter()
    llm.generate(prompts, modes["prompt_logprobs=0"], use_tqdm=False)      # compiles the every-token graphs
    print(f"{len(prompts)} prompts x {args.tokens} tokens; every-token graphs compiled in "
          f"{time.perf_counter() - t0:.1f} s (with one scoring run)")
    seconds, outs = {}, {}
    for name, params in modes.items():
        llm.reset_scheduler()                                             # no prefix-cache hits between modes
        t0 = time.perf_counter()
        outs[name] = llm.generate(prompts, params, use_tqdm=False)
        seconds[name] = time.perf_counter() - t0
    print("| mode | seconds | prompt tokens/s | time vs plain |\n|---|---|---|---|")
    for name, s in seconds.items():
        print(f"| {name} | {s:.2f} | {n / s:.0f} | {s / seconds['plain']:.2f}x |")
    ours = [[d[t] for d, t in zip(o.prompt_logprobs[1:], p[1:])] for o, p in zip(outs["prompt_logprobs=0"], prompts)]
    ppl = float(np.exp(-np.mean(np.concatenate(ours))))
    python = os.path.join(ROOT, ".venv-bench", "bin", "python")
    if args.no_hf or not os.path.exists(python):
        print(f"ms_atb perplexity {ppl:.3f} (HF comparison skipped: {'--no-hf' if args.no_hf else 'no .venv-bench'})")
        return
    path = os.path.join(ROOT, "outputs", "scoring_prompts.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(prompts, f)
    run = subprocess.run([python, os.path.abspath(__file__), "--hf-worker", gguf_path(), path],
                         capture_output=True, text=True, check=True)
    theirs = json.loads(run.stdout.strip().splitlines()[-1])
    diff = max(abs(a - b) for x, y in zip(ours, theirs) for a, b in zip(x, y))
    hf_ppl = float(np.exp(-np.mean(np.concatenate(theirs))))
    print(f"prompt log-probabilities vs HF transformers: max |difference| {diff:.2e} over {n - len(prompts)} "
          f"tokens; perplexity ms_atb {ppl:.3f}, HF {hf_ppl:.3f}")


if __name__ == "__main__":
    main()
