// MsAtbReshapeAndCache: writes this step's key/value rows into their cache slots, in place.
//   key, value [T, KVH, D]; key_cache, value_cache [NB, BS, KVH, D]; slot_mapping [T] int32
//   (slot = block * BS + offset; a negative slot is skipped); key_scale_cache, value_scale_cache
//   [NB, BS, KVH] float32 (int8 caches only) -> done [1] int32 (1).
// Core i copies the rows of tokens i, i + block_dim, ... through the unified buffer, chunk by chunk.
// int8 caches: each (token, KV head) row of D values is quantised on its own, as ops/reshape_and_cache.cc
// does: scale = max|x| / 127, q = round_half_even(x * (127 / max|x|)) (an all-zero or non-finite row: q 0,
// scale 0); the scale goes to slot * KVH + head of the scale cache.
#include <type_traits>

#include "kernel_operator.h"

using namespace AscendC;

namespace {

template <typename T, typename C>  // T: the rows' type; C: the caches' (T, or int8_t)
class ReshapeAndCacheKernel {
 public:
  __aicore__ inline void Init(GM_ADDR key, GM_ADDR value, GM_ADDR key_cache, GM_ADDR value_cache, GM_ADDR slot_mapping,
                              GM_ADDR key_scales, GM_ADDR value_scales, GM_ADDR done,
                              const MsAtbReshapeAndCacheTilingData &td) {
    t_ = td;
    const uint64_t rows = uint64_t{td.num_tokens} * td.row_elems, cache = uint64_t{td.num_slots} * td.row_elems;
    key_.SetGlobalBuffer((__gm__ T *)key, rows);                   // [T, KVH, D]
    value_.SetGlobalBuffer((__gm__ T *)value, rows);               // [T, KVH, D]
    key_cache_.SetGlobalBuffer((__gm__ C *)key_cache, cache);      // [NB, BS, KVH, D]
    value_cache_.SetGlobalBuffer((__gm__ C *)value_cache, cache);  // [NB, BS, KVH, D]
    slots_.SetGlobalBuffer((__gm__ int32_t *)slot_mapping, td.num_tokens);  // [T]
    done_.SetGlobalBuffer((__gm__ int32_t *)done, 1);                       // [1]
    pipe_.InitBuffer(stage_, 2, td.chunk_bytes);
    if (td.quant) {
      key_scales_.SetGlobalBuffer((__gm__ float *)key_scales, uint64_t{td.num_slots} * td.num_kv_heads);      // [NB, BS, KVH]
      value_scales_.SetGlobalBuffer((__gm__ float *)value_scales, uint64_t{td.num_slots} * td.num_kv_heads);  // [NB, BS, KVH]
      pipe_.InitBuffer(f32_buf_, td.f32_bytes);
      pipe_.InitBuffer(i32_buf_, td.i32_bytes);
      pipe_.InitBuffer(half_buf_, td.half_bytes);
      pipe_.InitBuffer(q8_out_, 2, td.int8_bytes);
      pipe_.InitBuffer(scale_out_, 2, td.scale_bytes);
      pipe_.InitBuffer(work_buf_, td.work_bytes);
      pipe_.InitBuffer(max_buf_, td.work_bytes);
    }
  }

  __aicore__ inline void Process() {
    for (uint32_t t = GetBlockIdx(); t < t_.num_tokens; t += t_.block_dim) {
      const int32_t slot = slots_.GetValue(t);
      if (slot < 0) continue;
      for (uint32_t e = 0; e < t_.row_elems; e += t_.chunk_elems) {
        const uint64_t to = uint64_t(slot) * t_.row_elems + e, from = uint64_t{t} * t_.row_elems + e;
        if constexpr (std::is_same<C, T>::value) {
          Move(key_cache_[to], key_[from]);
          Move(value_cache_[to], value_[from]);
        } else {
          const uint64_t scale_at = to / t_.head_dim;  // slot * KVH + first head of the chunk
          Quantize(key_cache_[to], key_scales_[scale_at], key_[from]);
          Quantize(value_cache_[to], value_scales_[scale_at], value_[from]);
        }
      }
    }
    if (GetBlockIdx() == 0) {
      done_.SetValue(0, 1);
      DataCacheCleanAndInvalid<int32_t, CacheLine::SINGLE_CACHE_LINE, DcciDst::CACHELINE_OUT>(done_);
    }
  }

 private:
  __aicore__ inline void Move(const GlobalTensor<C> &dst, const GlobalTensor<T> &src) {
    LocalTensor<T> buf = stage_.AllocTensor<T>();  // [chunk_elems]
    DataCopy(buf, src, t_.chunk_elems);
    stage_.EnQue(buf);
    buf = stage_.DeQue<T>();
    DataCopy(dst, buf, t_.chunk_elems);
    stage_.FreeTensor(buf);
  }

  // One chunk (whole heads) of a row quantised: its int8 values to dst, its heads' scales to scales.
  __aicore__ inline void Quantize(const GlobalTensor<C> &dst, const GlobalTensor<float> &scales,
                                  const GlobalTensor<T> &src) {
    const uint32_t D = t_.head_dim, n = t_.chunk_elems, heads = n / D;
    LocalTensor<T> x = stage_.AllocTensor<T>();  // [chunk]
    DataCopy(x, src, n);
    stage_.EnQue(x);
    x = stage_.DeQue<T>();
    LocalTensor<float> f = f32_buf_.Get<float>(), work = work_buf_.Get<float>(), mx = max_buf_.Get<float>();
    Cast(f, x, RoundMode::CAST_NONE, n);
    stage_.FreeTensor(x);
    LocalTensor<float> sc = scale_out_.AllocTensor<float>();  // [heads]
    for (uint32_t h = 0; h < heads; ++h) {
      Abs(work, f[h * D], D);
      ReduceMax(mx, work, work, D);
      PipeBarrier<PIPE_ALL>();
      const float amax = mx.GetValue(0);
      if (!(amax > 0.0f) || !(amax <= 3.4028235e38f)) {  // zeros, or a non-finite row: stored as zeros
        Duplicate(f[h * D], 0.0f, D);
        sc.SetValue(h, 0.0f);
      } else {
        Muls(f[h * D], f[h * D], 127.0f / amax, D);
        sc.SetValue(h, amax / 127.0f);
      }
    }
    // round half to even in int32, then exact steps down to int8 (|q| <= 127 is exact in float16)
    LocalTensor<int32_t> i32 = i32_buf_.Get<int32_t>();
    LocalTensor<half> h16 = half_buf_.Get<half>();
    Cast(i32, f, RoundMode::CAST_RINT, n);
    Cast(f, i32, RoundMode::CAST_NONE, n);
    Mins(f, f, 127.0f, n);
    Maxs(f, f, -127.0f, n);
    Cast(h16, f, RoundMode::CAST_RINT, n);
    LocalTensor<C> q = q8_out_.AllocTensor<C>();  // [chunk]
    Cast(q, h16, RoundMode::CAST_RINT, n);
    q8_out_.EnQue(q);
    q = q8_out_.DeQue<C>();
    DataCopy(dst, q, n);
    q8_out_.FreeTensor(q);
    scale_out_.EnQue(sc);
    sc = scale_out_.DeQue<float>();
    // heads x 4 bytes at any address: a byte-exact copy, so cores writing neighbouring slots never overlap
    DataCopyPad(scales, sc, DataCopyExtParams(1, heads * sizeof(float), 0, 0, 0));
    scale_out_.FreeTensor(sc);
  }

  MsAtbReshapeAndCacheTilingData t_;
  TPipe pipe_;
  TQueBind<TPosition::VECIN, TPosition::VECOUT, 2> stage_;
  TQue<QuePosition::VECOUT, 2> q8_out_, scale_out_;
  TBuf<TPosition::VECCALC> f32_buf_, i32_buf_, half_buf_, work_buf_, max_buf_;
  GlobalTensor<T> key_, value_;
  GlobalTensor<C> key_cache_, value_cache_;
  GlobalTensor<float> key_scales_, value_scales_;
  GlobalTensor<int32_t> slots_, done_;
};

}  // namespace

// Tiling key 0: float16; 1: bfloat16; 2: float16 rows into int8 caches; 3: bfloat16 rows into int8 caches.
extern "C" __global__ __aicore__ void ms_atb_reshape_and_cache(GM_ADDR key, GM_ADDR value, GM_ADDR key_cache,
                                                               GM_ADDR value_cache, GM_ADDR slot_mapping,
                                                               GM_ADDR key_scale_cache, GM_ADDR value_scale_cache,
                                                               GM_ADDR done, GM_ADDR workspace, GM_ADDR tiling) {
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
  GET_TILING_DATA_WITH_STRUCT(MsAtbReshapeAndCacheTilingData, td, tiling);
#define MS_ATB_RUN(T, C)                                                                                          \
  {                                                                                                               \
    ReshapeAndCacheKernel<T, C> op;                                                                               \
    op.Init(key, value, key_cache, value_cache, slot_mapping, key_scale_cache, value_scale_cache, done, td);      \
    op.Process();                                                                                                 \
  }
  if (TILING_KEY_IS(0)) MS_ATB_RUN(half, half)
  else if (TILING_KEY_IS(1)) MS_ATB_RUN(bfloat16_t, bfloat16_t)
  else if (TILING_KEY_IS(2)) MS_ATB_RUN(half, int8_t)
  else if (TILING_KEY_IS(3)) MS_ATB_RUN(bfloat16_t, int8_t)
#undef MS_ATB_RUN
}
