// nn::RmsNorm on the device (cuda_ops.hpp), over rows of C channels:
//   forward:  rstd = 1/sqrt(mean(x^2) + eps), out = x rstd w;
//   backward: with xhat = x rstd and g = dout w, per row
//             dx += rstd (g - xhat mean(g xhat)),
//             and over rows dw += sum dout xhat.
// The layout of layernorm.cu: one warp per row for the row-wise work, the weight gradient
// (and the residual gradient's column sums) as deterministic chunk sums added in order
// (detail::column_sums), no atomics. residual_rmsnorm_forward adds the residual
// first (stored, then normalised as stored), and before it the deferred bias of the layer
// that wrote x when given (a Llama block has none; the kernel serves any block).
#include <cuda_runtime.h>

#include <cstdint>

#include "ndmesh/nn/cuda_ops.hpp"
#include "tensor/cuda/common.cuh"

namespace ndmesh::cuda {

namespace {

using detail::Bf16Bits;
using detail::bits;
using detail::check_launch;
using detail::compute_stream;
using detail::load;
using detail::store;
using detail::warp_sum;

constexpr int kWarpsPerBlock = 8;

// S: the storage of the rows (float, or bf16 bits); D: of the normalised rows.
template <typename S, typename D>
__global__ void rmsnorm_forward_kernel(D* out, float* rstd, S* residual, const S* inp, const S* add,
                                       const float* x_bias, const float* weight, std::int64_t rows, int c,
                                       float eps) {
  const std::int64_t row = std::int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const S* x = detail::residual_row(residual, inp, add, x_bias, row * c, c, lane);
  float s = 0;
  for (int i = lane; i < c; i += 32) s += load(x + i) * load(x + i);
  const float r = 1.0f / sqrtf(warp_sum(s) / static_cast<float>(c) + eps);
  D* y = out + row * c;
  for (int i = lane; i < c; i += 32) store(y + i, load(x + i) * r * weight[i]);
  if (lane == 0) rstd[row] = r;
}

// dinp = dresidual + the norm's input gradient (dresidual may be dinp: accumulate).
template <typename S>
__global__ void rmsnorm_dinp_kernel(S* dinp, const S* dresidual, const S* dout, const S* inp,
                                    const float* weight, const float* rstd, std::int64_t rows, int c) {
  const std::int64_t row = std::int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const S* x = inp + row * c;
  const S* dy = dout + row * c;
  const float r = rstd[row];
  float gx_sum = 0;
  for (int i = lane; i < c; i += 32) gx_sum += load(dy + i) * weight[i] * (load(x + i) * r);
  const float gx_mean = warp_sum(gx_sum) / static_cast<float>(c);
  S* dx = dinp + row * c;
  const S* dres = dresidual + row * c;
  for (int i = lane; i < c; i += 32) {
    const float xhat = load(x + i) * r;
    store(dx + i, load(dres + i) + r * (load(dy + i) * weight[i] - xhat * gx_mean));
  }
}

constexpr int kColTile = 32, kRowLanes = 8;

// Chunk sums of dout xhat (dw): partials [chunks, c]; with dres, also of dres (rs_part).
template <typename S>
__global__ void rmsnorm_param_partials_kernel(float* dw_part, float* rs_part, const S* dout, const S* inp,
                                              const S* dres, const float* rstd, std::int64_t rows,
                                              std::int64_t c, std::int64_t chunk_rows) {
  __shared__ float dw_sums[kRowLanes][kColTile + 1], rs_sums[kRowLanes][kColTile + 1];
  const std::int64_t j = std::int64_t{blockIdx.x} * kColTile + threadIdx.x;
  const std::int64_t r0 = std::int64_t{blockIdx.y} * chunk_rows;
  const std::int64_t r1 = r0 + chunk_rows < rows ? r0 + chunk_rows : rows;
  float dw = 0, rs = 0;
  if (j < c)
    for (std::int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) {
      dw += load(dout + r * c + j) * (load(inp + r * c + j) * rstd[r]);
      if (dres != nullptr) rs += load(dres + r * c + j);
    }
  dw_sums[threadIdx.y][threadIdx.x] = dw;
  rs_sums[threadIdx.y][threadIdx.x] = rs;
  __syncthreads();
  if (threadIdx.y == 0 && j < c) {
    float w = dw_sums[0][threadIdx.x], s = rs_sums[0][threadIdx.x];
    for (int y = 1; y < kRowLanes; ++y) w += dw_sums[y][threadIdx.x], s += rs_sums[y][threadIdx.x];
    dw_part[std::int64_t{blockIdx.y} * c + j] = w;
    if (dres != nullptr) rs_part[std::int64_t{blockIdx.y} * c + j] = s;
  }
}

unsigned row_blocks(std::int64_t rows) {
  return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

template <typename S, typename D>
void forward(D* out, float* rstd, S* residual, const S* inp, const S* add, const float* weight,
             std::int64_t rows, std::int64_t channels, float eps, const char* what,
             const float* x_bias = nullptr) {
  if (rows <= 0 || channels <= 0) return;
  rmsnorm_forward_kernel<S, D><<<row_blocks(rows), kWarpsPerBlock * 32, 0, compute_stream()>>>(
      out, rstd, residual, inp, add, x_bias, weight, rows, static_cast<int>(channels), eps);
  check_launch(what);
}

// The column sums first (dresidual may be dinp, which the second kernel writes).
template <typename S>
void backward(S* dinp, const S* dresidual, float* dresidual_sums, float* dweight, const S* dout, const S* inp,
              const float* weight, const float* rstd, std::int64_t rows, std::int64_t channels) {
  if (rows <= 0 || channels <= 0) return;
  const S* dres = dresidual != nullptr ? dresidual : dinp;
  const std::int64_t chunk_rows = detail::column_chunk_rows(rows),
                     chunks = (rows + chunk_rows - 1) / chunk_rows;
  const std::int64_t sums = dresidual_sums != nullptr ? 2 : 1;
  DeviceBuffer partials(static_cast<std::size_t>(sums * chunks * channels) * sizeof(float));
  float* dw_part = static_cast<float*>(partials.data());
  float* rs_part = dresidual_sums != nullptr ? dw_part + chunks * channels : nullptr;
  const dim3 grid(static_cast<unsigned>((channels + kColTile - 1) / kColTile), static_cast<unsigned>(chunks));
  rmsnorm_param_partials_kernel<S><<<grid, dim3(kColTile, kRowLanes), 0, compute_stream()>>>(
      dw_part, rs_part, dout, inp, dresidual_sums != nullptr ? dres : nullptr, rstd, rows, channels,
      chunk_rows);
  check_launch("rmsnorm_backward (weight)");
  float* const dw[1] = {dweight};
  detail::column_sums(dw, 1, dw_part, chunks, channels);
  if (dresidual_sums != nullptr) {
    float* const rs[1] = {dresidual_sums};
    detail::column_sums(rs, 1, rs_part, chunks, channels);
  }
  rmsnorm_dinp_kernel<S><<<row_blocks(rows), kWarpsPerBlock * 32, 0, compute_stream()>>>(
      dinp, dres, dout, inp, weight, rstd, rows, static_cast<int>(channels));
  check_launch("rmsnorm_backward (dinp)");
}

}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, std::int64_t rows,
                     std::int64_t channels, float eps) {
  forward<float, float>(out, rstd, nullptr, inp, nullptr, weight, rows, channels, eps, "rmsnorm_forward");
}

void rmsnorm_forward(BFloat16* out, float* rstd, const float* inp, const float* weight, std::int64_t rows,
                     std::int64_t channels, float eps) {
  forward<float, Bf16Bits>(bits(out), rstd, nullptr, inp, nullptr, weight, rows, channels, eps,
                           "rmsnorm_forward (into bf16)");
}

void residual_rmsnorm_forward(float* residual, float* out, float* rstd, const float* x, const float* r,
                              const float* weight, std::int64_t rows, std::int64_t channels, float eps,
                              const float* x_bias) {
  forward<float, float>(out, rstd, residual, x, r, weight, rows, channels, eps, "residual_rmsnorm_forward",
                        x_bias);
}

void residual_rmsnorm_forward(float* residual, BFloat16* out, float* rstd, const float* x, const float* r,
                              const float* weight, std::int64_t rows, std::int64_t channels, float eps,
                              const float* x_bias) {
  forward<float, Bf16Bits>(bits(out), rstd, residual, x, r, weight, rows, channels, eps,
                           "residual_rmsnorm_forward (into bf16)", x_bias);
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, std::int64_t rows, std::int64_t channels, const float* dresidual,
                      float* dresidual_sums) {
  backward<float>(dinp, dresidual, dresidual_sums, dweight, dout, inp, weight, rstd, rows, channels);
}

}  // namespace ndmesh::cuda
