// DecoderLayer: a Llama decoder layer on the CPU in float32 as one kernel. A MindSpore CPU op costs ~30-45 us
// of dispatch whatever its size, and a layer is 8 kernels; this one calls the same kernels' entry points in
// the same order (AddRmsNorm, qkv linear, CachedAttention, o linear, AddRmsNorm, gate_up linear, SwiGlu,
// down linear), so its results are theirs, bit for bit, for one dispatch.
//   h [T, E] float32: the previous layer's MLP output (the embeddings in the first layer)
//   residual [T, E] float32: the running sum before h (absent in the first layer: x = RmsNorm(h), residual h)
//   input_norm [E], post_norm [E], eps [1] float32
//   w_qkv, w_o, w_gate_up, w_down: packed weights, each in the layout of its linear's kernel
//   plan [8] int32: the kernel of each linear (kinds below), then each linear's output width
//   cos [T, D], sin [T, D], perm [D] int32, key_cache, value_cache [NB, BS, KVH, D], slot_mapping [T] int32,
//   block_tables [B, MAXB] int32, context_lens [B] int32, query_start_loc [B + 1] int32, scale [1] float32,
//   rows [1] int32 (the linears' real rows), then, in the Quant variants (int8 caches), key_scale_cache and
//   value_scale_cache [NB, BS, KVH] float32
//   -> mlp_out [T, E], residual_out [T, E] float32: the layer's output is their sum.
// Each called kernel checks its own arguments; this one checks the plan and the widths between them.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <vector>

#include "kernel_profile.h"

using KernelFn = int (*)(int, void **, int *, int64_t **, const char **, void *, void *);

extern "C" {
int AddRmsNorm(int, void **, int *, int64_t **, const char **, void *, void *);
int RmsNorm(int, void **, int *, int64_t **, const char **, void *, void *);
int SwiGlu(int, void **, int *, int64_t **, const char **, void *, void *);
int LoraAdd(int, void **, int *, int64_t **, const char **, void *, void *);
int CachedAttention(int, void **, int *, int64_t **, const char **, void *, void *);
int CachedAttentionQuant(int, void **, int *, int64_t **, const char **, void *, void *);
int PackedMatMulRows(int, void **, int *, int64_t **, const char **, void *, void *);
int QuantMatMulQ8_0Rows(int, void **, int *, int64_t **, const char **, void *, void *);
int QuantMatMulQ4_0Rows(int, void **, int *, int64_t **, const char **, void *, void *);
int QuantMatMulQ4_1Rows(int, void **, int *, int64_t **, const char **, void *, void *);
int QuantMatMulInt8Rows(int, void **, int *, int64_t **, const char **, void *, void *);
int QuantDotQ8_0Rows(int, void **, int *, int64_t **, const char **, void *, void *);
int QuantDotQ4_0Rows(int, void **, int *, int64_t **, const char **, void *, void *);
int QuantDotQ4_1Rows(int, void **, int *, int64_t **, const char **, void *, void *);
int QuantDotInt8Rows(int, void **, int *, int64_t **, const char **, void *, void *);
}

namespace {

constexpr int64_t kPanel = 16;  // output columns per weight panel
// The linear kernels by kind, the order of ops/decoder_layer.py's LINEAR_KERNELS.
constexpr KernelFn kLinears[] = {PackedMatMulRows,    QuantMatMulQ8_0Rows, QuantMatMulQ4_0Rows,
                                 QuantMatMulQ4_1Rows, QuantMatMulInt8Rows, QuantDotQ8_0Rows,
                                 QuantDotQ4_0Rows,    QuantDotQ4_1Rows,    QuantDotInt8Rows};
constexpr int kNumKinds = sizeof(kLinears) / sizeof(kLinears[0]);

int Fail(const char *msg) {
  std::fprintf(stderr, "ms_atb DecoderLayer: %s\n", msg);
  return 1;
}

// One tensor argument of a called kernel.
struct Arg {
  void *data;
  int ndim;
  int64_t *shape;
  const char *dtype;
};

constexpr int kMaxArgs = 16;

// Calls kernel fn through the aot ABI on args[0, n) (n <= kMaxArgs).
int Run(KernelFn fn, const Arg *args, int n) {
  void *params[kMaxArgs];
  int ndims[kMaxArgs];
  int64_t *shapes[kMaxArgs];
  const char *dtypes[kMaxArgs];
  for (int i = 0; i < n; ++i) {
    params[i] = args[i].data;
    ndims[i] = args[i].ndim;
    shapes[i] = args[i].shape;
    dtypes[i] = args[i].dtype;
  }
  return fn(n, params, ndims, shapes, dtypes, nullptr, nullptr);
}
int Run(KernelFn fn, std::initializer_list<Arg> args) { return Run(fn, args.begin(), static_cast<int>(args.size())); }

// Scratch of one thread, reused across calls (resized, never shrunk).
struct Scratch {
  std::vector<float> x, res, qkv, attn, a, gate_up, act, down;
};

// y [T, width] from a linear's output [T, 16 P]: the columns past width (the last panel's padding) dropped.
void Compact(const float *full, int64_t T, int64_t padded, int64_t width, float *y) {
  for (int64_t t = 0; t < T; ++t) std::memmove(y + t * width, full + t * padded, width * sizeof(float));
}

constexpr int kLoraInputs = 10;  // lora_slots, lora_ranks, then (lora_a, lora_b) of qkv, o, gate_up, down

int Layer(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, bool first, bool quant,
          bool lora) {
  // Profiled as a whole and, inside, as its parts under their own names: its time is theirs plus the glue.
  ms_atb::KernelScope profile_scope("DecoderLayer");
  const int inputs = 20 + (first ? 0 : 1) + (quant ? 2 : 0) + (lora ? kLoraInputs : 0);
  if (nparam != inputs + 2) return Fail("wrong number of inputs for this variant (first layer, int8 caches, LoRA)");
  // Indices of the inputs after h (and residual), in the order above.
  const int o = first ? 1 : 2;
  const int kInNorm = o, kPostNorm = o + 1, kEps = o + 2, kW = o + 3, kPlan = o + 7, kCos = o + 8;
  const int kKeyCache = kCos + 3, kRows = kCos + 10, kScales = kCos + 11, kLora = kScales + (quant ? 2 : 0);
  const int kMlpOut = nparam - 2, kResOut = nparam - 1;
  if (ndims[0] != 2 || ndims[kKeyCache] != 4 || ndims[kPlan] != 1 || shapes[kPlan][0] != 8 ||
      std::strcmp(dtypes[kPlan], "int32") != 0)
    return Fail("expected h [T, E], caches [NB, BS, KVH, D] and plan [8] int32");
  const int64_t T = shapes[0][0], E = shapes[0][1];
  const int64_t KVH = shapes[kKeyCache][2], D = shapes[kKeyCache][3];
  for (int i : {kMlpOut, kResOut})
    if (ndims[i] != 2 || shapes[i][0] != T || shapes[i][1] != E) return Fail("outputs must be [T, E] like h");
  if (!first && (ndims[1] != 2 || shapes[1][0] != T || shapes[1][1] != E)) return Fail("residual must be [T, E]");
  const int32_t *plan = static_cast<const int32_t *>(params[kPlan]);
  int64_t width[4];  // output widths of qkv, o, gate_up, down
  for (int i = 0; i < 4; ++i) {
    if (plan[i] < 0 || plan[i] >= kNumKinds) return Fail("plan names an unknown linear kernel (kinds 0..8)");
    width[i] = plan[4 + i];
    if (width[i] < 1 || ndims[kW + i] < 2 || shapes[kW + i][0] != (width[i] + kPanel - 1) / kPanel)
      return Fail("a weight's panels do not cover its linear's output width in plan");
  }
  const int64_t q_width = width[0] - 2 * KVH * D;
  if (q_width < D || width[1] != E || width[3] != E || width[2] % 2 != 0)
    return Fail("plan's widths must be qkv (H + 2 KVH) D, o E, gate_up 2 I, down E");
  const int64_t inter = width[2] / 2;

  thread_local Scratch s;
  auto buffer = [T](std::vector<float> &v, int64_t cols) {
    if (v.size() < static_cast<size_t>(T * cols)) v.resize(static_cast<size_t>(T * cols));
    return v.data();
  };
  const char *f32 = dtypes[0];
  int64_t te[2] = {T, E};
  float *x = buffer(s.x, E), *res = first ? static_cast<float *>(params[0]) : buffer(s.res, E);
  float *mlp_out = static_cast<float *>(params[kMlpOut]), *res_out = static_cast<float *>(params[kResOut]);
  Arg rows{params[kRows], 1, shapes[kRows], dtypes[kRows]};
  Arg eps{params[kEps], 1, shapes[kEps], dtypes[kEps]};

  // With LoRA: y [T, width] += each row's adapter delta of linear i (input x [T, K]), in place. The segments
  // name lora_ranks' columns: q, k, v (0-2), o (3), gate, up (4, 5), down (6).
  auto adapt = [&](int i, float *in, int64_t K, float *y) {
    if (!lora) return 0;
    const int64_t kv = KVH * D, inter = width[2] / 2;
    const int64_t seg_widths[4][3] = {{width[0] - 2 * kv, kv, kv}, {width[1], 0, 0}, {inter, inter, 0},
                                      {width[3], 0, 0}};
    const int first_target[4] = {0, 3, 4, 6}, num_segments[4] = {3, 1, 2, 1};
    int32_t seg[6];
    for (int g = 0; g < num_segments[i]; ++g) {
      seg[2 * g] = first_target[i] + g;
      seg[2 * g + 1] = static_cast<int32_t>(seg_widths[i][g]);
    }
    int64_t x_shape[2] = {T, K}, y_shape[2] = {T, width[i]}, seg_shape[2] = {num_segments[i], 2};
    const int ia = kLora + 2 + 2 * i, ib = ia + 1;
    return Run(LoraAdd, {{y, 2, y_shape, f32},
                         {in, 2, x_shape, f32},
                         {params[kLora], ndims[kLora], shapes[kLora], dtypes[kLora]},
                         {params[ia], ndims[ia], shapes[ia], dtypes[ia]},
                         {params[ib], ndims[ib], shapes[ib], dtypes[ib]},
                         {params[kLora + 1], ndims[kLora + 1], shapes[kLora + 1], dtypes[kLora + 1]},
                         {seg, 2, seg_shape, "int32"},
                         {y, 2, y_shape, f32}});
  };

  // A linear: y [T, width] from x [T, K]; through `full` [T, 16 P] when width is not whole panels.
  auto linear = [&](int i, float *in, int64_t K, std::vector<float> &full, float *y) {
    int64_t x_shape[2] = {T, K}, y_shape[2] = {T, shapes[kW + i][0] * kPanel};
    float *out = y_shape[1] == width[i] ? y : buffer(full, y_shape[1]);
    const int status = Run(kLinears[plan[i]], {{in, 2, x_shape, f32},
                                                {params[kW + i], ndims[kW + i], shapes[kW + i], dtypes[kW + i]},
                                                rows,
                                                {out, 2, y_shape, f32}});
    if (status == 0 && out != y) Compact(out, T, y_shape[1], width[i], y);
    return status == 0 ? adapt(i, in, K, y) : status;
  };

  int status;
  Arg in_norm{params[kInNorm], 1, shapes[kInNorm], dtypes[kInNorm]};
  if (first)  // x = RmsNorm(h), residual = h
    status = Run(RmsNorm, {{params[0], 2, te, f32}, in_norm, eps, {x, 2, te, f32}});
  else  // residual = h + residual, x = RmsNorm(residual)
    status = Run(AddRmsNorm, {{params[0], 2, te, f32}, {params[1], 2, te, f32}, in_norm, eps, {res, 2, te, f32},
                              {x, 2, te, f32}});
  if (status != 0) return status;
  std::vector<float> &qkv_full = s.down;  // free until the down linear
  float *qkv = buffer(s.qkv, width[0]);   // [T, (H + 2 KVH) D]
  if ((status = linear(0, x, E, qkv_full, qkv)) != 0) return status;
  int64_t qkv_shape[2] = {T, width[0]}, q_shape[2] = {T, q_width};
  float *attn = buffer(s.attn, q_width);  // [T, H D]
  {
    Arg args[kMaxArgs];
    args[0] = {qkv, 2, qkv_shape, f32};
    const int extra = 10 + (quant ? 2 : 0);  // cos .. scale, then the scale caches (rows skipped)
    for (int i = 1; i <= extra; ++i) {
      const int j = i <= 10 ? kCos + i - 1 : kScales + i - 11;
      args[i] = {params[j], ndims[j], shapes[j], dtypes[j]};
    }
    args[extra + 1] = {attn, 2, q_shape, f32};
    status = Run(quant ? CachedAttentionQuant : CachedAttention, args, extra + 2);
    if (status != 0) return status;
  }
  float *a = buffer(s.a, E);  // [T, E]: the attention block's output
  if ((status = linear(1, attn, q_width, s.down, a)) != 0) return status;
  Arg post_norm{params[kPostNorm], 1, shapes[kPostNorm], dtypes[kPostNorm]};
  status = Run(AddRmsNorm, {{a, 2, te, f32}, {res, 2, te, f32}, post_norm, eps, {res_out, 2, te, f32},
                            {x, 2, te, f32}});
  if (status != 0) return status;
  float *gate_up = buffer(s.gate_up, width[2]);  // [T, 2 I]
  if ((status = linear(2, x, E, s.down, gate_up)) != 0) return status;
  int64_t gu_shape[2] = {T, width[2]}, act_shape[2] = {T, inter};
  float *act = buffer(s.act, inter);  // [T, I]
  if ((status = Run(SwiGlu, {{gate_up, 2, gu_shape, f32}, {act, 2, act_shape, f32}})) != 0) return status;
  return linear(3, act, inter, s.down, mlp_out);
}

}  // namespace

#define MS_ATB_DECODER_LAYER(NAME, FIRST, QUANT, LORA)                                                    \
  extern "C" int NAME(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,       \
                      void *stream, void *extra) {                                                        \
    return Layer(nparam, params, ndims, shapes, dtypes, FIRST, QUANT, LORA);                              \
  }

MS_ATB_DECODER_LAYER(DecoderLayer, false, false, false)
MS_ATB_DECODER_LAYER(DecoderLayerQuant, false, true, false)
MS_ATB_DECODER_LAYER(DecoderLayerFirst, true, false, false)
MS_ATB_DECODER_LAYER(DecoderLayerFirstQuant, true, true, false)
MS_ATB_DECODER_LAYER(DecoderLayerLora, false, false, true)
MS_ATB_DECODER_LAYER(DecoderLayerQuantLora, false, true, true)
MS_ATB_DECODER_LAYER(DecoderLayerFirstLora, true, false, true)
MS_ATB_DECODER_LAYER(DecoderLayerFirstQuantLora, true, true, true)
#undef MS_ATB_DECODER_LAYER
