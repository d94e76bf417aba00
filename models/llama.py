"""Llama for causal LM as MindSpore graph-mode Cells, attending over a paged KV cache."""
import collections

import mindspore as ms
from mindspore.common.initializer import initializer
import numpy as np
from mindspore import nn, ops

from ms_atb.formats.gguf_reader import GGUFBlocks
from ms_atb.formats.llama_config import LlamaConfig, rope_inv_freq, rope_tables
from ms_atb.formats.sharding import num_kv_heads_per_rank
from ms_atb.formats.weight_formats import EMBED
from ms_atb.models.llama_layers import RMSNorm, LlamaDecoderLayer
from ms_atb.models.lora import host_parameter
from ms_atb.models.parallel import ColumnParallelLinear
from ms_atb.ops import LastTokenNorm, quant_matmul
from ms_atb.ops.quant_embedding import QuantEmbedding

__all__ = ["EMBED", "LlamaConfig", "LlamaForCausalLM", "LlamaTokenLogits", "rope_inv_freq", "rope_tables"]


class LlamaForCausalLM(nn.Cell):
    """construct(input_ids [T], positions [T], slot_mapping [T], block_tables [B, MAXB], context_lens [B],
    query_start_loc [B+1], lora_slots [T] (with LoRA only)) -> logits [B, vocab] of each sequence's last scheduled
    token. attention_backend: the KV-cache ops' backend for the device (ms_atb/attention_backends.py); None: its
    default."""

    def __init__(self, config: LlamaConfig, num_blocks: int, block_size: int, dtype=ms.float32,
                 device: str = "cpu", tp_size: int = 1, tp_rank: int = 0, attention_backend: str | None = None,
                 cache_dtype=None, weight_formats: dict | None = None, activation_dtype: str = "float32",
                 lora: tuple[int, int] | None = None):
        """cache_dtype: the KV cache's storage dtype (ms.float32, float16, bfloat16 or int8); None: dtype.
        weight_formats: {HF weight name: quantized format} of the linears kept quantized (CPU, float32 only;
        ms_atb/formats/weight_formats.py), the others float; lm_head's under "lm_head.weight".
        activation_dtype (model.activation_dtype): "int8" quantizes the inputs of the quantized linears.
        lora: (max_loras, max_rank): every decoder projection takes LoRA adapters (CPU), each token's slot an input
        of the graph and the slots' weights Parameters that models/lora.py writes; None: no adapters."""
        super().__init__()
        formats = weight_formats or {}

        def fmt(name):
            return formats.get(name, "float32")
        cache_dtype = dtype if cache_dtype is None else cache_dtype
        self.quantized = cache_dtype == ms.int8
        assert config.num_attention_heads % tp_size == 0, "the engine checks tensor_parallel_size (validate_tp)"
        self.config, self.dtype = config, dtype
        self.tp_size, self.tp_rank = tp_size, tp_rank
        h, v = config.hidden_size, config.vocab_size
        # Tied or not, lm_head is its own [hidden, V] copy (in the linears' fast layout), replicated.
        self.lm_head = ColumnParallelLinear(h, v, 1, 0, dtype, device, fmt("lm_head.weight"), activation_dtype)
        self._init_embedding(formats.get(EMBED))
        self.layers = nn.CellList([LlamaDecoderLayer(
            config, dtype, device, tp_size, tp_rank, attention_backend, self.quantized,
            tuple(fmt(f"model.layers.{i}.{n}.weight") for n in ("self_attn.q_proj", "self_attn.o_proj",
                                                                  "mlp.gate_proj", "mlp.down_proj")),
            activation_dtype, lora=lora)
            for i in range(config.num_hidden_layers)])
        # each slot's rank on q, k, v, o, gate, up, down (0: no adapter there), over a host array models/lora.py writes
        self.lora_ranks_host = None if lora is None else np.zeros((lora[0], 7), np.int32)
        self.lora_ranks = None if lora is None else host_parameter(self.lora_ranks_host, "lora_ranks")  # [L, 7]
        self.norm = RMSNorm(h, config.rms_norm_eps, dtype, device)
        self.last_token_norm = LastTokenNorm(config.rms_norm_eps, dtype, device)
        cos, sin, perm = rope_tables(config)
        self.cos = ms.Parameter(ms.Tensor(cos, dtype), name="rope_cos", requires_grad=False)  # [P, D]
        self.sin = ms.Parameter(ms.Tensor(sin, dtype), name="rope_sin", requires_grad=False)  # [P, D]
        self.perm = ms.Tensor(perm)  # [D]
        kvh = num_kv_heads_per_rank(config, tp_size)
        shape = (num_blocks, block_size, kvh, config.head_dim)

        # The pool starts as an initializer, not an array: its zeros are allocated when the graph first runs,
        # as pages the OS maps on first write, so a block's pages are touched when a sequence first writes it.
        def caches(name, shape, dtype):
            return ms.ParameterTuple(ms.Parameter(initializer("zeros", shape, dtype), name=f"{name}.{i}",
                                                  requires_grad=False) for i in range(config.num_hidden_layers))
        self.key_caches = caches("key_cache", shape, cache_dtype)  # per layer [NB, BS, KVH, D]
        self.value_caches = caches("value_cache", shape, cache_dtype)
        # int8: one scale per slot and KV head, indexed by the values' slot, so it moves with its block.
        self.key_scale_caches = caches("key_scale_cache", shape[:3], ms.float32) if self.quantized else None
        self.value_scale_caches = caches("value_scale_cache", shape[:3], ms.float32) if self.quantized else None

    def _init_embedding(self, fmt: str | None) -> None:
        """The embedding as the model holds it: float [V, hidden] (fmt None), or kept in a GGUF block format fmt
        (ms_atb/formats/weight_formats.py), its rows dequantised as they are gathered: a tied model gathers from its
        lm_head's blocks, an untied one holds its own, packed as a linear [hidden, V] is."""
        c, dtype = self.config, self.dtype
        self.embed_fmt, self.embedding = fmt, None
        shape, wtype = (c.vocab_size, c.hidden_size), dtype                      # [V, hidden]
        if fmt is not None:
            tied = c.tie_word_embeddings
            assert not tied or self.lm_head.fmt == fmt, "weight_formats gives a tied embedding lm_head's format"
            self.embedding = QuantEmbedding(fmt, self.lm_head.activations if tied else "float32")
            shape, wtype = None if tied else quant_matmul.packed_shape(fmt, c.hidden_size, c.vocab_size), ms.int8
        self.embed_tokens = None if shape is None else ms.Parameter(initializer("zeros", shape, wtype),
                                                                    name="embed_tokens")

    def embed(self, input_ids):
        """[T] int32 -> [T, hidden] in the model's dtype."""
        if self.embedding is None:
            return ops.gather(self.embed_tokens, input_ids, 0)
        w = self.lm_head.weight if self.embed_tokens is None else self.embed_tokens
        h = self.embedding(input_ids, w)  # [T, hidden] float32
        return h if self.dtype == ms.float32 else h.astype(self.dtype)

    def layers_out(self, input_ids, positions, slot_mapping, block_tables, context_lens, query_start_loc,
                   lora_slots=None):
        """The last decoder layer's MLP output and the residual [T, hidden] each (their sum is the layer's
        output, before the final norm); writes the KV cache. lora_slots [T] int32: each token's adapter slot (-1:
        none), with LoRA."""
        h = self.embed(input_ids)  # [T, hidden]
        cos = ops.gather(self.cos, positions, 0)  # [T, D]
        sin = ops.gather(self.sin, positions, 0)  # [T, D]
        # Tokens past query_start_loc[-1] are bucket padding: the linears skip them (zero rows).
        rows = query_start_loc[-1:]  # int32 [1]
        lora = None if self.lora_ranks is None else (lora_slots, self.lora_ranks)
        residual = None
        for i, layer in enumerate(self.layers):
            if self.quantized:  # [NB, BS, KVH] float32 each
                h, residual = layer(h, residual, cos, sin, self.perm, self.key_caches[i], self.value_caches[i],
                                    slot_mapping, block_tables, context_lens, query_start_loc, rows,
                                    self.key_scale_caches[i], self.value_scale_caches[i], lora)
            else:
                h, residual = layer(h, residual, cos, sin, self.perm, self.key_caches[i], self.value_caches[i],
                                    slot_mapping, block_tables, context_lens, query_start_loc, rows, None, None, lora)
        return h, residual

    def hidden_states(self, input_ids, positions, slot_mapping, block_tables, context_lens, query_start_loc,
                      lora_slots=None):
        """The last decoder layer's output [T, hidden] (before the final norm); writes the KV cache."""
        h, residual = self.layers_out(input_ids, positions, slot_mapping, block_tables, context_lens,
                                      query_start_loc, lora_slots)
        return h + residual

    def construct(self, input_ids, positions, slot_mapping, block_tables, context_lens, query_start_loc,
                  lora_slots=None):
        h, residual = self.layers_out(input_ids, positions, slot_mapping, block_tables, context_lens,
                                      query_start_loc, lora_slots)  # [T, hidden] each
        # Each sequence's last token, normed [B, hidden]; real sequences come first and own >= 1 token,
        # padded ones own none: lm_head skips them (seqs int32 [1]: the real ones).
        h, seqs = self.last_token_norm(h, residual, query_start_loc, self.norm.weight)
        return self.lm_head(h, seqs).astype(ms.float32)  # [B, V], padded sequences' rows zero

    def weight_parameters(self) -> dict:
        """{name: Parameter} of everything but the KV pool and the LoRA slots: what load_weights fills and the RoPE
        tables."""
        pool = {id(p) for caches in (self.key_caches, self.value_caches, self.key_scale_caches,
                                     self.value_scale_caches) if caches is not None for p in caches}
        pool.update(id(p) for p in self.lora_parameters())
        return {p.name: p for p in self.get_parameters() if id(p) not in pool}

    def lora_parameters(self) -> list:
        """The LoRA slots' Parameters (none without LoRA): the ranks, each linear's stacked A and B."""
        if self.lora_ranks is None:
            return []
        return [self.lora_ranks] + [p for layer in self.layers for linear in layer.lora_linears()
                                    for p in (linear.lora_a, linear.lora_b)]

    def _weight_targets(self) -> dict:
        """HF name -> (Parameter, or the linear it is a slice of; column offset in that linear or None for
        a whole Parameter; HF-layout shape [out, in])."""
        c, h = self.config, self.config.hidden_size
        targets = {"model.embed_tokens.weight": (self.embed_tokens, None, (c.vocab_size, h)),
                   "model.norm.weight": (self.norm.weight, None, (h,))}
        if not c.tie_word_embeddings:
            targets["lm_head.weight"] = (self.lm_head, 0, (c.vocab_size, h))
        for i, layer in enumerate(self.layers):
            p, attn, mlp = f"model.layers.{i}.", layer.self_attn, layer.mlp
            q, kv, inter = attn.q_size, attn.kv_size, mlp.inter
            targets.update({
                p + "input_layernorm.weight": (layer.input_layernorm.weight, None, (h,)),
                p + "post_attention_layernorm.weight": (layer.post_attention_layernorm.weight, None, (h,)),
                p + "self_attn.q_proj.weight": (attn.qkv_proj, 0, (q, h)),
                p + "self_attn.k_proj.weight": (attn.qkv_proj, q, (kv, h)),
                p + "self_attn.v_proj.weight": (attn.qkv_proj, q + kv, (kv, h)),
                p + "self_attn.o_proj.weight": (attn.o_proj, 0, (h, q)),
                p + "mlp.gate_proj.weight": (mlp.gate_up_proj, 0, (inter, h)),
                p + "mlp.up_proj.weight": (mlp.gate_up_proj, inter, (inter, h)),
                p + "mlp.down_proj.weight": (mlp.down_proj, 0, (h, inter))})
            if c.attention_bias:
                targets.update({p + "self_attn.q_proj.bias": (attn.qkv_bias, 0, (q,)),
                                p + "self_attn.k_proj.bias": (attn.qkv_bias, q, (kv,)),
                                p + "self_attn.v_proj.bias": (attn.qkv_bias, q + kv, (kv,))})
            if c.qk_norm:
                targets.update({p + "self_attn.q_norm.weight": (attn.q_norm.weight, None, (attn.head_dim,)),
                                p + "self_attn.k_norm.weight": (attn.k_norm.weight, None, (attn.head_dim,))})
        return targets

    def load_weights(self, weights) -> None:
        """Fill the Parameters from (HF name, HF-layout array already sliced for this rank) pairs, one by one.
        Linear weights [out, in] are stored transposed, [in, out]; q/k/v biases fill one [q + 2 kv]
        Parameter; a tied embedding also fills lm_head. A linear kept in a GGUF block format takes its parts as
        GGUFBlocks (rows of blocks, stacked in output order); a GGUFBlocks for a float target is dequantised.
        The rows of blocks read from a GGUF file are released once packed (gguf_reader.release)."""
        targets = self._weight_targets()
        parts = collections.Counter(id(param) for param, offset, _ in targets.values() if offset is not None)
        pending, seen = {}, set()  # pending: id(fused target) -> (its parts so far, parts left)
        for name, array in weights:
            if not self._expects(name, array, targets, seen):
                continue
            seen.add(name)
            param, offset, _ = targets[name]
            if name == EMBED:
                self._load_embedding(array)
            elif offset is None:                 # a norm
                array = array.dequantize() if isinstance(array, GGUFBlocks) else array
                param.set_data(ms.Tensor(np.ascontiguousarray(array, np.float32), self.dtype))
            else:
                got, left = pending.pop(id(param), None) or ([], parts[id(param)])
                got.append((offset, array))
                if left > 1:
                    pending[id(param)] = (got, left - 1)
                else:
                    _fill(param, sorted(got, key=lambda g: g[0]), self.dtype)
        missing = [n for n in targets if n not in seen]
        if missing:
            raise ValueError(f"missing tensor {missing[0]!r} (expected shape {targets[missing[0]][2]})"
                             + (f" and {len(missing) - 1} more" if len(missing) > 1 else ""))

    def _expects(self, name: str, array, targets: dict, seen: set) -> bool:
        """True for a tensor the model takes; False for one it skips (a tied model's lm_head copy); ValueError
        for an unknown one, one given twice, or one of the wrong shape."""
        if name not in targets:
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                return False  # some tied checkpoints store the copy too
            raise ValueError(f"unexpected tensor {name!r} with shape {tuple(np.shape(array))}")
        if name in seen:
            raise ValueError(f"tensor {name!r} given twice")
        shape = targets[name][2]
        if tuple(array.shape) != shape:
            raise ValueError(f"tensor {name!r}: expected shape {shape}, found {tuple(array.shape)}")
        return True

    def _load_embedding(self, array) -> None:
        """The embedding [V, hidden] (float, or GGUFBlocks): into the form _init_embedding chose, and into a tied
        lm_head."""
        blocks = array if isinstance(array, GGUFBlocks) else None
        tied = self.config.tie_word_embeddings
        if blocks is not None and blocks.fmt == self.embed_fmt:
            if tied:
                self.lm_head.set_blocks(blocks.rows)
            else:
                packed = quant_matmul.pack_gguf(blocks.rows, blocks.fmt, self.config.hidden_size)
                self.embed_tokens.set_data(ms.Tensor.from_numpy(packed))
            blocks.release()
            return
        array = blocks.dequantize() if blocks is not None else array
        self.embed_tokens.set_data(ms.Tensor(np.ascontiguousarray(array, np.float32), self.dtype))
        if tied and blocks is not None and self.lm_head.fmt == blocks.fmt:
            self.lm_head.set_blocks(blocks.rows)
        elif tied:
            self.lm_head.set_weight(array.T)


def _fill(target, got: list, dtype) -> None:
    """Fills a fused target, a linear or the 1-D q/k/v bias Parameter, from all its parts (offset, HF-layout array
    or GGUFBlocks), in output order."""
    if isinstance(target, ms.Parameter):                # the bias: [q + 2 kv]
        target.set_data(ms.Tensor(np.concatenate([np.asarray(a, np.float32) for _, a in got]), dtype))
        return
    if all(isinstance(a, GGUFBlocks) and a.fmt == target.fmt for _, a in got):
        target.set_blocks([(offset, a.rows) for offset, a in got])
        for _, a in got:
            a.release()
        return
    buf = np.empty((target.in_features, target.out_features), np.float32)     # [in, out]
    for offset, a in got:
        a = a.dequantize() if isinstance(a, GGUFBlocks) else a
        buf[:, offset:offset + a.shape[0]] = a.T
    target.set_weight(buf)


class LlamaTokenLogits(nn.Cell):
    """The same model, returning the logits of EVERY scheduled token: construct(...same inputs...) ->
    [T, vocab], rows past query_start_loc[-1] zero. For prompt log-probabilities; it shares the
    model's Parameters (no prefix added to their names) and compiles its own graphs."""

    def __init__(self, model: LlamaForCausalLM):
        super().__init__(auto_prefix=False)
        self.model = model

    def construct(self, input_ids, positions, slot_mapping, block_tables, context_lens, query_start_loc,
                  lora_slots=None):
        m = self.model
        h = m.norm(m.hidden_states(input_ids, positions, slot_mapping, block_tables, context_lens,
                                   query_start_loc, lora_slots))  # [T, hidden]
        return m.lm_head(h, query_start_loc[-1:]).astype(ms.float32)  # [T, V]
