"""What the engine tests share: the tiny model's numpy reference, the shared tiny engine's build settings,
and scheduler settings for a block."""
import contextlib
import functools
import os

from ms_atb.config import config_keys
from ms_atb.formats.loader import load_config
from ms_atb.models.weights import iter_weights
from numpy_llama import forward

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_CONFIG = os.path.join(ROOT, "configs", "tiny_llama.yaml")
TINY_MODEL = "random:tiny-llama?seed=0"       # the model of configs/tiny_llama.yaml
# The settings under which the engine's greedy tokens equal a float32 reference's (HF transformers', the numpy
# model's): float32 activations into the quantized linears, a float32 KV cache (the defaults, auto, take int8
# activations and a float16 cache on the CPU).
EXACT = {"activation_dtype": "float32", "cache_dtype": "float32"}
# The shared tiny engine (conftest.tiny_engine): small step caps keep its compiled graphs few; exact.
TINY_BUILD = {"max_num_batched_tokens": 64, "max_num_seqs": 8, "num_blocks": 96, "precompile": False, **EXACT}
# The same caps as ms-atb-generate flags: a CLI run with them reuses the shared engine's graphs.
TINY_CLI_SET = [arg for key, value in TINY_BUILD.items() for arg in ("--set", f"{key}={value}")]
# What reset_scheduler() may change without recompiling.
RESETTABLE = ("num_blocks", "enable_prefix_caching", "allocation", "policy", "enable_chunked_prefill",
              "max_num_seqs", "max_num_batched_tokens")


@functools.lru_cache(maxsize=1)
def _tiny_model():
    config = load_config(TINY_MODEL)
    return dict(iter_weights(TINY_MODEL, config)), config


def tiny_logits(tokens):
    """The independent numpy model's logits [len(tokens), vocab] at every position."""
    weights, config = _tiny_model()
    return forward(weights, config, list(tokens))


def scheduler_state(llm, keys=RESETTABLE) -> dict:
    """The engine's current value of each reset_scheduler() setting in keys."""
    sections = config_keys()
    return {k: llm.num_blocks if k == "num_blocks" else getattr(getattr(llm.config, sections[k]), k) for k in keys}


@contextlib.contextmanager
def scheduler_settings(llm, **overrides):
    """llm.reset_scheduler(**overrides) inside the block, the settings from before after it (both empty the cache)."""
    before = scheduler_state(llm, overrides)
    llm.reset_scheduler(**overrides)
    try:
        yield llm
    finally:
        llm.reset_scheduler(**before)


def with_buckets(llm, buckets):
    """llm, its runner limited to the token buckets `buckets` (ascending, the last one the engine's
    max_num_batched_tokens) before any graph compiled: every step pads up to the first bucket that holds it, so
    an engine built for one check compiles len(buckets) graphs, not one per bucket it meets. Padding changes
    no real token's result: a padding token writes no cache slot and no sequence attends to it."""
    runner = llm.runner
    assert not runner.compiled and buckets == sorted(buckets) and buckets[-1] == runner.max_num_batched_tokens
    runner.buckets = list(buckets)
    return llm
