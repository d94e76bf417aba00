"""run_steps: one run of the engine. Its requests are admitted (Admission), the engine steps until every one is
done, and each output is yielded as it is made; the run's figures are written into `figures` when it ends, even
when it fails (docs/design.md, section 2)."""
from __future__ import annotations

import time
from typing import Callable, Iterator

from ms_atb.engine.admission import Admission
from ms_atb.engine.engine import Engine
from ms_atb.engine.output_processor import OutputProcessor
from ms_atb.engine.request import Request
from ms_atb.outputs import RequestOutput


def run_steps(engine: Engine, admit: Admission, processor: OutputProcessor, make_bar: Callable, figures: dict
              ) -> Iterator[tuple[Request, RequestOutput]]:
    """make_bar: () -> a progress bar (tqdm's interface) or None, made once the first requests are admitted;
    figures: replaced, when the run ends, by tokens_per_s, num_output_tokens, elapsed_s, num_deduplicated and the
    engine's usage figures."""
    start = time.perf_counter()
    engine.begin_run()
    bar = None
    try:
        admit.fill(start)
        bar = make_bar()
        while engine.has_unfinished():
            out = engine.step()
            now = time.perf_counter()
            finished = out.finished + engine.finish(processor.add_tokens(out.sampled), "stop", now)
            engine.release(finished)
            for request, output in processor.finish(finished):
                admit.in_flight -= 1
                if bar is not None:
                    tokens = engine.num_sampled_tokens + processor.num_copied_tokens
                    bar.update(1)
                    bar.set_postfix_str(f"{tokens / (time.perf_counter() - start):.1f} tok/s", refresh=False)
                yield request, output
            admit.fill(now)
    finally:
        if bar is not None:
            bar.close()
        elapsed = max(time.perf_counter() - start, 1e-9)
        tokens = engine.num_sampled_tokens + processor.num_copied_tokens
        figures.clear()
        figures.update(tokens_per_s=tokens / elapsed, num_output_tokens=tokens, elapsed_s=elapsed,
                       num_deduplicated=processor.num_deduplicated, **engine.usage_stats())
