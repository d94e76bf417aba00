"""scripts/soak.py at a size for CI: 240 short requests through the tiny model on a small pool
with prefix caching, preemption and abandoned generate_iter() runs, checked against a roomy-pool run."""
import pytest

from scripts_import import load_script

soak = load_script("soak")

# The shared tiny engine (conftest.py: smaller step caps than the script's engine) on prompts of up to
# MAX_MODEL_LEN tokens: the roomy pool holds max_num_seqs requests of MAX_MODEL_LEN tokens.
MAX_MODEL_LEN = 64
ROOMY_BLOCKS = 32
SMALL_BLOCKS = 12


@pytest.fixture
def llm(tiny_llm):
    sc, kv = tiny_llm.config.scheduler, tiny_llm.config.kv_cache
    assert sc.max_num_seqs * MAX_MODEL_LEN <= ROOMY_BLOCKS * kv.block_size       # the reference never preempts
    return tiny_llm


@pytest.mark.slow               # 240 requests, twice
def test_soak_frees_everything_and_matches_the_roomy_pool(llm):
    work = soak.make_workload(240, seed=1, max_model_len=MAX_MODEL_LEN)
    assert len({tuple(p) for p, _ in work}) < len(work)               # exact duplicates are in the workload
    assert any("seed" in params for _, params in work)
    ref = soak.run_reference(llm, work, round_size=60, roomy_blocks=ROOMY_BLOCKS, log=None)
    assert all(r is not None for r in ref)
    f = soak.run_soak(llm, work, ref, round_size=60, small_blocks=SMALL_BLOCKS, seed=1, log=None)
    assert f["failures"] == []
    assert f["requests"] == len(work) and f["mismatches"] == 0
    assert f["abandoned_rounds"] >= 1 and f["cancelled"] >= 1           # closed early, then re-run
    assert f["preemptions"] >= 1 and f["prefix_hits"] >= 1 and f["evictions"] >= 1
    assert soak.held(llm) == []
    assert llm.scheduler.block_manager.num_blocks == SMALL_BLOCKS


def test_held_names_what_a_live_request_holds(llm):
    """The check the soak relies on does see a request that is still running."""
    from ms_atb import SamplingParams
    llm.reset_scheduler(num_blocks=SMALL_BLOCKS, enable_prefix_caching=True)
    requests = [llm.make_request(list(range(1, 40)), SamplingParams(max_tokens=1 if k == 0 else 8, temperature=0.0,
                                                                 ignore_eos=True),
                                 index=k, request_id=f"held-{k}") for k in range(3)]
    results = llm.generate_iter(requests, use_tqdm=False)
    next(results)                                   # one finished; the others are in the scheduler
    problems = soak.held(llm)
    assert any("blocks are not free" in p for p in problems)
    assert any("the scheduler holds" in p for p in problems)
    results.close()
    assert soak.held(llm) == []
