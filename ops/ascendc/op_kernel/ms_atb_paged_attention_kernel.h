// The MsAtbPagedAttention kernel class (see ms_atb_paged_attention.cpp for the op): work split, queries,
// the vector-unit span step, the online softmax, the output and the merge of context parts. The Cube
// unit's span step is in ms_atb_paged_attention_cube.h.
#ifndef MS_ATB_PAGED_ATTENTION_KERNEL_H_
#define MS_ATB_PAGED_ATTENTION_KERNEL_H_

#include <type_traits>

#include "kernel_operator.h"

namespace ms_atb_kernel {

using namespace AscendC;

constexpr float kNoScore = -1.0e30f;  // the running maximum before any score: finite, so m - m stays 0
constexpr uint32_t kFrac = 16;        // rows / columns of a 16-bit fractal
constexpr uint32_t kFracElems = 256;
constexpr int64_t kAivPerGroup = 2;   // a mixed launch's group: one AIC (Cube) and two AIVs (vector)
// Cross-core flags of a mixed launch (mode 2: between the AIC and the AIVs of a group), one hand-off each.
constexpr uint16_t kFlagScores = 0;  // AIC -> AIVs: the span's scores are in the workspace
constexpr uint16_t kFlagProbs = 1;   // AIVs -> AIC: both halves of P are in the workspace
constexpr uint16_t kFlagPv = 2;      // AIC -> AIVs: P x V is in the workspace
constexpr uint16_t kFlagKv = 3;      // AIVs -> AIC: the span's int8 K and V rows are in the workspace, widened

template <typename T, typename C>  // T: queries and output (half / bfloat16_t); C: caches (T, or int8_t)
class PagedAttentionKernel {
 public:
  __aicore__ inline void Init(GM_ADDR query, GM_ADDR key_cache, GM_ADDR value_cache, GM_ADDR block_tables,
                              GM_ADDR context_lens, GM_ADDR query_start_loc, GM_ADDR scale, GM_ADDR key_scales,
                              GM_ADDR value_scales, GM_ADDR out, GM_ADDR workspace,
                              const MsAtbPagedAttentionTilingData &td) {
    t_ = td;
    const uint64_t rows = uint64_t{td.num_tokens} * td.num_heads * td.head_dim;
    const uint64_t slots = uint64_t{td.num_blocks} * td.block_size;
    const uint64_t cache = slots * td.num_kv_heads * td.head_dim;
    query_.SetGlobalBuffer((__gm__ T *)query, rows);            // [T, H, D]
    out_.SetGlobalBuffer((__gm__ T *)out, rows);                // [T, H, D]
    key_.SetGlobalBuffer((__gm__ C *)key_cache, cache);         // [NB, BS, KVH, D]
    value_.SetGlobalBuffer((__gm__ C *)value_cache, cache);     // [NB, BS, KVH, D]
    tables_.SetGlobalBuffer((__gm__ int32_t *)block_tables, uint64_t{td.num_seqs} * td.max_blocks);  // [B, MAXB]
    lens_.SetGlobalBuffer((__gm__ int32_t *)context_lens, td.num_seqs);                             // [B]
    starts_.SetGlobalBuffer((__gm__ int32_t *)query_start_loc, td.num_seqs + 1);                    // [B + 1]
    scale_.SetGlobalBuffer((__gm__ float *)scale, 1);
    if (td.quant) {
      key_scales_.SetGlobalBuffer((__gm__ float *)key_scales, slots * td.num_kv_heads);      // [NB, BS, KVH]
      value_scales_.SetGlobalBuffer((__gm__ float *)value_scales, slots * td.num_kv_heads);  // [NB, BS, KVH]
    } else {
      key_t_.SetGlobalBuffer((__gm__ T *)key_cache, cache);  // the Cube's view of the 16-bit caches
      value_t_.SetGlobalBuffer((__gm__ T *)value_cache, cache);
    }
    if (td.ws_bytes > 0) {
      ws_f_.SetGlobalBuffer((__gm__ float *)workspace, td.ws_bytes / sizeof(float));
      ws_t_.SetGlobalBuffer((__gm__ T *)workspace, td.ws_bytes / sizeof(T));
    }
    subs_ = td.cube ? kAivPerGroup : 1;
    if (td.cube && ASCEND_IS_AIC) {  // the mixed form: the AIC holds the Cube's buffers, each AIV a unified buffer
      InitCubeBuffers();
      return;
    }
    if (!td.cube) pipe_.InitBuffer(q_in_, 1, td.q_bytes);
    if (!td.cube || td.quant) {  // the vector unit reads the cache (on a mixed launch: int8 rows to widen)
      pipe_.InitBuffer(k_in_, 2, td.kv_bytes);
      pipe_.InitBuffer(v_in_, 2, td.kv_bytes);
      pipe_.InitBuffer(kf_buf_, td.kv_f32_bytes);
      pipe_.InitBuffer(vf_buf_, td.kv_f32_bytes);
    }
    pipe_.InitBuffer(out_q_, 1, td.out_bytes);
    pipe_.InitBuffer(qf_buf_, td.rows_f32_bytes);
    pipe_.InitBuffer(acc_buf_, td.rows_f32_bytes);
    pipe_.InitBuffer(scores_buf_, td.scores_bytes);
    pipe_.InitBuffer(m_buf_, td.stats_bytes);
    pipe_.InitBuffer(l_buf_, td.stats_bytes);
    pipe_.InitBuffer(m_new_buf_, td.stats_bytes);
    pipe_.InitBuffer(alpha_buf_, td.stats_bytes);
    pipe_.InitBuffer(work_buf_, td.work_bytes);
    pipe_.InitBuffer(dot_buf_, td.work_bytes);
    if (td.stage_bytes) pipe_.InitBuffer(stage_buf_, td.stage_bytes);
    if (td.cube) pipe_.InitBuffer(p_buf_, td.p_bytes);
  }

  // Work items go round robin to the vector cores of a vector-only launch, or to the groups of a mixed one,
  // whose AIC and both AIVs walk the same items (each AIV takes half of an item's queries).
  __aicore__ inline void Process() {
    if (t_.cube && ASCEND_IS_AIC) {
      ProcessCube();
      return;
    }
    const int64_t aiv = GetBlockIdx(), cores = t_.block_dim, core = aiv / subs_, aivs = cores * subs_;
    sub_ = static_cast<uint32_t>(aiv % subs_);
    const uint32_t group = t_.num_heads / t_.num_kv_heads, head_splits = group / t_.head_tile;
    int64_t unit = 0, zero = 0;
    uint32_t item = 0;
    for (uint32_t b = 0; b < t_.num_seqs; ++b) {
      const int32_t q0 = starts_.GetValue(b), nq = starts_.GetValue(b + 1) - q0;
      for (int32_t qt = 0; qt < nq; qt += t_.q_tile)
        for (uint32_t g = 0; g < t_.num_kv_heads; ++g)
          for (uint32_t hs = 0; hs < head_splits; ++hs, ++item)
            for (uint32_t split = 0; split < t_.kv_splits; ++split, ++unit)
              if (unit % cores == core) Attend(b, q0, nq, qt, g, g * group + hs * t_.head_tile, item, split);
    }
    // Rows before the first sequence and after the last one.
    const int32_t first = starts_.GetValue(0), last = starts_.GetValue(t_.num_seqs);
    for (uint32_t row = 0; row < t_.num_tokens; ++row)
      if ((row < static_cast<uint32_t>(first) || row >= static_cast<uint32_t>(last)) && zero++ % aivs == aiv)
        ZeroRow(row);
    if (t_.kv_splits == 1) return;
    SyncAll();  // every part is in the workspace (the AIVs' barrier: the AICs take no part in the merge)
    item = 0;
    for (uint32_t b = 0; b < t_.num_seqs; ++b) {
      const int32_t q0 = starts_.GetValue(b), nq = starts_.GetValue(b + 1) - q0;
      for (int32_t qt = 0; qt < nq; qt += t_.q_tile)
        for (uint32_t g = 0; g < t_.num_kv_heads; ++g)
          for (uint32_t hs = 0; hs < head_splits; ++hs, ++item)
            for (uint32_t s = 0; s < subs_; ++s)
              if ((int64_t{item} * subs_ + s) % aivs == aiv) Merge(q0, nq, qt, g * group + hs * t_.head_tile, item, s);
    }
  }

 private:
  // Queries qt..qt+q_tile of sequence b, query heads head0..head0+head_tile (KV head g), over part `split`
  // of the cache tokens they see.
  // (On an AIV of a mixed launch: its half of the queries, the Cube's products read from the workspace.)
  __aicore__ inline void Attend(uint32_t b, int32_t q0, int32_t nq_seq, int32_t qt, uint32_t g, uint32_t head0,
                                uint32_t item, uint32_t split) {
    const uint32_t D = t_.head_dim, S = t_.span;
    int32_t nq_item, first_pos, begin, end;
    ContextPart(b, nq_seq, qt, split, &nq_item, &first_pos, &begin, &end);
    uint32_t qoff, nq;
    Share(nq_item, sub_, &qoff, &nq);
    const uint32_t rows = nq * t_.head_tile;  // row r = query qoff + r / head_tile, head head0 + r % head_tile
    first_pos += qoff;
    LocalTensor<float> acc = acc_buf_.Get<float>(), m = m_buf_.Get<float>(), l = l_buf_.Get<float>();
    if (rows > 0) {
      Duplicate(acc, 0.0f, rows * D);
      Duplicate(m, kNoScore, rows);
      Duplicate(l, 0.0f, rows);
    }
    if (t_.cube) {  // a launch with prefill chunks takes every item through the Cube
      for (int32_t s = begin; s < end; s += S) SoftmaxSpan(b, g, s, end, first_pos, qoff, rows);
    } else if (begin < end) {
      LoadQueryVector(q0 + qt, nq, head0, rows);
      CopyIn(b, g, begin, end);
      for (int32_t s = begin; s < end; s += S) {
        if (s + static_cast<int32_t>(S) < end) CopyIn(b, g, s + S, end);
        VectorSpan(b, g, s, end, first_pos, rows);
      }
    }
    if (rows == 0) return;
    if (t_.kv_splits == 1) WriteOut(q0 + qt + qoff, nq, head0, rows);
    else WritePartial((item * t_.kv_splits + split) * subs_ + sub_, rows);
  }

  // The queries (nq_item of them, from qt), the position of the first one in the context, and the cache tokens
  // [begin, end) of part `split` of an item: its kv_splits parts are runs of whole spans.
  __aicore__ inline void ContextPart(uint32_t b, int32_t nq_seq, int32_t qt, uint32_t split, int32_t *nq_item,
                                     int32_t *first_pos, int32_t *begin, int32_t *end) {
    const int32_t S = t_.span;
    *nq_item = nq_seq - qt < static_cast<int32_t>(t_.q_tile) ? nq_seq - qt : t_.q_tile;
    *first_pos = lens_.GetValue(b) - nq_seq + qt;
    const int32_t last_pos = *first_pos + *nq_item - 1;
    const int32_t per_split = ((last_pos + S) / S + t_.kv_splits - 1) / t_.kv_splits * S;
    *begin = split * per_split;
    *end = *begin + per_split < last_pos + 1 ? *begin + per_split : last_pos + 1;
  }

  // The queries [*qoff, *qoff + *nq) of an item's nq_item that AIV `sub` of its group takes (all of them on a
  // vector-only launch).
  __aicore__ inline void Share(int32_t nq_item, uint32_t sub, uint32_t *qoff, uint32_t *nq) {
    const uint32_t n = static_cast<uint32_t>(nq_item), half = (n + subs_ - 1) / subs_;
    *qoff = sub * half < n ? sub * half : n;
    *nq = n - *qoff < half ? n - *qoff : half;
  }

  __aicore__ inline void LoadQueryVector(int32_t row0, int32_t nq, uint32_t head0, uint32_t rows) {
    const uint32_t D = t_.head_dim, ht = t_.head_tile;
    LocalTensor<float> qf = qf_buf_.Get<float>();  // [rows, D]
    LocalTensor<T> q = q_in_.AllocTensor<T>();      // [nq, ht * D]
    DataCopy(q, query_[(uint64_t{uint32_t(row0)} * t_.num_heads + head0) * D],
             DataCopyParams(nq, ht * D * sizeof(T) / 32, (t_.num_heads - ht) * D * sizeof(T) / 32, 0));
    q_in_.EnQue(q);
    q = q_in_.DeQue<T>();
    Cast(qf, q, RoundMode::CAST_NONE, rows * D);
    q_in_.FreeTensor(q);
    Muls(qf, qf, scale_.GetValue(0), rows * D);
  }

  // The cache slot of token tok of sequence b.
  __aicore__ inline int64_t Slot(uint32_t b, int32_t tok) {
    return int64_t{tables_.GetValue(uint64_t{b} * t_.max_blocks + tok / t_.block_size)} * t_.block_size +
           tok % t_.block_size;
  }

  // Cache tokens base..min(base + span, end) of KV head g into the K and V queues, block by block.
  __aicore__ inline void CopyIn(uint32_t b, uint32_t g, int32_t base, int32_t end) {
    const uint32_t D = t_.head_dim, BS = t_.block_size;
    const int32_t stop = base + static_cast<int32_t>(t_.span) < end ? base + t_.span : end;
    LocalTensor<C> k = k_in_.AllocTensor<C>(), v = v_in_.AllocTensor<C>();  // [span, D] each
    const uint16_t gap = (t_.num_kv_heads - 1) * D * sizeof(C) / 32;        // blocks between a token's heads
    for (int32_t tok = base; tok < stop;) {
      const int32_t in_block = tok % BS, n = (BS - in_block < uint32_t(stop - tok)) ? BS - in_block : stop - tok;
      const uint64_t src = (Slot(b, tok) * t_.num_kv_heads + g) * D;
      const DataCopyParams params(n, D * sizeof(C) / 32, gap, 0);
      DataCopy(k[(tok - base) * D], key_[src], params);
      DataCopy(v[(tok - base) * D], value_[src], params);
      tok += n;
    }
    k_in_.EnQue(k);
    v_in_.EnQue(v);
  }

  // ntok cached rows in float32; int8 rows go through float16 (exact) and take their scales.
  __aicore__ inline void RowsToFloat(const LocalTensor<float> &dst, const LocalTensor<C> &src, uint32_t b, uint32_t g,
                                     int32_t base, int32_t ntok, const GlobalTensor<float> &scales) {
    const uint32_t D = t_.head_dim;
    if constexpr (std::is_same<C, int8_t>::value) {
      LocalTensor<half> h = stage_buf_.Get<half>();  // [span, D]
      Cast(h, src, RoundMode::CAST_NONE, ntok * D);
      Cast(dst, h, RoundMode::CAST_NONE, ntok * D);
      PipeBarrier<PIPE_ALL>();
      for (int32_t t = 0; t < ntok; ++t)
        Muls(dst[t * D], dst[t * D], scales.GetValue(Slot(b, base + t) * t_.num_kv_heads + g), D);
    } else {
      Cast(dst, src, RoundMode::CAST_NONE, ntok * D);
    }
  }

  // One span on the vector unit: Q.K^T as Mul + ReduceSum per (row, token), P.V as Axpy per (row, token).
  __aicore__ inline void VectorSpan(uint32_t b, uint32_t g, int32_t base, int32_t end, int32_t first_pos,
                                    uint32_t rows) {
    const uint32_t D = t_.head_dim, S = t_.span, ht = t_.head_tile;
    const int32_t ntok = end - base < static_cast<int32_t>(S) ? end - base : S;
    LocalTensor<float> kf = kf_buf_.Get<float>(), vf = vf_buf_.Get<float>();  // [span, D] each
    LocalTensor<C> k = k_in_.DeQue<C>(), v = v_in_.DeQue<C>();
    RowsToFloat(kf, k, b, g, base, ntok, key_scales_);
    RowsToFloat(vf, v, b, g, base, ntok, value_scales_);
    k_in_.FreeTensor(k);
    v_in_.FreeTensor(v);
    LocalTensor<float> qf = qf_buf_.Get<float>(), acc = acc_buf_.Get<float>(), scores = scores_buf_.Get<float>();
    LocalTensor<float> work = work_buf_.Get<float>(), dot = dot_buf_.Get<float>();
    for (uint32_t r = 0; r < rows; ++r) {
      const int32_t cnt = Seen(first_pos, r / ht, base, ntok);
      LocalTensor<float> sr = scores[r * S];  // [span]
      for (int32_t t = 0; t < cnt; ++t) {
        Mul(work, qf[r * D], kf[t * D], D);
        ReduceSum(dot, work, work, D);
        PipeBarrier<PIPE_ALL>();
        sr.SetValue(t, dot.GetValue(0));
      }
    }
    Softmax(first_pos, base, ntok, rows, false);
    for (uint32_t r = 0; r < rows; ++r) {
      const int32_t cnt = Seen(first_pos, r / ht, base, ntok);
      LocalTensor<float> sr = scores[r * S], ar = acc[r * D];
      for (int32_t t = 0; t < cnt; ++t) Axpy(ar, vf[t * D], sr.GetValue(t), D);
    }
  }

  // Tokens base.. of a span of ntok that query `query` (first_pos + query in the context) sees: causal.
  __aicore__ inline int32_t Seen(int32_t first_pos, uint32_t query, int32_t base, int32_t ntok) {
    const int32_t seen = first_pos + static_cast<int32_t>(query) - base + 1;
    return seen < ntok ? seen : ntok;
  }

  // The online-softmax step over the scores of one span: new running max, rescaled sum and accumulator,
  // probabilities in place of the scores. full: the rows hold span scores, the unseen ones masked here (the
  // Cube's P x V reads whole rows: they become 0).
  __aicore__ inline void Softmax(int32_t first_pos, int32_t base, int32_t ntok, uint32_t rows, bool full) {
    const uint32_t D = t_.head_dim, S = t_.span, ht = t_.head_tile;
    LocalTensor<float> acc = acc_buf_.Get<float>(), scores = scores_buf_.Get<float>();
    LocalTensor<float> m = m_buf_.Get<float>(), l = l_buf_.Get<float>(), m_new = m_new_buf_.Get<float>();
    LocalTensor<float> alpha = alpha_buf_.Get<float>(), work = work_buf_.Get<float>(), dot = dot_buf_.Get<float>();
    for (uint32_t r = 0; r < rows; ++r) {
      const int32_t cnt = Seen(first_pos, r / ht, base, ntok);
      LocalTensor<float> sr = scores[r * S];
      m_new.SetValue(r, m.GetValue(r));
      if (cnt <= 0) {
        if (full) Duplicate(sr, 0.0f, S);
        continue;
      }
      if (full) for (uint32_t t = cnt; t < S; ++t) sr.SetValue(t, kNoScore);
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
      const int32_t cnt = Seen(first_pos, r / ht, base, ntok);
      if (cnt <= 0) continue;
      const int32_t n = full ? S : cnt;
      LocalTensor<float> sr = scores[r * S], ar = acc[r * D];
      Adds(sr, sr, -m_new.GetValue(r), n);
      Exp(sr, sr, n);
      ReduceSum(dot, sr, work, n);
      Muls(ar, ar, alpha.GetValue(r), D);
      PipeBarrier<PIPE_ALL>();
      l.SetValue(r, l.GetValue(r) + dot.GetValue(0));
    }
  }

#include "ms_atb_paged_attention_cube.h"

  // out rows = acc / l, rounded to T.
  __aicore__ inline void WriteOut(int32_t row0, int32_t nq, uint32_t head0, uint32_t rows) {
    const uint32_t D = t_.head_dim, ht = t_.head_tile;
    LocalTensor<float> acc = acc_buf_.Get<float>(), l = l_buf_.Get<float>();
    LocalTensor<T> o = out_q_.AllocTensor<T>();  // [nq, ht * D]
    for (uint32_t r = 0; r < rows; ++r) Muls(acc[r * D], acc[r * D], 1.0f / l.GetValue(r), D);
    Cast(o, acc, RoundMode::CAST_RINT, rows * D);
    out_q_.EnQue(o);
    o = out_q_.DeQue<T>();
    DataCopy(out_[(uint64_t{uint32_t(row0)} * t_.num_heads + head0) * D], o,
             DataCopyParams(nq, ht * D * sizeof(T) / 32, 0, (t_.num_heads - ht) * D * sizeof(T) / 32));
    out_q_.FreeTensor(o);
  }

  // Workspace offsets (float elements) of partial result `slot`: rows x D, then max, then sum.
  __aicore__ inline uint64_t PartialAt(uint32_t slot) {
    return (uint64_t{t_.block_dim} * t_.ws_core_bytes + uint64_t{slot} * t_.partial_bytes) / sizeof(float);
  }
  __aicore__ inline uint32_t PartialRows() {
    return (t_.q_tile * t_.head_tile * t_.head_dim * 4 + 31) / 32 * 8;  // float elements, whole blocks
  }

  __aicore__ inline void WritePartial(uint32_t slot, uint32_t rows) {
    const uint64_t at = PartialAt(slot);
    const uint32_t stats = t_.stats_bytes / sizeof(float);
    PipeBarrier<PIPE_ALL>();
    DataCopy(ws_f_[at], acc_buf_.Get<float>(), rows * t_.head_dim);
    DataCopy(ws_f_[at + PartialRows()], m_buf_.Get<float>(), stats);
    DataCopy(ws_f_[at + PartialRows() + stats], l_buf_.Get<float>(), stats);
  }

  // The parts of one item merged: M = max m_j, acc = sum acc_j e^(m_j - M), l = sum l_j e^(m_j - M).
  __aicore__ inline void Merge(int32_t q0, int32_t nq_seq, int32_t qt, uint32_t head0, uint32_t item, uint32_t sub) {
    const uint32_t D = t_.head_dim, stats = t_.stats_bytes / sizeof(float);
    uint32_t qoff, nq;
    Share(nq_seq - qt < static_cast<int32_t>(t_.q_tile) ? nq_seq - qt : t_.q_tile, sub, &qoff, &nq);
    const uint32_t rows = nq * t_.head_tile;
    if (rows == 0) return;
    LocalTensor<float> acc = acc_buf_.Get<float>(), m = m_buf_.Get<float>(), l = l_buf_.Get<float>();
    LocalTensor<float> m_new = m_new_buf_.Get<float>(), alpha = alpha_buf_.Get<float>();
    LocalTensor<float> part = qf_buf_.Get<float>(), mj = scores_buf_.Get<float>(), lj = mj[stats];
    for (uint32_t j = 0; j < t_.kv_splits; ++j) {
      const uint64_t at = PartialAt((item * t_.kv_splits + j) * subs_ + sub);
      const bool first = j == 0;
      DataCopy(first ? acc : part, ws_f_[at], rows * D);
      DataCopy(first ? m : mj, ws_f_[at + PartialRows()], stats);
      DataCopy(first ? l : lj, ws_f_[at + PartialRows() + stats], stats);
      PipeBarrier<PIPE_ALL>();
      if (first) continue;
      Max(m_new, m, mj, rows);
      Sub(alpha, m, m_new, rows);
      Exp(alpha, alpha, rows);
      Sub(mj, mj, m_new, rows);
      Exp(mj, mj, rows);
      Mul(l, l, alpha, rows);
      Mul(lj, lj, mj, rows);
      Add(l, l, lj, rows);
      Adds(m, m_new, 0.0f, rows);
      PipeBarrier<PIPE_ALL>();
      for (uint32_t r = 0; r < rows; ++r) {
        Muls(acc[r * D], acc[r * D], alpha.GetValue(r), D);
        Axpy(acc[r * D], part[r * D], mj.GetValue(r), D);
      }
    }
    WriteOut(q0 + qt + qoff, nq, head0, rows);
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
      alpha_buf_, work_buf_, dot_buf_, stage_buf_, p_buf_;
  TQue<QuePosition::A1, 1> q_l1_, p_l1_;
  TQue<QuePosition::B1, 1> k_l1_, v_l1_;
  TQue<QuePosition::A2, 1> q_l0a_, p_l0a_;
  TQue<QuePosition::B2, 1> k_l0b_, v_l0b_;
  TQue<QuePosition::CO1, 1> s_l0c_, pv_l0c_;
  LocalTensor<T> q_a_;  // the item's queries in L0A (zZ), held over its spans
  uint32_t subs_ = 1, sub_ = 0;  // AIVs per group of the launch, and this AIV's index in its group
  GlobalTensor<T> query_, out_, key_t_, value_t_, ws_t_;
  GlobalTensor<C> key_, value_;
  GlobalTensor<int32_t> tables_, lens_, starts_;
  GlobalTensor<float> scale_, key_scales_, value_scales_, ws_f_;
};

}  // namespace ms_atb_kernel

#endif  // MS_ATB_PAGED_ATTENTION_KERNEL_H_
