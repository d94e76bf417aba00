"""The config's sections: one dataclass per YAML section, each leaf with its default and its meaning.

docs/config.md is generated from these (scripts/gen_config_doc.py); ms_atb/config.py loads and validates them.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Union

from ms_atb.sampling_params import CONFIG, sampling_fields

DEVICES = ("cpu", "npu", "npu:N")          # npu: the device msrun or DEVICE_ID assigns; npu:N: device id N
DTYPES = ("float32", "float16", "bfloat16")
# auto: float16 on the CPU (its quality measured against float32: docs/design.md, "Defaults"), the model's dtype
# on an NPU; float32 keeps float32 rows (with float32 activations, greedy tokens equal HF transformers').
CACHE_DTYPES = ("auto", "float32", "float16", "bfloat16", "int8")
# auto: a GGUF's Q8_0/Q4_0/Q4_1 linears as stored, other quantized types as Q8_0, float weights in float32;
# int8: every linear per-output-channel int8, quantized on load. Quantized weights run on the CPU only.
WEIGHT_DTYPES = ("auto", "float32", "int8")
# int8: the quantized linears' inputs, per row and block of 32 (CPU, float32 model); float32: as given, results
# equal to the float32 weights' bit for bit; auto: int8 where it can run (resolve_activation_dtype), else float32.
ACTIVATION_DTYPES = ("auto", "float32", "int8")
DEFAULT_MAX_MODEL_LEN = 2048                # when model.max_model_len is unset, and the model allows it


def _leaf(default, doc: str):
    """A config leaf: its default and its meaning. docs/config.md is generated from these
    (scripts/gen_config_doc.py); a section's docstring opens its part there."""
    return field(default=default, metadata={"doc": doc})


@dataclass
class ModelSection:
    """Which weights and tokenizer, and the dtypes the model computes in and holds its linears in."""
    path: str = _leaf(
        "", "An HF directory, a `.gguf` file, a MindSpore `.ckpt` (MindFormers names), "
            "`pkg:<package>/<file>` (a file inside an installed package, found without importing it) or "
            "`random:<preset>[?seed=N]` (seeded random weights built in memory). A relative path is relative to "
            "the YAML file.")
    dtype: str = _leaf(
        "float32", "The dtype the model computes in. CPU: `float32`; `float16` runs, slower to compile and to "
                   "prefill (its norms and rotary embedding are MindSpore half-precision ops, its linears our "
                   "float32 kernels on float32 casts of the activations); `bfloat16` does not run. Ascend: "
                   "`float16` or `bfloat16`.")
    max_model_len: Union[int, None] = _leaf(
        None, "Prompt + generated tokens per request, at most. Unset: the model's `max_position_embeddings`, at "
              "most 2048, and at most a Mistral model's `sliding_window` (a larger value is refused there).")
    tokenizer: Union[str, None] = _leaf(
        None, "Where to read the tokenizer from; unset: the model path. Ids a model pads its vocabulary with "
              "decode to no text; the model's `eos_token_id` (config.json) stops requests when the tokenizer "
              "names no EOS.")
    weight_dtype: str = _leaf(
        "auto", "How the linears hold their weights. `auto`: a GGUF's `Q8_0` / `Q4_0` / "
                "`Q4_1` blocks as stored, multiplied by our `QuantMatMul` kernel; other quantized GGUF types "
                "(K-quants, mixed types in one fused projection) converted to `Q8_0` on load (logged); float "
                "tensors in float32; on Ascend `auto` means `dtype`. `float32`: everything dequantised, whatever "
                "`dtype`. `int8` (CPU only): every linear quantized on load, per output channel, symmetric. A GGUF's "
                "quantized embedding stays in its blocks (rows dequantised as they are gathered). On SmolLM2 "
                "`auto` with `activation_dtype: float32` gives the float32 dequantisation's products bit for bit.")
    activation_dtype: str = _leaf(
        "auto", "The dtype of the quantized linears' inputs. `auto`: `int8` where it can run (CPU, `dtype: "
                "float32`, linears kept quantized), else `float32`. `float32`: as the model computes them, the "
                "exact choice (greedy tokens equal HF transformers' with `cache_dtype: float32` too). `int8`: each "
                "quantized linear's input is quantized per row and block of 32 (symmetric, max |x| / 127) and meets "
                "the stored weight blocks in integer dot products (refused where it cannot run); linears held as "
                "floats keep float32 activations (logged). SmolLM2: perplexity +0.45%, faster decode and prefill "
                "(BENCHMARKS.md).")


@dataclass
class KVCacheSection:
    """The paged KV pool: its blocks, its size, prefix caching, placement, kernels and storage dtype."""
    block_size: int = _leaf(16, "Tokens per KV block.")
    num_blocks: Union[int, str] = _leaf(
        "auto", "Blocks in the pool: an integer, or `auto` = `memory_budget` / bytes per block (values and int8 "
                "scales; both printed). On the CPU a pool larger than the memory available is refused before the "
                "build.")
    memory_budget: Union[int, str] = _leaf(
        "1GiB", "The KV budget of `num_blocks: auto`: a byte count or a size like `1GiB` or `512MiB`. A "
                "configured size, never the free memory, so two engines in one process size alike; per card "
                "under tensor parallelism.")
    enable_prefix_caching: bool = _leaf(
        True, "Share the KV of common prompt prefixes: whole blocks, shared only when their tokens and every "
              "block before them compare equal.")
    allocation: str = _leaf(
        "contiguous", "`contiguous` (contiguous-first placement), `scattered` (a plain free list) or `static` "
                      "(`max_model_len` tokens of blocks reserved per admitted request: the static pre-allocation "
                      "baseline).")
    attention_backend: str = _leaf(
        "auto", "The kernels of `reshape_and_cache` and `paged_attention`. CPU: `cpu` "
                "(our C++ kernels) or `ascendc` (our AscendC kernels run through our CPU implementation of the "
                "Ascend C API subset; float16 models, float16 or int8 caches, int8 with head_dim a multiple of "
                "32). NPU: `ms_atb` (our AscendC custom ops, built by scripts/build_ascend_ops.sh) or "
                "`mindspore` (MindSpore's built-in ops). `auto`: `cpu` on the CPU, `ms_atb` on npu.")
    cache_dtype: str = _leaf(
        "auto", "The KV cache's storage: `auto` (`float16` on the CPU, its quality measured against `float32` in "
                "BENCHMARKS.md; the model's dtype on an NPU), `float32` (with `activation_dtype: float32`, greedy "
                "tokens equal HF transformers'), `float16`, `bfloat16` or `int8` (symmetric, a float32 scale per "
                "token and KV head, computed as the token is written). The model still computes in its own dtype: "
                "the kernels convert as they read and write. Other than `auto`: CPU only.")
    disk_cache_dir: str = _leaf(
        "", "A directory keeping computed prefix blocks on disk between processes (empty: off): a later job, a "
            "job resumed after a kill and the replicas of a data-parallel job read a prompt's blocks from it "
            "instead of computing them. Shared safely by concurrent jobs; used only by engines whose KV bytes "
            "would be the same (model, dtypes, block size, tensor-parallel layout). Must be your own and closed to "
            "group and others' writes. Needs `enable_prefix_caching`; CPU only (docs/usage.md, \"KV disk tier\").")
    disk_cache_bytes: Union[int, str] = _leaf(
        "10GiB", "The disk tier's budget: a byte count or a size like `10GiB`. The least recently used blocks go "
                 "first, across every process using the directory.")


@dataclass
class SchedulerSection:
    """Continuous batching: how much runs in a step, and in which order waiting requests are admitted."""
    max_num_seqs: int = _leaf(32, "Requests running at once, at most.")
    max_num_batched_tokens: int = _leaf(
        512, "Tokens per model step, at most; the largest token bucket a graph is compiled for.")
    enable_chunked_prefill: bool = _leaf(True, "Split long prompts over several steps.")
    policy: str = _leaf(
        "auto", "Admission order: `fcfs` (arrival order), `prefix` (waiting requests that share a prefix admitted "
                "together, within a waiting bound; exact greedy duplicates computed once), or `auto`: `prefix` "
                "in ms-atb-generate, `fcfs` in `LLM` (LLM.prepare's default_policy).")


@dataclass
class ParallelSection:
    """Tensor and data parallelism under msrun (docs/usage.md)."""
    tensor_parallel_size: int = _leaf(
        1, "Ranks each layer is split over, one process per card under msrun.")
    data_parallel_size: int = _leaf(
        1, "Independent engine replicas, each of `tensor_parallel_size` ranks (msrun's world size is the "
           "product); ms-atb-generate splits its input among them.")


@dataclass
class LoraSection:
    """LoRA adapters from PEFT directories, chosen per request; many run in one batch (docs/usage.md, "LoRA")."""
    enable_lora: bool = _leaf(
        False, "Take LoRA adapters (`LoRARequest`, ms-atb-generate's `--lora`). CPU only. Off: a request naming an "
               "adapter is refused.")
    max_loras: int = _leaf(
        4, "Adapters resident at once (the model's slots; the memory check counts them). A request whose adapter is "
           "not resident waits for a slot no running request uses, and the least recently used adapter there is "
           "replaced.")
    max_lora_rank: int = _leaf(
        16, "The largest adapter rank taken; an adapter of a higher rank is refused. Each slot holds this rank's "
            "room on every projection.")


@dataclass
class ContextSection:
    """The device, the engine's seed and the caches of compiled graphs."""
    device: str = _leaf(
        "cpu", "`cpu`, `npu` (Ascend: the device msrun or `DEVICE_ID` assigns) or `npu:N` (device id N).")
    mode: str = _leaf("graph", "MindSpore's execution mode: `graph` only.")
    seed: int = _leaf(0, "The engine's seed, >= 0: requests without a seed of their own draw from it.")
    compile_cache: Union[str, None] = _leaf(
        "auto", "A directory keeping compiled graphs, and the weights as the model holds them, between runs "
                "(docs/usage.md, \"Compile cache\"). `auto`: `$MS_ATB_GRAPH_CACHE` (`off`: none) or "
                "`~/.cache/ms_atb/graphs` (`$XDG_CACHE_HOME` respected); null: off.")
    precompile: bool = _leaf(
        False, "`false`: each token bucket's graph is loaded or compiled when a step first needs it, so a run "
               "pays only for the sizes it meets; `true`: every bucket's graph at build (14 on SmolLM2, about "
               "25 s cold), so no request pays a compile.")


def _config_type(annotation: str) -> str:
    """SamplingParams spells an optional type `int | None`; the sections (and _coerce) `Union[int, None]`."""
    head, bar, tail = annotation.partition(" | ")
    return f"Union[{head}, {tail}]" if bar else annotation


# The `sampling.*` leaves: the SamplingParams fields marked CONFIG, with their names, types and meanings, and
# the config's own default where SamplingParams declares one (max_tokens 64, temperature 0.0).
SamplingSection = dataclasses.make_dataclass(
    "SamplingSection",
    [(f.name, _config_type(f.type), _leaf(f.metadata.get("config_default", f.default), f.metadata["doc"]))
     for f in sampling_fields(CONFIG)],
    namespace={"__module__": __name__,
               "__doc__": "The defaults of requests that do not set a field (ms_atb.SamplingParams). The Python "
                          "API's own defaults differ for max_tokens (16) and temperature (1.0)."})
