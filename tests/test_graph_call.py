"""GraphCall: ModelRunner runs each token bucket's compiled graph without the per-call compile check, with the
ordinary Cell call's logits bit for bit, buckets alternating on one model."""
import mindspore as ms
import numpy as np
import pytest

from ms_atb.worker.graph_call import GraphCall
from test_model_runner import make_step


@pytest.fixture(scope="module")
def runner(tiny_engine):
    """The shared tiny engine's runner; its KV cache is dropped afterwards (the steps here write blocks the
    engine's scheduler does not know)."""
    yield tiny_engine.runner
    tiny_engine.reset_scheduler()


def test_buckets_alternate_and_match_the_ordinary_call_bit_for_bit(runner, monkeypatch):
    rng = np.random.default_rng(1)
    a, b = [int(t) for t in rng.integers(0, 512, 6)], [int(t) for t in rng.integers(0, 512, 3)]
    steps = {1: make_step([("a", [20], 6, a[-1:])]),                                 # decode: bucket 1
             8: make_step([("a", [20], 6, a[-4:]), ("b", [21], 3, b)]),              # 7 tokens: bucket 8
             2: make_step([("a", [20], 6, a[-1:]), ("b", [21], 3, b[-1:])])}         # decode of 2: bucket 2
    runner.execute(make_step([("a", [20], 6, a)]))       # a's cache filled (bucket 8)
    for step in steps.values():                           # each bucket's graph compiled by its first step
        runner.execute(step)
    model = runner.model
    own_phase = model.phase
    checked = []                                          # the ordinary path's compile checks, by bucket
    ordinary = type(model).compile_and_run

    def spy(cell, *args, **kwargs):
        checked.append(args[0].shape[0])
        return ordinary(cell, *args, **kwargs)
    monkeypatch.setattr(type(model), "compile_and_run", spy)
    for bucket in (1, 8, 2, 1, 8, 1, 2):                  # each bucket's graph in turn, repeatedly
        step = steps[bucket]
        fast = runner.execute(step)
        assert checked == []
        arrays, num_seqs = runner.prepare(step)
        assert len(arrays[0]) == bucket and bucket in runner.graph_call
        plain = model(*[ms.Tensor(x) for x in arrays]).asnumpy()[:num_seqs]   # Cell.__call__, compile check
        assert fast.shape == (num_seqs, runner.model_config.vocab_size)
        assert np.array_equal(fast, plain), f"bucket {bucket}: max diff {np.abs(fast - plain).max()}"
        assert model.phase == own_phase and checked == [bucket]   # the fast phase lasts one call
        checked.clear()
    one, eight, two = (runner.execute(steps[k]) for k in (1, 8, 2))
    # the same token at the same context through the three graphs: a's last at 6, b's last at 3
    assert np.allclose(one[0], eight[0], atol=1e-5) and np.allclose(one[0], two[0], atol=1e-5)
    assert np.allclose(eight[1], two[1], atol=1e-5) and not np.allclose(one[0], two[1], atol=1e-2)


def test_a_key_without_a_compiled_graph_is_a_value_error(runner):
    call = GraphCall(runner.model)
    with pytest.raises(ValueError, match="no graph compiled for 3"):
        call(3, ms.Tensor(np.zeros(3, np.int32)))


def test_a_replaced_model_runs_no_graph_of_the_old_one(runner, monkeypatch):
    step = make_step([("a", [20], 6, [7])])
    runner.execute(step)                                  # bucket 1 ready
    old = runner.graph_call
    assert old.cell is runner.model and 1 in old
    monkeypatch.setattr(runner, "graph_call", old)        # both restored after the test
    monkeypatch.setattr(runner, "model", ms.nn.Cell())
    with pytest.raises(ValueError, match="no graph compiled for 1"):
        runner.execute(step)
    assert runner.graph_call is not old and runner.graph_call.cell is runner.model


def test_profile_step_host_split_times_both_calls(runner, capsys):
    from scripts_import import load_script
    profile_step = load_script("profile_step")
    step = make_step([("a", [20], 6, [7])])
    runner.execute(step)                                  # bucket 1 ready
    profile_step.host_split(runner, step, 3)
    line = capsys.readouterr().out
    assert line.startswith("host split over 3 steps: prepare min") and line.count(" ms") == 10
    assert "graph call min" in line and "ordinary Cell call min" in line and "CPU time (all threads)" in line
