"""LoRA speed on SmolLM2, in one run: --sequences greedy requests (random token-id prompts, ignore_eos) on the base
model alone (an engine without LoRA), then the same requests spread evenly over --adapters random adapters of rank
--rank on every projection (an engine with LoRA, every adapter resident); output tok/s of each, their ratio
(target: mixed >= 0.7x base) and the time to load one adapter (read, checked, written into its slot). Both engines
are built and their graphs compiled (and the adapters loaded) before any clock starts; the runs alternate over
--repeats and the best of each is reported. The same base requests on the LoRA engine are printed too (the cost of
the slots when no row uses them).

    .venv/bin/python scripts/bench_lora.py                                   # 32 sequences, 4 adapters of rank 16
    .venv/bin/python scripts/bench_lora.py --sequences 4 --output-len 4 --prompt-len 8 --repeats 1   # a smoke run
Wall-clock figures need a quiet machine.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time

import numpy as np

from script_args import require_at_least

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=os.path.join(ROOT, "configs", "smollm2_135m.yaml"))
    p.add_argument("--sequences", type=int, default=32)
    p.add_argument("--adapters", type=int, default=4)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--max-num-batched-tokens", type=int, default=512)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)
    require_at_least(p, args, 1, "sequences", "adapters", "rank", "prompt_len", "output_len",
                     "max_num_batched_tokens", "repeats")
    return args


def write_adapter(folder: str, config, rank: int, seed: int) -> str:
    """A random PEFT adapter of `rank` on every projection of a model of LlamaConfig `config`."""
    from safetensors.numpy import save_file
    h, d, f = config.hidden_size, config.head_dim, config.intermediate_size
    q, kv = config.num_attention_heads * d, config.num_key_value_heads * d
    shapes = {"q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q), "gate_proj": (f, h),
              "up_proj": (f, h), "down_proj": (h, f)}
    rng = np.random.default_rng(seed)
    tensors = {}
    for i in range(config.num_hidden_layers):
        for t, (o, n) in shapes.items():
            module = "mlp" if t in ("gate_proj", "up_proj", "down_proj") else "self_attn"
            name = f"base_model.model.model.layers.{i}.{module}.{t}"
            tensors[name + ".lora_A.weight"] = (rng.standard_normal((rank, n)) / math.sqrt(n)).astype(np.float32)
            tensors[name + ".lora_B.weight"] = (rng.standard_normal((o, rank)) * 0.01).astype(np.float32)
    os.makedirs(folder, exist_ok=True)
    save_file(tensors, os.path.join(folder, "adapter_model.safetensors"))
    with open(os.path.join(folder, "adapter_config.json"), "w") as fh:
        json.dump({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(TARGETS),
                   "use_rslora": False, "use_dora": False, "bias": "none"}, fh)
    return folder


def timed(llm, prompts, params, lora) -> tuple[float, int]:
    """(seconds, output tokens) of one generate call."""
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False, lora_request=lora)
    return time.perf_counter() - start, sum(len(o.token_ids) for o in outs)


def main(argv=None):
    args = parse_args(argv)
    from ms_atb import LLM, LoRARequest, SamplingParams
    settings = {"max_num_seqs": args.sequences, "max_num_batched_tokens": args.max_num_batched_tokens,
                "max_model_len": args.prompt_len + args.output_len, "enable_prefix_caching": False,
                "precompile": True}
    base = LLM(args.config, **settings)
    lora_llm = LLM(args.config, enable_lora=True, max_loras=args.adapters, max_lora_rank=args.rank, **settings)
    vocab = base.model_config.vocab_size
    lo, hi = (100, min(vocab, 49000)) if vocab > 1000 else (1, vocab)
    rng = np.random.default_rng(args.seed)
    prompts = [rng.integers(lo, hi, args.prompt_len).tolist() for _ in range(args.sequences)]
    params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)
    with tempfile.TemporaryDirectory() as work:
        adapters = [LoRARequest(f"a{i}", i + 1, write_adapter(os.path.join(work, f"a{i}"), base.model_config,
                                                               args.rank, args.seed + i))
                    for i in range(args.adapters)]
        mixed = [adapters[i % args.adapters] for i in range(args.sequences)]
        lora_llm.generate(prompts[:args.adapters], SamplingParams(max_tokens=1), use_tqdm=False,
                          lora_request=mixed[:args.adapters])        # every adapter loaded before any clock
        stats = lora_llm.stats()
        load_s = stats["lora_load_s"] / max(1, stats["lora_loads"])
        runs = {"base": [], "mixed": [], "base_on_lora_engine": []}
        for _ in range(args.repeats):
            runs["base"].append(timed(base, prompts, params, None))
            runs["mixed"].append(timed(lora_llm, prompts, params, mixed))
            runs["base_on_lora_engine"].append(timed(lora_llm, prompts, params, None))
    best = {k: max(n / s for s, n in v) for k, v in runs.items()}
    result = {"sequences": args.sequences, "adapters": args.adapters, "rank": args.rank,
              "prompt_len": args.prompt_len, "output_len": args.output_len,
              "base_tok_s": best["base"], "mixed_tok_s": best["mixed"],
              "base_on_lora_engine_tok_s": best["base_on_lora_engine"], "ratio": best["mixed"] / best["base"],
              "adapter_load_s": load_s}
    print(f"base only            {best['base']:8.1f} output tok/s")
    print(f"{args.adapters} adapters mixed     {best['mixed']:8.1f} output tok/s   ratio {result['ratio']:.2f}x "
          f"(target >= 0.70x)")
    print(f"base on LoRA engine  {best['base_on_lora_engine']:8.1f} output tok/s")
    print(f"one adapter's load   {load_s * 1000:8.1f} ms (rank {args.rank}, every projection)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
