"""scripts/research/placement_lookahead.py: its simulator is the churn benchmark, its copies are independent,
and its planner only ever places a prompt where the prompt fits."""
from scripts_import import load_script

lookahead = load_script("research/placement_lookahead")
bench = load_script("bench_block_manager")
MIX = bench.MIXES["churn 16-1024/16-1024"]


def _check_pool(bm):
    held = [b for req in bm._requests.values() for b in req.block_ids]
    free = [b for start, end in bm.placement.ranges.ranges() for b in range(start, end)]
    assert len(held) == len(set(held)) and not set(free) & set(held)
    assert len(free) + len(held) == bm.num_blocks
    assert all(bm._ref_counts[b] == 1 for b in held) and all(bm._ref_counts[b] == 0 for b in free)


def test_without_a_planner_it_replays_the_benchmark_exactly():
    for seed in (0, 3):
        sim = lookahead.ChurnSim(seed, num_blocks=512, mix=MIX)
        for _ in range(400):
            sim.step()
        adapter = bench.OursAdapter("contiguous", 512, 16, placement=lookahead.NearFitBaseline)
        ref = bench.run_workload(adapter, MIX, 400, seed=seed, num_blocks=512)
        s = sim.bm.stats()
        assert s["allocation_contiguity"] == ref["allocation_contiguity"]
        assert s["contiguity"] == ref["contiguity"]
        assert sim.bm._counters["multi_block_allocations"] > 20 and s["allocation_contiguity"] < 0.9  # not trivial


def test_a_copy_runs_on_without_touching_the_original():
    sim = lookahead.ChurnSim(1, num_blocks=512, mix=MIX)
    for _ in range(100):
        sim.step()
    before = (dict(sim.placement.ranges.ranges()), {r: list(q.block_ids) for r, q in sim.bm._requests.items()},
              {k: list(v) for k, v in sim.running.items()}, sim.rng.getstate(), dict(sim.bm._counters))
    trial = sim.copy()
    for _ in range(150):
        trial.step()
    assert trial.bm._counters != sim.bm._counters
    after = (dict(sim.placement.ranges.ranges()), {r: list(q.block_ids) for r, q in sim.bm._requests.items()},
             {k: list(v) for k, v in sim.running.items()}, sim.rng.getstate(), dict(sim.bm._counters))
    assert after == before
    _check_pool(trial.bm)
    for _ in range(50):      # and the original goes on as if no copy had been made
        sim.step()
    _check_pool(sim.bm)


def test_planner_places_prompts_where_they_fit_and_keeps_the_pool_sound():
    for future in ("exact", "sampled"):
        planner = lookahead.make_planner(future, horizon=10, samples=2)
        chosen = []

        def spy(sim):
            placement = planner(sim)
            if placement is not None:
                start, lo = placement
                need = -(-sim.waiting[0][1] // sim.block_size)
                end = sim.placement.ranges.end_of(start)
                assert end is not None and start <= lo and lo + need <= end
                chosen.append(placement)
            return placement
        sim = lookahead.ChurnSim(2, num_blocks=512, mix=MIX)
        for _ in range(120):
            sim.step(spy)
        assert chosen
        _check_pool(sim.bm)
