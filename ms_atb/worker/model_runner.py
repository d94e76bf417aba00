"""ModelRunner: turns a scheduler step into padded static-shape tensors, runs the model graph, returns logits.

Graph strategy: static shapes in a small set of buckets. The token count T is padded up to a bucket
(powers of two up to 64, then up to four per octave: see token_buckets); the batch is padded to
min(token bucket, max_num_seqs), so there is one graph per token bucket; block tables are padded to a
fixed width ceil(max_model_len / block_size). Padded tokens get slot -1 (no cache write) and are not
multiplied by the linears (they stop at query_start_loc[-1]); padded sequences get context_len 0 and an
empty query range (no attention). Dynamic shapes were measured slower on this CPU (see
scripts/bench_model.py).

With LoRA (lora.enable_lora) each token's adapter slot is one more int32 input [T] (-1: none, padding included),
and the adapters a step needs are written into their slots before it runs (load_lora, models/lora.py): switching
adapters compiles nothing.
"""
from __future__ import annotations

import dataclasses
import math
import os
import time

import mindspore as ms
import numpy as np

from ms_atb.config import parse_device, resolve_cache_dtype
from ms_atb.formats import loader
from ms_atb.formats.llama_config import LlamaConfig
from ms_atb.formats.peft_adapter import load_adapter
from ms_atb.formats.sharding import num_kv_heads_per_rank
from ms_atb.formats.weight_formats import linear_activations, weight_formats
from ms_atb.models import weights
from ms_atb.models.llama import LlamaForCausalLM, LlamaTokenLogits
from ms_atb.models.lora import write_slot
from ms_atb.ops.backends import resolve_backend
from ms_atb.worker.graph_call import GraphCall
from ms_atb.worker.kv_pool import KVPool

_DTYPES = {"float32": ms.float32, "fp32": ms.float32, "float16": ms.float16, "fp16": ms.float16,
           "bfloat16": ms.bfloat16, "bf16": ms.bfloat16}
_DEVICES = {"cpu": "CPU", "npu": "Ascend", "ascend": "Ascend"}


def _ms_dtype(dtype):
    if isinstance(dtype, str):
        if dtype.lower() not in _DTYPES:
            raise ValueError(f"dtype {dtype!r} not supported; allowed: {sorted(_DTYPES)}")
        return _DTYPES[dtype.lower()]
    if dtype in (ms.float32, ms.float16, ms.bfloat16):
        return dtype
    if dtype in (np.float32, np.float16):
        return ms.float32 if dtype == np.float32 else ms.float16
    raise ValueError(f"dtype {dtype!r} not supported; allowed: {sorted(_DTYPES)}")


def cache_ms_dtype(dtype, cache_dtype: str | None = None, device: str = "cpu"):
    """The KV cache's storage dtype: kv_cache.cache_dtype ("auto" as config.resolve_cache_dtype reads it on
    `device`), or the model's dtype for None."""
    if cache_dtype == "auto":
        cache_dtype = resolve_cache_dtype(cache_dtype, str(dtype), device)
    if cache_dtype is None:
        return _ms_dtype(dtype)
    if cache_dtype == "int8":
        return ms.int8
    if cache_dtype in ("float32", "float16", "bfloat16"):
        return _ms_dtype(cache_dtype)
    raise ValueError(f"cache_dtype {cache_dtype!r} not supported; allowed: auto, float32, float16, bfloat16, int8")


def kv_cache_bytes_per_block(config: LlamaConfig, block_size: int, dtype, tp_size: int = 1,
                             cache_dtype: str | None = None, device: str = "cpu") -> int:
    """Bytes of K and V cache of one block over all layers on one rank: the values, and with an int8 cache
    their float32 scales (one per token and KV head, for K and for V). cache_dtype: as cache_ms_dtype's."""
    storage = cache_ms_dtype(dtype, cache_dtype, device)
    itemsize = {ms.int8: 1, ms.float16: 2, ms.bfloat16: 2}.get(storage, 4)
    kvh = num_kv_heads_per_rank(config, tp_size)
    per_row = config.head_dim * itemsize + (4 if storage == ms.int8 else 0)   # one (token, KV head) row
    return 2 * config.num_hidden_layers * block_size * kvh * per_row


def token_buckets(max_num_batched_tokens: int) -> list[int]:
    """Token-count buckets below max_num_batched_tokens, then max_num_batched_tokens itself: powers of
    two up to 64, then steps of max(64, a quarter of the octave) — 64, 128, 192, ..., 512, 640, 768, ...
    A step above 64 tokens pads by at most 63 tokens or 25% (a 166-token prefill tail runs in the 192
    graph, not 256) while the graph count grows with the log of the cap (4 per octave; one graph
    costs ~6 s to compile on SmolLM2)."""
    buckets, b = [], 1
    while b < min(max_num_batched_tokens, 64):
        buckets.append(b)
        b *= 2
    b = 64
    while b < max_num_batched_tokens:
        buckets.append(b)
        b += max(64, (1 << (b.bit_length() - 1)) // 4)
    return buckets + [max_num_batched_tokens]


def _set_device(device: str, device_id: int | None, setting: str) -> None:
    """Graph mode on the device; ValueError naming context.device (`setting`) when this MindSpore cannot use it."""
    ms.set_context(mode=ms.GRAPH_MODE)
    if ms.get_context("device_target") != _DEVICES[device]:
        try:
            # only possible before MindSpore's runtime starts
            ms.set_device(_DEVICES[device], *(() if device_id is None else (device_id,)))
        except RuntimeError as e:            # e.g. "npu" with a CPU-only MindSpore build
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ValueError(f"context.device {setting!r}: this MindSpore {ms.__version__} cannot use it "
                             f"({reason}); 'cpu' works with every build") from None


class ModelRunner:
    graph_call: GraphCall | None = None          # runs self.model's ready bucket graphs (see _graph_call)

    def __init__(self, config, num_blocks: int | None = None, max_model_len: int | None = None,
                 tp_rank: int = 0, model_config=None, formats: dict | None = None):
        """config: a validated EngineConfig (ms_atb/config.py): model.path and dtype, kv_cache.block_size,
        the scheduler's step caps, context.device, parallel.tensor_parallel_size (already checked against
        the model). num_blocks and max_model_len: as the engine resolved them (kv_cache.num_blocks may be
        "auto", model.max_model_len None); None takes the config's. model_config: the model's LlamaConfig
        when the caller has loaded it and checked max_model_len against it (LLM); None: both done here.
        formats: the linears' weight formats the caller chose (ms_atb/formats/weight_formats.py); None: chosen
        here."""
        model_path, device = config.model.path, config.context.device
        num_blocks = config.kv_cache.num_blocks if num_blocks is None else num_blocks
        max_model_len = config.model.max_model_len if max_model_len is None else max_model_len
        block_size, sc = config.kv_cache.block_size, config.scheduler
        tp_size = config.parallel.tensor_parallel_size
        for name, value in (("num_blocks", num_blocks), ("max_model_len", max_model_len)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        device, device_id = parse_device(device)   # "npu:N" -> ("npu", N); None: msrun's or DEVICE_ID's
        if model_config is None:
            model_config = loader.load_config(model_path)
            model_config.check_max_model_len(max_model_len)
        self.model_config = model_config
        self.dtype = _ms_dtype(config.model.dtype)
        self.cache_dtype = cache_ms_dtype(config.model.dtype, config.kv_cache.cache_dtype, device)
        self.num_blocks, self.block_size = num_blocks, block_size
        self.max_num_seqs, self.max_model_len = sc.max_num_seqs, max_model_len
        self.max_num_batched_tokens = sc.max_num_batched_tokens
        self.max_blocks_per_seq = math.ceil(max_model_len / block_size)
        self.buckets = token_buckets(sc.max_num_batched_tokens)
        _set_device(device, device_id, config.context.device)
        self.attention_backend = resolve_backend(device, config.kv_cache.attention_backend)
        if formats is None:
            formats = weight_formats(model_path, self.model_config, config.model.weight_dtype, tp_size, device,
                                     config.model.activation_dtype, config.model.dtype)[0]
        self.weight_formats = formats
        # the quantized linears' kernels and layout: model.activation_dtype, "auto" resolved
        self.activation_dtype = linear_activations(config.model.activation_dtype, self.weight_formats,
                                                   config.model.dtype)
        self.lora = (config.lora.max_loras, config.lora.max_lora_rank) if config.lora.enable_lora else None
        self.lora_load_seconds = 0.0             # spent reading adapters and writing them into their slots
        self.model = LlamaForCausalLM(self.model_config, num_blocks, block_size, self.dtype, device,
                                      tp_size, tp_rank, attention_backend=self.attention_backend,
                                      cache_dtype=self.cache_dtype, weight_formats=self.weight_formats,
                                      activation_dtype=self.activation_dtype, lora=self.lora)
        # with a disk tier (kv_cache.disk_cache_dir), the pool's bytes are arrays of ours: blocks move in and out
        self.kv_pool = KVPool(self.model) if config.kv_cache.disk_cache_dir else None
        self.disk_tier = None                    # DiskTier, attached by the engine's builder
        self.model_path, self.tp_size, self.tp_rank = model_path, tp_size, tp_rank
        self.weight_cache = self._load_weights(config.context.compile_cache)
        self.compiled = set()                    # token buckets whose graph is ready
        self.compile_seconds = 0.0               # spent compiling or loading them
        self.graph_log = []                      # (bucket asked for, seconds it took), in order
        self.graph_cache = None                  # GraphCache (open_graph_cache)
        self.token_logits = None                 # LlamaTokenLogits, built when first needed
        self.warmup_stats = None

    def _load_weights(self, compile_cache: str | None):
        """Fills the model's weights from the weight cache (ms_atb/worker/weight_cache.py) beside the graphs,
        or from the model file, then saves them there. Returns the WeightCache."""
        from ms_atb.worker.graph_cache import cache_root
        from ms_atb.worker.weight_cache import WeightCache
        read = loader.model_kind(self.model_path)[0] != "random"     # computed weights are not kept
        cache = WeightCache(cache_root(compile_cache), self._weight_key_parts() if read else None)
        params = self.model.weight_parameters()
        if not cache.load(params):
            self.model.load_weights(weights.iter_weights(self.model_path, self.model_config, self.tp_size,
                                                         self.tp_rank, dtype=np.float32, formats=self.weight_formats))
            cache.save(params)
        return cache

    def _bucket(self, num_tokens: int) -> int:
        for b in self.buckets:
            if b >= num_tokens:
                return b
        raise ValueError(f"step has {num_tokens} tokens, above max_num_batched_tokens "
                         f"{self.max_num_batched_tokens}")

    def prepare(self, step) -> tuple[list, int]:
        """The six padded int32 input arrays of a step (seven with LoRA: each token's adapter slot), and its number
        of sequences."""
        num_seqs, num_tokens = len(step.request_ids), len(step.token_ids)
        if num_seqs > self.max_num_seqs:
            raise ValueError(f"step has {num_seqs} sequences, above max_num_seqs {self.max_num_seqs}")
        if not (len(step.positions) == len(step.slot_mapping) == num_tokens):
            raise ValueError("token_ids, positions and slot_mapping must have one entry per token")
        if not (len(step.block_tables) == len(step.context_lens) == num_seqs == len(step.query_start_loc) - 1):
            raise ValueError("block_tables and context_lens need B entries and query_start_loc B+1")
        t = self._bucket(num_tokens)
        b = min(t, self.max_num_seqs)
        ids = np.zeros(t, np.int32)
        positions = np.zeros(t, np.int32)
        slots = np.full(t, -1, np.int32)
        ids[:num_tokens], positions[:num_tokens], slots[:num_tokens] = (
            step.token_ids, step.positions, step.slot_mapping)
        tables = np.zeros((b, self.max_blocks_per_seq), np.int32)
        for i, table in enumerate(step.block_tables):
            if len(table) > self.max_blocks_per_seq:
                raise ValueError(f"block table {i} has {len(table)} blocks, above "
                                 f"max_model_len / block_size = {self.max_blocks_per_seq}")
            tables[i, :len(table)] = table
        context_lens = np.zeros(b, np.int32)
        context_lens[:num_seqs] = step.context_lens
        qsl = np.full(b + 1, num_tokens, np.int32)
        qsl[:num_seqs + 1] = step.query_start_loc
        arrays = [ids, positions, slots, tables, context_lens, qsl]
        if self.lora is not None:
            lora_slots = np.full(t, -1, np.int32)     # [T]: each token its sequence's slot
            lora_slots[:num_tokens] = np.repeat(np.asarray(step.lora_slots, np.int32), step.num_scheduled_tokens)
            arrays.append(lora_slots)
        return arrays, num_seqs

    def load_lora(self, slot: int, path: str, key: str) -> None:
        """Slot `slot` holds the adapter of directory `path` from the next step on; ValueError when its files no
        longer hold the adapter `key` names (changed since the request naming it was checked)."""
        start = time.perf_counter()
        adapter = load_adapter(path, self.model_config, self.lora[1])
        if adapter.key != key:
            raise ValueError(f"LoRA adapter {path!r}: its files changed since the request naming it was checked")
        write_slot(self.model, slot, adapter, self.tp_size, self.tp_rank)
        self.lora_load_seconds += time.perf_counter() - start

    def execute(self, step, every_token: bool = False) -> np.ndarray:
        """Logits float32 of each sequence's last scheduled token [B, vocab]; with every_token, of
        every scheduled token [T, vocab] (its graphs compile on first use). The step's tier transfers: its
        loads are copied into the pool before the graph runs, the blocks it computes handed to the tier after."""
        arrays, num_seqs = self.prepare(step)
        # from_numpy shares the fresh arrays' memory (no copy, no per-element checks); nothing writes them again
        tensors = [ms.Tensor.from_numpy(a) for a in arrays]
        loads, stores = getattr(step, "kv_loads", None), getattr(step, "kv_stores", None)   # a core Step has both
        if loads:
            self.disk_tier.load_into(self.kv_pool, loads)
        if every_token:
            if self.token_logits is None:
                self.token_logits = LlamaTokenLogits(self.model)
            logits = self.token_logits(*tensors).asnumpy()[:len(step.token_ids)]  # [T, V]
        else:
            self.ensure_compiled(len(arrays[0]))
            # [B_bucket, V]; prepare() padded to the bucket
            logits = self._graph_call()(len(arrays[0]), *tensors).asnumpy()[:num_seqs]
        used = getattr(step, "kv_used", None)
        if stores or used:                       # the graph has run: its cache writes are in the pool
            self.disk_tier.store_from(self.kv_pool, stores, used)
        return logits

    def open_graph_cache(self, root: str | None) -> str:
        """Keeps this runner's graphs in `root` between runs (ms_atb.worker.graph_cache): each bucket is
        loaded or compiled, and saved, when first needed. Returns the cache's status. A runner keeps the first
        cache it opened (the graphs it loaded are numbered in that cache's order)."""
        from ms_atb.worker.graph_cache import GraphCache
        if self.graph_cache is None:
            self.graph_cache = GraphCache(root, self.graph_key_parts() if root else {}).open()
        return self.graph_cache.status

    def ensure_compiled(self, bucket: int) -> None:
        """The graph of token bucket `bucket` ready to run: nothing when it is, else loaded from the graph
        cache or compiled (seconds on SmolLM2), its time added to compile_seconds."""
        if bucket in self.compiled:
            return
        start = time.perf_counter()
        if self.graph_cache is None:
            self._compile_bucket(bucket)
        else:
            self.graph_cache.ensure(bucket, self._compile_bucket)
        seconds = time.perf_counter() - start
        self.compile_seconds += seconds
        self.graph_log.append((bucket, seconds))

    def warmup(self, graph_cache: str | None = None) -> dict:
        """Compile (or load) the graph of every token bucket with an all-padding step (no cache write).
        graph_cache: a directory that keeps the compiled graphs between runs, when no open_graph_cache()
        came before."""
        start = time.perf_counter()
        if self.graph_cache is None:
            self.open_graph_cache(graph_cache)
        for t in self.buckets:
            self.ensure_compiled(t)
        self.warmup_stats = {**self.graph_stats(), "seconds": time.perf_counter() - start}
        return self.warmup_stats

    def graph_stats(self) -> dict:
        """Graphs ready, from the cache or compiled, the seconds spent on them, the cache's status and path."""
        cache = self.graph_cache
        on = cache is not None and cache.path is not None and cache.status in ("loaded", "saved", "empty")
        return {"graphs": len(self.compiled), "seconds": self.compile_seconds,
                "graphs_loaded": cache.loaded if cache else 0, "graphs_saved": cache.saved if cache else 0,
                "graph_cache": cache.status if cache else "off", "graph_cache_path": str(cache.path) if on else None}

    def _weight_key_parts(self) -> dict:
        """Everything the held weights depend on besides ms_atb's and MindSpore's code."""
        from ms_atb.worker.graph_cache import files_identity
        return {"model": files_identity(self.model_path), "config": dataclasses.asdict(self.model_config),
                "dtype": str(self.dtype), "device": ms.get_context("device_target"),
                "weight_formats": self.weight_formats, "activation_dtype": self.activation_dtype,
                "tp": [self.tp_size, self.tp_rank]}

    def kv_identity(self) -> bytes:
        """16 bytes naming everything the KV bytes this runner writes depend on: the weights' parts, the cache's
        dtype and block size, the attention kernels, ms_atb's sources and MindSpore's version (the disk tier's
        hash root: an engine that would write other bytes finds other blocks)."""
        from ms_atb.ops.build import kernel_library
        from ms_atb.worker.graph_cache import cache_key
        parts = {**self._weight_key_parts(), "kv_identity": 1, "cache_dtype": str(self.cache_dtype),
                 "block_size": self.block_size, "attention_backend": self.attention_backend,
                 "kernels": os.path.basename(kernel_library()),
                 **{k: os.path.basename(v) for k, v in self._attention_library().items()}}
        return bytes.fromhex(cache_key(parts))

    def graph_key_parts(self) -> dict:
        """Everything the compiled graphs depend on besides ms_atb's and MindSpore's code: the weights' parts
        and the shapes, kernels and attention backend."""
        from ms_atb.ops.build import loaded_kernel_library
        return {**self._weight_key_parts(), "cache_dtype": str(self.cache_dtype),
                "num_blocks": self.num_blocks, "block_size": self.block_size, "max_num_seqs": self.max_num_seqs,
                "max_blocks_per_seq": self.max_blocks_per_seq, "buckets": self.buckets,
                "kernels": loaded_kernel_library(), "attention_backend": self.attention_backend,
                **self._attention_library(), **({"lora": list(self.lora)} if self.lora is not None else {})}

    def _attention_library(self) -> dict:
        if self.attention_backend != "ascendc":
            return {}
        from ms_atb.ops.ascendc_build import loaded_ascendc_library
        return {"ascendc_kernels": loaded_ascendc_library()}

    def _compile_bucket(self, t: int) -> None:
        """Runs bucket t's graph once on an all-padding step (no cache write), which compiles or loads it."""
        b = min(t, self.max_num_seqs)
        arrays = [np.zeros(t, np.int32), np.zeros(t, np.int32), np.full(t, -1, np.int32),
                  np.zeros((b, self.max_blocks_per_seq), np.int32), np.zeros(b, np.int32),
                  np.zeros(b + 1, np.int32)] + ([np.full(t, -1, np.int32)] if self.lora is not None else [])
        self._graph_call().compile(t, *[ms.Tensor(a) for a in arrays]).asnumpy()
        self.compiled.add(t)

    def _graph_call(self) -> GraphCall:
        """The GraphCall of self.model: a fresh one, knowing no graph, once self.model is another Cell, so that
        no step ever runs a graph compiled for a model this runner no longer holds."""
        if self.graph_call is None or self.graph_call.cell is not self.model:
            self.graph_call = GraphCall(self.model)
        return self.graph_call
