"""The flat statistics LLM.stats() returns: the scheduler's counters, the KV pool's shape and the last run's
figures in one dict (docs/design.md section 3.5)."""
from __future__ import annotations


def flat_stats(scheduler: dict, run: dict, pool: dict, extra: dict) -> dict:
    """scheduler: Scheduler.stats(); run: the last run's figures (run_steps), "kv_"-prefixed ones the pool's usage;
    pool: num_blocks, block_size, cache_dtype, bytes_per_block; extra: further counters (LoRA loads, the disk
    tier's), added as they are. Run figures are the last run's; the cache and scheduling counters add up since
    the KV cache was last emptied."""
    queries = scheduler.get("prefix_cache_queries", 0)
    out = {
        "kv_cache_usage": run.get("kv_cache_usage_mean", scheduler.get("usage", 0.0)),
        "kv_cache_usage_peak": run.get("kv_cache_usage_peak", 0.0),
        "prefix_cache_hit_rate": scheduler.get("prefix_cache_hits", 0) / queries if queries else 0.0,
        "prefix_cache_hits": scheduler.get("prefix_cache_hits", 0),
        "prefix_cache_queries": queries,
        "num_preemptions": scheduler["num_preemptions"],
        "contiguity": scheduler.get("contiguity", 1.0),
        "allocation_contiguity": scheduler.get("allocation_contiguity", 1.0),
        "evictions": scheduler.get("evictions", 0),
        "peak_running": scheduler["peak_running"],
        **pool,
        "num_computed_tokens": scheduler["num_computed_prompt_tokens"],
        "disk_cache_hit_tokens": scheduler.get("disk_cache_hit_tokens", 0),
        "disk_cache_written_blocks": 0,
        **extra,
        "tokens_per_s": 0.0, "num_output_tokens": 0, "elapsed_s": 0.0, "num_deduplicated": 0,   # before any run
    }
    out.update({k: v for k, v in run.items() if not k.startswith("kv_")})
    return out
