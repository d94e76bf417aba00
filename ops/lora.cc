// LoraAdd: a linear's output plus each row's LoRA delta, y + scaling * (x A^T) B^T, for a batch whose rows use
// different adapters. The rows are grouped by adapter slot, and each group's shrink (u = x A^T) and expand
// (u B^T) read the slot's A and B once, whatever the group's size.
//   y [T, W] float32: the base linear's output
//   x [T, K] float32: the linear's input
//   slots [T] int32: each row's adapter slot in [0, L), or -1 (no adapter: the row is y's)
//   lora_a [L, S R, K] float32: slot l's A of segment g in rows g R .. g R + R, zero past its rank
//   lora_b [L, R, W] float32: slot l's B transposed, the scaling folded in: column j, of segment g, takes
//     sum over r of u[g R + r] * lora_b[l, r, j]
//   ranks [L, NT] int32: slot l's rank on each target (0: the adapter leaves that target alone); at most R
//   segments [S, 2] int32: each segment's target (a column of ranks) and width; the widths add up to W
//   -> out [T, W] float32, which may be y's own buffer (each element is read before it is written).
// A fused linear (q/k/v, gate/up) is S segments of one output, each with its own A and its own columns of B.
// Every u element is one dot product in a fixed order and every delta element sums r in order, so a row's
// result depends on its own x, its slot and that slot's weights: not on the batch, the groups or the threads.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#if defined(__FMA__)
#include <immintrin.h>
#endif

#include "dtype.h"
#include "kernel_profile.h"
#include "thread_pool.h"

namespace {

int Fail(const char *msg) {
  std::fprintf(stderr, "ms_atb LoraAdd: %s\n", msg);
  return 1;
}

// 8 floats; GCC's vector extension, lowered to the widest vectors the build targets. V8u: the same at any
// address (an unaligned load).
typedef float V8 __attribute__((vector_size(32)));
typedef float V8u __attribute__((vector_size(32), aligned(4), may_alias));

inline V8 Load(const float *p) { return *reinterpret_cast<const V8u *>(p); }

// a * b + c, fused where the build has FMA (x86 with FMA, every AArch64 core), else rounded twice; never left to
// the compiler, which fuses some chains and not others (GCC's tuning avoids FMA in some loop-carried sums): a
// product must round alike in every tile that computes it.
#if !defined(__FMA__) && !defined(__aarch64__)
// The product p kept apart from the addition that follows it (a separate rounding: no contraction).
template <typename T>
inline void Rounded(T &p) {
#if defined(__x86_64__) || defined(__i386__)
  asm("" : "+x"(p));
#else
  asm("" : "+m"(p));
#endif
}
#endif

inline V8 Fma(V8 a, V8 b, V8 c) {
#if defined(__FMA__)
  return _mm256_fmadd_ps(a, b, c);
#elif defined(__aarch64__)
  V8 r;  // a lane at a time, which the vectoriser turns into fmla
  for (int i = 0; i < 8; ++i) r[i] = __builtin_fmaf(a[i], b[i], c[i]);
  return r;
#else
  V8 p = a * b;
  Rounded(p);
  return p + c;
#endif
}
inline float Fma(float a, float b, float c) {
#if defined(__FMA__) || defined(__aarch64__)
  return __builtin_fmaf(a, b, c);
#else
  float p = a * b;
  Rounded(p);
  return p + c;
#endif
}

inline float Sum(V8 s) { return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7])); }

// dot(x[i], a[j]) for i < NX, j < NA, over k elements, into out[i * ldo + j]: one 8-lane sum a dot, then its lanes
// in a fixed tree, then the tail in order. Every dot takes these steps whatever the tile it is computed in, so
// the grouping of rows changes no result.
template <int NX, int NA>
void DotTile(const float *const *x, const float *const *a, int64_t k, float *out, int64_t ldo) {
  V8 s[NX][NA] = {};
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    V8 av[NA];
    for (int j = 0; j < NA; ++j) av[j] = Load(a[j] + i);
    for (int r = 0; r < NX; ++r) {
      const V8 xv = Load(x[r] + i);
      for (int j = 0; j < NA; ++j) s[r][j] = Fma(xv, av[j], s[r][j]);
    }
  }
  for (int r = 0; r < NX; ++r)
    for (int j = 0; j < NA; ++j) {
      float d = Sum(s[r][j]);
      for (int64_t m = i; m < k; ++m) d = Fma(x[r][m], a[j][m], d);
      out[r * ldo + j] = d;
    }
}

template <int NX>
void DotRows(const float *const *x, const float *const *a, int na, int64_t k, float *out, int64_t ldo) {
  switch (na) {
    case 4: return DotTile<NX, 4>(x, a, k, out, ldo);
    case 3: return DotTile<NX, 3>(x, a, k, out, ldo);
    case 2: return DotTile<NX, 2>(x, a, k, out, ldo);
    default: return DotTile<NX, 1>(x, a, k, out, ldo);
  }
}

// out[c] += sum over r < rank of u[r] * b[r * ldb + c], for c < n: each column's terms added in r order, then
// to out (register blocks of 32 and 8 columns, then single columns, each column summed alike).
void Expand(const float *u, int64_t rank, const float *b, int64_t ldb, int64_t n, float *out) {
  int64_t c = 0;
  for (; c + 32 <= n; c += 32) {
    V8 d0 = {}, d1 = {}, d2 = {}, d3 = {};
    for (int64_t r = 0; r < rank; ++r) {
      const float *br = b + r * ldb + c, ur = u[r];
      const V8 uv = V8{} + ur;
      d0 = Fma(uv, Load(br), d0);
      d1 = Fma(uv, Load(br + 8), d1);
      d2 = Fma(uv, Load(br + 16), d2);
      d3 = Fma(uv, Load(br + 24), d3);
    }
    *reinterpret_cast<V8u *>(out + c) = Load(out + c) + d0;
    *reinterpret_cast<V8u *>(out + c + 8) = Load(out + c + 8) + d1;
    *reinterpret_cast<V8u *>(out + c + 16) = Load(out + c + 16) + d2;
    *reinterpret_cast<V8u *>(out + c + 24) = Load(out + c + 24) + d3;
  }
  for (; c + 8 <= n; c += 8) {
    V8 d = {};
    for (int64_t r = 0; r < rank; ++r) d = Fma(V8{} + u[r], Load(b + r * ldb + c), d);
    *reinterpret_cast<V8u *>(out + c) = Load(out + c) + d;
  }
  for (; c < n; ++c) {
    float d = 0.0f;
    for (int64_t r = 0; r < rank; ++r) d = Fma(u[r], b[r * ldb + c], d);
    out[c] += d;
  }
}

constexpr int64_t kCols = 128;  // output columns of one expand item: a [R, 128] block of B stays in L1
constexpr int kRowsPerDot = 4;  // rows of A per shrink call

struct Shape {
  int64_t T, W, K, L, R, S, NT;
};

struct Segment {
  int target;
  int64_t offset, width;
};

// Checks every argument (out at index 7); fills shape and segments.
int Check(int nparam, int *ndims, int64_t **shapes, const char **dtypes, void **params, Shape &s,
          std::vector<Segment> &segments) {
  if (nparam != 8) return Fail("expected 7 inputs (y, x, slots, lora_a, lora_b, ranks, segments) and 1 output");
  const int want_ndim[8] = {2, 2, 1, 3, 3, 2, 2, 2};
  for (int i = 0; i < 8; ++i)
    if (ndims[i] != want_ndim[i])
      return Fail("expected y [T, W], x [T, K], slots [T], lora_a [L, S R, K], lora_b [L, R, W], ranks [L, NT], "
                  "segments [S, 2], out [T, W]");
  for (int i : {0, 1, 3, 4, 7})
    if (ms_atb::ParseDType(dtypes[i]) != ms_atb::DType::kFloat32)
      return Fail("y, x, lora_a, lora_b and out must be float32");
  for (int i : {2, 5, 6})
    if (ms_atb::ParseDType(dtypes[i]) != ms_atb::DType::kInt32) return Fail("slots, ranks and segments must be int32");
  s = {shapes[0][0], shapes[0][1], shapes[1][1], shapes[3][0], shapes[4][1], shapes[6][0], shapes[5][1]};
  if (shapes[1][0] != s.T || shapes[2][0] != s.T || shapes[7][0] != s.T || shapes[7][1] != s.W)
    return Fail("x, slots and out need y's T rows, out y's W columns");
  if (shapes[6][1] != 2 || s.S < 1 || s.R < 1 || s.L < 1 || shapes[3][1] != s.S * s.R || shapes[3][2] != s.K)
    return Fail("lora_a must be [L, S R, K]: S segments of rank R over x's K columns");
  if (shapes[4][0] != s.L || shapes[4][2] != s.W || shapes[5][0] != s.L)
    return Fail("lora_b must be [L, R, W] and ranks [L, NT] for lora_a's L slots");
  const int32_t *seg = static_cast<const int32_t *>(params[6]);
  int64_t offset = 0;
  segments.clear();
  for (int64_t g = 0; g < s.S; ++g) {
    if (seg[2 * g] < 0 || seg[2 * g] >= s.NT || seg[2 * g + 1] < 1)
      return Fail("a segment names a target outside ranks' columns, or has no columns");
    segments.push_back({seg[2 * g], offset, seg[2 * g + 1]});
    offset += seg[2 * g + 1];
  }
  if (offset != s.W) return Fail("the segments' widths must add up to W");
  const int32_t *ranks = static_cast<const int32_t *>(params[5]);
  for (int64_t i = 0; i < s.L * s.NT; ++i)
    if (ranks[i] < 0 || ranks[i] > s.R) return Fail("a rank is outside [0, R]");
  const int32_t *slots = static_cast<const int32_t *>(params[2]);
  for (int64_t t = 0; t < s.T; ++t)
    if (slots[t] < -1 || slots[t] >= s.L) return Fail("a slot is outside [-1, L)");
  return 0;
}

struct Item {
  int64_t group, segment, first;  // shrink: rows first.. of A; expand: columns first.. of the segment
};

// Scratch of the calling thread: rows in slot order, each group's start, the u of every row.
struct Scratch {
  std::vector<int64_t> order, start;
  std::vector<float> u;
  std::vector<Item> items;
};

}  // namespace

extern "C" std::vector<int64_t> LoraAddInferShape(int *ndims, int64_t **shapes, void *extra) {
  return {shapes[0][0], shapes[0][1]};
}

extern "C" int LoraAdd(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream,
                       void *extra) {
  ms_atb::KernelScope profile_scope("LoraAdd");
  Shape s;
  std::vector<Segment> segments;
  if (Check(nparam, ndims, shapes, dtypes, params, s, segments) != 0) return 1;
  const float *y = static_cast<const float *>(params[0]), *x = static_cast<const float *>(params[1]);
  const int32_t *slots = static_cast<const int32_t *>(params[2]), *ranks = static_cast<const int32_t *>(params[5]);
  const float *a = static_cast<const float *>(params[3]), *b = static_cast<const float *>(params[4]);
  float *out = static_cast<float *>(params[7]);
  if (out != y) std::memcpy(out, y, static_cast<size_t>(s.T * s.W) * sizeof(float));

  thread_local Scratch own;
  Scratch &sc = own;  // the calling thread's: the workers below reach it through this reference
  // Rows grouped by slot (a counting sort: rows keep their order within a group); group l is slot l.
  sc.start.assign(s.L + 1, 0);
  for (int64_t t = 0; t < s.T; ++t)
    if (slots[t] >= 0) ++sc.start[slots[t] + 1];
  for (int64_t l = 0; l < s.L; ++l) sc.start[l + 1] += sc.start[l];
  if (sc.start[s.L] == 0) return 0;
  sc.order.resize(sc.start[s.L]);
  {
    std::vector<int64_t> next(sc.start.begin(), sc.start.end() - 1);
    for (int64_t t = 0; t < s.T; ++t)
      if (slots[t] >= 0) sc.order[next[slots[t]]++] = t;
  }
  const int64_t SR = s.S * s.R;
  if (sc.u.size() < static_cast<size_t>(s.T * SR)) sc.u.resize(static_cast<size_t>(s.T * SR));
  float *u = sc.u.data();  // [T, S R]: row t's u, read only where its slot's rank reaches
  auto rank = [&](int64_t l, int64_t g) { return static_cast<int64_t>(ranks[l * s.NT + segments[g].target]); };
  ms_atb::ThreadPool &pool = ms_atb::ThreadPool::Get();

  // Shrink: u[t, g R + r] = x[t] . lora_a[l, g R + r] for r below slot l's rank on segment g.
  sc.items.clear();
  for (int64_t l = 0; l < s.L; ++l)
    if (sc.start[l + 1] > sc.start[l])
      for (int64_t g = 0; g < s.S; ++g)
        for (int64_t r = 0; r < rank(l, g); r += kRowsPerDot) sc.items.push_back({l, g, r});
  pool.Run(static_cast<int64_t>(sc.items.size()), [&](int64_t i) {
    const Item it = sc.items[i];
    const int n = static_cast<int>(std::min<int64_t>(kRowsPerDot, rank(it.group, it.segment) - it.first));
    const float *rows[kRowsPerDot];
    for (int r = 0; r < n; ++r) rows[r] = a + (it.group * SR + it.segment * s.R + it.first + r) * s.K;
    const int64_t first = sc.start[it.group], last = sc.start[it.group + 1];
    const int64_t offset = it.segment * s.R + it.first;
    for (int64_t j = first; j < last; j += 2) {  // two rows of x at a time share each load of A
      const int64_t t0 = sc.order[j];
      if (j + 1 < last) {
        const int64_t t1 = sc.order[j + 1];
        const float *xs[2] = {x + t0 * s.K, x + t1 * s.K};
        float pair[2 * kRowsPerDot];
        DotRows<2>(xs, rows, n, s.K, pair, kRowsPerDot);
        std::memcpy(u + t0 * SR + offset, pair, n * sizeof(float));
        std::memcpy(u + t1 * SR + offset, pair + kRowsPerDot, n * sizeof(float));
      } else {
        const float *xs[1] = {x + t0 * s.K};
        DotRows<1>(xs, rows, n, s.K, u + t0 * SR + offset, 0);
      }
    }
  });

  // Expand: out[t, j] = y[t, j] + sum over r of u[t, g R + r] * lora_b[l, r, j], in blocks of kCols columns.
  sc.items.clear();
  for (int64_t l = 0; l < s.L; ++l)
    if (sc.start[l + 1] > sc.start[l])
      for (int64_t g = 0; g < s.S; ++g)
        if (rank(l, g) > 0)
          for (int64_t c = 0; c < segments[g].width; c += kCols) sc.items.push_back({l, g, c});
  pool.Run(static_cast<int64_t>(sc.items.size()), [&](int64_t i) {
    const Item it = sc.items[i];
    const Segment &seg = segments[it.segment];
    const int64_t col = seg.offset + it.first, n = std::min(kCols, seg.width - it.first), rk = rank(it.group,
                                                                                                   it.segment);
    const float *bl = b + it.group * s.R * s.W + col;  // row r of the block at bl + r W
    for (int64_t j = sc.start[it.group]; j < sc.start[it.group + 1]; ++j) {
      const int64_t t = sc.order[j];
      Expand(u + t * SR + it.segment * s.R, rk, bl, s.W, n, out + t * s.W + col);
    }
  });
  return 0;
}
