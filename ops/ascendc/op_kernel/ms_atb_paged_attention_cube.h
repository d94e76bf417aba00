// Members of PagedAttentionKernel (included inside the class, ms_atb_paged_attention_kernel.h): the mixed form
// of a launch with prefill chunks (KERNEL_TYPE_MIX_AIC_1_2): per group, the AIC runs the Cube's part of every
// item of the group and its two AIVs the softmax, each AIV on half of the item's queries. Per span of S cache
// tokens, with M = the item's rows rounded up to 16, through the group's exchange area of the workspace:
//   AIC: Q [M, D] (L1 NZ -> L0A zZ, once per item) x K^T [D, S] (L1 NZ -> L0B nZ) -> scores [M, S] in L0C
//        -> workspace (Fixpipe, row-major);                                   set kFlagScores
//   AIV: wait kFlagScores; its rows of the scores -> unified buffer: scale, causal mask, online softmax
//        -> its rows of P [rows, S] in T -> workspace;                        set kFlagProbs
//   AIC: wait kFlagProbs (both AIVs); P -> L1 NZ -> L0A; V [S, D] (L1 NZ -> L0B nZ, each fractal transposed)
//        -> P x V [M, D] in L0C -> workspace;                                 set kFlagPv
//   AIV: wait kFlagPv; its rows of P x V added to its rescaled accumulator.
// Each area is written again only after its readers have signalled (the AIVs read the scores before they
// set kFlagProbs, and P x V before they can set the next kFlagProbs), so one area of each suffices.
// Rows past the item's and tokens past the span's end are padding: V's padding rows are zeroed in L1 and P's
// padding columns are 0, so they add nothing; the padding rows of the results are never read.

__aicore__ inline void InitCubeBuffers() {
  pipe_.InitBuffer(q_l1_, 1, t_.q_l1_bytes);
  pipe_.InitBuffer(p_l1_, 1, t_.p_l1_bytes);
  pipe_.InitBuffer(k_l1_, 1, t_.kv_l1_bytes);
  pipe_.InitBuffer(v_l1_, 1, t_.kv_l1_bytes);
  pipe_.InitBuffer(q_l0a_, 1, t_.q_l0a_bytes);
  pipe_.InitBuffer(p_l0a_, 1, t_.p_l0a_bytes);
  pipe_.InitBuffer(k_l0b_, 1, t_.kv_l0b_bytes);
  pipe_.InitBuffer(v_l0b_, 1, t_.kv_l0b_bytes);
  pipe_.InitBuffer(s_l0c_, 1, t_.s_l0c_bytes);
  pipe_.InitBuffer(pv_l0c_, 1, t_.pv_l0c_bytes);
}

// The AIC of group GetBlockIdx(): the Cube's part of the group's items, in the order its AIVs take them.
__aicore__ inline void ProcessCube() {
  const int64_t core = GetBlockIdx(), cores = t_.block_dim;
  const uint32_t group = t_.num_heads / t_.num_kv_heads, head_splits = group / t_.head_tile;
  int64_t unit = 0;
  for (uint32_t b = 0; b < t_.num_seqs; ++b) {
    const int32_t q0 = starts_.GetValue(b), nq_seq = starts_.GetValue(b + 1) - q0;
    for (int32_t qt = 0; qt < nq_seq; qt += t_.q_tile)
      for (uint32_t g = 0; g < t_.num_kv_heads; ++g)
        for (uint32_t hs = 0; hs < head_splits; ++hs)
          for (uint32_t split = 0; split < t_.kv_splits; ++split, ++unit) {
            if (unit % cores != core) continue;
            int32_t nq, first_pos, begin, end;
            ContextPart(b, nq_seq, qt, split, &nq, &first_pos, &begin, &end);
            if (begin >= end) continue;
            LoadQueryCube(q0 + qt, nq, g * group + hs * t_.head_tile);
            for (int32_t s = begin; s < end; s += t_.span) CubeSpan(b, g, s, end, nq * t_.head_tile);
            q_l0a_.FreeTensor(q_a_);
          }
  }
}

// Element offsets of the group's exchange area of the workspace: scores [M, S] float, P [M, S] in T,
// P x V [M, D] float.
__aicore__ inline void ExchangeAt(uint64_t *at_scores, uint64_t *at_p, uint64_t *at_pv, uint64_t *at_k = nullptr,
                                  uint64_t *at_v = nullptr) {
  const uint32_t M = t_.rows_pad, S = t_.span;
  const int64_t group = ASCEND_IS_AIC ? GetBlockIdx() : GetBlockIdx() / subs_;
  const uint64_t ws = uint64_t(group) * t_.ws_core_bytes;
  *at_scores = ws / sizeof(float);
  *at_p = (ws + (M * S * 4 + 31) / 32 * 32) / sizeof(T);
  const uint64_t pv = ws + (M * S * 4 + 31) / 32 * 32 + (M * S * sizeof(T) + 31) / 32 * 32;
  *at_pv = pv / sizeof(float);
  const uint64_t k = pv + (M * t_.head_dim * 4 + 31) / 32 * 32, kv = (S * t_.head_dim * sizeof(T) + 31) / 32 * 32;
  if (at_k != nullptr) *at_k = k / sizeof(T);  // int8 caches: K and V [S, D] widened to T
  if (at_v != nullptr) *at_v = (k + kv) / sizeof(T);
}

// The fractals [start, start + count * stride) (every stride-th) of an L1 tensor into consecutive fractals
// of an L0 tensor, at most 255 per LoadData.
__aicore__ inline void Fractals(const LocalTensor<T> &dst, const LocalTensor<T> &src, uint32_t count, uint32_t start,
                                uint32_t stride, bool transpose) {
  for (uint32_t i = 0; i < count; i += 255) {
    const uint32_t n = count - i < 255 ? count - i : 255;
    LoadData(dst[i * kFracElems], src, LoadData2DParams(start + i * stride, n, stride, 0, 0, transpose, 0));
  }
}

// The item's queries (nq queries x head_tile heads from row row0, head head0) into L0A, held in q_a_.
__aicore__ inline void LoadQueryCube(int32_t row0, int32_t nq, uint32_t head0) {
  const uint32_t D = t_.head_dim, M = t_.rows_pad, ht = t_.head_tile;
  LocalTensor<T> q1 = q_l1_.AllocTensor<T>();  // [M, D] NZ
  DataCopy(q1, query_[(uint64_t{uint32_t(row0)} * t_.num_heads + head0) * D],
           Nd2NzParams(nq, ht, D, t_.num_heads * D, D, M, 1, ht * kFrac));
  q_l1_.EnQue(q1);
  q1 = q_l1_.DeQue<T>();
  q_a_ = q_l0a_.AllocTensor<T>();  // [M, D] zZ
  for (uint32_t mb = 0; mb < M / kFrac; ++mb) Fractals(q_a_[mb * (D / kFrac) * kFracElems], q1, D / kFrac, mb, M / kFrac, false);
  q_l0a_.EnQue(q_a_);
  q_a_ = q_l0a_.DeQue<T>();
  q_l1_.FreeTensor(q1);
}

// AIC: one span (cache tokens base..min(base + S, end) of KV head g) of an item of `rows` rows.
__aicore__ inline void CubeSpan(uint32_t b, uint32_t g, int32_t base, int32_t end, uint32_t rows) {
  const uint32_t D = t_.head_dim, S = t_.span, M = t_.rows_pad, BS = t_.block_size;
  const int32_t ntok = end - base < static_cast<int32_t>(S) ? end - base : S;
  uint64_t at_scores, at_p, at_pv, at_k, at_v;
  ExchangeAt(&at_scores, &at_p, &at_pv, &at_k, &at_v);
  LocalTensor<T> k1 = k_l1_.AllocTensor<T>(), v1 = v_l1_.AllocTensor<T>();  // [S, D] NZ each
  if (ntok < static_cast<int32_t>(S))  // V's rows ntok..S of every column block
    InitConstValue(v1[ntok * kFrac], InitConstValueParams<T>(D / kFrac, S - ntok, ntok, T(0.0f)));
  if (t_.quant) {  // the AIVs' widened rows, contiguous [ntok, D]
    CrossCoreWaitFlag<2, PIPE_MTE2>(kFlagKv);
    DataCopy(k1, ws_t_[at_k], Nd2NzParams(1, ntok, D, 0, D, S, 1, 0));
    DataCopy(v1, ws_t_[at_v], Nd2NzParams(1, ntok, D, 0, D, S, 1, 0));
  }
  for (int32_t tok = base; tok < base + ntok && !t_.quant;) {
    const int32_t in_block = tok % BS, left = base + ntok - tok;
    const int32_t n = static_cast<int32_t>(BS) - in_block < left ? static_cast<int32_t>(BS) - in_block : left;
    const uint64_t src = (Slot(b, tok) * t_.num_kv_heads + g) * D;
    const Nd2NzParams nz(1, n, D, 0, t_.num_kv_heads * D, S, 1, 0);
    DataCopy(k1[(tok - base) * kFrac], key_t_[src], nz);
    DataCopy(v1[(tok - base) * kFrac], value_t_[src], nz);
    tok += n;
  }
  k_l1_.EnQue(k1);
  v_l1_.EnQue(v1);
  k1 = k_l1_.DeQue<T>();
  v1 = v_l1_.DeQue<T>();
  // scores = Q x K^T: K's NZ fractals are already K^T's nZ fractals, in order.
  LocalTensor<T> k0 = k_l0b_.AllocTensor<T>();
  Fractals(k0, k1, (D / kFrac) * (S / kFrac), 0, 1, false);
  k_l0b_.EnQue(k0);
  k0 = k_l0b_.DeQue<T>();
  k_l1_.FreeTensor(k1);
  LocalTensor<float> s0 = s_l0c_.AllocTensor<float>();  // [M, S] NZ
  Mmad(s0, q_a_, k0, MmadParams(M, S, D, false, 0, false, false, false));
  k_l0b_.FreeTensor(k0);
  s_l0c_.EnQue(s0);
  s0 = s_l0c_.DeQue<float>();
  Fixpipe<float, float, CFG_ROW_MAJOR>(ws_f_[at_scores], s0, FixpipeParamsV220(S, M, M, S, false));
  s_l0c_.FreeTensor(s0);
  CrossCoreSetFlag<2, PIPE_FIX>(kFlagScores);
  CrossCoreWaitFlag<2, PIPE_MTE2>(kFlagProbs);  // P x V.
  LocalTensor<T> p1 = p_l1_.AllocTensor<T>();  // [M, S] NZ
  DataCopy(p1, ws_t_[at_p], Nd2NzParams(1, rows, S, 0, S, M, 1, 0));
  p_l1_.EnQue(p1);
  p1 = p_l1_.DeQue<T>();
  LocalTensor<T> p0 = p_l0a_.AllocTensor<T>();  // [M, S] zZ
  for (uint32_t mb = 0; mb < M / kFrac; ++mb) Fractals(p0[mb * (S / kFrac) * kFracElems], p1, S / kFrac, mb, M / kFrac, false);
  p_l0a_.EnQue(p0);
  p0 = p_l0a_.DeQue<T>();
  p_l1_.FreeTensor(p1);
  LocalTensor<T> v0 = v_l0b_.AllocTensor<T>();  // [S, D] nZ
  for (uint32_t kb = 0; kb < S / kFrac; ++kb) Fractals(v0[kb * (D / kFrac) * kFracElems], v1, D / kFrac, kb, S / kFrac, true);
  v_l0b_.EnQue(v0);
  v0 = v_l0b_.DeQue<T>();
  v_l1_.FreeTensor(v1);
  LocalTensor<float> o0 = pv_l0c_.AllocTensor<float>();  // [M, D] NZ
  Mmad(o0, p0, v0, MmadParams(M, D, S, false, 0, false, false, false));
  p_l0a_.FreeTensor(p0);
  v_l0b_.FreeTensor(v0);
  pv_l0c_.EnQue(o0);
  o0 = pv_l0c_.DeQue<float>();
  Fixpipe<float, float, CFG_ROW_MAJOR>(ws_f_[at_pv], o0, FixpipeParamsV220(D, M, M, D, false));
  pv_l0c_.FreeTensor(o0);
  CrossCoreSetFlag<2, PIPE_FIX>(kFlagPv);
}

// AIV: the softmax step of one span for its `rows` rows (queries qoff.. of the item, the first at first_pos),
// between the AIC's two products. With no rows it still takes part in every hand-off. With int8 caches it
// first widens its half of the span's K and V rows for the Cube; the Cube then multiplies the int8 values,
// so each score column takes its token's K scale, and each P column its token's V scale (P x V sums
// p_n s_n v_n), while the softmax's sum takes the unscaled probabilities.
__aicore__ inline void SoftmaxSpan(uint32_t b, uint32_t g, int32_t base, int32_t end, int32_t first_pos, uint32_t qoff,
                                   uint32_t rows) {
  const uint32_t D = t_.head_dim, S = t_.span, r0 = qoff * t_.head_tile;
  const int32_t ntok = end - base < static_cast<int32_t>(S) ? end - base : S;
  uint64_t at_scores, at_p, at_pv, at_k, at_v;
  ExchangeAt(&at_scores, &at_p, &at_pv, &at_k, &at_v);
  // With int8 caches: the span's K scales and V scales / v_max ([S] each, 0 past ntok). P takes the V scales
  // relative to the span's largest, so its 16-bit values stay as far from the subnormals as the
  // probabilities themselves; P x V takes v_max back in float32.
  LocalTensor<float> ks, vs;
  float v_max = 0.0f;
  if constexpr (std::is_same<C, int8_t>::value) {
    ks = vf_buf_.Get<float>();
    vs = ks[S];
    const int32_t half = (ntok + subs_ - 1) / subs_, t0 = sub_ * half < ntok ? sub_ * half : ntok;
    const int32_t n = ntok - t0 < half ? ntok - t0 : half;
    if (n > 0) {
      CopyIn(b, g, base + t0, base + t0 + n);
      LocalTensor<C> k = k_in_.DeQue<C>(), v = v_in_.DeQue<C>();
      Widen(k, n, at_k + uint64_t(t0) * D);
      Widen(v, n, at_v + uint64_t(t0) * D);
      k_in_.FreeTensor(k);
      v_in_.FreeTensor(v);
    }
    CrossCoreSetFlag<2, PIPE_MTE3>(kFlagKv);
    Duplicate(ks, 0.0f, 2 * S);
    PipeBarrier<PIPE_ALL>();
    for (int32_t t = 0; t < ntok; ++t) {
      const int64_t slot = Slot(b, base + t) * t_.num_kv_heads + g;
      ks.SetValue(t, key_scales_.GetValue(slot));
      vs.SetValue(t, value_scales_.GetValue(slot));
      if (vs.GetValue(t) > v_max) v_max = vs.GetValue(t);
    }
    if (v_max <= 0.0f) v_max = 1.0f;  // all-zero rows: any factor
    PipeBarrier<PIPE_ALL>();
    Muls(vs, vs, 1.0f / v_max, S);
  }
  CrossCoreWaitFlag<2, PIPE_MTE2>(kFlagScores);
  if (rows > 0) {
    LocalTensor<float> scores = scores_buf_.Get<float>();  // [rows, S]
    DataCopy(scores, ws_f_[at_scores + r0 * S], rows * S);
    if (t_.quant) for (uint32_t r = 0; r < rows; ++r) Mul(scores[r * S], scores[r * S], ks, S);
    Muls(scores, scores, scale_.GetValue(0), rows * S);
    Softmax(first_pos, base, ntok, rows, true);
    if (t_.quant) for (uint32_t r = 0; r < rows; ++r) Mul(scores[r * S], scores[r * S], vs, S);
    LocalTensor<T> p = p_buf_.Get<T>();  // [rows, S]
    Cast(p, scores, RoundMode::CAST_RINT, rows * S);
    PipeBarrier<PIPE_ALL>();
    DataCopy(ws_t_[at_p + r0 * S], p, rows * S);
  }
  CrossCoreSetFlag<2, PIPE_MTE3>(kFlagProbs);
  CrossCoreWaitFlag<2, PIPE_MTE2>(kFlagPv);
  if (rows > 0) {
    LocalTensor<float> pv = qf_buf_.Get<float>(), acc = acc_buf_.Get<float>();  // [rows, D]; qf is free here
    DataCopy(pv, ws_f_[at_pv + r0 * D], rows * D);
    if (t_.quant) Muls(pv, pv, v_max, rows * D);
    Add(acc, acc, pv, rows * D);
  }
}

// AIV, int8 caches: n int8 rows of D widened to T (exact: |q| <= 127) and written to the workspace at `at`.
__aicore__ inline void Widen(const LocalTensor<C> &src, int32_t n, uint64_t at) {
  const uint32_t count = uint32_t(n) * t_.head_dim;
  LocalTensor<half> h = stage_buf_.Get<half>();  // [span, D]
  Cast(h, src, RoundMode::CAST_NONE, count);
  if constexpr (std::is_same<T, half>::value) {
    PipeBarrier<PIPE_ALL>();
    DataCopy(ws_t_[at], h, count);
  } else {  // int8 -> float16 -> float32 -> bfloat16, each step exact
    LocalTensor<float> f = kf_buf_.Get<float>();  // [span, D]
    Cast(f, h, RoundMode::CAST_NONE, count);
    LocalTensor<T> w = stage_buf_.Get<T>();
    Cast(w, f, RoundMode::CAST_RINT, count);
    PipeBarrier<PIPE_ALL>();
    DataCopy(ws_t_[at], w, count);
  }
}
