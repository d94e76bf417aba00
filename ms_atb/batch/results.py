"""The result lines of ms-atb-generate's own format (the OpenAI format's are in ms_atb/batch/openai_batch.py).

A sampled request: {"id", "text", "token_ids", "finish_reason", ["logprobs", "cumulative_logprob"],
"num_prompt_tokens", "num_cached_tokens", "ttft_s", ["prompt_logprobs"], ["outputs": every sample, n > 1]}; the
top-level fields are those of the first sample. A beam search request: the best beam's fields, "num_prompt_tokens"
and "beams" (each with "cumulative_logprob" and "score"). A line that cannot run: {"id", "error"}.
"""
from __future__ import annotations


def sample_line(item_id, o) -> dict:
    """The line of a sampled request's RequestOutput."""
    record = {"id": item_id, **_sample_fields(o.outputs[0]),
              "num_prompt_tokens": len(o.prompt_token_ids), "num_cached_tokens": o.num_cached_tokens,
              "ttft_s": round(o.metrics.ttft, 6) if o.metrics.ttft is not None else None}
    del record["index"]
    if o.prompt_logprobs is not None:
        record["prompt_logprobs"] = o.prompt_logprobs
    if len(o.outputs) > 1:              # SamplingParams n > 1: every sample
        record["outputs"] = [_sample_fields(c) for c in o.outputs]
    return record


def beam_line(item_id, o) -> dict:
    """The line of a beam search request's BeamSearchOutput."""
    beams = [{"text": b.text, "token_ids": b.token_ids, "finish_reason": b.finish_reason,
              "cumulative_logprob": b.cumulative_logprob, "score": b.score} for b in o.sequences]
    return {"id": item_id, **beams[0], "num_prompt_tokens": len(o.prompt_token_ids), "beams": beams}


def error_line(item_id, message: str) -> dict:
    return {"id": item_id, "error": message}


def _sample_fields(c) -> dict:
    record = {"index": c.index, "text": c.text, "token_ids": c.token_ids, "finish_reason": c.finish_reason}
    if c.logprobs is not None:          # keys become strings in JSON
        record.update(logprobs=c.logprobs, cumulative_logprob=c.cumulative_logprob)
    return record
