// Integer matrix products for specjax's BlockQuant matrices on XLA:CPU with int8 activations (an XLA
// FFI custom call; specjax/models/native_kernels.py builds, loads and calls it).
//
// y[m, o] = sum_b sx[m, b] * (scale[o, b] * sum_{i in b} q[o, i] * x8[m, i] - offset[o, b] * sum_{i in b} x8[m, i])
//
// x is quantized here, per row and per block of the matrix's columns: x8 = round(x * 127 / amax),
// sx = amax / 127 (what llama.cpp does with its q8 activations, on finer blocks). The sums over a block
// are exact integer arithmetic (AVX-512 VNNI, vpdpbusd: 64 products per instruction, four times the
// float32 FMA rate, no conversion of the weights to float; on AVX2, maddubs and madd, the same integers:
// simd16.h); the float32 combination of the blocks runs in
// one fixed order, so a row's result does not depend on how many rows the call has or which thread ran
// it: a verification of k + 1 rows gives each row exactly what a one-row decoding step gives it.
//
// Layout ("tiles of 16 output rows", made by `int8_activations.tile_arrays`, same array shapes as the
// row-major BlockQuant): the bytes of 16 output rows are one contiguous tile in which the rows' 4-byte
// words alternate: word w of rows 0..15, then word w + 1, ... so each 64-byte vector holds one word per
// output row (one vpdpbusd lane each). A word is 4 int8 values (stored signed; VNNI flips them to q + 128:
// vpdpbusd multiplies unsigned by signed bytes; 128 · Σx8 is subtracted), or 4 bytes of 4-bit pairs
// whose low nibbles are columns c..c+3 and high nibbles columns in/2 + c..c+3 (BlockQuant's own pairing),
// so the low and high nibbles of one vector feed two different scale blocks.
// The scale (offset) of a tile is [nb][16] floats, so one vector load gives 16 output rows' scales. Or, where
// the scales factor exactly (GGUF's K-quants: a float16 per 256 columns times a small integer per block), the
// compact form: int8 sub-scales [nb][16] and float32 super-scales [nb / group][16]; the kernel forms
// sub · super, the very float32 the full form stores (the product is exact), so both forms give the same bits
// and the compact one reads 1 + 4 / group bytes per block and row instead of 4. Or, where each scale is a
// float16 (Q8_0, Q5_0: no shared factor), float16 scales [nb][16], widened exactly: 2 bytes instead of 4.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "gemm_common.h"
#include "simd16.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using namespace specjax::simd;  // F16 / I16: 16 lanes, the same bits on AVX-512 VNNI and AVX2

constexpr int64_t kLanes = 16;  // output rows per tile: one int32 lane of a vector each
#if defined(SPECJAX_SIMD_AVX512)
constexpr int kMaxRows = 8;  // rows of x per register tile (2 x 8 of the 32 registers)
#else
constexpr int kMaxRows = 4;  // AVX2 has 16 registers and a lane group takes two
#endif

// values: tiles of 16 output rows (see above); scale, offset: [out / 16][nb][16] (float32 or, compact, int8
// with super-scales [out / 16][nb / group][16]).
struct Problem : specjax::GemmArgs {
  const int8_t* scale8 = nullptr;  // compact: sub-scales (offset8 too where there are offsets)
  const int8_t* offset8 = nullptr;
  const uint16_t* scale16 = nullptr;  // float16 scales (offsets)
  const uint16_t* offset16 = nullptr;
  const float* scale_super = nullptr;  // compact: float32 super-scales, or
  const float* offset_super = nullptr;
  const uint16_t* scale_super16 = nullptr;  // float16 ones (GGUF's K-quants: d is a float16)
  const uint16_t* offset_super16 = nullptr;
  int64_t group = 1, n_super = 0;
  std::vector<int8_t> x8;     // [m, in]
  std::vector<float> sx;      // [m, nb]
  std::vector<int32_t> xsum;  // [m, nb]
};

// x8, sx and xsum of every row of x: round to nearest even (the default MXCSR mode), one scale per block.
void Quantize(Problem& p) {
  const int64_t B = p.block;
  for (int64_t r = 0; r < p.m; ++r) {
    for (int64_t b = 0; b < p.nb; ++b) {
      const float* xb = p.x + r * p.in + b * B;
      int8_t* qb = p.x8.data() + r * p.in + b * B;
      F16 amax = Zero();
      for (int64_t k = 0; k < B; k += 16) amax = Max(amax, Abs(Load(xb + k)));
      const float a = ReduceMax(amax);
      const float inv = a > 0.0f ? 127.0f / a : 0.0f;
      I16 sum = IZero();
      for (int64_t k = 0; k < B; k += 16) {
        const I16 q = ToInt(Mul(Load(xb + k), Set1(inv)));
        StoreInt8(qb + k, q);
        sum = IAdd(sum, q);
      }
      p.sx[r * p.nb + b] = a / 127.0f;
      p.xsum[r * p.nb + b] = IReduceAdd(sum);
    }
  }
}

// The integer sums of one scale block for MR rows of x: `words` vectors from w (nibble: 0 = int8 values,
// 1 = low nibbles, 2 = high nibbles) against x8 from xb.
template <int MR>
inline void BlockSums(I16 (&d)[MR], const uint8_t* w, int64_t words, int nibble, const int8_t* xb, int64_t in) {
  for (int r = 0; r < MR; ++r) d[r] = IZero();
  for (int64_t v = 0; v < words; ++v, w += 64)
    for (int r = 0; r < MR; ++r) d[r] = DotWords(d[r], w, nibble, xb + r * in + 4 * v);
}

// How a matrix stores its scales (offsets): float32, compact (int8 sub-scales times float32 or float16
// super-scales) or float16.
enum Form { kFull, kCompact, kCompactHalf, kHalf };

// One tile's scales (offsets): block b's 16 lanes in the matrix's form.
struct TileScales {
  const float* full;
  const int8_t* sub;
  const float* super;
  const uint16_t* super16;
  const uint16_t* half;
  int64_t group;

  template <Form F>
  F16 At(int64_t b) const {
    if constexpr (F == kCompact) return Mul(LoadInt8AsFloat(sub + b * kLanes), Load(super + b / group * kLanes));
    if constexpr (F == kCompactHalf)
      return Mul(LoadInt8AsFloat(sub + b * kLanes), LoadHalfAsFloat(super16 + b / group * kLanes));
    if constexpr (F == kHalf) return LoadHalfAsFloat(half + b * kLanes);
    return Load(full + b * kLanes);
  }
};

// Tile g's scales (offsets) in the matrix's form.
TileScales ScalesOf(const Problem& p, int64_t g, bool offsets) {
  const int64_t at = g * kLanes * p.nb, at_super = g * kLanes * p.n_super;
  const auto tile = [at](const auto* a) { return a ? a + at : nullptr; };
  const auto super = [at_super](const auto* a) { return a ? a + at_super : nullptr; };
  if (offsets)
    return {tile(p.offset), tile(p.offset8), super(p.offset_super), super(p.offset_super16), tile(p.offset16),
            p.group};
  return {tile(p.scale), tile(p.scale8), super(p.scale_super), super(p.scale_super16), tile(p.scale16), p.group};
}

// acc += sx · (scale · Σ q x8 − offset · Σ x8) for block b of each row (VNNI's int8 form Σ (q + 128) x8
// first loses 128 · Σ x8).
template <int MR, bool OFF, Form F>
inline void Combine(const Problem& p, F16 (&acc)[MR], const I16 (&d)[MR], int64_t m0, int64_t b,
                    const TileScales& sc, const TileScales& of) {
  const F16 s = sc.At<F>(b);
  const F16 o = OFF ? of.At<F>(b) : s;
  for (int r = 0; r < MR; ++r) {
    const int64_t at = (m0 + r) * p.nb + b;
    const I16 di = p.q4 || !kInt8Flipped ? d[r] : ISub(d[r], ISet1(128 * p.xsum[at]));
    F16 t = Mul(ToFloat(di), s);
    if (OFF) t = FNMAdd(o, Set1(static_cast<float>(p.xsum[at])), t);
    acc[r] = FMAdd(t, Set1(p.sx[at]), acc[r]);
  }
}

// MR rows of x (from m0) times the 16 output rows of tile g. Blocks are combined in one fixed order
// (4-bit: b, b + nb / 2, b + 1, ...; int8: 0, 1, ...), whatever MR is.
template <int MR, bool OFF, Form F>
void Tile(const Problem& p, int64_t m0, int64_t g) {
  const int64_t B = p.block, nb = p.nb;
  const uint8_t* w = static_cast<const uint8_t*>(p.values) + g * kLanes * (p.q4 ? p.in / 2 : p.in);
  const TileScales sc = ScalesOf(p, g, false), of = ScalesOf(p, g, true);
  const int8_t* x8 = p.x8.data() + m0 * p.in;
  F16 acc[MR];
  I16 d[MR];
  for (int r = 0; r < MR; ++r) acc[r] = Zero();
  if (p.q4) {
    const int64_t half = p.in / 2, words = B / 4;  // a block of low (high) nibbles: B bytes per row
    for (int64_t b = 0; b < nb / 2; ++b, w += 64 * words) {
      BlockSums<MR>(d, w, words, 1, x8 + b * B, p.in);
      Combine<MR, OFF, F>(p, acc, d, m0, b, sc, of);
      BlockSums<MR>(d, w, words, 2, x8 + half + b * B, p.in);
      Combine<MR, OFF, F>(p, acc, d, m0, b + nb / 2, sc, of);
    }
  } else {
    const int64_t words = B / 4;
    for (int64_t b = 0; b < nb; ++b, w += 64 * words) {
      BlockSums<MR>(d, w, words, 0, x8 + b * B, p.in);
      Combine<MR, OFF, F>(p, acc, d, m0, b, sc, of);
    }
  }
  for (int r = 0; r < MR; ++r) Store(p.y + (m0 + r) * p.out + g * kLanes, acc[r]);
}

template <int MR, Form F>
void TileOf(const Problem& p, int64_t m0, int64_t g) {
  (p.offset || p.offset8 || p.offset16) ? Tile<MR, true, F>(p, m0, g) : Tile<MR, false, F>(p, m0, g);
}

template <int MR>
void TileAny(const Problem& p, int64_t m0, int64_t g) {
  if (p.scale8) {
    p.scale_super16 ? TileOf<MR, kCompactHalf>(p, m0, g) : TileOf<MR, kCompact>(p, m0, g);
  } else if (p.scale16) {
    TileOf<MR, kHalf>(p, m0, g);
  } else {
    TileOf<MR, kFull>(p, m0, g);
  }
}

// Rows m0.. of x (at most kMaxRows) times tile g.
void Rows(const Problem& p, int64_t m0, int64_t g) {
  switch (std::min<int64_t>(kMaxRows, p.m - m0)) {
    case 8: TileAny<8>(p, m0, g); break;
    case 7: TileAny<7>(p, m0, g); break;
    case 6: TileAny<6>(p, m0, g); break;
    case 5: TileAny<5>(p, m0, g); break;
    case 4: TileAny<4>(p, m0, g); break;
    case 3: TileAny<3>(p, m0, g); break;
    case 2: TileAny<2>(p, m0, g); break;
    default: TileAny<1>(p, m0, g); break;
  }
}

// Tiles [g0, g1) for every row of x, spans of tiles small enough to stay in L2 while the row tiles of x
// pass over them (the weights are read from memory once per call, x from cache).
void Chunk(const Problem& p, int64_t g0, int64_t g1) {
  const int64_t tile_bytes = kLanes * (p.q4 ? p.in / 2 : p.in);
  const int64_t span = std::max<int64_t>(1, (256 << 10) / tile_bytes);
  for (int64_t s0 = g0; s0 < g1; s0 += span) {
    const int64_t s1 = std::min(g1, s0 + span);
    for (int64_t m0 = 0; m0 < p.m; m0 += kMaxRows)
      for (int64_t g = s0; g < s1; ++g) Rows(p, m0, g);
  }
}

// The form of the scales into p, checked: float32, float16, or compact (int8 sub-scales with float32 or
// float16 super-scales [out, nb / group]).
ffi::Error ReadForm(Problem& p, ffi::AnyBuffer scale, ffi::AnyBuffer scale_super, ffi::AnyBuffer offset,
                    ffi::AnyBuffer offset_super) {
  const bool compact = scale.element_type() == ffi::DataType::S8, half = scale.element_type() == ffi::DataType::F16;
  if (!compact && !half && scale.element_type() != ffi::DataType::F32)
    return ffi::Error::InvalidArgument("scale must be float32, float16 or int8 sub-scales");
  if ((offset.element_count() && offset.element_type() != scale.element_type()) ||
      compact != (scale_super.element_count() > 0) || (offset_super.element_count() > 0) != (compact && p.offset))
    return ffi::Error::InvalidArgument("scale, offset and their super-scales must take one form");
  if (half) {
    p.scale16 = reinterpret_cast<const uint16_t*>(p.scale);
    p.offset16 = reinterpret_cast<const uint16_t*>(p.offset);
    p.scale = p.offset = nullptr;
  }
  if (!compact) return ffi::Error::Success();
  if (scale_super.dimensions().size() != 2 || (p.offset && offset_super.dimensions().size() != 2))
    return ffi::Error::InvalidArgument("super-scales must be [out, nb / group]");
  p.n_super = scale_super.dimensions()[1];
  if (p.n_super == 0 || p.nb % p.n_super != 0 || scale_super.dimensions()[0] != p.out ||
      (p.offset && (offset_super.dimensions()[0] != p.out || offset_super.dimensions()[1] != p.n_super)))
    return ffi::Error::InvalidArgument("super-scales must be [out, nb / group]");
  const auto super_type = scale_super.element_type();
  if ((super_type != ffi::DataType::F32 && super_type != ffi::DataType::F16) ||
      (p.offset && offset_super.element_type() != super_type))
    return ffi::Error::InvalidArgument("super-scales must be float32 or float16, both of one type");
  p.group = p.nb / p.n_super;
  p.scale8 = reinterpret_cast<const int8_t*>(p.scale);
  p.offset8 = reinterpret_cast<const int8_t*>(p.offset);
  p.scale = p.offset = nullptr;
  const void* ss = scale_super.untyped_data();
  const void* os = p.offset8 ? offset_super.untyped_data() : nullptr;
  if (super_type == ffi::DataType::F16) {
    p.scale_super16 = static_cast<const uint16_t*>(ss);
    p.offset_super16 = static_cast<const uint16_t*>(os);
  } else {
    p.scale_super = static_cast<const float*>(ss);
    p.offset_super = static_cast<const float*>(os);
  }
  return ffi::Error::Success();
}

ffi::Error Gemm(ffi::ThreadPool pool, specjax::F32Matrix x, ffi::AnyBuffer values, ffi::AnyBuffer scale,
                ffi::AnyBuffer scale_super, ffi::AnyBuffer offset, ffi::AnyBuffer offset_super,
                specjax::F32Result y) {
  auto work = std::make_shared<specjax::ChunkedWork<Problem>>();
  Problem& p = work->problem;
  if (auto err = specjax::ReadArgs(x, values, scale, offset, y, p); err.failure()) return err;
  if (auto err = ReadForm(p, scale, scale_super, offset, offset_super); err.failure()) return err;
  if (p.out % kLanes != 0 || p.block > 64 || (p.q4 && p.nb % 2 != 0))
    return ffi::Error::InvalidArgument("shapes the int8 activation kernel does not take");
  if (p.m == 0) return ffi::Error::Success();
  p.x8.resize(p.m * p.in);
  p.sx.resize(p.m * p.nb);
  p.xsum.resize(p.m * p.nb);
  Quantize(p);
  work->run_chunk = Chunk;
  specjax::RunChunked(pool, work, p.out / kLanes, 1);  // chunks of whole tiles
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecjaxInt8ActivationGemm, Gemm,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<specjax::F32Matrix>()  // x
                                  .Arg<ffi::AnyBuffer>()      // values
                                  .Arg<ffi::AnyBuffer>()      // scale: float32, float16 or int8 sub-scales
                                  .Arg<ffi::AnyBuffer>()      // super-scales f32 / f16 (compact), else [out, 0]
                                  .Arg<ffi::AnyBuffer>()      // offset (as scale), or empty
                                  .Arg<ffi::AnyBuffer>()      // offset super-scales (as scale's), else [out, 0]
                                  .Ret<specjax::F32Matrix>());
