// nn::Rope on the device (cuda_ops.hpp): the rotate-half rotation of the first `heads` heads
// of every row at the row's position, in place, one thread per (row, head, pair). Angles,
// cosines and sines in float as the CPU twin (sinf and cosf here against the CPU's double cos
// and sin of the same float angle: an ulp or so apart). The inverse rotation (the backward)
// is the same kernel with the sine negated.
#include <cuda_runtime.h>

#include <cstdint>

#include "ndmesh/nn/cuda_ops.hpp"
#include "tensor/cuda/common.cuh"

namespace ndmesh::cuda {

namespace {

using detail::Bf16Bits;
using detail::bits;
using detail::load;
using detail::store;

template <typename S>
__global__ void rope_kernel(S* x, const float* inv_freq, const std::int64_t* positions, std::int64_t rows,
                            std::int64_t seq, std::int64_t width, std::int64_t heads, std::int64_t half,
                            float sign) {
  const std::int64_t n = rows * heads * half, stride = std::int64_t{gridDim.x} * blockDim.x;
  for (std::int64_t k = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; k < n; k += stride) {
    const std::int64_t i = k % half, h = (k / half) % heads, r = k / (half * heads);
    const std::int64_t p = positions != nullptr ? positions[r % seq] : r % seq;
    const float a = static_cast<float>(p) * inv_freq[i];
    const float c = cosf(a), s = sign * sinf(a);
    S* v = x + r * width + h * 2 * half;
    const float x1 = load(v + i), x2 = load(v + i + half);
    store(v + i, x1 * c - x2 * s);
    store(v + i + half, x2 * c + x1 * s);
  }
}

template <typename S>
void rotate(S* x, const float* inv_freq, const std::int64_t* positions, std::int64_t rows, std::int64_t seq,
            std::int64_t width, std::int64_t heads, std::int64_t head_dim, bool inverse, const char* what) {
  const std::int64_t n = rows * heads * (head_dim / 2);
  if (n <= 0) return;
  rope_kernel<S><<<detail::blocks_for(n), detail::kThreads, 0, detail::compute_stream()>>>(
      x, inv_freq, positions, rows, seq, width, heads, head_dim / 2, inverse ? -1.0f : 1.0f);
  detail::check_launch(what);
}

}  // namespace

void rope_rotate(float* x, const float* inv_freq, const std::int64_t* positions, std::int64_t rows, std::int64_t seq,
                 std::int64_t width, std::int64_t heads, std::int64_t head_dim, bool inverse) {
  rotate<float>(x, inv_freq, positions, rows, seq, width, heads, head_dim, inverse, "rope_rotate");
}

void rope_rotate(BFloat16* x, const float* inv_freq, const std::int64_t* positions, std::int64_t rows,
                 std::int64_t seq, std::int64_t width, std::int64_t heads, std::int64_t head_dim, bool inverse) {
  rotate<Bf16Bits>(bits(x), inv_freq, positions, rows, seq, width, heads, head_dim, inverse, "rope_rotate (bf16)");
}

}  // namespace ndmesh::cuda
