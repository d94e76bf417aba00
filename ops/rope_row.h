// One head of rotary embedding, shared by the RotaryEmbedding and RopeAndCache kernels.
#pragma once

#include <cstdint>

namespace ms_atb {

// y [D] = x * cos + x[perm] * sin; the signs folded into sin and perm encode rotate-half or
// interleaved pairs. y must not alias x.
inline void RotateHead(const float *x, const float *cos, const float *sin, const int32_t *perm, int64_t D,
                       float *y) {
  for (int64_t d = 0; d < D; ++d) y[d] = x[d] * cos[d] + x[perm[d]] * sin[d];
}

}  // namespace ms_atb
