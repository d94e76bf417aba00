// MsAtbReshapeAndCache: writes this step's key/value rows into their cache slots, in place.
//   key, value [T, KVH, D]; key_cache, value_cache [NB, BS, KVH, D]; slot_mapping [T] int32
//   (slot = block * BS + offset; a negative slot is skipped) -> done [1] int32 (1).
// Core i copies the rows of tokens i, i + block_dim, ... through the unified buffer, chunk by chunk.
#include "kernel_operator.h"

using namespace AscendC;

namespace {

template <typename T>
class ReshapeAndCacheKernel {
 public:
  __aicore__ inline void Init(GM_ADDR key, GM_ADDR value, GM_ADDR key_cache, GM_ADDR value_cache, GM_ADDR slot_mapping,
                              GM_ADDR done, const MsAtbReshapeAndCacheTilingData &td) {
    t_ = td;
    const uint64_t rows = uint64_t{td.num_tokens} * td.row_elems, cache = uint64_t{td.num_slots} * td.row_elems;
    key_.SetGlobalBuffer((__gm__ T *)key, rows);                   // [T, KVH, D]
    value_.SetGlobalBuffer((__gm__ T *)value, rows);               // [T, KVH, D]
    key_cache_.SetGlobalBuffer((__gm__ T *)key_cache, cache);      // [NB, BS, KVH, D]
    value_cache_.SetGlobalBuffer((__gm__ T *)value_cache, cache);  // [NB, BS, KVH, D]
    slots_.SetGlobalBuffer((__gm__ int32_t *)slot_mapping, td.num_tokens);  // [T]
    done_.SetGlobalBuffer((__gm__ int32_t *)done, 1);                       // [1]
    pipe_.InitBuffer(stage_, 2, td.chunk_bytes);
  }

  __aicore__ inline void Process() {
    for (uint32_t t = GetBlockIdx(); t < t_.num_tokens; t += t_.block_dim) {
      const int32_t slot = slots_.GetValue(t);
      if (slot < 0) continue;
      for (uint32_t e = 0; e < t_.row_elems; e += t_.chunk_elems) {
        Move(key_cache_[uint64_t(slot) * t_.row_elems + e], key_[uint64_t{t} * t_.row_elems + e]);
        Move(value_cache_[uint64_t(slot) * t_.row_elems + e], value_[uint64_t{t} * t_.row_elems + e]);
      }
    }
    if (GetBlockIdx() == 0) {
      done_.SetValue(0, 1);
      DataCacheCleanAndInvalid<int32_t, CacheLine::SINGLE_CACHE_LINE, DcciDst::CACHELINE_OUT>(done_);
    }
  }

 private:
  __aicore__ inline void Move(const GlobalTensor<T> &dst, const GlobalTensor<T> &src) {
    LocalTensor<T> buf = stage_.AllocTensor<T>();  // [chunk_elems]
    DataCopy(buf, src, t_.chunk_elems);
    stage_.EnQue(buf);
    buf = stage_.DeQue<T>();
    DataCopy(dst, buf, t_.chunk_elems);
    stage_.FreeTensor(buf);
  }

  MsAtbReshapeAndCacheTilingData t_;
  TPipe pipe_;
  TQueBind<TPosition::VECIN, TPosition::VECOUT, 2> stage_;
  GlobalTensor<T> key_, value_, key_cache_, value_cache_;
  GlobalTensor<int32_t> slots_, done_;
};

}  // namespace

// Tiling key 0: float16; 1: bfloat16.
extern "C" __global__ __aicore__ void ms_atb_reshape_and_cache(GM_ADDR key, GM_ADDR value, GM_ADDR key_cache,
                                                               GM_ADDR value_cache, GM_ADDR slot_mapping, GM_ADDR done,
                                                               GM_ADDR workspace, GM_ADDR tiling) {
  GET_TILING_DATA_WITH_STRUCT(MsAtbReshapeAndCacheTilingData, td, tiling);
  if (TILING_KEY_IS(0)) {
    ReshapeAndCacheKernel<half> op;
    op.Init(key, value, key_cache, value_cache, slot_mapping, done, td);
    op.Process();
  } else if (TILING_KEY_IS(1)) {
    ReshapeAndCacheKernel<bfloat16_t> op;
    op.Init(key, value, key_cache, value_cache, slot_mapping, done, td);
    op.Process();
  }
}
