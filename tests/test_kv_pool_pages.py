"""The KV pool costs no memory until it is written: building a model maps none of its pages, a step maps
the pages of the blocks it writes (and MindSpore's own working memory), and the unwritten blocks read zero."""
import os

import mindspore as ms
import numpy as np
import pytest

import numpy_llama as nl
from ms_atb.models.llama import LlamaConfig, LlamaForCausalLM

BS, MAXB, T_PAD, B_PAD = 16, 4, 16, 1
CONFIG = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rope_theta=10000.0)
POOL_MIB = 512


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the resident set size from /proc")
def test_pool_pages_are_mapped_only_when_written():
    ms.set_context(mode=ms.GRAPH_MODE)
    config = LlamaConfig(**CONFIG)
    per_block = 2 * config.num_hidden_layers * BS * config.num_key_value_heads * config.head_dim * 4   # K and V
    num_blocks = POOL_MIB * 2**20 // per_block
    before = rss_mib()
    model = LlamaForCausalLM(config, num_blocks, BS)
    weights = nl.random_weights(config, 0)
    model.load_weights(weights.items())
    assert rss_mib() - before < POOL_MIB / 8, "building the model touched the KV pool"

    tokens = [5, 17, 200, 3, 9, 41, 77]
    block = num_blocks - 1                       # the pool's last block: every earlier one stays unwritten
    ids = np.zeros(T_PAD, np.int32)
    ids[:len(tokens)] = tokens
    positions = np.arange(T_PAD, dtype=np.int32)
    slots = np.full(T_PAD, -1, np.int32)
    slots[:len(tokens)] = block * BS + np.arange(len(tokens))
    tables = np.full((B_PAD, MAXB), block, np.int32)
    lens, qsl = np.array([len(tokens)], np.int32), np.array([0, len(tokens)], np.int32)
    logits = model(*(ms.Tensor(a) for a in (ids, positions, slots, tables, lens, qsl))).asnumpy()[0]
    assert rss_mib() - before < POOL_MIB / 4, "a step of one block touched the whole KV pool"

    np.testing.assert_allclose(logits, nl.forward(weights, config, tokens)[-1], atol=1e-4)
    keys = model.key_caches[0].asnumpy()         # [NB, BS, KVH, D]
    assert keys[block, :len(tokens)].any(axis=(1, 2)).all()                      # each written row holds data
    assert not keys[:block].any() and not keys[block, len(tokens):].any()          # the rest reads zero
