"""HF transformers' model step on the embedded default, the peer of scripts/bench_model.py (run in the bench venv).

Times, with torch fp32 on the CPU, the same shapes bench_model.py times for ms_atb: one decode step of `batch`
sequences each holding a KV cache of ctx - 1 tokens (the cache is cropped back after every step), and the prefill
of one prompt (logits of its last token only). Prints one JSON line.
    .venv-bench/bin/python scripts/bench_model_hf.py --gguf FILE [--batches 1 8 32] [--ctx 256] [--prompt 512]
"""
import argparse
import json
import os
import time
import warnings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    args = ap.parse_args()
    import torch
    import transformers
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", category=FutureWarning)  # past_key_values -> cache (transformers 5.x)
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(args.gguf), gguf_file=os.path.basename(args.gguf),
                                                 dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(0)
    out = {"versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                        "threads": torch.get_num_threads()}, "decode_ms": {}}
    with torch.inference_mode():
        for b in args.batches:
            ids = torch.randint(100, 49000, (b, args.ctx), generator=gen)
            past = model(ids[:, :-1], use_cache=True).past_key_values  # ctx - 1 tokens cached
            times = []
            for _ in range(args.repeats + 1):
                start = time.perf_counter()
                model(ids[:, -1:], past_key_values=past, use_cache=True)
                times.append(time.perf_counter() - start)
                past.crop(-1)  # back to ctx - 1 tokens
                assert past.get_seq_length() == args.ctx - 1
            out["decode_ms"][b] = 1e3 * sum(times[1:]) / args.repeats
        ids = torch.randint(100, 49000, (1, args.prompt), generator=gen)
        times = []
        for _ in range(max(1, args.repeats // 3) + 1):
            start = time.perf_counter()
            model(ids, use_cache=True, logits_to_keep=1)
            times.append(time.perf_counter() - start)
        out["prefill_ms"] = 1e3 * sum(times[1:]) / (len(times) - 1)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
