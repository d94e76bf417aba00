"""The layers of a Llama decoder as MindSpore graph-mode Cells: norm, attention over the paged KV cache, MLP."""
import mindspore as ms
from mindspore.common.initializer import initializer
import numpy as np
from mindspore import nn, ops

from ms_atb.formats.llama_config import LlamaConfig
from ms_atb.formats.peft_adapter import TARGETS
from ms_atb.formats.sharding import num_heads_per_rank, num_kv_heads_per_rank
from ms_atb.models.parallel import ColumnParallelLinear, RowParallelLinear
from ms_atb.ops import (AddRmsNorm, CachedAttention, DecoderLayer, PagedAttention, ReshapeAndCache, RmsNorm,
                        RotaryEmbedding, SwiGlu)
from ms_atb.ops.backends import resolve_backend


class RMSNorm(nn.Cell):
    """norm(x [T, size]) -> [T, size]; norm(x, residual) -> (h, norm(h)), h = x + residual [T, size]."""

    def __init__(self, size: int, eps: float, dtype, device):
        super().__init__()
        self.weight = ms.Parameter(ms.Tensor(np.ones(size), dtype), name="weight")  # [size]
        self.norm = RmsNorm(eps, dtype, device)
        self.add_norm = AddRmsNorm(eps, dtype, device)

    def construct(self, x, residual=None):
        if residual is None:
            return self.norm(x, self.weight)
        return self.add_norm(x, residual, self.weight)


class LlamaAttention(nn.Cell):
    """attention_backend: the KV-cache ops' backend, a plain string (ms_atb/attention_backends.py); quantized: int8 caches."""

    def __init__(self, config: LlamaConfig, dtype, device, tp_size, tp_rank, attention_backend=None, quantized=False,
                 formats=("float32", "float32"), activations="float32"):
        """formats: the weight formats of (qkv_proj, o_proj); activations: their quantized inputs' dtype."""
        super().__init__()
        d = config.head_dim
        self.num_heads = num_heads_per_rank(config, tp_size)
        self.num_kv_heads = num_kv_heads_per_rank(config, tp_size)
        self.head_dim = d
        self.q_size, self.kv_size = self.num_heads * d, self.num_kv_heads * d
        self.qkv_proj = ColumnParallelLinear(config.hidden_size, (self.q_size, self.kv_size, self.kv_size),
                                             tp_size, tp_rank, dtype, device, formats[0], activations)
        self.o_proj = RowParallelLinear(self.q_size, config.hidden_size, tp_size, tp_rank, dtype, device, formats[1],
                                        activations)
        self.has_bias, self.has_qk_norm = config.attention_bias, config.qk_norm
        if self.has_bias:  # [q + 2 kv] of this rank, in qkv_proj's column order
            self.qkv_bias = ms.Parameter(initializer("zeros", (self.q_size + 2 * self.kv_size,), dtype),
                                         name="qkv_bias")
        if self.has_qk_norm:  # weights [D], the same on every rank
            self.q_norm = RMSNorm(d, config.rms_norm_eps, dtype, device)
            self.k_norm = RMSNorm(d, config.rms_norm_eps, dtype, device)
        # Our CPU kernels in float32: rotary embedding, q/k/v split, cache write and attention are one op;
        # elsewhere one op each, with the reshapes between them.
        self.fused = device == "cpu" and dtype == ms.float32 and resolve_backend(device, attention_backend) == "cpu"
        if self.fused:
            self.cached_attn = CachedAttention(d ** -0.5, quantized)
        else:
            self.rope = RotaryEmbedding(self.num_heads + self.num_kv_heads, d, dtype, device)
            self.reshape_and_cache = ReshapeAndCache(device=device, backend=attention_backend, quantized=quantized)
            self.attn = PagedAttention(self.num_heads, self.num_kv_heads, d, d ** -0.5, device=device,
                                       backend=attention_backend, quantized=quantized)

    def construct(self, x, cos, sin, perm, key_cache, value_cache, slot_mapping, block_tables,
                  context_lens, query_start_loc, rows, key_scale_cache=None, value_scale_cache=None, lora=None):
        """lora: (slots [T] int32, ranks [L, 7] int32) when the layer takes LoRA adapters (enable_lora)."""
        t = x.shape[0]
        qkv = self.qkv_proj(x, rows, lora)  # [T, q + 2 kv]
        if self.has_bias:
            qkv = qkv + self.qkv_bias
        if self.has_qk_norm:
            q, k, v = ops.split(qkv, (self.q_size, self.kv_size, self.kv_size), -1)
            q = self.q_norm(q.reshape(t * self.num_heads, self.head_dim)).reshape(t, self.q_size)  # [T, q]
            k = self.k_norm(k.reshape(t * self.num_kv_heads, self.head_dim)).reshape(t, self.kv_size)
            qkv = ops.concat((q, k, v), -1)  # [T, q + 2 kv]
        if self.fused:
            o = self.cached_attn(qkv, cos, sin, perm, key_cache, value_cache, slot_mapping, block_tables, context_lens,
                                 query_start_loc, key_scale_cache, value_scale_cache)  # [T, q]
            return self.o_proj(o, rows, lora)
        qkv = self.rope(qkv, cos, sin, perm)  # [T, q + 2 kv], q and k rotated
        q, k, v = ops.split(qkv, (self.q_size, self.kv_size, self.kv_size), -1)
        q = q.reshape(t, self.num_heads, self.head_dim)  # [T, H, D]
        k = k.reshape(t, self.num_kv_heads, self.head_dim)  # [T, KVH, D]
        v = v.reshape(t, self.num_kv_heads, self.head_dim)  # [T, KVH, D]
        written = self.reshape_and_cache(k, v, key_cache, value_cache, slot_mapping, key_scale_cache,
                                         value_scale_cache)
        q = ops.depend(q, written)
        o = self.attn(q, key_cache, value_cache, block_tables, context_lens, query_start_loc, key_scale_cache,
                      value_scale_cache)  # [T, H, D]
        return self.o_proj(o.reshape(t, self.q_size), rows, lora)


class LlamaMLP(nn.Cell):
    def __init__(self, config: LlamaConfig, dtype, device, tp_size, tp_rank, formats=("float32", "float32"),
                 activations="float32"):
        """formats: the weight formats of (gate_up_proj, down_proj); activations: their quantized inputs' dtype."""
        super().__init__()
        self.inter = config.intermediate_size // tp_size
        self.gate_up_proj = ColumnParallelLinear(config.hidden_size, (self.inter, self.inter),
                                                 tp_size, tp_rank, dtype, device, formats[0], activations)
        self.down_proj = RowParallelLinear(self.inter, config.hidden_size, tp_size, tp_rank, dtype, device,
                                           formats[1], activations)
        self.swiglu = SwiGlu(dtype, device)

    def construct(self, x, rows, lora=None):  # [T, hidden]; rows int32 [1]: real (unpadded) tokens
        gate_up = self.gate_up_proj(x, rows, lora)  # [T, 2 I/tp]
        return self.down_proj(self.swiglu(gate_up), rows, lora)  # swiglu: [T, I/tp]


def _target(name: str) -> int:
    """A projection's column in the LoRA ranks (ops/lora.py's target numbering: PEFT's target order)."""
    return TARGETS.index(name)


class LlamaDecoderLayer(nn.Cell):
    def __init__(self, config: LlamaConfig, dtype, device, tp_size, tp_rank, attention_backend=None,
                 quantized=False, formats=("float32",) * 4, activations="float32", one_op=True, lora=None):
        """formats: the weight formats of (qkv_proj, o_proj, gate_up_proj, down_proj); activations: their
        quantized inputs' dtype (model.activation_dtype). one_op: the layer runs as one DecoderLayer op where
        it can (below); False keeps one op per part (for comparing the two). lora: (max_loras, max_rank) to take
        LoRA adapters on every projection (models/lora.py fills them), or None."""
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, device)
        self.self_attn = LlamaAttention(config, dtype, device, tp_size, tp_rank, attention_backend, quantized,
                                        formats[:2], activations)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, device)
        self.mlp = LlamaMLP(config, dtype, device, tp_size, tp_rank, formats[2:], activations)
        if lora is not None:
            self._enable_lora(*lora)
        # On the CPU fused path (our float32 kernels, cpu attention) each of the layer's 8 kernels costs a
        # MindSpore dispatch (~30-45 us) whatever its size: one op calls them all. Not with tensor parallelism
        # (an AllReduce sits between the parts), nor with a qkv bias or qk-norm (ops between the kernels).
        attn = self.self_attn
        self.one_op = one_op and attn.fused and tp_size == 1 and not (attn.has_bias or attn.has_qk_norm)
        if self.one_op:
            linears = (attn.qkv_proj, attn.o_proj, self.mlp.gate_up_proj, self.mlp.down_proj)
            self.layer = DecoderLayer(config.rms_norm_eps, attn.head_dim ** -0.5, tuple(x.fmt for x in linears),
                                      tuple(x.out_features for x in linears), activations, quantized,
                                      lora is not None)

    def _enable_lora(self, max_loras: int, max_rank: int) -> None:
        """Each projection's LoRA slots; the segments name the ranks' columns (the one-op layer's order too)."""
        attn, mlp = self.self_attn, self.mlp
        attn.qkv_proj.enable_lora(max_loras, max_rank, ((_target("q_proj"), attn.q_size),
                                                        (_target("k_proj"), attn.kv_size),
                                                        (_target("v_proj"), attn.kv_size)))
        attn.o_proj.enable_lora(max_loras, max_rank, ((_target("o_proj"), attn.o_proj.out_features),))
        mlp.gate_up_proj.enable_lora(max_loras, max_rank, ((_target("gate_proj"), mlp.inter),
                                                           (_target("up_proj"), mlp.inter)))
        mlp.down_proj.enable_lora(max_loras, max_rank, ((_target("down_proj"), mlp.down_proj.out_features),))

    def lora_linears(self) -> tuple:
        """The four linears in the one-op layer's order: qkv, o, gate_up, down."""
        return self.self_attn.qkv_proj, self.self_attn.o_proj, self.mlp.gate_up_proj, self.mlp.down_proj

    def construct(self, h, residual, cos, sin, perm, key_cache, value_cache, slot_mapping, block_tables,
                  context_lens, query_start_loc, rows, key_scale_cache=None, value_scale_cache=None, lora=None):
        """h [T, hidden]: the previous layer's MLP output, or the embeddings with residual None; residual
        [T, hidden]: the running sum before h. Returns (MLP output, residual): the layer's output is their
        sum, added by the next layer's first norm (one op with it). lora: (slots [T] int32, ranks [L, 7] int32)
        with LoRA adapters, else None."""
        if self.one_op:
            attn, mlp = self.self_attn, self.mlp
            adapters = None
            if lora is not None:
                qkv, o, gate_up, down = self.lora_linears()
                adapters = lora + (qkv.lora_a, qkv.lora_b, o.lora_a, o.lora_b, gate_up.lora_a, gate_up.lora_b,
                                   down.lora_a, down.lora_b)
            return self.layer(h, residual, self.input_layernorm.weight, self.post_attention_layernorm.weight,
                              attn.qkv_proj.weight, attn.o_proj.weight, mlp.gate_up_proj.weight, mlp.down_proj.weight,
                              cos, sin, perm, key_cache, value_cache, slot_mapping, block_tables, context_lens,
                              query_start_loc, rows, key_scale_cache, value_scale_cache, adapters)
        if residual is None:
            x, residual = self.input_layernorm(h), h
        else:
            residual, x = self.input_layernorm(h, residual)
        a = self.self_attn(x, cos, sin, perm, key_cache, value_cache, slot_mapping, block_tables, context_lens,
                           query_start_loc, rows, key_scale_cache, value_scale_cache, lora)  # [T, hidden]
        residual, x = self.post_attention_layernorm(a, residual)
        return self.mlp(x, rows, lora), residual
