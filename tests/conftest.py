"""Shared engines: building one compiles its graphs (seconds to minutes), so tests share them."""
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def smollm2_llm():
    """The embedded default with small step caps (fewer graphs to compile)."""
    from ms_atb import LLM
    return LLM(os.path.join(ROOT, "configs", "smollm2_135m.yaml"), max_num_batched_tokens=128,
               max_num_seqs=8, max_model_len=512, num_blocks=160)
