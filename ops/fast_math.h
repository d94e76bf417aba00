// Elementwise math shared by the kernels, written as plain arithmetic so that loops vectorise.
#ifndef MS_ATB_OPS_FAST_MATH_H_
#define MS_ATB_OPS_FAST_MATH_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace ms_atb {

// exp(x) for x <= 0 (Cephes-style polynomial, ~1 ulp; 0 below -87); plain arithmetic so that loops vectorise.
inline float ExpNonPositive(float in) {
  const float x = in < -87.0f ? -87.0f : in;
  const float n = __builtin_floorf(x * 1.44269504f + 0.5f);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const float scale = __builtin_bit_cast(float, (static_cast<int32_t>(n) + 127) << 23);
  return in < -87.0f ? 0.0f : y * scale;
}

// x * sigmoid(x), through exp(-|x|) so that the exponential never overflows.
inline float Silu(float x) {
  const float e = ExpNonPositive(-__builtin_fabsf(x));
  const float num = x >= 0.0f ? 1.0f : e;  // a select, so that loops over Silu vectorise
  return x * num / (1.0f + e);
}

}  // namespace ms_atb

#endif  // MS_ATB_OPS_FAST_MATH_H_
