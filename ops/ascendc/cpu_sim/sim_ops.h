// CPU implementation of the Ascend C API subset: DataCopy between global and local memory, and the
// vector instructions the kernels use (element-wise, scalar, reductions, casts). Every operand is
// checked: alive, in bounds, 32-byte aligned where the hardware requires it.
#ifndef MS_ATB_ASCENDC_SIM_OPS_H_
#define MS_ATB_ASCENDC_SIM_OPS_H_

#include <algorithm>
#include <limits>
#include <type_traits>

#include "sim_tensor.h"

namespace AscendC {

struct DataCopyParams {
  uint16_t blockCount = 1;  // number of contiguous pieces
  uint16_t blockLen = 0;    // length of each piece, in 32-byte blocks
  uint16_t srcStride = 0;   // gap between pieces in the source, in 32-byte blocks
  uint16_t dstStride = 0;   // gap between pieces in the destination, in 32-byte blocks
  DataCopyParams() = default;
  DataCopyParams(uint16_t count, uint16_t len, uint16_t src_stride, uint16_t dst_stride)
      : blockCount(count), blockLen(len), srcStride(src_stride), dstStride(dst_stride) {}
};

namespace detail {
inline void CheckCopy(uint64_t bytes, uint64_t local_address, uint64_t gm_offset) {
  SIM_REQUIRE(bytes % kBlockBytes == 0, "copy alignment",
              "DataCopy of " + std::to_string(bytes) + " bytes, not a whole number of 32-byte blocks");
  SIM_REQUIRE(local_address % kBlockBytes == 0, "copy alignment",
              "DataCopy at local address " + std::to_string(local_address) + ", not 32-byte aligned");
  SIM_REQUIRE(gm_offset % kBlockBytes == 0, "copy alignment",
              "DataCopy at global offset " + std::to_string(gm_offset) + " bytes, not 32-byte aligned");
}
template <typename T>
T *Operand(const LocalTensor<T> &t, int32_t count, const char *op) {
  SIM_REQUIRE(count >= 0, "local bounds", std::string(op) + " with a negative count");
  RequireCore(CoreType::kAiv, "the vector instruction ", op);
  SIM_REQUIRE(t.Slot() == nullptr || InMemory(t.GetPosition(), "unified buffer"), "operand position",
              std::string(op) + " operand in " + MemoryName(t.GetPosition()) +
                  ": vector instructions take unified-buffer tensors");
  SIM_REQUIRE(t.Address() % kBlockBytes == 0, "vector operand alignment",
              std::string(op) + " operand at local address " + std::to_string(t.Address()) + ", not 32-byte aligned");
  return t.Data(0, static_cast<uint32_t>(count));
}
}  // namespace detail

// Global -> local, count contiguous elements.
template <typename T>
void DataCopy(const LocalTensor<T> &dst, const GlobalTensor<T> &src, uint32_t count) {
  uint64_t gm_offset;
  const T *from = src.Span(count, &gm_offset);
  detail::CheckCopy(count * sizeof(T), dst.Address(), gm_offset);
  std::memcpy(dst.Data(0, count), from, count * sizeof(T));
}

// Local -> global, count contiguous elements.
template <typename T>
void DataCopy(const GlobalTensor<T> &dst, const LocalTensor<T> &src, uint32_t count) {
  uint64_t gm_offset;
  T *to = dst.Span(count, &gm_offset);
  detail::CheckCopy(count * sizeof(T), src.Address(), gm_offset);
  std::memcpy(to, src.Data(0, count), count * sizeof(T));
}

// Global -> local in blockCount pieces of blockLen blocks, the strides (in blocks) between pieces.
template <typename T>
void DataCopy(const LocalTensor<T> &dst, const GlobalTensor<T> &src, const DataCopyParams &p) {
  const uint64_t piece = p.blockLen * kBlockBytes / sizeof(T);
  const uint64_t src_step = piece + p.srcStride * kBlockBytes / sizeof(T);
  const uint64_t dst_step = piece + p.dstStride * kBlockBytes / sizeof(T);
  SIM_REQUIRE(p.blockCount > 0 && p.blockLen > 0, "copy alignment", "DataCopyParams with an empty piece");
  uint64_t gm_offset;
  const T *from = src.Span((p.blockCount - 1) * src_step + piece, &gm_offset);
  detail::CheckCopy(piece * sizeof(T), dst.Address(), gm_offset);
  T *to = dst.Data(0, static_cast<uint32_t>((p.blockCount - 1) * dst_step + piece));
  for (uint16_t i = 0; i < p.blockCount; ++i) std::memcpy(to + i * dst_step, from + i * src_step, piece * sizeof(T));
}

// Local -> global in pieces, as above.
template <typename T>
void DataCopy(const GlobalTensor<T> &dst, const LocalTensor<T> &src, const DataCopyParams &p) {
  const uint64_t piece = p.blockLen * kBlockBytes / sizeof(T);
  const uint64_t src_step = piece + p.srcStride * kBlockBytes / sizeof(T);
  const uint64_t dst_step = piece + p.dstStride * kBlockBytes / sizeof(T);
  SIM_REQUIRE(p.blockCount > 0 && p.blockLen > 0, "copy alignment", "DataCopyParams with an empty piece");
  uint64_t gm_offset;
  T *to = dst.Span((p.blockCount - 1) * dst_step + piece, &gm_offset);
  detail::CheckCopy(piece * sizeof(T), src.Address(), gm_offset);
  const T *from = src.Data(0, static_cast<uint32_t>((p.blockCount - 1) * src_step + piece));
  for (uint16_t i = 0; i < p.blockCount; ++i) std::memcpy(to + i * dst_step, from + i * src_step, piece * sizeof(T));
}

#define MS_ATB_SIM_BINARY(Name, expr)                                                                  \
  template <typename T>                                                                                \
  void Name(const LocalTensor<T> &dst, const LocalTensor<T> &src0, const LocalTensor<T> &src1,         \
            const int32_t count) {                                                                     \
    const T *a = detail::Operand(src0, count, #Name), *b = detail::Operand(src1, count, #Name);        \
    T *d = detail::Operand(dst, count, #Name);                                                         \
    for (int32_t i = 0; i < count; ++i) d[i] = (expr);                                                 \
  }
MS_ATB_SIM_BINARY(Add, a[i] + b[i])
MS_ATB_SIM_BINARY(Sub, a[i] - b[i])
MS_ATB_SIM_BINARY(Mul, a[i] * b[i])
MS_ATB_SIM_BINARY(Div, a[i] / b[i])
MS_ATB_SIM_BINARY(Max, std::max(a[i], b[i]))
MS_ATB_SIM_BINARY(Min, std::min(a[i], b[i]))
#undef MS_ATB_SIM_BINARY

#define MS_ATB_SIM_SCALAR(Name, expr)                                                                  \
  template <typename T>                                                                                \
  void Name(const LocalTensor<T> &dst, const LocalTensor<T> &src, const T scalar, const int32_t count) { \
    const T *a = detail::Operand(src, count, #Name);                                                   \
    T *d = detail::Operand(dst, count, #Name);                                                         \
    for (int32_t i = 0; i < count; ++i) d[i] = (expr);                                                 \
  }
MS_ATB_SIM_SCALAR(Adds, a[i] + scalar)
MS_ATB_SIM_SCALAR(Muls, a[i] * scalar)
MS_ATB_SIM_SCALAR(Maxs, std::max(a[i], scalar))
#undef MS_ATB_SIM_SCALAR

// dst += src * scalar
template <typename T>
void Axpy(const LocalTensor<T> &dst, const LocalTensor<T> &src, const T scalar, const int32_t count) {
  const T *a = detail::Operand(src, count, "Axpy");
  T *d = detail::Operand(dst, count, "Axpy");
  for (int32_t i = 0; i < count; ++i) d[i] += a[i] * scalar;
}

template <typename T>
void Exp(const LocalTensor<T> &dst, const LocalTensor<T> &src, const int32_t count) {
  static_assert(std::is_same<T, float>::value, "the kernels take Exp in float32");
  const T *a = detail::Operand(src, count, "Exp");
  T *d = detail::Operand(dst, count, "Exp");
  for (int32_t i = 0; i < count; ++i) d[i] = std::exp(a[i]);
}

template <typename T>
void Duplicate(const LocalTensor<T> &dst, const T scalar, const int32_t count) {
  T *d = detail::Operand(dst, count, "Duplicate");
  for (int32_t i = 0; i < count; ++i) d[i] = scalar;
}

// dst[0] = max / sum of src[0:count]; work is the instruction's scratch (count elements at most).
template <typename T>
void ReduceMax(const LocalTensor<T> &dst, const LocalTensor<T> &src, const LocalTensor<T> &work, const int32_t count) {
  SIM_REQUIRE(count > 0, "local bounds", "ReduceMax of no elements");
  const T *a = detail::Operand(src, count, "ReduceMax");
  detail::Operand(work, 1, "ReduceMax");
  T lanes[8];
  for (int j = 0; j < 8; ++j) lanes[j] = a[0];
  int32_t i = 0;
  for (; i + 8 <= count; i += 8)
    for (int j = 0; j < 8; ++j) lanes[j] = lanes[j] > a[i + j] ? lanes[j] : a[i + j];
  for (; i < count; ++i) lanes[0] = lanes[0] > a[i] ? lanes[0] : a[i];
  T m = lanes[0];
  for (int j = 1; j < 8; ++j) m = m > lanes[j] ? m : lanes[j];
  detail::Operand(dst, 1, "ReduceMax")[0] = m;
}
template <typename T>
void ReduceSum(const LocalTensor<T> &dst, const LocalTensor<T> &src, const LocalTensor<T> &work, const int32_t count) {
  SIM_REQUIRE(count > 0, "local bounds", "ReduceSum of no elements");
  const T *a = detail::Operand(src, count, "ReduceSum");
  detail::Operand(work, 1, "ReduceSum");
  T lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // 8 partial sums, added pairwise at the end, as a tree reduction does
  int32_t i = 0;
  for (; i + 8 <= count; i += 8)
    for (int j = 0; j < 8; ++j) lanes[j] += a[i + j];
  for (; i < count; ++i) lanes[i % 8] += a[i];
  detail::Operand(dst, 1, "ReduceSum")[0] =
      ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
}

namespace detail {
template <typename T>
float ToFloat(T x) { return static_cast<float>(x); }
template <typename D>
D FromFloat(float x, RoundMode mode) {
  if constexpr (!std::is_integral<D>::value) {
    return D(x);
  } else {
  double r = mode == RoundMode::CAST_RINT ? std::nearbyint(x) : mode == RoundMode::CAST_ROUND ? std::round(x)
           : mode == RoundMode::CAST_FLOOR ? std::floor(x) : mode == RoundMode::CAST_CEIL ? std::ceil(x) : std::trunc(x);
  const double lo = static_cast<double>(std::numeric_limits<D>::min()), hi = static_cast<double>(std::numeric_limits<D>::max());
  return static_cast<D>(std::isnan(r) ? 0.0 : std::min(hi, std::max(lo, r)));  // saturating
  }
}
template <typename D, typename S>
constexpr bool Is() { return std::is_same<D, S>::value; }
}  // namespace detail

// The conversions the kernels use, with the round modes the hardware takes for them: widening (16-bit float
// -> float32, int8 -> float16, int32 -> float32) with CAST_NONE; float32 -> 16-bit float with CAST_RINT
// (round to nearest even); float32 -> int32 and float16 -> int8 with an integer rounding mode (saturating).
template <typename D, typename S>
void Cast(const LocalTensor<D> &dst, const LocalTensor<S> &src, const RoundMode mode, const uint32_t count) {
  using detail::Is;
  constexpr bool f16 = Is<S, half>() || Is<S, bfloat16_t>(), to16 = Is<D, half>() || Is<D, bfloat16_t>();
  constexpr bool widening = (f16 && Is<D, float>()) || (Is<S, int8_t>() && Is<D, half>()) ||
                            (Is<S, int32_t>() && Is<D, float>());
  constexpr bool to_int = (Is<S, float>() && Is<D, int32_t>()) || (Is<S, half>() && Is<D, int8_t>());
  static_assert(widening || to_int || (Is<S, float>() && to16), "a Cast the kernels do not use");
  const S *a = detail::Operand(src, static_cast<int32_t>(count), "Cast");
  D *d = detail::Operand(dst, static_cast<int32_t>(count), "Cast");
  if (widening) SIM_REQUIRE(mode == RoundMode::CAST_NONE, "cast mode", "a widening Cast takes RoundMode::CAST_NONE");
  else if (!to_int)
    SIM_REQUIRE(mode == RoundMode::CAST_RINT, "cast mode", "the kernels narrow with RoundMode::CAST_RINT");
  else SIM_REQUIRE(mode != RoundMode::CAST_NONE && mode != RoundMode::CAST_ODD, "cast mode",
                   "a Cast to an integer type names its rounding");
  for (uint32_t i = 0; i < count; ++i) d[i] = detail::FromFloat<D>(detail::ToFloat(a[i]), mode);
}

template <typename T>
void Abs(const LocalTensor<T> &dst, const LocalTensor<T> &src, const int32_t count) {
  const T *a = detail::Operand(src, count, "Abs");
  T *d = detail::Operand(dst, count, "Abs");
  for (int32_t i = 0; i < count; ++i) d[i] = std::fabs(a[i]);
}

template <typename T>
void Mins(const LocalTensor<T> &dst, const LocalTensor<T> &src, const T scalar, const int32_t count) {
  const T *a = detail::Operand(src, count, "Mins");
  T *d = detail::Operand(dst, count, "Mins");
  for (int32_t i = 0; i < count; ++i) d[i] = std::min(a[i], scalar);
}

struct DataCopyExtParams {
  uint16_t blockCount = 1;  // pieces
  uint32_t blockLen = 0;    // bytes of each piece: any number
  uint32_t srcStride = 0;   // local -> global: 32-byte blocks between the local pieces
  uint32_t dstStride = 0;   // local -> global: bytes between the global pieces
  uint32_t rsv = 0;
  DataCopyExtParams() = default;
  DataCopyExtParams(uint16_t count, uint32_t len, uint32_t src_stride, uint32_t dst_stride, uint32_t r)
      : blockCount(count), blockLen(len), srcStride(src_stride), dstStride(dst_stride), rsv(r) {}
};

// Local -> global of pieces of any byte length: the copy writes those bytes only (its global address
// need not be 32-byte aligned; the local one must).
template <typename T>
void DataCopyPad(const GlobalTensor<T> &dst, const LocalTensor<T> &src, const DataCopyExtParams &p) {
  SIM_REQUIRE(p.blockCount > 0 && p.blockLen > 0 && p.blockLen % sizeof(T) == 0, "copy alignment",
              "DataCopyPad of an empty piece or of part of an element");
  SIM_REQUIRE(src.Address() % kBlockBytes == 0, "copy alignment",
              "DataCopyPad from a local address not 32-byte aligned");
  const uint64_t piece = p.blockLen / sizeof(T), local_step = (p.blockLen + kBlockBytes - 1) / kBlockBytes * kBlockBytes /
                                                                  sizeof(T) + p.srcStride * kBlockBytes / sizeof(T);
  const uint64_t global_step = piece + p.dstStride / sizeof(T);
  uint64_t gm_offset;
  T *to = dst.Span((p.blockCount - 1) * global_step + piece, &gm_offset);
  const T *from = src.Data(0, static_cast<uint32_t>((p.blockCount - 1) * local_step + piece));
  for (uint16_t i = 0; i < p.blockCount; ++i) std::memcpy(to + i * global_step, from + i * local_step, p.blockLen);
}

}  // namespace AscendC

#endif  // MS_ATB_ASCENDC_SIM_OPS_H_
