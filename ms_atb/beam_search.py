"""Beam search over the engine: each step is one generate() of every live beam for one token, with
the top 2 x beam_width log-probabilities, as vLLM's LLM.beam_search does. With prefix caching (on by
default) a beam's whole blocks are found in the cache, so a step computes only the rest of its last
block; beams that share a history share its blocks.

Per prompt, each step ranks the expansions of its live beams by cumulative log-probability. Those of
the first beam_width that end with a stop token become finished hypotheses; the best ones that do not
are the next live beams (up to beam_width). A prompt stops when max_tokens is reached or when it has
beam_width hypotheses and no live beam scores above the worst of them (HF's default early stopping).
Results are ranked by score = cumulative log-probability / (generated tokens ** length_penalty),
a stop token not counted.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ms_atb.progress import progress_bar
from ms_atb.sampling_params import MAX_LOGPROBS, SamplingParams, is_int, is_number


@dataclass
class BeamSearchParams:
    beam_width: int
    max_tokens: int = 16
    ignore_eos: bool = False
    length_penalty: float = 1.0

    def __post_init__(self):
        top = MAX_LOGPROBS // 2
        if not is_int(self.beam_width) or not 1 <= self.beam_width <= top:
            raise ValueError(f"beam_width must be an int in [1, {top}], got {self.beam_width!r}")
        if not is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {self.max_tokens!r}")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be a bool, got {self.ignore_eos!r}")
        if not is_number(self.length_penalty) or not math.isfinite(self.length_penalty):
            raise ValueError(f"length_penalty must be a finite number, got {self.length_penalty!r}")


@dataclass
class BeamSequence:
    token_ids: list[int]               # generated tokens, a final stop token included
    cumulative_logprob: float
    finish_reason: str                 # "stop" | "length"
    text: str = ""
    score: float = 0.0


@dataclass
class BeamSearchOutput:
    prompt: str | None
    prompt_token_ids: list[int]
    sequences: list[BeamSequence] = field(default_factory=list)   # best first, beam_width of them


def beam_search(llm, prompts, params: BeamSearchParams, use_tqdm: bool = True) -> list[BeamSearchOutput]:
    if not isinstance(params, BeamSearchParams):
        raise ValueError(f"beam_search takes BeamSearchParams, got {type(params).__name__}")
    requests = llm.make_requests(prompts, SamplingParams(max_tokens=params.max_tokens))   # validates all first
    stops = llm.stop_token_ids
    width = params.beam_width
    step_params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, logprobs=2 * width)
    live = [[BeamSequence([], 0.0, "length")] for _ in requests]
    done: list[list[BeamSequence]] = [[] for _ in requests]
    bar = progress_bar(params.max_tokens, use_tqdm and llm.rank == 0, "step", "beam search")
    for _ in range(params.max_tokens):
        beams = [(i, beam) for i, group in enumerate(live) for beam in group]
        if not beams:
            break
        outs = llm.generate([requests[i].prompt_token_ids + beam.token_ids for i, beam in beams],
                            step_params, use_tqdm=False)
        candidates: list[list[BeamSequence]] = [[] for _ in requests]
        for (i, beam), out in zip(beams, outs):
            for token, logprob in out.logprobs[0].items():
                candidates[i].append(BeamSequence(beam.token_ids + [token], beam.cumulative_logprob + logprob,
                                                  "length"))
        for i, group in enumerate(candidates):
            if not group:
                continue
            group.sort(key=lambda b: (-b.cumulative_logprob, b.token_ids))
            live[i] = []
            for rank, cand in enumerate(group):
                if cand.token_ids[-1] in stops and not params.ignore_eos:
                    if rank < width:
                        cand.finish_reason = "stop"
                        done[i].append(cand)
                elif len(live[i]) < width:
                    live[i].append(cand)
            if _finished(done[i], live[i], params):
                live[i] = []
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    outputs = []
    for request, hypotheses, rest in zip(requests, done, live):
        ranked = sorted(hypotheses + rest, key=lambda b: -_score(b, params.length_penalty))[:width]
        for beam in ranked:
            beam.score = _score(beam, params.length_penalty)
            beam.text = llm.tokenizer.decode(beam.token_ids) if llm.tokenizer is not None else ""
        outputs.append(BeamSearchOutput(request.prompt, list(request.prompt_token_ids), ranked))
    return outputs


def _score(beam: BeamSequence, length_penalty: float) -> float:
    length = len(beam.token_ids) - (beam.finish_reason == "stop")
    return beam.cumulative_logprob / max(length, 1) ** length_penalty


def _finished(hypotheses: list[BeamSequence], live: list[BeamSequence], params: BeamSearchParams) -> bool:
    """beam_width hypotheses, and no live beam scoring above the worst of the best beam_width."""
    if len(hypotheses) < params.beam_width or not live:
        return not live
    worst = sorted(_score(h, params.length_penalty) for h in hypotheses)[-params.beam_width]
    return max(_score(b, params.length_penalty) for b in live) <= worst
