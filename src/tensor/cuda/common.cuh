// What the .cu files share: the compute stream, launch sizes, warp reductions and the
// deterministic column sums. Internal to the CUDA sources (no ndmesh/core header: fmt does
// not compile under nvcc).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ndmesh/core/dtype.hpp"
#include "ndmesh/tensor/device.hpp"
#include "tensor/cuda/errors.hpp"

namespace ndmesh::cuda::detail {

/// The process's compute stream (cuda::stream()) as its CUDA type.
inline cudaStream_t compute_stream() { return static_cast<cudaStream_t>(cuda::stream()); }

/// Threads per block of the element-wise kernels.
inline constexpr int kThreads = 256;

/// Blocks for a grid-stride loop over n items, `threads` per block: enough to fill any GPU
/// (capped; the loop covers the rest), at least 1.
inline unsigned blocks_for(std::int64_t n, int threads = kThreads, std::int64_t cap = 8192) {
  const std::int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > cap ? cap : b));
}

/// Sum and maximum over the 32 lanes of a warp (every lane gets the result).
template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/// Storage types of the kernels templated on it: float (the fp32 path, and the twin every
/// bf16 kernel is tested against) or bfloat16 as its bits (std::uint16_t: the layout of
/// ndmesh::BFloat16, no cuda_bf16.h, so that the emulator runs it). Arithmetic is float:
/// load() widens exactly, store() rounds to nearest even (NaN stays a quiet NaN) as
/// BFloat16::from_float does.
using Bf16Bits = std::uint16_t;
__device__ __forceinline__ float load(const float* p) { return *p; }
__device__ __forceinline__ float load(const Bf16Bits* p) {
  return __uint_as_float(static_cast<std::uint32_t>(*p) << 16);
}
__device__ __forceinline__ Bf16Bits to_bf16(float f) {
  std::uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<Bf16Bits>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<Bf16Bits>(u >> 16);
}
__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(Bf16Bits* p, float v) { *p = to_bf16(v); }
/// The bits behind a BFloat16 pointer (the public API's type).
inline Bf16Bits* bits(BFloat16* p) { return reinterpret_cast<Bf16Bits*>(p); }
inline const Bf16Bits* bits(const BFloat16* p) { return reinterpret_cast<const Bf16Bits*>(p); }

/// Rows per chunk of a column sum over `rows` rows: at most 64 chunks of at least 64 rows.
inline std::int64_t column_chunk_rows(std::int64_t rows) {
  const std::int64_t per = (rows + 63) / 64;
  return per < 64 ? 64 : per;
}

/// dst[j] += sum over c < chunks of partials[c * cols + j], in the order c = 0, 1, ...:
/// the second pass of the deterministic column sums (bias and LayerNorm backward).
void add_column_partials(float* dst, const float* partials, std::int64_t chunks, std::int64_t cols);

}  // namespace ndmesh::cuda::detail
