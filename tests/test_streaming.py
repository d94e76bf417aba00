"""A run over a stream of requests holds a bounded number of them, and a batch job's memory does not grow with its
number of lines."""
import json
import os
import tracemalloc

import pytest

from ms_atb import SamplingParams
from ms_atb.batch.cli import main
from engine_helpers import TINY_CLI_SET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "tiny_llama.yaml")


def test_a_streamed_run_takes_at_most_window_requests_ahead_and_keeps_none(tiny_llm):
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    prompts = [[i % 50 + 1, 7, 9] for i in range(40)]
    pulled, ahead = [0], []

    def requests():
        for i, p in enumerate(prompts):
            pulled[0] += 1
            yield tiny_llm.make_request(p, params, i, request_id=f"s{i}")
    outputs = {}
    for request, out in tiny_llm.stream(requests(), use_tqdm=False, window=5):
        ahead.append(pulled[0] - len(outputs))
        outputs[request.index] = out
    assert sorted(outputs) == list(range(40)) and max(ahead) <= 5
    listed = tiny_llm.generate(prompts, params, use_tqdm=False)           # the same tokens as a list run
    assert [outputs[i].token_ids for i in range(40)] == [o.token_ids for o in listed]
    assert not tiny_llm.engine.samples and not tiny_llm.scheduler.has_unfinished()


def test_a_stream_of_exact_duplicates_gets_every_output(tiny_llm):
    """Under the prefix policy a duplicate waits for its original; one that arrives after the original finished
    is computed again."""
    params = SamplingParams(max_tokens=2, temperature=0.0)
    tiny_llm.reset_scheduler(policy="prefix")
    try:
        def requests():
            for i in range(12):
                yield tiny_llm.make_request([5, 6, 7], params, i, request_id=f"d{i}")
        got = [r.index for r, _ in tiny_llm.stream(requests(), use_tqdm=False, window=2)]
    finally:
        tiny_llm.reset_scheduler(policy="fcfs")
    assert sorted(got) == list(range(12))


def _job_peak(tmp_path, lines: int) -> int:
    inp, out = tmp_path / f"in{lines}.jsonl", tmp_path / f"out{lines}.jsonl"
    inp.write_text("".join(json.dumps({"id": f"line {i}", "prompt": [i % 300 + 1, 2, 3, 4]}) + "\n"
                           for i in range(lines)))
    main(["--config", TINY, "--input", str(inp), "--output", str(out), "--no-progress", "--max-tokens", "1",
          *TINY_CLI_SET])          # one warm-up line already ran: the engine is built
    tracemalloc.start()
    try:
        assert main(["--config", TINY, "--input", str(inp), "--output", str(out), "--no-progress", "--max-tokens",
                     "1", "--overwrite", *TINY_CLI_SET]) == 0
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.slow
def test_a_batch_jobs_memory_does_not_grow_with_its_lines(tmp_path, cli_on_tiny_engine):
    small, large = _job_peak(tmp_path, 1200), _job_peak(tmp_path, 3600)      # both past the window of requests
    # Holding every request and output cost about 9 KB a line (21 MB more for 2,400 more lines); the streamed
    # job holds a 24-byte id and a byte of state per line, and a bounded window of requests.
    assert large - small < 500_000, (small, large)
