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

/// 16-byte accesses (llm.c's Packed128): eight elements of a row at a time, as two float4 (fp32)
/// or one 16-byte pack of eight bf16, widened to float on the load and rounded once on the store.
/// The pointer must be 16-byte aligned (is_aligned16); the callers keep a scalar path for rows
/// whose length or start is not (odd shapes, views into a buffer).
inline bool is_aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }
__device__ __forceinline__ void load8(const float* p, float (&v)[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ void load8(const Bf16Bits* p, float (&v)[8]) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const unsigned w[4] = {u.x, u.y, u.z, u.w};
  for (int k = 0; k < 4; ++k) {
    v[2 * k] = __uint_as_float(w[k] << 16);
    v[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
  }
}
__device__ __forceinline__ void store8(float* p, const float (&v)[8]) {
  float4 a, b;
  a.x = v[0], a.y = v[1], a.z = v[2], a.w = v[3], b.x = v[4], b.y = v[5], b.z = v[6], b.w = v[7];
  reinterpret_cast<float4*>(p)[0] = a;
  reinterpret_cast<float4*>(p)[1] = b;
}
__device__ __forceinline__ void store8(Bf16Bits* p, const float (&v)[8]) {
  unsigned w[4];
  for (int k = 0; k < 4; ++k)
    w[k] = static_cast<unsigned>(to_bf16(v[2 * k])) | (static_cast<unsigned>(to_bf16(v[2 * k + 1])) << 16);
  uint4 u;
  u.x = w[0], u.y = w[1], u.z = w[2], u.w = w[3];
  *reinterpret_cast<uint4*>(p) = u;
}

/// The residual connection before a row-wise norm, by one warp a row (`lane` of 32), for the
/// row that starts at element `at` of x: with `add`, residual = (x + x_bias) + add (x_bias may
/// be null: x + add) is stored (rounded to S) and its row returned as the row to normalise;
/// without `add` (residual and add null), x's row. Each lane reads back only what it wrote, so
/// no barrier is needed.
template <typename S>
__device__ __forceinline__ const S* residual_row(S* residual, const S* x, const S* add, const float* x_bias,
                                                 std::int64_t at, int c, int lane) {
  if (add == nullptr) return x + at;
  S* res = residual + at;
  const S *xr = x + at, *a = add + at;
  if (x_bias != nullptr)
    for (int i = lane; i < c; i += 32)
      store(res + i, __fadd_rn(__fadd_rn(load(xr + i), x_bias[i]), load(a + i)));
  else
    for (int i = lane; i < c; i += 32) store(res + i, load(xr + i) + load(a + i));
  return res;
}

/// Rows per chunk of a column sum over `rows` rows: at most 64 chunks of at least 64 rows.
inline std::int64_t column_chunk_rows(std::int64_t rows) {
  const std::int64_t per = (rows + 63) / 64;
  return per < 64 ? 64 : per;
}

/// The second pass of the deterministic column sums (bias and LayerNorm backward): partials
/// [chunks, count * cols] (the chunk sums of `count` quantities side by side) added over the
/// chunks into dst[q][j] += sum over c of partials[c, q * cols + j], q < count (at most 3), in a
/// fixed order (the same bits every run). One launch for every quantity, 16 columns a block.
void column_sums(float* const* dst, int count, const float* partials, std::int64_t chunks, std::int64_t cols);

}  // namespace ndmesh::cuda::detail
