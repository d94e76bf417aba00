"""A roofline cost model of one engine step: FLOPs and bytes moved from the model shape and the
batch, against a device's peak compute and memory bandwidth.

step time = max(FLOPs / peak_flops, bytes / mem_bandwidth) / efficiency + step_overhead_s

FLOPs: 2 x (decoder-layer matmul parameters) per scheduled token, plus 2 x hidden x vocab (the
lm_head) per sequence that samples a token (the model returns logits of last tokens only), plus
attention: 4 x num_heads x head_dim x layers per (query token, context token) pair, causal.
Bytes: every matmul weight read once per step, each scheduled sequence's whole KV context read
once (one kernel pass over its block table), and the KV of every scheduled token written.
Activations, norms, RoPE and sampling are left out (small next to these at these shapes).
Pure Python: no MindSpore import, so the simulator runs anywhere in seconds.
"""
from __future__ import annotations

from dataclasses import dataclass

GiB = 1024 ** 3
KV_VALUE_BYTES = {"auto": None, "float16": 2, "bfloat16": 2, "int8": 1}   # None: the weights' dtype_bytes
MiB = 1024 ** 2


@dataclass(frozen=True)
class ModelShape:
    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int                      # weights, and the KV cache when kv_cache_dtype is "auto"
    kv_cache_dtype: str = "auto"          # "auto" | "float16" | "bfloat16" | "int8" (+ a float32 scale a row)

    @classmethod
    def from_config(cls, config, dtype_bytes: int, name: str = "model") -> "ModelShape":
        """From a LlamaConfig (or anything with its field names)."""
        return cls(name, config.vocab_size, config.hidden_size, config.intermediate_size,
                   config.num_hidden_layers, config.num_attention_heads,
                   config.num_key_value_heads, config.head_dim, dtype_bytes)

    @property
    def layer_params(self) -> int:
        """Matmul weights of all decoder layers: q, k, v, o projections and the SwiGLU MLP."""
        h, d = self.hidden_size, self.head_dim
        attn = h * self.num_heads * d * 2 + h * self.num_kv_heads * d * 2
        mlp = 3 * h * self.intermediate_size
        return self.num_layers * (attn + mlp)

    @property
    def lm_head_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        """Layers + lm_head + input embedding (counted once even when tied), norms left out."""
        return self.layer_params + 2 * self.lm_head_params

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token over all layers: the values, and an int8 cache's float32 scale per (K or V, layer,
        KV head) row."""
        if self.kv_cache_dtype not in KV_VALUE_BYTES:
            raise ValueError(f"kv_cache_dtype must be one of {sorted(KV_VALUE_BYTES)}, got {self.kv_cache_dtype!r}")
        value = KV_VALUE_BYTES[self.kv_cache_dtype] or self.dtype_bytes
        scale = 4 if self.kv_cache_dtype == "int8" else 0
        return 2 * self.num_layers * self.num_kv_heads * (self.head_dim * value + scale)

    @property
    def weight_bytes_per_step(self) -> int:
        """Weights a step reads: layer matmuls and the lm_head (the embedding is a gather)."""
        return (self.layer_params + self.lm_head_params) * self.dtype_bytes


@dataclass(frozen=True)
class Device:
    name: str
    peak_flops: float            # FLOP/s at the model's dtype
    mem_bandwidth: float         # bytes/s
    memory_bytes: float
    efficiency: float            # fraction of the roofline reached, stated, not fitted
    step_overhead_s: float       # fixed per step: host scheduling, launches, sampling
    source: str = ""

    def __post_init__(self):
        if not 0 < self.efficiency <= 1:
            raise ValueError(f"efficiency must be in (0, 1], got {self.efficiency}")
        if self.peak_flops <= 0 or self.mem_bandwidth <= 0 or self.step_overhead_s < 0:
            raise ValueError("peak_flops and mem_bandwidth must be > 0, step_overhead_s >= 0")


# Llama-2-7b-hf / Llama-2-70b-hf config.json; SmolLM2-135M from its GGUF metadata.
LLAMA2_7B = ModelShape("Llama2-7B", 32000, 4096, 11008, 32, 32, 32, 128, 2)
LLAMA2_70B = ModelShape("Llama2-70B", 32000, 8192, 28672, 80, 64, 8, 128, 2)
SMOLLM2_135M = ModelShape("SmolLM2-135M", 49152, 576, 1536, 30, 9, 3, 64, 4)

ATLAS_800I_A2 = Device(
    "Atlas 800I A2, one Ascend 910B4 card", peak_flops=280e12, mem_bandwidth=1.6e12,
    memory_bytes=64e9, efficiency=0.6, step_overhead_s=0.003,
    source="910B-class card with 64 GB HBM2e: fp16 dense peak 280 TFLOPS (ai.gitee.com Ascend "
           "910B spec page), HBM bandwidth 1.6 TB/s (commonly quoted figure for the 64 GB part; "
           "not measured here); efficiency 0.6 and a 3 ms step overhead are assumptions")
THIS_CPU = Device(
    "this 2-core CPU, float32", peak_flops=190e9, mem_bandwidth=10e9, memory_bytes=24 * GiB,
    efficiency=0.6, step_overhead_s=0.005,
    source="190 GFLOP/s: numpy BLAS on 135M shapes and 10 GB/s: numpy copy of 256 MB "
           "(read + write), both measured on the 2-core development machine; efficiency 0.6 (MindSpore matmuls reached 95-130 of "
           "190 GFLOP/s) and 5 ms overhead are assumptions")


@dataclass
class StepCost:
    flops: float
    bytes: float
    seconds: float
    bound: str                   # "compute" | "memory"


class CostModel:
    def __init__(self, model: ModelShape, device: Device):
        self.model = model
        self.device = device
        m = model
        self._flops_per_token = 2 * m.layer_params
        self._flops_per_sample = 2 * m.lm_head_params
        self._flops_per_pair = 4 * m.num_heads * m.head_dim * m.num_layers
        self._kv_token = m.kv_bytes_per_token

    def cost(self, num_scheduled_tokens: list[int], context_lens: list[int],
             num_sampled: int) -> StepCost:
        """num_scheduled_tokens[b] new tokens of sequence b, which has context_lens[b] tokens
        of KV after the step (its queries are the last ones); num_sampled sequences sample."""
        num_tokens = sum(num_scheduled_tokens)
        pairs = 0
        for n, ctx in zip(num_scheduled_tokens, context_lens):
            start = ctx - n                  # query at position p attends to p + 1 tokens
            pairs += (ctx * (ctx + 1) - start * (start + 1)) // 2
        flops = (self._flops_per_token * num_tokens + self._flops_per_sample * num_sampled
                 + self._flops_per_pair * pairs)
        nbytes = (self.model.weight_bytes_per_step
                  + self._kv_token * (sum(context_lens) + num_tokens))
        d = self.device
        t_compute, t_memory = flops / d.peak_flops, nbytes / d.mem_bandwidth
        seconds = max(t_compute, t_memory) / d.efficiency + d.step_overhead_s
        return StepCost(flops, nbytes, seconds, "compute" if t_compute >= t_memory else "memory")

    def step_cost(self, step) -> StepCost:
        """The cost of a scheduler Step."""
        return self.cost(step.num_scheduled_tokens, step.context_lens, sum(step.sampled))
