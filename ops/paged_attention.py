"""PagedAttention: causal GQA attention of decode tokens and prefill chunks over the paged KV cache."""
import mindspore as ms
from mindspore import Tensor, nn

from ms_atb.ops import build
from ms_atb.ops.backends import ascend_custom_op, resolve_backend

_INPUTS = ("query", "key_cache", "value_cache", "block_tables", "context_lens", "query_start_loc", "scale")


class PagedAttention(nn.Cell):
    """pa(query [T, H, D], key_cache [NB, BS, KVH, D], value_cache, block_tables [B, MAXB] int32,
    context_lens [B] int32, query_start_loc [B + 1] int32) -> [T, H, D].

    Sequence b owns query rows query_start_loc[b]:query_start_loc[b+1], the LAST tokens of its
    context_lens[b] tokens (their K/V must already be in the cache); causal; query head h reads
    kv head h // (H // KVH). Rows owned by no sequence come out zero; a sequence with an empty
    query range is skipped. backend (ms_atb/attention_backends.py): on the CPU "cpu" (float32, float16 and bfloat16,
    computed in float32) or "ascendc" (float16 and bfloat16, head_dim a multiple of 16); on Ascend
    "ms_atb" or "mindspore"; None: the device's default. With the "cpu" backend the caches' dtype may
    differ from the query's: their rows are converted to float32 as they are read.

    quantized=True ("cpu" or "ascendc" backend): int8 caches; construct also takes key_scale_cache and
    value_scale_cache [NB, BS, KVH] float32, and each cached row is dequantised (int8 value x its scale)
    in the kernel's inner loop ("ascendc": head_dim a multiple of 32, whole 32-byte int8 rows).

    The "cpu" backend also takes query [T, H * D] and returns [T, H * D] (the same values).
    """

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, device: str = "cpu",
                 backend: str | None = None, quantized: bool = False):
        super().__init__()
        if num_heads < 1 or num_kv_heads < 1 or num_heads % num_kv_heads != 0:
            raise ValueError(f"num_heads ({num_heads}) must be a positive multiple of num_kv_heads ({num_kv_heads})")
        if head_dim < 1:
            raise ValueError(f"head_dim must be >= 1, got {head_dim}")
        self.backend = resolve_backend(device, backend)
        if self.backend == "ascendc" and head_dim % (32 if quantized else 16):
            raise ValueError(f"attention_backend 'ascendc' copies whole 32-byte blocks: head_dim must be a multiple "
                             f"of {32 if quantized else 16}{' with an int8 cache' if quantized else ''}, got {head_dim}")
        self.num_heads, self.num_kv_heads, self.head_dim, self.scale = num_heads, num_kv_heads, head_dim, scale
        if quantized and self.backend not in ("cpu", "ascendc"):
            raise ValueError(f"an int8 KV cache runs with attention_backend 'cpu' or 'ascendc', got {self.backend!r}")
        self.device, self.quantized = device, quantized
        self.scale_t = Tensor([scale], ms.float32)  # [1]
        if quantized and self.backend == "ascendc":
            from ms_atb.ops import ascendc_build
            self.op = ascendc_build.aot_op("MsAtbPagedAttentionQuant",
                                           _INPUTS + ("key_scale_cache", "value_scale_cache"), lambda q, *_: q)
        elif quantized:
            self.op = build.aot_op("PagedAttentionQuant", _INPUTS + ("key_scale_cache", "value_scale_cache"),
                                   lambda q, *_: q)
        elif self.backend == "cpu":
            self.op = build.aot_op("PagedAttention", _INPUTS, lambda q, *_: q)
        elif self.backend == "ascendc":
            from ms_atb.ops import ascendc_build
            self.op = ascendc_build.aot_op("MsAtbPagedAttention", _INPUTS, lambda q, *_: q)
        elif self.backend == "ms_atb":
            # UNVERIFIED (no Ascend here): our AscendC kernel, installed as a CANN custom op.
            self.op = ascend_custom_op("MsAtbPagedAttention", _INPUTS, lambda q, *_: q, lambda q, *_: q)
        else:
            # UNVERIFIED (no Ascend here): MindSpore's ATB-backed PagedAttention, which takes per-sequence
            # query counts (q_seq_lens) and, with mask_mode TRAPEZOIDAL, builds the causal mask of
            # multi-token queries itself, so prefill chunks over cached prefixes need no extra op.
            from mindspore.ops.auto_generate import PagedAttention as AscendPagedAttention
            self.op = AscendPagedAttention(num_heads, scale, num_kv_heads, mask_mode="TRAPEZOIDAL")

    def construct(self, query, key_cache, value_cache, block_tables, context_lens, query_start_loc,
                  key_scale_cache=None, value_scale_cache=None):
        if self.quantized:
            return self.op(query, key_cache, value_cache, block_tables, context_lens, query_start_loc, self.scale_t,
                           key_scale_cache, value_scale_cache)
        if self.backend != "mindspore":
            return self.op(query, key_cache, value_cache, block_tables, context_lens, query_start_loc, self.scale_t)
        q_seq_lens = query_start_loc[1:] - query_start_loc[:-1]  # [B]
        return self.op(query, key_cache, value_cache, block_tables, context_lens, None, None, None, q_seq_lens)
