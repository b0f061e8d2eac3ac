// ops::fill_columns on the device (cuda_ops.hpp): the trailing columns of each row set to one
// value (a padded vocabulary's logits to -inf before the softmax), one thread per element.
#include <cuda_runtime.h>

#include <cstdint>

#include "ndmesh/nn/cuda_ops.hpp"
#include "tensor/cuda/common.cuh"

namespace ndmesh::cuda {

namespace {
__global__ void fill_columns_kernel(float* x, std::int64_t rows, std::int64_t width, std::int64_t from, float value) {
  const std::int64_t cols = width - from, n = rows * cols, stride = std::int64_t{gridDim.x} * blockDim.x;
  for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride)
    x[(i / cols) * width + from + i % cols] = value;
}
}  // namespace

void fill_columns(float* x, std::int64_t rows, std::int64_t width, std::int64_t from, float value) {
  if (rows <= 0 || from >= width) return;
  fill_columns_kernel<<<detail::blocks_for(rows * (width - from)), detail::kThreads, 0, detail::compute_stream()>>>(
      x, rows, width, from, value);
  detail::check_launch("fill_columns");
}

}  // namespace ndmesh::cuda
