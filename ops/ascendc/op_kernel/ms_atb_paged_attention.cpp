// MsAtbPagedAttention: causal GQA attention of decode tokens and prefill chunks over the paged cache.
//   query [T, H, D]; key_cache, value_cache [NB, BS, KVH, D]; block_tables [B, MAXB] int32;
//   context_lens [B] int32; query_start_loc [B + 1] int32; scale [1] float32 -> out [T, H, D].
// Sequence b owns query rows query_start_loc[b]:query_start_loc[b+1], the last tokens of its
// context_lens[b] tokens; rows owned by no sequence are written zero. float16 / bfloat16 in memory,
// float32 in the vector unit, one online-softmax update per span of cache tokens.
// Work item = (sequence, q_tile queries, KV head, head_tile heads of its group); core i takes items
// i, i + block_dim, ... All of it runs on the vector unit.
#include "kernel_operator.h"

using namespace AscendC;

namespace {

constexpr float kNoScore = -1.0e30f;  // the running maximum before any score: finite, so m - m stays 0

template <typename T>
class PagedAttentionKernel {
 public:
  __aicore__ inline void Init(GM_ADDR query, GM_ADDR key_cache, GM_ADDR value_cache, GM_ADDR block_tables,
                              GM_ADDR context_lens, GM_ADDR query_start_loc, GM_ADDR scale, GM_ADDR out,
                              const MsAtbPagedAttentionTilingData &td) {
    t_ = td;
    const uint64_t rows = uint64_t{td.num_tokens} * td.num_heads * td.head_dim;
    const uint64_t cache = uint64_t{td.num_blocks} * td.block_size * td.num_kv_heads * td.head_dim;
    query_.SetGlobalBuffer((__gm__ T *)query, rows);            // [T, H, D]
    out_.SetGlobalBuffer((__gm__ T *)out, rows);                // [T, H, D]
    key_.SetGlobalBuffer((__gm__ T *)key_cache, cache);         // [NB, BS, KVH, D]
    value_.SetGlobalBuffer((__gm__ T *)value_cache, cache);     // [NB, BS, KVH, D]
    tables_.SetGlobalBuffer((__gm__ int32_t *)block_tables, uint64_t{td.num_seqs} * td.max_blocks);  // [B, MAXB]
    lens_.SetGlobalBuffer((__gm__ int32_t *)context_lens, td.num_seqs);                             // [B]
    starts_.SetGlobalBuffer((__gm__ int32_t *)query_start_loc, td.num_seqs + 1);                    // [B + 1]
    scale_.SetGlobalBuffer((__gm__ float *)scale, 1);
    pipe_.InitBuffer(q_in_, 1, td.q_bytes);
    pipe_.InitBuffer(k_in_, 2, td.kv_bytes);
    pipe_.InitBuffer(v_in_, 2, td.kv_bytes);
    pipe_.InitBuffer(out_q_, 1, td.out_bytes);
    pipe_.InitBuffer(qf_buf_, td.rows_f32_bytes);
    pipe_.InitBuffer(acc_buf_, td.rows_f32_bytes);
    pipe_.InitBuffer(kf_buf_, td.kv_f32_bytes);
    pipe_.InitBuffer(vf_buf_, td.kv_f32_bytes);
    pipe_.InitBuffer(scores_buf_, td.scores_bytes);
    pipe_.InitBuffer(m_buf_, td.stats_bytes);
    pipe_.InitBuffer(l_buf_, td.stats_bytes);
    pipe_.InitBuffer(m_new_buf_, td.stats_bytes);
    pipe_.InitBuffer(alpha_buf_, td.stats_bytes);
    pipe_.InitBuffer(work_buf_, td.work_bytes);
    pipe_.InitBuffer(dot_buf_, td.work_bytes);
  }

  __aicore__ inline void Process() {
    const int64_t core = GetBlockIdx(), cores = t_.block_dim;
    const uint32_t group = t_.num_heads / t_.num_kv_heads, head_splits = group / t_.head_tile;
    int64_t item = 0;
    for (uint32_t b = 0; b < t_.num_seqs; ++b) {
      const int32_t q0 = starts_.GetValue(b), nq = starts_.GetValue(b + 1) - q0;
      for (int32_t qt = 0; qt < nq; qt += t_.q_tile)
        for (uint32_t g = 0; g < t_.num_kv_heads; ++g)
          for (uint32_t hs = 0; hs < head_splits; ++hs, ++item)
            if (item % cores == core) Attend(b, q0, nq, qt, g, g * group + hs * t_.head_tile);
    }
    // Rows before the first sequence and after the last one.
    const int32_t first = starts_.GetValue(0), last = starts_.GetValue(t_.num_seqs);
    for (uint32_t row = 0; row < t_.num_tokens; ++row)
      if ((row < static_cast<uint32_t>(first) || row >= static_cast<uint32_t>(last)) && item++ % cores == core)
        ZeroRow(row);
  }

 private:
  // Queries qt..qt+q_tile of sequence b, query heads head0..head0+head_tile (KV head g).
  __aicore__ inline void Attend(uint32_t b, int32_t q0, int32_t nq_seq, int32_t qt, uint32_t g, uint32_t head0) {
    const uint32_t D = t_.head_dim, H = t_.num_heads, ht = t_.head_tile;
    const int32_t nq = nq_seq - qt < static_cast<int32_t>(t_.q_tile) ? nq_seq - qt : t_.q_tile;
    const uint32_t rows = nq * ht;                       // row r = query r / ht, head head0 + r % ht
    const int32_t ctx = lens_.GetValue(b);
    const int32_t first_pos = ctx - nq_seq + qt, last_pos = first_pos + nq - 1;
    const uint64_t row_gap = (H - ht) * D * sizeof(T) / 32;  // blocks between a token's head tiles
    LocalTensor<float> qf = qf_buf_.Get<float>(), acc = acc_buf_.Get<float>();  // [rows, D] each
    LocalTensor<float> m = m_buf_.Get<float>(), l = l_buf_.Get<float>();        // [rows] each
    {
      LocalTensor<T> q = q_in_.AllocTensor<T>();  // [nq, ht * D]
      DataCopy(q, query_[(uint64_t{uint32_t(q0 + qt)} * H + head0) * D],
               DataCopyParams(nq, ht * D * sizeof(T) / 32, row_gap, 0));
      q_in_.EnQue(q);
      q = q_in_.DeQue<T>();
      Cast(qf, q, RoundMode::CAST_NONE, rows * D);
      q_in_.FreeTensor(q);
    }
    Muls(qf, qf, scale_.GetValue(0), rows * D);
    Duplicate(acc, 0.0f, rows * D);
    Duplicate(m, kNoScore, rows);
    Duplicate(l, 0.0f, rows);
    const int32_t spans = (last_pos + t_.span) / t_.span;
    CopyIn(b, g, 0, last_pos);
    for (int32_t s = 0; s < spans; ++s) {
      if (s + 1 < spans) CopyIn(b, g, (s + 1) * t_.span, last_pos);
      Update(s * t_.span, last_pos, first_pos, rows);
    }
    LocalTensor<T> o = out_q_.AllocTensor<T>();  // [nq, ht * D]
    for (uint32_t r = 0; r < rows; ++r) Muls(acc[r * D], acc[r * D], 1.0f / l.GetValue(r), D);
    Cast(o, acc, RoundMode::CAST_RINT, rows * D);
    out_q_.EnQue(o);
    o = out_q_.DeQue<T>();
    DataCopy(out_[(uint64_t{uint32_t(q0 + qt)} * H + head0) * D], o, DataCopyParams(nq, ht * D * sizeof(T) / 32, 0, row_gap));
    out_q_.FreeTensor(o);
  }

  // Cache tokens base..base+span (up to last_pos) of KV head g into the K and V queues, block by block.
  __aicore__ inline void CopyIn(uint32_t b, uint32_t g, int32_t base, int32_t last_pos) {
    const uint32_t D = t_.head_dim, BS = t_.block_size;
    const int32_t end = base + static_cast<int32_t>(t_.span) <= last_pos + 1 ? base + t_.span : last_pos + 1;
    LocalTensor<T> k = k_in_.AllocTensor<T>(), v = v_in_.AllocTensor<T>();  // [span, D] each
    const uint16_t gap = (t_.num_kv_heads - 1) * D * sizeof(T) / 32;      // blocks between a token's heads
    for (int32_t tok = base; tok < end;) {
      const int32_t in_block = tok % BS, n = (BS - in_block < uint32_t(end - tok)) ? BS - in_block : end - tok;
      const int64_t block = tables_.GetValue(uint64_t{b} * t_.max_blocks + tok / BS);
      const uint64_t src = ((block * BS + in_block) * t_.num_kv_heads + g) * D;
      const DataCopyParams params(n, D * sizeof(T) / 32, gap, 0);
      DataCopy(k[(tok - base) * D], key_[src], params);
      DataCopy(v[(tok - base) * D], value_[src], params);
      tok += n;
    }
    k_in_.EnQue(k);
    v_in_.EnQue(v);
  }

  // One online-softmax step over the span starting at cache token base.
  __aicore__ inline void Update(int32_t base, int32_t last_pos, int32_t first_pos, uint32_t rows) {
    const uint32_t D = t_.head_dim, S = t_.span, ht = t_.head_tile;
    const int32_t ntok = last_pos + 1 - base < static_cast<int32_t>(S) ? last_pos + 1 - base : S;
    LocalTensor<float> kf = kf_buf_.Get<float>(), vf = vf_buf_.Get<float>();  // [span, D] each
    LocalTensor<T> k = k_in_.DeQue<T>(), v = v_in_.DeQue<T>();
    Cast(kf, k, RoundMode::CAST_NONE, ntok * D);
    Cast(vf, v, RoundMode::CAST_NONE, ntok * D);
    k_in_.FreeTensor(k);
    v_in_.FreeTensor(v);
    LocalTensor<float> qf = qf_buf_.Get<float>(), acc = acc_buf_.Get<float>(), scores = scores_buf_.Get<float>();
    LocalTensor<float> m = m_buf_.Get<float>(), l = l_buf_.Get<float>(), m_new = m_new_buf_.Get<float>();
    LocalTensor<float> alpha = alpha_buf_.Get<float>(), work = work_buf_.Get<float>(), dot = dot_buf_.Get<float>();
    for (uint32_t r = 0; r < rows; ++r) {
      const int32_t seen = first_pos + static_cast<int32_t>(r / ht) - base + 1;  // causal: tokens row r sees
      const int32_t cnt = seen < ntok ? seen : ntok;
      m_new.SetValue(r, m.GetValue(r));
      if (cnt <= 0) continue;
      LocalTensor<float> sr = scores[r * S];  // [span]
      for (int32_t t = 0; t < cnt; ++t) {
        Mul(work, qf[r * D], kf[t * D], D);
        ReduceSum(dot, work, work, D);
        PipeBarrier<PIPE_ALL>();
        sr.SetValue(t, dot.GetValue(0));
      }
      ReduceMax(dot, sr, work, cnt);
      PipeBarrier<PIPE_ALL>();
      const float mx = dot.GetValue(0);
      if (mx > m.GetValue(r)) m_new.SetValue(r, mx);
    }
    PipeBarrier<PIPE_ALL>();
    Sub(alpha, m, m_new, rows);
    Exp(alpha, alpha, rows);
    Mul(l, l, alpha, rows);
    Adds(m, m_new, 0.0f, rows);
    PipeBarrier<PIPE_ALL>();
    for (uint32_t r = 0; r < rows; ++r) {
      const int32_t seen = first_pos + static_cast<int32_t>(r / ht) - base + 1;
      const int32_t cnt = seen < ntok ? seen : ntok;
      if (cnt <= 0) continue;
      LocalTensor<float> sr = scores[r * S], ar = acc[r * D];
      Adds(sr, sr, -m_new.GetValue(r), cnt);
      Exp(sr, sr, cnt);
      ReduceSum(dot, sr, work, cnt);
      Muls(ar, ar, alpha.GetValue(r), D);
      PipeBarrier<PIPE_ALL>();
      l.SetValue(r, l.GetValue(r) + dot.GetValue(0));
      for (int32_t t = 0; t < cnt; ++t) Axpy(ar, vf[t * D], sr.GetValue(t), D);
    }
  }

  __aicore__ inline void ZeroRow(uint32_t row) {
    const uint32_t chunk = t_.q_tile * t_.head_tile * t_.head_dim, n = t_.num_heads * t_.head_dim;
    for (uint32_t e = 0; e < n; e += chunk) {
      const uint32_t len = n - e < chunk ? n - e : chunk;
      LocalTensor<T> o = out_q_.AllocTensor<T>();
      Duplicate(o.template ReinterpretCast<int16_t>(), int16_t(0), len);  // +0.0 in float16 and bfloat16
      out_q_.EnQue(o);
      o = out_q_.DeQue<T>();
      DataCopy(out_[uint64_t{row} * n + e], o, len);
      out_q_.FreeTensor(o);
    }
  }

  MsAtbPagedAttentionTilingData t_;
  TPipe pipe_;
  TQue<QuePosition::VECIN, 1> q_in_;
  TQue<QuePosition::VECIN, 2> k_in_, v_in_;
  TQue<QuePosition::VECOUT, 1> out_q_;
  TBuf<TPosition::VECCALC> qf_buf_, acc_buf_, kf_buf_, vf_buf_, scores_buf_, m_buf_, l_buf_, m_new_buf_,
      alpha_buf_, work_buf_, dot_buf_;
  GlobalTensor<T> query_, key_, value_, out_;
  GlobalTensor<int32_t> tables_, lens_, starts_;
  GlobalTensor<float> scale_;
};

}  // namespace

// Tiling key 0: float16; 1: bfloat16.
extern "C" __global__ __aicore__ void ms_atb_paged_attention(GM_ADDR query, GM_ADDR key_cache, GM_ADDR value_cache,
                                                             GM_ADDR block_tables, GM_ADDR context_lens,
                                                             GM_ADDR query_start_loc, GM_ADDR scale, GM_ADDR out,
                                                             GM_ADDR workspace, GM_ADDR tiling) {
  GET_TILING_DATA_WITH_STRUCT(MsAtbPagedAttentionTilingData, td, tiling);
  if (TILING_KEY_IS(0)) {
    PagedAttentionKernel<half> op;
    op.Init(query, key_cache, value_cache, block_tables, context_lens, query_start_loc, scale, out, td);
    op.Process();
  } else if (TILING_KEY_IS(1)) {
    PagedAttentionKernel<bfloat16_t> op;
    op.Init(query, key_cache, value_cache, block_tables, context_lens, query_start_loc, scale, out, td);
    op.Process();
  }
}
