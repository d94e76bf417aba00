// CPU implementation of the Cube-unit subset of the Ascend C API: global memory -> L1 with the ND -> NZ
// conversion (DataCopy with Nd2NzParams), L1 -> L0A / L0B (LoadData, 2D), the matrix multiply into L0C
// (Mmad), L0C -> global memory with the NZ -> ND conversion (Fixpipe), and InitConstValue for L1 / L0.
// Our own code, written from the public documentation of the API's names, signatures and layouts.
//
// Layouts, for 16-bit types (a fractal is 16 x 16 elements, 512 bytes; C0 = 16 elements = 32 bytes):
//   L1 (A1, B1), "NZ": a [rows, cols] matrix as cols / 16 column blocks of C0Stride rows x 16, row-major:
//       (r, c) at (c / 16) * C0Stride * 16 + r * 16 + c % 16
//   L0A (A2), "zZ": A [M, K] as M/16 x K/16 fractals in row-major order, each row-major inside:
//       (m, k) at ((m / 16) * (K / 16) + k / 16) * 256 + (m % 16) * 16 + k % 16
//   L0B (B2), "nZ": B [K, N] as K/16 x N/16 fractals in row-major order, each column-major inside:
//       (k, n) at ((k / 16) * (N / 16) + n / 16) * 256 + (n % 16) * 16 + k % 16
//   L0C (CO1), "NZ" of float: C [M, N] at ((n / 16) * (M / 16) + m / 16) * 256 + (m % 16) * 16 + n % 16
// Rules enforced (besides those of sim_core.h):
//   "cube operand position": Mmad takes A from L0A, B from L0B and writes L0C; LoadData goes L1 -> L0A / L0B;
//                            Nd2Nz copies land in L1; Fixpipe reads L0C
//   "core type"            : every one of these runs on the AIC (the Cube core of a group)
//   "cube shape"           : Mmad's m, n, k are whole fractals (multiples of 16) within [16, 4095], and the
//                            operands hold them (an overflow of an L0 tensor is caught here or by "local bounds")
#ifndef MS_ATB_ASCENDC_SIM_CUBE_H_
#define MS_ATB_ASCENDC_SIM_CUBE_H_

#include <type_traits>
#include <vector>

#include "sim_ops.h"

namespace AscendC {

constexpr uint32_t kFractal = 16;                       // rows and columns of a 16-bit fractal
constexpr uint32_t kFractalElems = kFractal * kFractal;  // 256 elements, 512 bytes

struct Nd2NzParams {
  uint16_t ndNum = 1;               // ND matrices copied
  uint16_t nValue = 0;              // rows of each
  uint16_t dValue = 0;              // columns of each (elements)
  uint16_t srcNdMatrixStride = 0;   // elements between the source matrices
  uint16_t srcDValue = 0;           // elements between the rows of a source matrix
  uint16_t dstNzC0Stride = 0;       // rows (of C0 elements) between the column blocks of the destination
  uint16_t dstNzNStride = 1;        // rows (of C0 elements) between consecutive destination rows
  uint16_t dstNzMatrixStride = 0;   // elements between the destination matrices
  Nd2NzParams() = default;
  Nd2NzParams(uint16_t nd, uint16_t n, uint16_t d, uint16_t src_matrix, uint16_t src_d, uint16_t c0_stride,
              uint16_t n_stride, uint16_t dst_matrix)
      : ndNum(nd), nValue(n), dValue(d), srcNdMatrixStride(src_matrix), srcDValue(src_d), dstNzC0Stride(c0_stride),
        dstNzNStride(n_stride), dstNzMatrixStride(dst_matrix) {}
};

struct LoadData2DParams {
  uint16_t startIndex = 0;   // first source fractal
  uint8_t repeatTimes = 0;   // fractals copied
  uint16_t srcStride = 0;    // fractals between consecutive source fractals
  uint8_t sid = 0;
  uint16_t dstGap = 0;       // fractals left out between consecutive destination fractals
  bool ifTranspose = false;  // transpose each fractal
  uint8_t addrMode = 0;
  LoadData2DParams() = default;
  LoadData2DParams(uint16_t start, uint8_t repeat, uint16_t src_stride, uint8_t s, uint16_t gap, bool transpose,
                   uint8_t mode)
      : startIndex(start), repeatTimes(repeat), srcStride(src_stride), sid(s), dstGap(gap), ifTranspose(transpose),
        addrMode(mode) {}
};

struct MmadParams {
  uint16_t m = 0, n = 0, k = 0;
  bool isBias = false;
  int32_t fmOffset = 0;
  bool enSsparse = false, enWinogradA = false, enWinogradB = false;
  uint8_t unitFlag = 0;
  bool cmatrixInitVal = true;   // true: C = A * B; false: C += A * B
  bool cmatrixSource = false;
  MmadParams() = default;
  MmadParams(uint16_t m_, uint16_t n_, uint16_t k_, bool bias, int32_t offset, bool sparse, bool wa, bool wb)
      : m(m_), n(n_), k(k_), isBias(bias), fmOffset(offset), enSsparse(sparse), enWinogradA(wa), enWinogradB(wb) {}
};

enum class CO2Layout { NZ, ROW_MAJOR };
struct FixpipeConfig { CO2Layout format; };
constexpr FixpipeConfig CFG_ROW_MAJOR = {CO2Layout::ROW_MAJOR};
enum QuantMode_t { NoQuant };

struct FixpipeParamsV220 {
  uint16_t nSize = 0;       // columns written
  uint16_t mSize = 0;       // rows written
  uint16_t srcStride = 0;   // rows (of 16 elements) between the column blocks of the L0C matrix
  uint32_t dstStride = 0;   // elements between the rows written
  QuantMode_t quantPre = NoQuant;
  bool reluEn = false;
  FixpipeParamsV220() = default;
  FixpipeParamsV220(uint16_t n, uint16_t m, uint16_t src_stride, uint32_t dst_stride, bool relu)
      : nSize(n), mSize(m), srcStride(src_stride), dstStride(dst_stride), reluEn(relu) {}
};

template <typename T>
struct InitConstValueParams {
  uint16_t repeatTimes = 0;  // repeats
  uint16_t blockNum = 0;     // 32-byte blocks written per repeat
  uint16_t dstGap = 0;       // 32-byte blocks left out between repeats
  T initValue{};
  InitConstValueParams() = default;
  InitConstValueParams(uint16_t repeat, uint16_t blocks, uint16_t gap, T value)
      : repeatTimes(repeat), blockNum(blocks), dstGap(gap), initValue(value) {}
};

// The Cube instructions' operands sit where the hardware reads them; what (a std::string expression) names the
// misplacement and is built only when it happens.
#define SIM_CUBE_POSITION(ok, op, what) SIM_REQUIRE(ok, "cube operand position", std::string(op) + ": " + (what))

namespace detail {
template <typename T>
constexpr bool IsCube16() { return std::is_same<T, half>::value || std::is_same<T, bfloat16_t>::value; }
}  // namespace detail

// Global (ND) -> L1 (NZ): ndNum matrices of nValue rows x dValue columns.
template <typename T>
void DataCopy(const LocalTensor<T> &dst, const GlobalTensor<T> &src, const Nd2NzParams &p) {
  static_assert(detail::IsCube16<T>(), "the kernels feed the Cube 16-bit types");
  RequireCore(CoreType::kAic, "DataCopy with Nd2NzParams (global memory -> L1)");
  const std::string where = MemoryName(dst.GetPosition());
  SIM_CUBE_POSITION(where == "L1", "DataCopy with Nd2NzParams", "the destination is in " + where + ", not L1");
  SIM_REQUIRE(p.ndNum > 0 && p.nValue > 0 && p.dValue > 0, "copy alignment", "Nd2NzParams with an empty matrix");
  SIM_REQUIRE(p.dValue % kFractal == 0, "copy alignment",
              "Nd2NzParams dValue " + std::to_string(p.dValue) + ": not whole 32-byte column blocks");
  SIM_REQUIRE(p.dstNzC0Stride >= p.nValue && p.dValue <= p.srcDValue, "copy alignment",
              "Nd2NzParams strides shorter than the rows or columns they hold");
  SIM_REQUIRE(dst.Address() % kBlockBytes == 0, "copy alignment", "Nd2Nz destination not 32-byte aligned");
  const uint64_t last = uint64_t(p.ndNum - 1) * p.srcNdMatrixStride + uint64_t(p.nValue - 1) * p.srcDValue + p.dValue;
  uint64_t gm_offset;
  const T *from = src.Span(last, &gm_offset);
  const uint32_t extent = (p.ndNum - 1) * p.dstNzMatrixStride + (p.dValue / kFractal - 1) * p.dstNzC0Stride * kFractal +
                          (p.nValue - 1) * p.dstNzNStride * kFractal + kFractal;
  T *to = dst.Data(0, extent);
  for (uint32_t m = 0; m < p.ndNum; ++m)
    for (uint32_t r = 0; r < p.nValue; ++r)
      for (uint32_t c = 0; c < p.dValue; ++c)
        to[m * p.dstNzMatrixStride + (c / kFractal) * p.dstNzC0Stride * kFractal + r * p.dstNzNStride * kFractal +
           c % kFractal] = from[m * p.srcNdMatrixStride + r * p.srcDValue + c];
}

// L1 -> L0A / L0B, fractal by fractal (each transposed when ifTranspose).
template <typename T>
void LoadData(const LocalTensor<T> &dst, const LocalTensor<T> &src, const LoadData2DParams &p) {
  static_assert(detail::IsCube16<T>(), "the kernels feed the Cube 16-bit types");
  RequireCore(CoreType::kAic, "LoadData (L1 -> L0A / L0B)");
  const std::string from = MemoryName(src.GetPosition()), to = MemoryName(dst.GetPosition());
  SIM_CUBE_POSITION(from == "L1" && (to == "L0A" || to == "L0B"), "LoadData",
                    "copies L1 -> L0A / L0B, not " + from + " -> " + to);
  SIM_REQUIRE(p.repeatTimes > 0, "cube shape", "LoadData of no fractals");
  SIM_REQUIRE(src.Address() % 512 == 0 && dst.Address() % 512 == 0, "cube shape",
              "LoadData operands start on a whole fractal (512 bytes)");
  for (uint32_t i = 0; i < p.repeatTimes; ++i) {
    const T *s = src.Data((p.startIndex + i * p.srcStride) * kFractalElems, kFractalElems);
    T *d = dst.Data(i * (1 + p.dstGap) * kFractalElems, kFractalElems);
    for (uint32_t r = 0; r < kFractal; ++r)
      for (uint32_t c = 0; c < kFractal; ++c) d[r * kFractal + c] = p.ifTranspose ? s[c * kFractal + r] : s[r * kFractal + c];
  }
}

// C [m, n] (L0C, float) = (or +=) A [m, k] (L0A, zZ) x B [k, n] (L0B, nZ), accumulated in float32.
template <typename D, typename S>
void Mmad(const LocalTensor<D> &dst, const LocalTensor<S> &fm, const LocalTensor<S> &filter, const MmadParams &p) {
  static_assert(std::is_same<D, float>::value && detail::IsCube16<S>(),
                "the kernels multiply 16-bit matrices into float32");
  RequireCore(CoreType::kAic, "Mmad (the Cube's matrix multiply)");
  SIM_CUBE_POSITION(InMemory(fm.GetPosition(), "L0A"), "Mmad", "the left matrix is not in L0A");
  SIM_CUBE_POSITION(InMemory(filter.GetPosition(), "L0B"), "Mmad", "the right matrix is not in L0B");
  SIM_CUBE_POSITION(InMemory(dst.GetPosition(), "L0C"), "Mmad", "the result is not in L0C");
  for (const auto &dim : {std::make_pair("m", p.m), std::make_pair("n", p.n), std::make_pair("k", p.k)})
    SIM_REQUIRE(dim.second >= kFractal && dim.second <= 4095 && dim.second % kFractal == 0, "cube shape",
                std::string("Mmad ") + dim.first + " = " + std::to_string(dim.second) +
                    ": not a whole number of 16-element fractals in [16, 4095]");
  const uint32_t M = p.m, N = p.n, K = p.k, mb = M / kFractal, nb = N / kFractal, kb = K / kFractal;
  SIM_REQUIRE(uint64_t{M} * K <= fm.GetSize() && uint64_t{K} * N <= filter.GetSize() &&
                  uint64_t{M} * N <= dst.GetSize(),
              "cube shape", "Mmad m x k = " + std::to_string(M) + " x " + std::to_string(K) + ", k x n = " +
                                std::to_string(K) + " x " + std::to_string(N) + " past its L0 tensors (" +
                                std::to_string(fm.GetSize()) + ", " + std::to_string(filter.GetSize()) + ", " +
                                std::to_string(dst.GetSize()) + " elements)");
  const S *a = fm.Data(0, M * K), *b = filter.Data(0, K * N);
  D *c = dst.Data(0, M * N);
  // The operands unpacked from their fractals: A row-major [M, K], B column-major (B^T row-major [N, K]).
  std::vector<float> ra(uint64_t{M} * K), rb(uint64_t{N} * K);
  for (uint32_t m = 0; m < M; ++m)
    for (uint32_t k = 0; k < K; ++k)
      ra[uint64_t{m} * K + k] = static_cast<float>(
          a[((m / kFractal) * kb + k / kFractal) * kFractalElems + (m % kFractal) * kFractal + k % kFractal]);
  for (uint32_t k = 0; k < K; ++k)
    for (uint32_t n = 0; n < N; ++n)
      rb[uint64_t{n} * K + k] = static_cast<float>(
          b[((k / kFractal) * nb + n / kFractal) * kFractalElems + (n % kFractal) * kFractal + k % kFractal]);
  for (uint32_t m = 0; m < M; ++m)
    for (uint32_t n = 0; n < N; ++n) {
      float acc = 0.0f;  // products of 16-bit values are exact in float32; summed in k order
      const float *x = &ra[uint64_t{m} * K], *y = &rb[uint64_t{n} * K];
      for (uint32_t k = 0; k < K; ++k) acc += x[k] * y[k];
      D &out = c[((n / kFractal) * mb + m / kFractal) * kFractalElems + (m % kFractal) * kFractal + n % kFractal];
      out = p.cmatrixInitVal ? acc : out + acc;
    }
}

// L0C (NZ, float) -> global memory (ND, row-major): mSize rows of nSize columns, dstStride elements apart.
template <typename D, typename S, const FixpipeConfig &config = CFG_ROW_MAJOR>
void Fixpipe(const GlobalTensor<D> &dst, const LocalTensor<S> &src, const FixpipeParamsV220 &p) {
  static_assert(std::is_same<D, float>::value && std::is_same<S, float>::value, "the kernels move float32 results");
  static_assert(config.format == CO2Layout::ROW_MAJOR, "the kernels write row-major results");
  RequireCore(CoreType::kAic, "Fixpipe (L0C -> global memory)");
  SIM_CUBE_POSITION(InMemory(src.GetPosition(), "L0C"), "Fixpipe", "the source is not in L0C");
  SIM_REQUIRE(p.mSize > 0 && p.nSize > 0 && p.nSize % kFractal == 0 && p.srcStride >= p.mSize &&
                  p.srcStride % kFractal == 0,
              "cube shape", "Fixpipe of " + std::to_string(p.mSize) + " x " + std::to_string(p.nSize) + " from an L0C "
                            "matrix of " + std::to_string(p.srcStride) + " rows: not whole fractals");
  SIM_REQUIRE(p.dstStride >= p.nSize && p.dstStride * sizeof(D) % kBlockBytes == 0, "copy alignment",
              "Fixpipe rows not whole 32-byte blocks apart");
  uint64_t gm_offset;
  D *to = dst.Span(uint64_t(p.mSize - 1) * p.dstStride + p.nSize, &gm_offset);
  detail::CheckCopy(p.nSize * sizeof(D), 0, gm_offset);
  const S *from = src.Data(0, (p.nSize / kFractal - 1) * p.srcStride * kFractal + p.srcStride * kFractal);
  for (uint32_t m = 0; m < p.mSize; ++m)
    for (uint32_t n = 0; n < p.nSize; ++n) {
      const float v = from[(n / kFractal) * p.srcStride * kFractal + m * kFractal + n % kFractal];
      to[uint64_t{m} * p.dstStride + n] = p.reluEn && v < 0 ? 0.0f : v;
    }
}

// Fills 32-byte blocks of an L1 / L0A / L0B tensor with one value.
template <typename T>
void InitConstValue(const LocalTensor<T> &dst, const InitConstValueParams<T> &p) {
  RequireCore(CoreType::kAic, "InitConstValue (L1 / L0A / L0B)");
  const std::string where = MemoryName(dst.GetPosition());
  SIM_CUBE_POSITION(where == "L1" || where == "L0A" || where == "L0B", "InitConstValue",
                    "fills L1 / L0A / L0B, not " + where);
  const uint32_t per_block = kBlockBytes / sizeof(T);
  for (uint32_t r = 0; r < p.repeatTimes; ++r) {
    T *d = dst.Data(r * (p.blockNum + p.dstGap) * per_block, p.blockNum * per_block);
    for (uint32_t i = 0; i < p.blockNum * per_block; ++i) d[i] = p.initValue;
  }
}

}  // namespace AscendC

#endif  // MS_ATB_ASCENDC_SIM_CUBE_H_
