"""Admission: how a run's requests enter the engine (LLM.stream): a list all at once, any other iterable up to a
window of requests ahead of their outputs, so that a long batch job holds a bounded number in memory."""
from __future__ import annotations

from typing import Iterable

from ms_atb.engine.engine import Engine
from ms_atb.engine.output_processor import OutputProcessor
from ms_atb.engine.request import Request


class Admission:
    """Takes a run's requests into the engine: a list all at once (every id checked before any is queued), any
    other iterable up to `window` requests ahead of their outputs."""

    def __init__(self, engine: Engine, requests: Iterable[Request], processor: OutputProcessor, window: int | None,
                 stops: set[int], seed: list):
        """stops: the model's stop token ids; seed: the run's seed words, each request's index appended."""
        self.engine, self.processor = engine, processor
        self.listed = isinstance(requests, (list, tuple))
        self.source = iter(requests)
        self.window = None if self.listed else window
        self.in_flight = 0                  # requests taken whose output has not been yielded
        self.stops, self.seed = stops, seed

    def fill(self, now: float) -> None:
        if self.listed:
            batch, self.listed = list(self.source), False
            computed = [r for r in batch if self.processor.add(r)]     # a reused id fails before anything is queued
            self.in_flight += len(batch)
            for r in computed:
                self._queue(r, now)
            return
        while self.window is None or self.in_flight < self.window:
            r = next(self.source, None)
            if r is None:
                return
            if not isinstance(r, Request):
                raise ValueError(f"stream() runs requests made by LLM.make_request(), got {type(r).__name__}")
            self.in_flight += 1
            if self.processor.add(r):
                self._queue(r, now)

    def _queue(self, r: Request, now: float) -> None:
        try:
            self.engine.add(r, self.stops, self.seed + [r.index], now)
        except ValueError as e:      # the scheduler changed since the request was made
            raise ValueError(f"request {r.index}: {e}") from None
