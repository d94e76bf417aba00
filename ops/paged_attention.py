"""PagedAttention: causal GQA attention of decode tokens and prefill chunks over the paged KV cache."""
import mindspore as ms
from mindspore import Tensor, nn

from ms_atb.ops import build


class PagedAttention(nn.Cell):
    """pa(query [T, H, D], key_cache [NB, BS, KVH, D], value_cache, block_tables [B, MAXB] int32,
    context_lens [B] int32, query_start_loc [B + 1] int32) -> [T, H, D].

    Sequence b owns query rows query_start_loc[b]:query_start_loc[b+1], the LAST tokens of its
    context_lens[b] tokens (their K/V must already be in the cache); causal; query head h reads
    kv head h // (H // KVH). Rows owned by no sequence come out zero; a sequence with an empty
    query range is skipped. float32, float16 and bfloat16 (computed in float32) on the CPU; bfloat16 is tested
    through ms_atb.ops.paged_attention (tests/test_ops_functional.py). The caches' dtype may differ from the
    query's: their rows are converted to float32 as they are read.

    quantized=True: int8 caches; construct also takes key_scale_cache and value_scale_cache [NB, BS, KVH]
    float32, and each cached row is dequantised (int8 value x its scale) in the kernel's inner loop.
    """

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, device: str = "cpu",
                 quantized: bool = False):
        super().__init__()
        if num_heads < 1 or num_kv_heads < 1 or num_heads % num_kv_heads != 0:
            raise ValueError(f"num_heads ({num_heads}) must be a positive multiple of num_kv_heads ({num_kv_heads})")
        if head_dim < 1:
            raise ValueError(f"head_dim must be >= 1, got {head_dim}")
        if device not in ("cpu", "npu"):
            raise ValueError(f"device must be 'cpu' or 'npu', got {device!r}")
        self.num_heads, self.num_kv_heads, self.head_dim, self.scale = num_heads, num_kv_heads, head_dim, scale
        if quantized and device != "cpu":
            raise ValueError("an int8 KV cache runs on the CPU only (kv_cache.cache_dtype int8 with device 'cpu')")
        self.device, self.quantized = device, quantized
        self.scale_t = Tensor([scale], ms.float32)  # [1]
        if device == "cpu":
            names = ("query", "key_cache", "value_cache", "block_tables", "context_lens", "query_start_loc", "scale")
            self.op = (build.aot_op("PagedAttentionQuant", names + ("key_scale_cache", "value_scale_cache"),
                                    lambda q, *_: q) if quantized
                       else build.aot_op("PagedAttention", names, lambda q, *_: q))
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
        if self.device == "cpu":
            return self.op(query, key_cache, value_cache, block_tables, context_lens, query_start_loc, self.scale_t)
        q_seq_lens = query_start_loc[1:] - query_start_loc[:-1]  # [B]
        return self.op(query, key_cache, value_cache, block_tables, context_lens, None, None, None, q_seq_lens)
