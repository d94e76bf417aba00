"""What the engine tests share: the tiny model's numpy reference, and scheduler settings for a block."""
import contextlib
import functools

from ms_atb.config import config_keys
from ms_atb.models.loader import iter_weights, load_config
from numpy_llama import forward

TINY_MODEL = "random:tiny-llama?seed=0"       # the model of configs/tiny_llama.yaml


@functools.lru_cache(maxsize=1)
def _tiny_model():
    config = load_config(TINY_MODEL)
    return dict(iter_weights(TINY_MODEL, config)), config


def tiny_logits(tokens):
    """The independent numpy model's logits [len(tokens), vocab] at every position."""
    weights, config = _tiny_model()
    return forward(weights, config, list(tokens))


@contextlib.contextmanager
def scheduler_settings(llm, **overrides):
    """llm.reset_scheduler(**overrides) inside the block, the settings from before after it (both empty the cache)."""
    before = {k: llm.num_blocks if k == "num_blocks" else getattr(getattr(llm.config, config_keys()[k]), k)
              for k in overrides}
    llm.reset_scheduler(**overrides)
    try:
        yield llm
    finally:
        llm.reset_scheduler(**before)
