// nn::Linear's bias on the device (cuda_ops.hpp): the forward add and the backward column
// sums. The matrix products of the layer are cuda::gemm (src/tensor/cuda/blas.cu).
//
// bias_backward is deterministic: the rows are cut into at most 64 chunks; a block sums 32
// columns of one chunk (its row lanes y take rows y, y + lanes, ..., then the lanes' sums are
// added in order y = 0, 1, ...), and a second pass adds the chunk sums in chunk order
// (detail::column_sums). No atomics: the same bits on every run.
// Both kernels take fp32 or bf16 rows (detail::load/store); the bias and its gradient are fp32.
// Where the rows allow it (cols a multiple of 8, the buffers 16-byte aligned) a thread moves 8
// columns with 16-byte accesses (detail::load8/store8), else one at a time.
#include <cuda_runtime.h>

#include <cstdint>

#include "ndmesh/nn/cuda_ops.hpp"
#include "tensor/cuda/common.cuh"

namespace ndmesh::cuda {

namespace {

using detail::bits;
using detail::check_launch;
using detail::compute_stream;
using detail::is_aligned16;
using detail::load;
using detail::load8;
using detail::store;
using detail::store8;

// S: float, or bfloat16 bits (the bf16 overloads: float math, one rounding per store).
// out += bias, then (when residual is not null) += residual: two adds in that order, one
// rounding each in fp32 (bf16 rows: both in float, one rounding at the store).
template <typename S>
__global__ void bias_forward_kernel(S* out, const float* bias, const S* residual, std::int64_t rows,
                                    std::int64_t cols) {
  const std::int64_t j = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  const float b = bias[j];
  for (std::int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    S* o = out + r * cols + j;
    const float with_bias = __fadd_rn(load(o), b);
    store(o, residual != nullptr ? __fadd_rn(with_bias, load(residual + r * cols + j)) : with_bias);
  }
}

// The same, eight columns a thread: columns [8 j, 8 j + 8).
template <typename S>
__global__ void bias_forward_vec_kernel(S* out, const float* bias, const S* residual, std::int64_t rows,
                                        std::int64_t cols) {
  const std::int64_t j = (std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x) * 8;
  if (j >= cols) return;
  float b[8], v[8], res[8];
  load8(bias + j, b);
  for (std::int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    S* o = out + r * cols + j;
    load8(o, v);
    if (residual != nullptr) load8(residual + r * cols + j, res);
    for (int k = 0; k < 8; ++k) {
      v[k] = __fadd_rn(v[k], b[k]);
      if (residual != nullptr) v[k] = __fadd_rn(v[k], res[k]);
    }
    store8(o, v);
  }
}

constexpr int kColTile = 32, kRowLanes = 8, kVecRowLanes = 32;

template <typename S>
__global__ void bias_partials_kernel(float* partials, const S* dout, std::int64_t rows, std::int64_t cols,
                                     std::int64_t chunk_rows) {
  __shared__ float sums[kRowLanes][kColTile + 1];
  const std::int64_t j = std::int64_t{blockIdx.x} * kColTile + threadIdx.x;
  const std::int64_t r0 = std::int64_t{blockIdx.y} * chunk_rows;
  const std::int64_t r1 = r0 + chunk_rows < rows ? r0 + chunk_rows : rows;
  float acc = 0;
  if (j < cols)
    for (std::int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) acc = __fadd_rn(acc, load(dout + r * cols + j));
  sums[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && j < cols) {
    float total = sums[0][threadIdx.x];
    for (int y = 1; y < kRowLanes; ++y) total = __fadd_rn(total, sums[y][threadIdx.x]);
    partials[std::int64_t{blockIdx.y} * cols + j] = total;
  }
}

// The same, eight columns a thread (4 x 8 = 32 columns a block, kVecRowLanes row lanes).
template <typename S>
__global__ void bias_partials_vec_kernel(float* partials, const S* dout, std::int64_t rows, std::int64_t cols,
                                         std::int64_t chunk_rows) {
  __shared__ float sums[kVecRowLanes][kColTile + 1];
  const std::int64_t j = std::int64_t{blockIdx.x} * kColTile + threadIdx.x * 8;
  const std::int64_t r0 = std::int64_t{blockIdx.y} * chunk_rows;
  const std::int64_t r1 = r0 + chunk_rows < rows ? r0 + chunk_rows : rows;
  float acc[8] = {}, v[8];
  if (j < cols)
    for (std::int64_t r = r0 + threadIdx.y; r < r1; r += kVecRowLanes) {
      load8(dout + r * cols + j, v);
      for (int k = 0; k < 8; ++k) acc[k] = __fadd_rn(acc[k], v[k]);
    }
  for (int k = 0; k < 8; ++k) sums[threadIdx.y][threadIdx.x * 8 + k] = acc[k];
  __syncthreads();
  if (threadIdx.y == 0 && j < cols) {
    float total[8];
    for (int k = 0; k < 8; ++k) {
      total[k] = sums[0][threadIdx.x * 8 + k];
      for (int y = 1; y < kVecRowLanes; ++y) total[k] = __fadd_rn(total[k], sums[y][threadIdx.x * 8 + k]);
    }
    store8(partials + std::int64_t{blockIdx.y} * cols + j, total);
  }
}

template <typename S>
void forward(S* out, const float* bias, const S* residual, std::int64_t rows, std::int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  const bool vec = cols % 8 == 0 && is_aligned16(out) && is_aligned16(bias) &&
                   (residual == nullptr || is_aligned16(residual));
  const auto row_blocks = static_cast<unsigned>(rows < 4096 ? rows : 4096);
  if (vec) {
    const std::int64_t lanes = cols / 8;
    const int threads = lanes < detail::kThreads ? static_cast<int>((lanes + 31) / 32 * 32) : detail::kThreads;
    const dim3 grid(static_cast<unsigned>((lanes + threads - 1) / threads), row_blocks);
    bias_forward_vec_kernel<S><<<grid, threads, 0, compute_stream()>>>(out, bias, residual, rows, cols);
  } else {
    const dim3 grid(static_cast<unsigned>((cols + detail::kThreads - 1) / detail::kThreads), row_blocks);
    bias_forward_kernel<S><<<grid, detail::kThreads, 0, compute_stream()>>>(out, bias, residual, rows, cols);
  }
  check_launch(residual != nullptr ? "bias_forward (+residual)" : "bias_forward");
}

template <typename S>
void backward(float* dbias, const S* dout, std::int64_t rows, std::int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  const std::int64_t chunk_rows = detail::column_chunk_rows(rows),
                     chunks = (rows + chunk_rows - 1) / chunk_rows;
  DeviceBuffer partials(static_cast<std::size_t>(chunks * cols) * sizeof(float));
  auto* p = static_cast<float*>(partials.data());
  const dim3 grid(static_cast<unsigned>((cols + kColTile - 1) / kColTile), static_cast<unsigned>(chunks));
  if (cols % 8 == 0 && is_aligned16(dout))
    bias_partials_vec_kernel<S><<<grid, dim3(kColTile / 8, kVecRowLanes), 0, compute_stream()>>>(p, dout, rows, cols,
                                                                                                  chunk_rows);
  else
    bias_partials_kernel<S><<<grid, dim3(kColTile, kRowLanes), 0, compute_stream()>>>(p, dout, rows, cols, chunk_rows);
  check_launch("bias_backward");
  float* const dst[1] = {dbias};
  detail::column_sums(dst, 1, p, chunks, cols);
}

}  // namespace

void bias_forward(float* out, const float* bias, std::int64_t rows, std::int64_t cols, const float* residual) {
  forward(out, bias, residual, rows, cols);
}
void bias_forward(BFloat16* out, const float* bias, std::int64_t rows, std::int64_t cols, const BFloat16* residual) {
  forward(bits(out), bias, residual != nullptr ? bits(residual) : nullptr, rows, cols);
}
void bias_backward(float* dbias, const float* dout, std::int64_t rows, std::int64_t cols) {
  backward(dbias, dout, rows, cols);
}
void bias_backward(float* dbias, const BFloat16* dout, std::int64_t rows, std::int64_t cols) {
  backward(dbias, bits(dout), rows, cols);
}

}  // namespace ndmesh::cuda
