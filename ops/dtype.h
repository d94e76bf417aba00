// Element types of the kernels: float32, float16 and bfloat16, converted to float32 for compute, and int8
// (KV-cache storage only, with a float32 scale per token and KV head: value = q * scale).
#ifndef MS_ATB_OPS_DTYPE_H_
#define MS_ATB_OPS_DTYPE_H_

#include <cstdint>
#include <cstring>

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace ms_atb {

struct Half { uint16_t bits; };
struct BFloat16 { uint16_t bits; };

enum class DType { kFloat32, kFloat16, kBFloat16, kInt8, kInt32, kOther };

inline DType ParseDType(const char *name) {
  if (std::strcmp(name, "float32") == 0) return DType::kFloat32;
  if (std::strcmp(name, "float16") == 0) return DType::kFloat16;
  if (std::strcmp(name, "bfloat16") == 0) return DType::kBFloat16;
  if (std::strcmp(name, "int8") == 0) return DType::kInt8;
  if (std::strcmp(name, "int32") == 0) return DType::kInt32;
  return DType::kOther;
}

inline float ToFloat(float x) { return x; }
inline float ToFloat(BFloat16 x) {
  uint32_t u = static_cast<uint32_t>(x.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float ToFloat(Half x) {
#if defined(__F16C__)
  return _cvtsh_ss(x.bits);
#else
  uint32_t sign = (x.bits & 0x8000u) << 16, exp = (x.bits >> 10) & 0x1f, man = x.bits & 0x3ffu, u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal
      exp = 127 - 15 + 1;
      while ((man & 0x400u) == 0) { man <<= 1; --exp; }
      u = sign | (exp << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

template <typename T> T FromFloat(float x);
template <> inline float FromFloat<float>(float x) { return x; }
template <> inline BFloat16 FromFloat<BFloat16>(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return BFloat16{static_cast<uint16_t>((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return BFloat16{static_cast<uint16_t>(u >> 16)};
}
template <> inline Half FromFloat<Half>(float x) {
#if defined(__F16C__)
  return Half{_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT)};
#else
  uint32_t u;
  std::memcpy(&u, &x, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  int32_t exp = static_cast<int32_t>((u >> 23) & 0xff) - 127 + 15;
  uint32_t man = u & 0x7fffffu;
  if (((u >> 23) & 0xff) == 0xff) return Half{static_cast<uint16_t>(sign | 0x7c00u | (man ? 0x200u : 0))};
  if (exp >= 31) return Half{static_cast<uint16_t>(sign | 0x7c00u)};
  if (exp <= 0) {
    if (exp < -10) return Half{static_cast<uint16_t>(sign)};
    man |= 0x800000u;
    uint32_t shift = static_cast<uint32_t>(14 - exp);
    uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return Half{static_cast<uint16_t>(sign | half)};
  }
  uint32_t half = sign | (static_cast<uint32_t>(exp) << 10) | (man >> 13), rem = man & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;
  return Half{static_cast<uint16_t>(half)};
#endif
}

// n values of a float16 or bfloat16 tensor to float32 (to = true: back, rounded).
template <typename T>
void Convert(void *narrow, float *wide, int64_t n, bool to) {
  T *x = static_cast<T *>(narrow);
  if (to) {
    for (int64_t i = 0; i < n; ++i) x[i] = FromFloat<T>(wide[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) wide[i] = ToFloat(x[i]);
  }
}

}  // namespace ms_atb

#endif  // MS_ATB_OPS_DTYPE_H_
