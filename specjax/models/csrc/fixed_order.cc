// The model's two reductions, attention and RMS norm, with every sum in one fixed order (XLA FFI custom
// calls for XLA:CPU; specjax/models/native_kernels.py builds and loads them, the model uses them with
// `activations=int8`).
//
// Why: with int8 activations a difference in the last place of x can move x's int8 rounding by a whole
// step, and XLA sums a reduction in an order that depends on the program's shapes (a one-token step and a
// verification block of k + 1 tokens disagree in the last place). Here a row's result depends only on its
// own numbers (attention: the sequence of keys and values a query sees, in slot order): the same in a
// one-token decoding step, in a verification block (chain or tree: a node's ancestors precede it), in a
// prefill, at any batch size or cache length. So greedy speculative decoding gives plain decoding's tokens.
//
// Attention's arguments: q f32 [B, T, N, H] (scaled, rotated); keys f32 [B, S, KV, H] and values f32 [B, KV, H, S]
// (the cache before this block's write: the transposed value layout of kv_cache.py); the block's own keys
// and values f32 [B, T, KV, H]; start s32 [B] (the block's first slot); visible pred [B, T, S] (slot
// visibility as kv_cache.attention_masks gives it for the cache after the write). Result f32 [B, T, N, H].
// Slot s of row b reads the block's entry s - start[b] when start[b] <= s < start[b] + T, else the cache.
//
// Order: the visible slots of a query are listed in ascending order (entry i = the i-th visible slot).
// Scores: per entry, 16-lane products over H then one fixed horizontal sum. Softmax: m = max, e_i =
// exp(score_i - m) (the polynomial below), z = sum of e_i with lane i mod 16, then a fixed horizontal sum.
// Output: per h, sum of e_i v_i[h] with lane i mod 16, then / z.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gemm_common.h"
#include "simd16.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using namespace specjax::simd;  // F16: 16 float32 lanes, the same bits on AVX-512 and AVX2

constexpr int64_t kL = 16;    // float32 lanes
constexpr int64_t kMaxG = 16;  // query heads per key / value head
// Aliases: a comma would split the binding macro's arguments.
using F32x4 = ffi::Buffer<ffi::F32, 4>;
using S32x1 = ffi::Buffer<ffi::S32, 1>;
using Predx3 = ffi::Buffer<ffi::PRED, 3>;
using F32x4Result = ffi::ResultBuffer<ffi::F32, 4>;
using F32x1 = ffi::Buffer<ffi::F32, 1>;

struct Problem {
  const float *q, *keys, *values, *bk, *bv;
  std::vector<float> bvt;  // the block's values transposed, [B, KV, H, T], like the cache's
  const int32_t* start;
  const bool* visible;
  float* out;
  int64_t B, T, N, H, S, KV, G;
};

// e^x for x <= 0 (scores minus their max): x = n ln2 + r, |r| <= ln2 / 2, e^r by its Taylor polynomial to
// degree 7 (relative error < 2e-7), times 2^n. Below -87 the result is 0 (a weight under float32's range).
// 2^n is a normal float there (n >= -126), so p · 2^n rounds once, like a scale by the exponent.
inline F16 Exp(F16 x) {
  const F16 n = RoundNearest(Mul(x, Set1(1.44269504088896341f)));
  F16 r = FNMAdd(n, Set1(0.693145751953125f), x);
  r = FNMAdd(n, Set1(1.428606765330187e-06f), r);
  F16 p = Set1(1.0f / 5040);
  for (const float c : {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f}) p = FMAdd(p, r, Set1(c));
  return KeepAtLeast(x, -87.0f, Mul(p, Pow2(n)));  // lanes below -87 (2^n out of range) become +0
}

// Where slot s of row b is stored: its key row (H floats) and its value column (stride between h's).
struct Entry {
  const float* key;
  const float* value;  // value[h * stride] is head dim h
  int64_t stride;      // S for the cache, T for the block (both transposed: consecutive slots are adjacent)
  int64_t slot;
  bool in_block;
};

// Queries (b, t, kv-head c): the G query heads sharing key/value head c.
void Query(const Problem& p, int64_t b, int64_t t, int64_t c, std::vector<Entry>& ent, std::vector<float>& e) {
  const int64_t H = p.H, G = p.G, S = p.S, T = p.T, KV = p.KV;
  const int64_t s0 = p.start[b];
  const bool* vis = p.visible + (b * T + t) * S;
  ent.clear();
  for (int64_t s = 0; s < S; ++s) {
    if (!vis[s]) continue;
    if (s >= s0 && s < s0 + T) {
      ent.push_back({p.bk + ((b * T + (s - s0)) * KV + c) * H, p.bvt.data() + (b * KV + c) * H * T + (s - s0), T, s, true});
    } else {
      ent.push_back({p.keys + ((b * S + s) * KV + c) * H, p.values + ((b * KV + c) * H) * S + s, S, s, false});
    }
  }
  const int64_t n = static_cast<int64_t>(ent.size()), padded = (n + kL - 1) / kL * kL;
  float* o_base = p.out + ((b * T + t) * p.N + c * G) * H;
  if (n == 0) {  // nothing visible (a padding row): zeros, never read
    std::memset(o_base, 0, sizeof(float) * G * H);
    return;
  }
  e.assign(G * padded, 0.0f);
  const float* q0 = p.q + ((b * T + t) * p.N + c * G) * H;
  F16 acc[kMaxG];
  for (int64_t i = 0; i < n; ++i) {  // scores: each key row read once for the G heads
    for (int64_t g = 0; g < G; ++g) acc[g] = Zero();
    for (int64_t h = 0; h < H; h += kL) {
      const F16 k = Load(ent[i].key + h);
      for (int64_t g = 0; g < G; ++g) acc[g] = FMAdd(Load(q0 + g * H + h), k, acc[g]);
    }
    for (int64_t g = 0; g < G; ++g) e[g * padded + i] = ReduceAdd(acc[g]);
  }
  float inv_z[kMaxG];
  for (int64_t g = 0; g < G; ++g) {
    float* eg = e.data() + g * padded;
    float m = eg[0];
    for (int64_t i = 1; i < n; ++i) m = std::max(m, eg[i]);
    F16 z = Zero();
    for (int64_t i = 0; i < padded; i += kL) {
      const F16 w = FirstLanes(Exp(Sub(Load(eg + i), Set1(m))), n - i);
      Store(eg + i, w);
      z = Add(z, w);
    }
    inv_z[g] = 1.0f / ReduceAdd(z);
  }
  // Values: entry i's value for head dim h, lanes i mod 16. A run of 16 cache entries in consecutive slots
  // is one vector load per h; other groups are gathered into `col` first (the same numbers, same lanes).
  alignas(64) float col[kL];
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t g = 0; g < G; ++g) acc[g] = Zero();
    for (int64_t i = 0; i < padded; i += kL) {
      F16 v;
      // 16 entries in consecutive slots of one array: the first and last are slots 15 apart in the cache (below
      // the block: no visible cache slot lies past it) or both in the block, so every slot between is too.
      const Entry &first = ent[i], &last = ent[std::min(i + kL, n) - 1];
      if (i + kL <= n && last.slot == first.slot + kL - 1 && first.in_block == last.in_block) {
        v = Load(first.value + h * first.stride);
      } else {
        for (int64_t l = 0; l < kL; ++l) col[l] = i + l < n ? ent[i + l].value[h * ent[i + l].stride] : 0.0f;
        v = Load(col);
      }
      for (int64_t g = 0; g < G; ++g) acc[g] = FMAdd(Load(e.data() + g * padded + i), v, acc[g]);
    }
    for (int64_t g = 0; g < G; ++g) o_base[g * H + h] = inv_z[g] * ReduceAdd(acc[g]);
  }
}

// Units: (b, t, kv-head) triples.
void Chunk(const Problem& p, int64_t u0, int64_t u1) {
  std::vector<Entry> ent;
  std::vector<float> e;
  ent.reserve(p.S);
  for (int64_t u = u0; u < u1; ++u) Query(p, u / (p.T * p.KV), (u / p.KV) % p.T, u % p.KV, ent, e);
}

ffi::Error Attention(ffi::ThreadPool pool, F32x4 q, F32x4 keys, F32x4 values, F32x4 bk, F32x4 bv, S32x1 start,
                     Predx3 visible, F32x4Result out) {
  auto work = std::make_shared<specjax::ChunkedWork<Problem>>();
  Problem& p = work->problem;
  const auto qd = q.dimensions(), kd = keys.dimensions(), vd = values.dimensions(), bd = bk.dimensions();
  p.B = qd[0], p.T = qd[1], p.N = qd[2], p.H = qd[3], p.S = kd[1], p.KV = kd[2];
  if (p.KV == 0 || p.N % p.KV != 0 || p.H % kL != 0 || kd[0] != p.B || kd[3] != p.H || vd[0] != p.B ||
      vd[1] != p.KV || vd[2] != p.H || vd[3] != p.S || bd[0] != p.B || bd[1] != p.T || bd[2] != p.KV ||
      bd[3] != p.H || bv.dimensions()[0] != p.B || bv.dimensions()[1] != p.T ||
      bv.dimensions()[2] != p.KV || bv.dimensions()[3] != p.H || start.dimensions()[0] != p.B ||
      visible.dimensions()[0] != p.B || visible.dimensions()[1] != p.T || visible.dimensions()[2] != p.S)
    return ffi::Error::InvalidArgument("shapes the fixed-order attention kernel does not take");
  p.G = p.N / p.KV;
  if (p.G > kMaxG) return ffi::Error::InvalidArgument("more query heads per key head than the kernel takes");
  p.q = q.typed_data(), p.keys = keys.typed_data(), p.values = values.typed_data();
  p.bk = bk.typed_data(), p.bv = bv.typed_data(), p.start = start.typed_data();
  p.visible = visible.typed_data(), p.out = out->typed_data();
  const int64_t units = p.B * p.T * p.KV;
  if (units == 0) return ffi::Error::Success();
  p.bvt.resize(p.B * p.KV * p.H * p.T);
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t j = 0; j < p.T; ++j)
      for (int64_t c = 0; c < p.KV; ++c)
        for (int64_t h = 0; h < p.H; ++h)
          p.bvt[((b * p.KV + c) * p.H + h) * p.T + j] = p.bv[((b * p.T + j) * p.KV + c) * p.H + h];
  work->run_chunk = Chunk;
  specjax::RunChunked(pool, work, units, 1);
  return ffi::Error::Success();
}

// RMS norm of each row of x [M, D]: y = (x · 1 / sqrt(mean(x²) + eps)) · scale, the sum of squares in 16 lanes
// (column i in lane i mod 16) then one fixed horizontal sum; D a multiple of 16.
ffi::Error RmsNorm(specjax::F32Matrix x, F32x1 scale, float eps, specjax::F32Result y) {
  const int64_t M = x.dimensions()[0], D = x.dimensions()[1];
  if (D % kL != 0 || scale.dimensions()[0] != D)
    return ffi::Error::InvalidArgument("shapes the fixed-order RMS norm does not take");
  const float* xs = x.typed_data();
  const float* sc = scale.typed_data();
  float* ys = y->typed_data();
  for (int64_t r = 0; r < M; ++r) {
    const float* xr = xs + r * D;
    F16 acc = Zero();
    for (int64_t i = 0; i < D; i += kL) {
      const F16 v = Load(xr + i);
      acc = FMAdd(v, v, acc);
    }
    const F16 inv = Set1(1.0f / std::sqrt(ReduceAdd(acc) / static_cast<float>(D) + eps));
    for (int64_t i = 0; i < D; i += kL) Store(ys + r * D + i, Mul(Mul(Load(xr + i), inv), Load(sc + i)));
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecjaxFixedOrderRmsNorm, RmsNorm,
                              ffi::Ffi::Bind().Arg<specjax::F32Matrix>().Arg<F32x1>().Attr<float>("eps").Ret<specjax::F32Matrix>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecjaxFixedOrderAttention, Attention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<F32x4>()
                                  .Arg<F32x4>()
                                  .Arg<F32x4>()
                                  .Arg<F32x4>()
                                  .Arg<F32x4>()
                                  .Arg<S32x1>()
                                  .Arg<Predx3>()
                                  .Ret<F32x4>());
