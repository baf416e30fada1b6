// Sixteen float32 / int32 lanes for the int8-activation and fixed-order kernels, on AVX-512 (one register) or
// on AVX2 + FMA (two registers, lanes 0-7 and 8-15).
//
// Both give the same bits: every lane runs the same IEEE operations (FMA where the kernels ask for it), the
// horizontal sum is one explicit tree (`ReduceAdd`: upper half + lower half down to four lanes, then
// (l0 + l2) + (l1 + l3), GCC's _mm512_reduce_add_ps), and the int8 products are exact integer sums either
// way (VNNI's vpdpbusd, or AVX2's maddubs / madd whose 16-bit pair sums cannot saturate on these operands).
// So a model gives the same tokens on an AVX2 machine as on an AVX-512 one (tests/models/test_simd_isa.py).
//
// The AVX-512 form needs F, BW and VNNI; any other x86-64 CPU with AVX2 and FMA gets the AVX2 form
// (`SPECJAX_NATIVE_ISA=avx2` builds it on an AVX-512 machine too, for tests and benchmarks).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define SPECJAX_SIMD_AVX512 1
#elif !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "specjax's int8-activation and fixed-order kernels need AVX2, FMA and F16C (or AVX-512 F, BW and VNNI)"
#endif

namespace specjax::simd {

#if defined(SPECJAX_SIMD_AVX512)

struct F16 {
  __m512 v;
};
struct I16 {
  __m512i v;
};

inline F16 Zero() { return {_mm512_setzero_ps()}; }
inline F16 Set1(float x) { return {_mm512_set1_ps(x)}; }
inline F16 Load(const float* p) { return {_mm512_loadu_ps(p)}; }
inline void Store(float* p, F16 a) { _mm512_storeu_ps(p, a.v); }
inline F16 Add(F16 a, F16 b) { return {_mm512_add_ps(a.v, b.v)}; }
inline F16 Sub(F16 a, F16 b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline F16 Mul(F16 a, F16 b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline F16 Max(F16 a, F16 b) { return {_mm512_max_ps(a.v, b.v)}; }
inline F16 Abs(F16 a) { return {_mm512_abs_ps(a.v)}; }
inline F16 FMAdd(F16 a, F16 b, F16 c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }    // a·b + c
inline F16 FNMAdd(F16 a, F16 b, F16 c) { return {_mm512_fnmadd_ps(a.v, b.v, c.v)}; }  // c − a·b
inline F16 RoundNearest(F16 a) {
  return {_mm512_roundscale_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
}
// a where x >= bound, else +0.
inline F16 KeepAtLeast(F16 x, float bound, F16 a) {
  return {_mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x.v, _mm512_set1_ps(bound), _CMP_GE_OQ), a.v)};
}
// Lanes 0..n-1 of a, the others +0 (0 <= n <= 16).
inline F16 FirstLanes(F16 a, int64_t n) {
  return {_mm512_maskz_mov_ps(n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1), a.v)};
}
// 2^n for integral n in float32's normal exponent range.
inline F16 Pow2(F16 n) {
  return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n.v), _mm512_set1_epi32(127)), 23))};
}
inline __m256 Fold256(F16 a) {  // upper 8 lanes + lower 8 (F only: no DQ extract)
  return _mm256_add_ps(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a.v), 1)), _mm512_castps512_ps256(a.v));
}
inline float ReduceMax(F16 a) { return _mm512_reduce_max_ps(a.v); }  // exact in any order

inline I16 IZero() { return {_mm512_setzero_si512()}; }
inline I16 ISet1(int32_t x) { return {_mm512_set1_epi32(x)}; }
inline I16 ISub(I16 a, I16 b) { return {_mm512_sub_epi32(a.v, b.v)}; }
inline I16 IAdd(I16 a, I16 b) { return {_mm512_add_epi32(a.v, b.v)}; }
inline I16 ToInt(F16 a) { return {_mm512_cvtps_epi32(a.v)}; }  // round to nearest even (MXCSR's default)
inline F16 ToFloat(I16 a) { return {_mm512_cvtepi32_ps(a.v)}; }
inline int32_t IReduceAdd(I16 a) { return _mm512_reduce_add_epi32(a.v); }
inline F16 LoadInt8AsFloat(const int8_t* p) {  // 16 int8 values, exactly, as float32
  return {_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))))};
}
inline F16 LoadHalfAsFloat(const uint16_t* p) {  // 16 float16 values, exactly, as float32
  return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))};
}
inline void StoreInt8(int8_t* p, I16 a) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtsepi32_epi8(a.v)); }

// Whether `DotWords` on int8 weights sums (q + 128)·x (the caller subtracts 128·Σx) rather than q·x.
constexpr bool kInt8Flipped = true;

// acc[l] += the dot product of the 4 bytes of word l of w (64 bytes: one 4-byte word per lane) with the 4 int8
// values of x: nibble 0: int8 weights; 1: low nibbles; 2: high nibbles (unsigned 0..15).
inline I16 DotWords(I16 acc, const uint8_t* w, int nibble, const int8_t* x) {
  const __m512i raw = _mm512_loadu_si512(w), low = _mm512_set1_epi8(0x0F);
  const __m512i u = nibble == 0   ? _mm512_xor_si512(raw, _mm512_set1_epi8(static_cast<char>(0x80)))
                    : nibble == 1 ? _mm512_and_si512(raw, low)
                                  : _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);
  int32_t word;
  std::memcpy(&word, x, 4);
  return {_mm512_dpbusd_epi32(acc.v, u, _mm512_set1_epi32(word))};
}

#else  // AVX2 + FMA: lanes 0-7 in lo, 8-15 in hi

struct F16 {
  __m256 lo, hi;
};
struct I16 {
  __m256i lo, hi;
};

inline F16 Zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline F16 Set1(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline F16 Load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline void Store(float* p, F16 a) {
  _mm256_storeu_ps(p, a.lo);
  _mm256_storeu_ps(p + 8, a.hi);
}
inline F16 Add(F16 a, F16 b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline F16 Sub(F16 a, F16 b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
inline F16 Mul(F16 a, F16 b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline F16 Max(F16 a, F16 b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
inline F16 Abs(F16 a) {
  const __m256 m = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  return {_mm256_and_ps(a.lo, m), _mm256_and_ps(a.hi, m)};
}
inline F16 FMAdd(F16 a, F16 b, F16 c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
inline F16 FNMAdd(F16 a, F16 b, F16 c) {
  return {_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)};
}
inline F16 RoundNearest(F16 a) {
  constexpr int kMode = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  return {_mm256_round_ps(a.lo, kMode), _mm256_round_ps(a.hi, kMode)};
}
inline F16 KeepAtLeast(F16 x, float bound, F16 a) {
  const __m256 b = _mm256_set1_ps(bound);
  return {_mm256_and_ps(_mm256_cmp_ps(x.lo, b, _CMP_GE_OQ), a.lo), _mm256_and_ps(_mm256_cmp_ps(x.hi, b, _CMP_GE_OQ), a.hi)};
}
inline F16 FirstLanes(F16 a, int64_t n) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), count = _mm256_set1_epi32(static_cast<int32_t>(n));
  const __m256 keep_lo = _mm256_castsi256_ps(_mm256_cmpgt_epi32(count, lane));
  const __m256 keep_hi = _mm256_castsi256_ps(_mm256_cmpgt_epi32(count, _mm256_add_epi32(lane, _mm256_set1_epi32(8))));
  return {_mm256_and_ps(keep_lo, a.lo), _mm256_and_ps(keep_hi, a.hi)};
}
inline F16 Pow2(F16 n) {
  const __m256i bias = _mm256_set1_epi32(127);
  return {_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n.lo), bias), 23)),
          _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n.hi), bias), 23))};
}
inline __m256 Fold256(F16 a) { return _mm256_add_ps(a.hi, a.lo); }
inline float ReduceMax(F16 a) {
  const __m256 m8 = _mm256_max_ps(a.lo, a.hi);
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  return std::max(_mm_cvtss_f32(m4), _mm_cvtss_f32(_mm_shuffle_ps(m4, m4, 1)));
}

inline I16 IZero() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
inline I16 ISet1(int32_t x) { return {_mm256_set1_epi32(x), _mm256_set1_epi32(x)}; }
inline I16 ISub(I16 a, I16 b) { return {_mm256_sub_epi32(a.lo, b.lo), _mm256_sub_epi32(a.hi, b.hi)}; }
inline I16 IAdd(I16 a, I16 b) { return {_mm256_add_epi32(a.lo, b.lo), _mm256_add_epi32(a.hi, b.hi)}; }
inline I16 ToInt(F16 a) { return {_mm256_cvtps_epi32(a.lo), _mm256_cvtps_epi32(a.hi)}; }
inline F16 ToFloat(I16 a) { return {_mm256_cvtepi32_ps(a.lo), _mm256_cvtepi32_ps(a.hi)}; }
inline int32_t IReduceAdd(I16 a) {
  alignas(32) int32_t l[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(l), _mm256_add_epi32(a.lo, a.hi));
  return l[0] + l[1] + l[2] + l[3] + l[4] + l[5] + l[6] + l[7];  // integers: any order
}
inline F16 LoadInt8AsFloat(const int8_t* p) {
  const auto eight = [](const int8_t* q) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q))));
  };
  return {eight(p), eight(p + 8)};
}
inline F16 LoadHalfAsFloat(const uint16_t* p) {  // F16C
  return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)))};
}
inline void StoreInt8(int8_t* p, I16 a) {  // saturating, like _mm512_cvtsepi32_epi8
  const __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(a.lo, a.hi), 0xD8);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm_packs_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)));
}

// AVX2 sums q·x for int8 weights directly: |q| times x with q's sign (pair sums <= 2·128·127 < 2^15).
constexpr bool kInt8Flipped = false;

inline __m256i DotHalf(__m256i acc, __m256i raw, int nibble, __m256i xw) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  __m256i pairs;
  if (nibble == 0) {
    pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(raw), _mm256_sign_epi8(xw, raw));
  } else {
    const __m256i u = nibble == 1 ? _mm256_and_si256(raw, low) : _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
    pairs = _mm256_maddubs_epi16(u, xw);  // u <= 15: pair sums <= 2·15·128
  }
  return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

inline I16 DotWords(I16 acc, const uint8_t* w, int nibble, const int8_t* x) {
  int32_t word;
  std::memcpy(&word, x, 4);
  const __m256i xw = _mm256_set1_epi32(word);
  return {DotHalf(acc.lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)), nibble, xw),
          DotHalf(acc.hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32)), nibble, xw)};
}

#endif

// The sum of the 16 lanes in one fixed tree, the same on both forms: upper 8 + lower 8, upper 4 + lower 4, then
// (l0 + l2) + (l1 + l3) (GCC's _mm512_reduce_add_ps).
inline float ReduceAdd(F16 a) {
  const __m256 s8 = Fold256(a);
  const __m128 s4 = _mm_add_ps(_mm256_extractf128_ps(s8, 1), _mm256_castps256_ps128(s8));
  const __m128 s2 = _mm_add_ps(s4, _mm_shuffle_ps(s4, s4, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm_cvtss_f32(s2) + _mm_cvtss_f32(_mm_shuffle_ps(s2, s2, 1));
}

}  // namespace specjax::simd
