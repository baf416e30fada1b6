// Fused dequantizing matrix products for specjax's BlockQuant matrices on XLA:CPU (an XLA FFI
// custom call; specjax/models/native_kernels.py builds, loads and calls it).
//
// y[m, o] = sum_i x[m, i] * w[o, i] with w = q * scale - offset per block of columns, q either
// int8 [out, in] or 4-bit pairs in uint8 [out, in / 2] (column j in the low nibble, column
// j + in / 2 in the high one). The weights are computed with the same float32 operations as the
// XLA path (a multiply, then a subtract: bit-identical to the float32 matrix); only the order of
// the dot product's additions differs.
//
// Why: XLA:CPU runs these products at a third of the memory bandwidth (the conversion is ALU work
// it vectorizes poorly, and its multi-row form materialises converted blocks); here each weight
// byte is read from memory once (prefetched a tile ahead) and converted in registers (4-bit values
// through a 16-entry table per scale block, vpermps), each load of x shared by 4 output rows'
// accumulators, on every thread of XLA's intra-op pool.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "gemm_common.h"
#include "xla/ffi/api/ffi.h"

#if !defined(__AVX512F__) || !defined(__AVX512BW__)
#error "specjax's native kernels need AVX-512 (F, BW); the XLA path is used instead"
#endif

namespace ffi = xla::ffi;

namespace {

using Problem = specjax::GemmArgs;  // row-major values and [out, nb] scales

inline __m512 Affine(__m512 q, const float* s, const float* off) {
  const __m512 p = _mm512_mul_ps(q, _mm512_set1_ps(*s));
  return off ? _mm512_sub_ps(p, _mm512_set1_ps(*off)) : p;
}

// MR rows of x times NR output rows starting at o (4-bit pairs).
template <int MR, int NR, bool OFF>
void TileQ4(const Problem& p, int64_t m0, int64_t o) {
  const int64_t half = p.in / 2, block = p.in / p.nb;
  const uint8_t* vals = static_cast<const uint8_t*>(p.values) + o * half;
  const float* x = p.x + m0 * p.in;
  const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m512 acc[MR][NR];
  for (int r = 0; r < MR; ++r)
    for (int n = 0; n < NR; ++n) acc[r][n] = _mm512_setzero_ps();
  for (int64_t k0 = 0; k0 < half; k0 += block) {
    const int64_t bl = k0 / block, bh = (k0 + half) / block;
    __m512 tl[NR], th[NR];  // the 16 values of this block's low / high nibbles, per output row
    for (int n = 0; n < NR; ++n) {
      const float* sc = p.scale + (o + n) * p.nb;
      const float* of = OFF ? p.offset + (o + n) * p.nb : nullptr;
      tl[n] = Affine(iota, sc + bl, OFF ? of + bl : nullptr);
      th[n] = Affine(iota, sc + bh, OFF ? of + bh : nullptr);
    }
    for (int64_t k = k0; k < k0 + block; k += 16) {
      __m512 xl[MR], xh[MR];
      for (int r = 0; r < MR; ++r) {
        xl[r] = _mm512_loadu_ps(x + r * p.in + k);
        xh[r] = _mm512_loadu_ps(x + r * p.in + k + half);
      }
      for (int n = 0; n < NR; ++n) {
        _mm_prefetch(reinterpret_cast<const char*>(vals + (n + NR) * half + k), _MM_HINT_T0);
        const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(vals + n * half + k)));
        const __m512 wl = _mm512_permutexvar_ps(b, tl[n]);  // vpermps reads the low 4 bits of a lane
        const __m512 wh = _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), th[n]);
        for (int r = 0; r < MR; ++r) {
          acc[r][n] = _mm512_fmadd_ps(wl, xl[r], acc[r][n]);
          acc[r][n] = _mm512_fmadd_ps(wh, xh[r], acc[r][n]);
        }
      }
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int n = 0; n < NR; ++n) p.y[(m0 + r) * p.out + o + n] = _mm512_reduce_add_ps(acc[r][n]);
}

// MR rows of x times NR output rows starting at o (int8).
template <int MR, int NR, bool OFF>
void TileI8(const Problem& p, int64_t m0, int64_t o) {
  const int64_t block = p.in / p.nb;
  const int8_t* vals = static_cast<const int8_t*>(p.values) + o * p.in;
  const float* x = p.x + m0 * p.in;
  __m512 acc[MR][NR];
  for (int r = 0; r < MR; ++r)
    for (int n = 0; n < NR; ++n) acc[r][n] = _mm512_setzero_ps();
  for (int64_t k = 0; k < p.in; k += 16) {
    const int64_t bk = k / block;
    __m512 xv[MR];
    for (int r = 0; r < MR; ++r) xv[r] = _mm512_loadu_ps(x + r * p.in + k);
    for (int n = 0; n < NR; ++n) {
      _mm_prefetch(reinterpret_cast<const char*>(vals + (n + NR) * p.in + k), _MM_HINT_T0);
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(vals + n * p.in + k));
      const __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(raw));
      const __m512 w = Affine(q, p.scale + (o + n) * p.nb + bk, OFF ? p.offset + (o + n) * p.nb + bk : nullptr);
      for (int r = 0; r < MR; ++r) acc[r][n] = _mm512_fmadd_ps(w, xv[r], acc[r][n]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int n = 0; n < NR; ++n) p.y[(m0 + r) * p.out + o + n] = _mm512_reduce_add_ps(acc[r][n]);
}

template <int MR, int NR>
void Tile(const Problem& p, int64_t m0, int64_t o) {
  if (p.q4) {
    p.offset ? TileQ4<MR, NR, true>(p, m0, o) : TileQ4<MR, NR, false>(p, m0, o);
  } else {
    p.offset ? TileI8<MR, NR, true>(p, m0, o) : TileI8<MR, NR, false>(p, m0, o);
  }
}

// Output rows [o0, o1) for MR rows of x: tiles of NR output rows, then single rows.
template <int MR, int NR>
void Rows(const Problem& p, int64_t m0, int64_t o0, int64_t o1) {
  int64_t o = o0;
  for (; o + NR <= o1; o += NR) Tile<MR, NR>(p, m0, o);
  for (; o < o1; ++o) Tile<MR, 1>(p, m0, o);
}

// Every row of x for output rows [o0, o1): 4 rows of x per pass (4 x 2 accumulators); fewer rows
// share each x load among 4 output rows. More than 4 rows of x take the passes span by span of
// output rows, so every pass after the first reads that span's weights from cache, not memory.
void Chunk(const Problem& p, int64_t o0, int64_t o1) {
  constexpr int64_t kSpan = 32;
  for (int64_t s0 = o0; s0 < o1; s0 += kSpan) {
    const int64_t s1 = std::min(o1, s0 + kSpan);
    int64_t m = 0;
    for (; m + 4 <= p.m; m += 4) Rows<4, 2>(p, m, s0, s1);
    switch (p.m - m) {
      case 3: Rows<3, 2>(p, m, s0, s1); break;
      case 2: Rows<2, 4>(p, m, s0, s1); break;
      case 1: Rows<1, 4>(p, m, s0, s1); break;
      default: break;
    }
  }
}

ffi::Error Gemm(ffi::ThreadPool pool, specjax::F32Matrix x, ffi::AnyBuffer values, specjax::F32Matrix scale,
                specjax::F32Matrix offset, specjax::F32Result y) {
  auto work = std::make_shared<specjax::ChunkedWork<Problem>>();
  Problem& p = work->problem;
  if (auto err = specjax::ReadArgs(x, values, scale, offset, y, p); err.failure()) return err;
  work->run_chunk = Chunk;
  specjax::RunChunked(pool, work, p.out, 4);  // chunks of whole tiles of 4 output rows
  return ffi::Error::Success();
}

}  // namespace

SPECJAX_GEMM_HANDLER(SpecjaxBlockQuantGemm, Gemm)
