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
// residual_layernorm_forward adds the residual first (stored, then normalised as stored), and
// before it the deferred bias of the layer that wrote x when given;
// every kernel is templated on the rows' storage (float, or bf16 bits: detail::load/store).
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

// S: the storage type of the rows (float, or bfloat16 bits with float statistics). With
// `add`, the row is first residual = inp + add, stored (rounded to S) and normalised as
// stored: the residual connection and the next norm in one pass over the row.
// D: the storage of the normalised rows (S, or bf16 bits from float rows: the norm's output
// kept in bf16 for the bf16 products that read it).
template <typename S, typename D>
__global__ void layernorm_forward_kernel(D* out, float* mean, float* rstd, S* residual, const S* inp, const S* add,
                                         const float* x_bias, const float* weight, const float* bias,
                                         std::int64_t rows, int c, float eps) {
  const std::int64_t row = std::int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const S* x = inp + row * c;
  if (add != nullptr) {  // each lane reads back only what it wrote: no barrier
    S* res = residual + row * c;
    const S* a = add + row * c;
    if (x_bias != nullptr)
      for (int i = lane; i < c; i += 32) store(res + i, __fadd_rn(__fadd_rn(load(x + i), x_bias[i]), load(a + i)));
    else
      for (int i = lane; i < c; i += 32) store(res + i, load(x + i) + load(a + i));
    x = res;
  }
  float s = 0;
  for (int i = lane; i < c; i += 32) s += load(x + i);
  const float m = warp_sum(s) / static_cast<float>(c);
  float v = 0;
  for (int i = lane; i < c; i += 32) v += (load(x + i) - m) * (load(x + i) - m);
  const float r = 1.0f / sqrtf(warp_sum(v) / static_cast<float>(c) + eps);
  D* y = out + row * c;
  for (int i = lane; i < c; i += 32) store(y + i, (load(x + i) - m) * r * weight[i] + bias[i]);
  if (lane == 0) mean[row] = m, rstd[row] = r;
}

// dinp = dresidual + the norm's input gradient (dresidual may be dinp: accumulate).
template <typename S>
__global__ void layernorm_dinp_kernel(S* dinp, const S* dresidual, const S* dout, const S* inp, const float* weight,
                                      const float* mean, const float* rstd, std::int64_t rows, int c) {
  const std::int64_t row = std::int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const S* x = inp + row * c;
  const S* dy = dout + row * c;
  const float m = mean[row], r = rstd[row];
  float g_sum = 0, gx_sum = 0;
  for (int i = lane; i < c; i += 32) {
    const float g = load(dy + i) * weight[i];
    g_sum += g;
    gx_sum += g * ((load(x + i) - m) * r);
  }
  const float g_mean = warp_sum(g_sum) / static_cast<float>(c);
  const float gx_mean = warp_sum(gx_sum) / static_cast<float>(c);
  S* dx = dinp + row * c;
  const S* dres = dresidual + row * c;
  for (int i = lane; i < c; i += 32) {
    const float xhat = (load(x + i) - m) * r;
    store(dx + i, load(dres + i) + r * (load(dy + i) * weight[i] - g_mean - xhat * gx_mean));
  }
}

constexpr int kColTile = 32, kRowLanes = 8;

// Chunk sums of dout xhat (dw) and dout (db): partials [chunks, c] each; with dres, also of
// dres (rs_part: the residual gradient's column sums).
template <typename S>
__global__ void layernorm_param_partials_kernel(float* dw_part, float* db_part, float* rs_part, const S* dout,
                                                const S* inp, const S* dres, const float* mean, const float* rstd,
                                                std::int64_t rows, std::int64_t c, std::int64_t chunk_rows) {
  __shared__ float dw_sums[kRowLanes][kColTile + 1], db_sums[kRowLanes][kColTile + 1],
      rs_sums[kRowLanes][kColTile + 1];
  const std::int64_t j = std::int64_t{blockIdx.x} * kColTile + threadIdx.x;
  const std::int64_t r0 = std::int64_t{blockIdx.y} * chunk_rows;
  const std::int64_t r1 = r0 + chunk_rows < rows ? r0 + chunk_rows : rows;
  float dw = 0, db = 0, rs = 0;
  if (j < c)
    for (std::int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) {
      const float dy = load(dout + r * c + j);
      dw += dy * ((load(inp + r * c + j) - mean[r]) * rstd[r]);
      db += dy;
      if (dres != nullptr) rs += load(dres + r * c + j);
    }
  dw_sums[threadIdx.y][threadIdx.x] = dw;
  db_sums[threadIdx.y][threadIdx.x] = db;
  rs_sums[threadIdx.y][threadIdx.x] = rs;
  __syncthreads();
  if (threadIdx.y == 0 && j < c) {
    float w = dw_sums[0][threadIdx.x], b = db_sums[0][threadIdx.x], s = rs_sums[0][threadIdx.x];
    for (int y = 1; y < kRowLanes; ++y)
      w += dw_sums[y][threadIdx.x], b += db_sums[y][threadIdx.x], s += rs_sums[y][threadIdx.x];
    dw_part[std::int64_t{blockIdx.y} * c + j] = w;
    db_part[std::int64_t{blockIdx.y} * c + j] = b;
    if (dres != nullptr) rs_part[std::int64_t{blockIdx.y} * c + j] = s;
  }
}

unsigned row_blocks(std::int64_t rows) {
  return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

template <typename S, typename D>
void forward(D* out, float* mean, float* rstd, S* residual, const S* inp, const S* add, const float* weight,
             const float* bias, std::int64_t rows, std::int64_t channels, float eps, const char* what,
             const float* x_bias = nullptr) {
  if (rows <= 0 || channels <= 0) return;
  layernorm_forward_kernel<S, D><<<row_blocks(rows), kWarpsPerBlock * 32, 0, compute_stream()>>>(
      out, mean, rstd, residual, inp, add, x_bias, weight, bias, rows, static_cast<int>(channels), eps);
  check_launch(what);
}

// The column sums first (dresidual may be dinp, which the second kernel writes).
template <typename S>
void backward(S* dinp, const S* dresidual, float* dresidual_sums, float* dweight, float* dbias, const S* dout,
              const S* inp, const float* weight, const float* mean, const float* rstd, std::int64_t rows,
              std::int64_t channels) {
  if (rows <= 0 || channels <= 0) return;
  const S* dres = dresidual != nullptr ? dresidual : dinp;
  const std::int64_t chunk_rows = detail::column_chunk_rows(rows),
                     chunks = (rows + chunk_rows - 1) / chunk_rows;
  const std::int64_t sums = dresidual_sums != nullptr ? 3 : 2;
  DeviceBuffer partials(static_cast<std::size_t>(sums * chunks * channels) * sizeof(float));
  float* dw_part = static_cast<float*>(partials.data());
  float* db_part = dw_part + chunks * channels;
  float* rs_part = dresidual_sums != nullptr ? db_part + chunks * channels : nullptr;
  const dim3 grid(static_cast<unsigned>((channels + kColTile - 1) / kColTile), static_cast<unsigned>(chunks));
  layernorm_param_partials_kernel<S><<<grid, dim3(kColTile, kRowLanes), 0, compute_stream()>>>(
      dw_part, db_part, rs_part, dout, inp, dresidual_sums != nullptr ? dres : nullptr, mean, rstd, rows, channels,
      chunk_rows);
  check_launch("layernorm_backward (weight and bias)");
  detail::add_column_partials(dweight, dw_part, chunks, channels);
  detail::add_column_partials(dbias, db_part, chunks, channels);
  if (dresidual_sums != nullptr) detail::add_column_partials(dresidual_sums, rs_part, chunks, channels);
  layernorm_dinp_kernel<S><<<row_blocks(rows), kWarpsPerBlock * 32, 0, compute_stream()>>>(
      dinp, dres, dout, inp, weight, mean, rstd, rows, static_cast<int>(channels));
  check_launch("layernorm_backward (dinp)");
}

}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, std::int64_t rows, std::int64_t channels, float eps) {
  forward<float, float>(out, mean, rstd, nullptr, inp, nullptr, weight, bias, rows, channels, eps,
                        "layernorm_forward");
}

void layernorm_forward(BFloat16* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, std::int64_t rows, std::int64_t channels, float eps) {
  forward<float, Bf16Bits>(bits(out), mean, rstd, nullptr, inp, nullptr, weight, bias, rows, channels, eps,
                           "layernorm_forward (into bf16)");
}

void residual_layernorm_forward(float* residual, float* out, float* mean, float* rstd, const float* x,
                                const float* r, const float* weight, const float* bias, std::int64_t rows,
                                std::int64_t channels, float eps, const float* x_bias) {
  forward<float, float>(out, mean, rstd, residual, x, r, weight, bias, rows, channels, eps,
                        "residual_layernorm_forward", x_bias);
}

void residual_layernorm_forward(float* residual, BFloat16* out, float* mean, float* rstd, const float* x,
                                const float* r, const float* weight, const float* bias, std::int64_t rows,
                                std::int64_t channels, float eps, const float* x_bias) {
  forward<float, Bf16Bits>(bits(out), mean, rstd, residual, x, r, weight, bias, rows, channels, eps,
                           "residual_layernorm_forward (into bf16)", x_bias);
}

void residual_layernorm_forward(BFloat16* residual, BFloat16* out, float* mean, float* rstd, const BFloat16* x,
                                const BFloat16* r, const float* weight, const float* bias, std::int64_t rows,
                                std::int64_t channels, float eps, const float* x_bias) {
  forward<Bf16Bits, Bf16Bits>(bits(out), mean, rstd, bits(residual), bits(x), bits(r), weight, bias, rows, channels, eps,
                    "residual_layernorm_forward (bf16)", x_bias);
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, std::int64_t rows,
                        std::int64_t channels, const float* dresidual, float* dresidual_sums) {
  backward<float>(dinp, dresidual, dresidual_sums, dweight, dbias, dout, inp, weight, mean, rstd, rows, channels);
}

void layernorm_backward(BFloat16* dinp, float* dweight, float* dbias, const BFloat16* dout, const BFloat16* inp,
                        const float* weight, const float* mean, const float* rstd, std::int64_t rows,
                        std::int64_t channels) {
  backward<Bf16Bits>(bits(dinp), nullptr, nullptr, dweight, dbias, bits(dout), bits(inp), weight, mean, rstd, rows,
                     channels);
}

}  // namespace ndmesh::cuda
