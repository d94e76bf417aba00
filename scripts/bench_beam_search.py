"""Beam search on the embedded default: what the prefix cache saves.

Eight chat prompts, greedy (max_tokens 32) as the yardstick, then LLM.beam_search (beam width 4,
max_tokens 32) with prefix caching on and off. Each beam-search step is one generate() of every live
beam for one token; with the cache a beam's whole blocks are found and only the rest of its last block
is computed. Prints seconds, the prompt tokens the model computed, and the ratios.

    .venv/bin/python scripts/bench_beam_search.py [--width 4] [--max-tokens 32]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUESTIONS = ["Translate to French: The weather is nice today.", "Summarize: The cat sat on the mat all afternoon.",
             "What is the capital of Japan?", "Write a haiku about the sea.", "Name three primary colors.",
             "Explain what a CPU does in one sentence.", "Give a synonym for happy.", "What is 12 times 12?"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()
    from ms_atb import LLM, BeamSearchParams, SamplingParams
    llm = LLM(os.path.join(ROOT, "configs", "smollm2_135m.yaml"), precompile=True)   # graphs before the clock
    tok = llm.get_tokenizer()
    ids = [tok.encode(llm.apply_chat_template([{"role": "user", "content": q}]), add_special_tokens=False)
           for q in QUESTIONS]
    llm.reset_scheduler(enable_prefix_caching=True)
    t0 = time.perf_counter()
    greedy = llm.generate(ids, SamplingParams(max_tokens=args.max_tokens, temperature=0.0), use_tqdm=False)
    rows = [("greedy", time.perf_counter() - t0, llm.scheduler.num_computed_prompt_tokens,
             sum(len(o.token_ids) for o in greedy))]
    params = BeamSearchParams(beam_width=args.width, max_tokens=args.max_tokens)
    for caching in (True, False):
        llm.reset_scheduler(enable_prefix_caching=caching)
        t0 = time.perf_counter()
        outs = llm.beam_search(ids, params, use_tqdm=False)
        rows.append((f"beam {args.width}, prefix cache {'on' if caching else 'off'}", time.perf_counter() - t0,
                     llm.scheduler.num_computed_prompt_tokens, sum(len(o.sequences[0].token_ids) for o in outs)))
    print(f"{len(ids)} chat prompts ({sum(map(len, ids))} tokens), max_tokens {args.max_tokens}; "
          f"prompt tokens computed counts every token fed to the model")
    print(f"{'run':<28} {'seconds':>8} {'tokens computed':>16} {'best-beam tokens':>17}")
    for name, seconds, computed, produced in rows:
        print(f"{name:<28} {seconds:8.2f} {computed:16,d} {produced:17,d}")
    on, off = rows[1], rows[2]
    print(f"prefix cache on vs off: {off[1] / on[1]:.1f}x faster, {off[2] / on[2]:.1f}x fewer tokens computed; "
          f"beam (cache on) / greedy: {on[1] / rows[0][1]:.1f}x the time")


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    main()
