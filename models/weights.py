"""A model path's weights for the cells: every format's tensors, checked against the config, sliced for the
tensor-parallel rank and cast; and LlamaForCausalLM built from a path.

ms_atb/formats reads every format without MindSpore but one: a MindSpore .ckpt is MindSpore's own
serialisation, read here (ms.load_checkpoint) and mapped from MindFormers' names by
ms_atb/formats/mindformers_ckpt.py. The formats a path may name are ms_atb/formats/loader.py's.
"""
from typing import Iterator

import mindspore as ms
import numpy as np

from ms_atb.formats import loader, mindformers_ckpt
from ms_atb.formats.gguf_reader import GGUFBlocks
from ms_atb.formats.llama_config import LlamaConfig
from ms_atb.formats.sharding import shard_slice
from ms_atb.models.llama import LlamaForCausalLM


def iter_weights(path, config: LlamaConfig, tp_size: int = 1, tp_rank: int = 0,
                 dtype=np.float32, formats: dict | None = None) -> Iterator[tuple[str, np.ndarray]]:
    """(hf_name, array) for every weight the model needs, HF layout, sliced for tp_rank, one at a time.
    formats: ms_atb/formats/weight_formats.py's map; the GGUF weights it keeps in a GGUF block format come as
    GGUFBlocks (a tied lm_head's too: the embedding then comes as blocks)."""
    kind, path = loader.model_kind(path)
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        raise ValueError(f"weight dtype {dtype!r} not supported; allowed: float32, float16") from None
    if dtype not in (np.float32, np.float16):
        raise ValueError(f"weight dtype {dtype} not supported; allowed: float32, float16")
    slices = {n: shard_slice(n, s, config, tp_size, tp_rank) for n, s in loader.expected_shapes(config).items()}
    if kind == "ckpt":
        source = mindformers_ckpt.iter_ckpt(path, _read_ckpt(path), _float32, config, loader.check_shapes, slices)
    else:
        source = loader.iter_tensors(kind, path, config, slices, formats)
    for name, w in source:
        yield name, w if isinstance(w, GGUFBlocks) or w.dtype == dtype else w.astype(dtype)


def _read_ckpt(path: str) -> dict:
    """{stored name: Parameter} of a .ckpt, optimizer state and training counters left out."""
    try:
        return ms.load_checkpoint(path, choice_func=lambda n: not mindformers_ckpt.is_training_state(n))
    except Exception as e:  # a corrupt or foreign file
        raise ValueError(f"{path}: not a readable MindSpore checkpoint ({e})") from e


def _float32(p) -> np.ndarray:
    """A checkpoint Parameter's values; numpy has no bfloat16, so those are widened first."""
    return (p.astype(ms.float32) if p.dtype == ms.bfloat16 else p).asnumpy()


def load_model(path, num_blocks: int, block_size: int, dtype=np.float32, device: str = "cpu",
               tp_size: int = 1, tp_rank: int = 0) -> LlamaForCausalLM:
    """LlamaForCausalLM with its weights loaded from `path`."""
    config = loader.load_config(path)
    ms_dtype = ms.float16 if np.dtype(dtype) == np.float16 else ms.float32
    model = LlamaForCausalLM(config, num_blocks, block_size, ms_dtype, device, tp_size, tp_rank)
    model.load_weights(iter_weights(path, config, tp_size, tp_rank, dtype))
    return model
