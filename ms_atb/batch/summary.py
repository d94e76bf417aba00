"""The end-of-run summary: throughput, latency percentiles and the KV cache's figures."""
from __future__ import annotations

import numpy as np


def summarize(outputs, elapsed_s: float, stats: dict) -> dict:
    ttfts = [o.metrics.ttft for o in outputs if o.metrics.ttft is not None]
    tpots = [o.metrics.tpot for o in outputs if o.metrics.tpot is not None]
    num_out = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    num_prompt = sum(len(o.prompt_token_ids) for o in outputs)

    def pct(xs, q):
        return float(np.percentile(xs, q)) * 1000 if xs else float("nan")

    return {
        "requests": len(outputs), "prompt_tokens": num_prompt, "output_tokens": num_out,
        "elapsed_s": elapsed_s, "output_tokens_per_s": num_out / elapsed_s if elapsed_s else 0.0,
        "total_tokens_per_s": (num_out + num_prompt) / elapsed_s if elapsed_s else 0.0,
        "ttft_p50_ms": pct(ttfts, 50), "ttft_p99_ms": pct(ttfts, 99),
        "tpot_p50_ms": pct(tpots, 50), "tpot_p99_ms": pct(tpots, 99),
        "kv_cache_usage_mean": stats.get("kv_cache_usage", 0.0),
        "kv_cache_usage_peak": stats.get("kv_cache_usage_peak", 0.0),
        "prefix_cache_hit_rate": stats.get("prefix_cache_hit_rate", 0.0),
        "num_preemptions": stats.get("num_preemptions", 0),
        "contiguity": stats.get("contiguity", 1.0),
        "allocation_contiguity": stats.get("allocation_contiguity", 1.0),
        "peak_running": stats.get("peak_running", 0),
    }


def format_summary(s: dict) -> str:
    return "\n".join([
        "== ms_atb summary ==",
        f"requests            {s['requests']}  (prompt tokens {s['prompt_tokens']}, "
        f"output tokens {s['output_tokens']})",
        f"wall time           {s['elapsed_s']:.2f} s",
        f"throughput          {s['output_tokens_per_s']:.1f} output tok/s, "
        f"{s['total_tokens_per_s']:.1f} total tok/s",
        f"TTFT p50 / p99      {s['ttft_p50_ms']:.0f} / {s['ttft_p99_ms']:.0f} ms",
        f"TPOT p50 / p99      {s['tpot_p50_ms']:.1f} / {s['tpot_p99_ms']:.1f} ms",
        f"KV cache usage      mean {s['kv_cache_usage_mean']:.1%}, peak {s['kv_cache_usage_peak']:.1%}",
        f"prefix hit rate     {s['prefix_cache_hit_rate']:.1%}",
        f"preemptions         {s['num_preemptions']}",
        f"contiguity          {s['contiguity']:.1%} of appended blocks, "
        f"{s['allocation_contiguity']:.1%} of multi-block allocations",
        f"peak running        {s['peak_running']}",
    ])
