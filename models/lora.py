"""LoRA adapters put into a model's slots: each projection's A and B, sliced for this tensor-parallel rank, written
into the stacked Parameters of its linear (models/parallel.py, `enable_lora`), and the slot's ranks.

Rules:
  1. A slot's weights are written between steps, never while a graph runs: the Parameters read the host arrays'
     memory, so what is written here is what the next step multiplies. The ranks are written last.
  2. Adapter weights split as their base weights do (ms_atb/formats/sharding.py): a column-parallel projection
     (q, k, v, gate, up) keeps its whole A [r, in] and this rank's rows of B [out, r]; a row-parallel one (o,
     down) this rank's columns of A and the whole B, so its partial delta is summed by the AllReduce that sums the
     partial outputs.
  3. B is stored transposed, [r, out], with the adapter's scaling folded in; A's rows past a slot's rank and B's
     rows past it are never read (the kernel stops at the rank), so a slot is not cleared before it is written.
"""
from __future__ import annotations

import numpy as np

import mindspore as ms

from ms_atb.formats.peft_adapter import TARGETS, LoraAdapter
from ms_atb.formats.sharding import shard_slice

_MODULE = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
           "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
_ROW_PARALLEL = ("o_proj", "down_proj")


def host_parameter(array: np.ndarray, name: str) -> ms.Parameter:
    """A Parameter whose data is `array`'s memory (rule 1): set_data with a from_numpy tensor shares it, where the
    Parameter's constructor would copy."""
    param = ms.Parameter(ms.Tensor(np.zeros((1,) * array.ndim, array.dtype)), name=name, requires_grad=False)
    param.set_data(ms.Tensor.from_numpy(array), slice_shape=True)
    return param


def write_slot(model, slot: int, adapter: LoraAdapter | None, tp_size: int = 1, tp_rank: int = 0) -> None:
    """Slot `slot` of `model` (a LlamaForCausalLM built with lora) holds `adapter` from now on; None: no adapter
    (every rank 0)."""
    ranks = model.lora_ranks_host            # [L, 7] int32
    assert ranks is not None and 0 <= slot < len(ranks), "the model takes LoRA adapters in this slot"
    ranks[slot] = 0                          # no step runs until the slot is whole again (rule 1)
    if adapter is None:
        return
    for i, layer in enumerate(model.layers):
        for linear in layer.lora_linears():
            _write_linear(model.config, linear, slot, i, adapter, tp_size, tp_rank)
    ranks[slot] = [adapter.rank if t in adapter.targets else 0 for t in TARGETS]


def _write_linear(config, linear, slot: int, layer: int, adapter: LoraAdapter, tp_size: int, tp_rank: int) -> None:
    """One linear's segments of slot `slot`: A rows g R .. g R + r, B^T columns of segment g (rules 2, 3)."""
    a, b = linear.lora_a_host[slot], linear.lora_b_host[slot]        # [S R, in], [R, out]
    max_rank, column = b.shape[0], 0
    for g, (index, width) in enumerate(linear.lora_segments):
        target = TARGETS[index]
        if (layer, target) in adapter.lora_a:
            lora_a, lora_b = adapter.lora_a[(layer, target)], adapter.lora_b[(layer, target)]  # [r, in], [out, r]
            name = f"model.layers.{layer}.{_MODULE[target]}.{target}.weight"
            if target in _ROW_PARALLEL:
                lora_a = lora_a[shard_slice(name, lora_a.shape, config, tp_size, tp_rank)]
            else:
                lora_b = lora_b[shard_slice(name, lora_b.shape, config, tp_size, tp_rank)]
            r = lora_a.shape[0]
            assert r <= max_rank and lora_a.shape[1] == a.shape[1] and lora_b.shape[0] == width, \
                "load_adapter checked the adapter against the model and max_lora_rank"
            a[g * max_rank:g * max_rank + r] = lora_a
            b[:r, column:column + width] = lora_b.T * np.float32(adapter.scaling)
        else:    # an adapter may leave a layer's projection alone: zeros there, its rank being the adapter's
            a[g * max_rank:(g + 1) * max_rank] = 0
            b[:, column:column + width] = 0
        column += width
