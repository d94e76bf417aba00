"""The end-of-run summary: throughput, latency percentiles and the KV cache's figures.

Running aggregates: a job adds each output as it finishes and keeps counts, sums and two latency histograms of
fixed size, never the outputs, so a million-line job's summary costs what a ten-line one's does. A percentile is
read from the histogram: the geometric middle of its bucket, within 0.5% of the exact value for latencies from
1 microsecond to a day.
"""
from __future__ import annotations

import math

_LOW_S, _RATIO = 1e-6, 1.01          # bucket i holds [_LOW_S * _RATIO**i, _LOW_S * _RATIO**(i + 1))
_BUCKETS = int(math.log(86400 / _LOW_S) / math.log(_RATIO)) + 1


class LatencyHistogram:
    def __init__(self):
        self.counts = [0] * _BUCKETS
        self.n = 0

    def add(self, seconds: float) -> None:
        i = int(math.log(max(seconds, _LOW_S) / _LOW_S) / math.log(_RATIO))
        self.counts[min(i, _BUCKETS - 1)] += 1
        self.n += 1

    def percentile_ms(self, q: float) -> float:
        """The q-th percentile in milliseconds (nan when empty)."""
        if not self.n:
            return float("nan")
        rank = max(1, math.ceil(q / 100 * self.n))
        seen = 0
        for i, c in enumerate(self.counts):
            seen += c
            if seen >= rank:
                return _LOW_S * _RATIO ** (i + 0.5) * 1000
        raise AssertionError("unreachable")


class Summary:
    """Aggregates of the outputs added so far."""

    def __init__(self):
        self.requests = self.prompt_tokens = self.output_tokens = 0
        self.ttft, self.tpot = LatencyHistogram(), LatencyHistogram()

    def add(self, output) -> None:
        self.requests += 1
        self.prompt_tokens += len(output.prompt_token_ids)
        self.output_tokens += sum(len(c.token_ids) for c in output.outputs)
        if output.metrics.ttft is not None:
            self.ttft.add(output.metrics.ttft)
        if output.metrics.tpot is not None:
            self.tpot.add(output.metrics.tpot)

    def result(self, elapsed_s: float, stats: dict) -> dict:
        """The summary's figures; stats: LLM.stats() of the run."""
        tokens = self.output_tokens + self.prompt_tokens
        return {
            "requests": self.requests, "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens,
            "elapsed_s": elapsed_s, "output_tokens_per_s": self.output_tokens / elapsed_s if elapsed_s else 0.0,
            "total_tokens_per_s": tokens / elapsed_s if elapsed_s else 0.0,
            "ttft_p50_ms": self.ttft.percentile_ms(50), "ttft_p99_ms": self.ttft.percentile_ms(99),
            "tpot_p50_ms": self.tpot.percentile_ms(50), "tpot_p99_ms": self.tpot.percentile_ms(99),
            "kv_cache_usage_mean": stats.get("kv_cache_usage", 0.0),
            "kv_cache_usage_peak": stats.get("kv_cache_usage_peak", 0.0),
            "prefix_cache_hit_rate": stats.get("prefix_cache_hit_rate", 0.0),
            "num_preemptions": stats.get("num_preemptions", 0),
            "contiguity": stats.get("contiguity", 1.0),
            "allocation_contiguity": stats.get("allocation_contiguity", 1.0),
            "peak_running": stats.get("peak_running", 0),
            "disk_cache": ({"hit_tokens": stats["disk_cache_hit_tokens"],
                            "written_blocks": stats["disk_cache_written_blocks"]}
                           if "disk_cache_read_blocks" in stats else None),      # None: no KV disk tier
        }


def summarize(outputs, elapsed_s: float, stats: dict) -> dict:
    """The summary of a list of outputs."""
    summary = Summary()
    for o in outputs:
        summary.add(o)
    return summary.result(elapsed_s, stats)


def format_summary(s: dict) -> str:
    disk = s.get("disk_cache")
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
    ] + ([f"KV disk tier        {disk['hit_tokens']} prompt tokens read, {disk['written_blocks']} blocks written"]
         if disk else []))
