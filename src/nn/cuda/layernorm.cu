// nn::LayerNorm on the device (cuda_ops.hpp), over rows of C channels:
//   forward:  mean, var (biased, two passes as the CPU), rstd = 1/sqrt(var + eps),
//             out = (x - mean) rstd w + b;
//   backward: with xhat = (x - mean) rstd and g = dout w, per row
//             dx += rstd (g - mean(g) - xhat mean(g xhat)),
//             and over rows dw += sum dout xhat, db += sum dout.
// One warp per row for the row-wise work (the lanes stride the channels, then a shuffle
// tree). The weight and bias gradients are column sums, computed deterministically like
// bias_backward: chunks of rows summed by 32 x 8 thread blocks, then the chunk sums added
// in order (detail::add_column_partials). No atomics anywhere: the same bits every run.
#include <cuda_runtime.h>

#include <cstdint>

#include "ndmesh/nn/cuda_ops.hpp"
#include "tensor/cuda/common.cuh"

namespace ndmesh::cuda {

namespace {

using detail::check_launch;
using detail::compute_stream;
using detail::warp_sum;

constexpr int kWarpsPerBlock = 8;

__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp,
                                         const float* weight, const float* bias, std::int64_t rows, int c,
                                         float eps) {
  const std::int64_t row = std::int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const float* x = inp + row * c;
  float s = 0;
  for (int i = lane; i < c; i += 32) s += x[i];
  const float m = warp_sum(s) / static_cast<float>(c);
  float v = 0;
  for (int i = lane; i < c; i += 32) v += (x[i] - m) * (x[i] - m);
  const float r = 1.0f / sqrtf(warp_sum(v) / static_cast<float>(c) + eps);
  float* y = out + row * c;
  for (int i = lane; i < c; i += 32) y[i] = (x[i] - m) * r * weight[i] + bias[i];
  if (lane == 0) mean[row] = m, rstd[row] = r;
}

__global__ void layernorm_dinp_kernel(float* dinp, const float* dout, const float* inp, const float* weight,
                                      const float* mean, const float* rstd, std::int64_t rows, int c) {
  const std::int64_t row = std::int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const float* x = inp + row * c;
  const float* dy = dout + row * c;
  const float m = mean[row], r = rstd[row];
  float g_sum = 0, gx_sum = 0;
  for (int i = lane; i < c; i += 32) {
    const float g = dy[i] * weight[i];
    g_sum += g;
    gx_sum += g * ((x[i] - m) * r);
  }
  const float g_mean = warp_sum(g_sum) / static_cast<float>(c);
  const float gx_mean = warp_sum(gx_sum) / static_cast<float>(c);
  float* dx = dinp + row * c;
  for (int i = lane; i < c; i += 32) {
    const float xhat = (x[i] - m) * r;
    dx[i] += r * (dy[i] * weight[i] - g_mean - xhat * gx_mean);
  }
}

constexpr int kColTile = 32, kRowLanes = 8;

// Chunk sums of dout xhat (dw) and dout (db): partials [chunks, c] each.
__global__ void layernorm_param_partials_kernel(float* dw_part, float* db_part, const float* dout,
                                                const float* inp, const float* mean, const float* rstd,
                                                std::int64_t rows, std::int64_t c, std::int64_t chunk_rows) {
  __shared__ float dw_sums[kRowLanes][kColTile + 1], db_sums[kRowLanes][kColTile + 1];
  const std::int64_t j = std::int64_t{blockIdx.x} * kColTile + threadIdx.x;
  const std::int64_t r0 = std::int64_t{blockIdx.y} * chunk_rows;
  const std::int64_t r1 = r0 + chunk_rows < rows ? r0 + chunk_rows : rows;
  float dw = 0, db = 0;
  if (j < c)
    for (std::int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) {
      const float dy = dout[r * c + j];
      dw += dy * ((inp[r * c + j] - mean[r]) * rstd[r]);
      db += dy;
    }
  dw_sums[threadIdx.y][threadIdx.x] = dw;
  db_sums[threadIdx.y][threadIdx.x] = db;
  __syncthreads();
  if (threadIdx.y == 0 && j < c) {
    float w = dw_sums[0][threadIdx.x], b = db_sums[0][threadIdx.x];
    for (int y = 1; y < kRowLanes; ++y) w += dw_sums[y][threadIdx.x], b += db_sums[y][threadIdx.x];
    dw_part[std::int64_t{blockIdx.y} * c + j] = w;
    db_part[std::int64_t{blockIdx.y} * c + j] = b;
  }
}

unsigned row_blocks(std::int64_t rows) {
  return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, std::int64_t rows, std::int64_t channels, float eps) {
  if (rows <= 0 || channels <= 0) return;
  layernorm_forward_kernel<<<row_blocks(rows), kWarpsPerBlock * 32, 0, compute_stream()>>>(
      out, mean, rstd, inp, weight, bias, rows, static_cast<int>(channels), eps);
  check_launch("layernorm_forward");
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, std::int64_t rows,
                        std::int64_t channels) {
  if (rows <= 0 || channels <= 0) return;
  layernorm_dinp_kernel<<<row_blocks(rows), kWarpsPerBlock * 32, 0, compute_stream()>>>(
      dinp, dout, inp, weight, mean, rstd, rows, static_cast<int>(channels));
  check_launch("layernorm_backward (dinp)");
  const std::int64_t chunk_rows = detail::column_chunk_rows(rows),
                     chunks = (rows + chunk_rows - 1) / chunk_rows;
  DeviceBuffer partials(static_cast<std::size_t>(2 * chunks * channels) * sizeof(float));
  float* dw_part = static_cast<float*>(partials.data());
  float* db_part = dw_part + chunks * channels;
  const dim3 grid(static_cast<unsigned>((channels + kColTile - 1) / kColTile), static_cast<unsigned>(chunks));
  layernorm_param_partials_kernel<<<grid, dim3(kColTile, kRowLanes), 0, compute_stream()>>>(
      dw_part, db_part, dout, inp, mean, rstd, rows, channels, chunk_rows);
  check_launch("layernorm_backward (weight and bias)");
  detail::add_column_partials(dweight, dw_part, chunks, channels);
  detail::add_column_partials(dbias, db_part, chunks, channels);
}

}  // namespace ndmesh::cuda
