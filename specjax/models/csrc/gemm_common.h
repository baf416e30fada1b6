// What the native kernels share: the split of their work into chunks on XLA's intra-op pool (all three
// libraries), the float32 matrix aliases, the two matrix-product kernels' argument checks and the float32 one's
// FFI binding (the int8 kernel binds its compact scales' super-scales too).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

#include "xla/ffi/api/ffi.h"

namespace specjax {

// Chunks are claimed one at a time by the calling thread and by helpers on the pool. Helpers that start late
// find nothing left; the caller never waits for a helper that has not claimed a chunk, so a busy pool cannot
// deadlock it. Heap-held (shared_ptr): a late helper may outlive the call.
template <typename P>
struct ChunkedWork {
  P problem;
  void (*run_chunk)(const P&, int64_t, int64_t) = nullptr;  // units [u0, u1)
  int64_t units = 0, chunk = 0, n_chunks = 0;
  std::atomic<int64_t> next{0}, done{0};

  void Run() {
    for (int64_t c; (c = next.fetch_add(1, std::memory_order_relaxed)) < n_chunks;) {
      run_chunk(problem, c * chunk, std::min(units, (c + 1) * chunk));
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

// Runs work->run_chunk over [0, units) in chunks of whole granules, about kChunksPerWorker chunks per
// worker (small enough to balance a noisy machine). The caller works too: one helper fewer than the pool
// has threads (2 cores: 2 workers, not 3).
template <typename P>
void RunChunked(xla::ffi::ThreadPool& pool, const std::shared_ptr<ChunkedWork<P>>& work, int64_t units,
                int64_t granule) {
  constexpr int64_t kChunksPerWorker = 8;
  const int64_t workers = std::max<int64_t>(1, pool.num_threads());
  const int64_t granules = (units + granule - 1) / granule;
  work->units = units;
  work->chunk = granule * std::max<int64_t>(1, granules / (workers * kChunksPerWorker));
  work->n_chunks = (units + work->chunk - 1) / work->chunk;
  const int64_t helpers = std::min<int64_t>(workers - 1, work->n_chunks - 1);
  for (int64_t t = 0; t < helpers; ++t) pool.Schedule([work] { work->Run(); });
  work->Run();
  while (work->done.load(std::memory_order_acquire) < work->n_chunks) _mm_pause();
}

using F32Matrix = xla::ffi::Buffer<xla::ffi::F32, 2>;  // aliases: a comma would split the binding macro's arguments
using F32Result = xla::ffi::ResultBuffer<xla::ffi::F32, 2>;

// The arguments both kernels take: x f32 [m, in], values uint8 [out, in / 2] (4-bit pairs) or int8
// [out, in], scale (offset: or empty) f32 [out, nb] with blocks of `block` columns, y f32 [m, out].
struct GemmArgs {
  const float* x;
  const void* values;
  const float* scale;
  const float* offset;  // null without offsets
  float* y;
  int64_t m, out, in, nb, block;
  bool q4;
};

// Reads the arguments into `a`; an error for values that are not such a matrix or scale blocks that are not
// whole blocks of a multiple of 16 columns (4-bit: the low half of the columns in whole blocks). Scale and offset
// are any [out, nb] buffers (float32 here; the int8 kernel also takes int8 sub-scales, and reads their type).
template <typename Scale, typename Offset>
inline xla::ffi::Error ReadArgs(F32Matrix x, xla::ffi::AnyBuffer values, Scale scale, Offset offset, F32Result y,
                                GemmArgs& a) {
  const auto vdims = values.dimensions();
  if (vdims.size() != 2 || scale.dimensions().size() != 2)
    return xla::ffi::Error::InvalidArgument("values and scale must be matrices");
  a.q4 = values.element_type() == xla::ffi::DataType::U8;
  if (!a.q4 && values.element_type() != xla::ffi::DataType::S8)
    return xla::ffi::Error::InvalidArgument("values must be uint8 (4-bit pairs) or int8");
  a.m = x.dimensions()[0];
  a.in = x.dimensions()[1];
  a.out = vdims[0];
  a.nb = scale.dimensions()[1];
  a.block = a.nb ? a.in / a.nb : 0;
  if (vdims[1] != (a.q4 ? a.in / 2 : a.in) || scale.dimensions()[0] != a.out || a.block * a.nb != a.in ||
      a.block % 16 != 0 || (a.q4 && (a.in / 2) % a.block != 0))
    return xla::ffi::Error::InvalidArgument("shapes the native kernels do not take");
  a.x = x.typed_data();
  a.values = values.untyped_data();
  a.scale = static_cast<const float*>(scale.untyped_data());
  a.offset = offset.element_count() ? static_cast<const float*>(offset.untyped_data()) : nullptr;
  a.y = y->typed_data();
  return xla::ffi::Error::Success();
}

}  // namespace specjax

// The float32 kernel's FFI binding: impl(thread pool, x f32 [m, in], values, scale f32, offset f32) -> y f32.
#define SPECJAX_GEMM_HANDLER(symbol, impl)                                                           \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(symbol, impl,                                                        \
                                xla::ffi::Ffi::Bind()                                                \
                                    .Ctx<xla::ffi::ThreadPool>()                                     \
                                    .Arg<specjax::F32Matrix>()                                       \
                                    .Arg<xla::ffi::AnyBuffer>()                                      \
                                    .Arg<specjax::F32Matrix>()                                       \
                                    .Arg<specjax::F32Matrix>()                                       \
                                    .Ret<specjax::F32Matrix>());
