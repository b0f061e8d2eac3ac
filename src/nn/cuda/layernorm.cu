// nn::LayerNorm on the device (cuda_ops.hpp), over rows of C channels:
//   forward:  mean, var (biased, two passes as the CPU), rstd = 1/sqrt(var + eps),
//             out = (x - mean) rstd w + b;
//   backward: with xhat = (x - mean) rstd and g = dout w, per row
//             dx += rstd (g - mean(g) - xhat mean(g xhat)),
//             and over rows dw += sum dout xhat, db += sum dout.
// One warp per row for the row-wise work, then a shuffle tree. Where every row starts 16 bytes
// aligned (C a multiple of 8, the buffers aligned) a lane moves eight elements at a time with
// 16-byte loads and stores (detail::load8/store8: two float4 of fp32, one pack of eight bf16),
// as llm.c's kernels do; otherwise the lanes stride the channels one element at a time.
//
// The backward reads its inputs once, in one pass over the rows: each warp computes its rows'
// dx and keeps its columns' sums of dout xhat, dout (and of the residual's gradient: the
// deferred bias of the layer before) in registers; the block adds its warps' sums in warp order
// and writes them as one row of partials, and a second launch adds those rows in order
// (detail::column_sums). Deterministic, no atomics: the same bits every run. (Rows whose
// shape or alignment does not allow 16-byte accesses, or C > 2048, run the earlier scalar
// passes: the partial sums of fixed chunks of rows, the sums, then dx.)
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
using detail::is_aligned16;
using detail::load;
using detail::load8;
using detail::store;
using detail::store8;
using detail::warp_sum;

constexpr int kWarpsPerBlock = 8;

// S: the storage type of the rows (float, or bfloat16 bits with float statistics). With
// `add`, the row is first residual = inp + add, stored (rounded to S) and normalised as
// stored: the residual connection and the next norm in one pass over the row.
// D: the storage of the normalised rows (S, or bf16 bits from float rows: the norm's output
// kept in bf16 for the bf16 products that read it).
template <typename S, typename D>
__global__ void layernorm_forward_kernel(D* out, float* mean, float* rstd, S* residual, const S* inp,
                                         const S* add, const float* x_bias, const float* weight,
                                         const float* bias, std::int64_t rows, int c, float eps) {
  const std::int64_t row = std::int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const S* x = detail::residual_row(residual, inp, add, x_bias, row * c, c, lane);
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

// The same with 16-byte accesses: lane l moves elements [8 (l + 32 k), 8 (l + 32 k) + 8).
// c % 8 == 0 and every pointer 16-byte aligned.
template <typename S, typename D>
__global__ void layernorm_forward_vec_kernel(D* out, float* mean, float* rstd, S* residual, const S* inp,
                                             const S* add, const float* x_bias, const float* weight,
                                             const float* bias, std::int64_t rows, int c, float eps) {
  const std::int64_t row = std::int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const S* x = inp + row * c;
  float v[8], w[8];
  if (add != nullptr) {  // each lane reads back only what it wrote: no barrier
    S* res = residual + row * c;
    const S* a = add + row * c;
    for (int i = lane * 8; i < c; i += 256) {
      float av[8];
      load8(x + i, v);
      load8(a + i, av);
      if (x_bias != nullptr) {
        load8(x_bias + i, w);
        for (int k = 0; k < 8; ++k) v[k] = __fadd_rn(__fadd_rn(v[k], w[k]), av[k]);
      } else {
        for (int k = 0; k < 8; ++k) v[k] = v[k] + av[k];
      }
      store8(res + i, v);
    }
    x = res;
  }
  float s = 0;
  for (int i = lane * 8; i < c; i += 256) {
    load8(x + i, v);
    for (int k = 0; k < 8; ++k) s += v[k];
  }
  const float m = warp_sum(s) / static_cast<float>(c);
  float var = 0;
  for (int i = lane * 8; i < c; i += 256) {
    load8(x + i, v);
    for (int k = 0; k < 8; ++k) var += (v[k] - m) * (v[k] - m);
  }
  const float r = 1.0f / sqrtf(warp_sum(var) / static_cast<float>(c) + eps);
  D* y = out + row * c;
  for (int i = lane * 8; i < c; i += 256) {
    float b[8];
    load8(x + i, v);
    load8(weight + i, w);
    load8(bias + i, b);
    for (int k = 0; k < 8; ++k) v[k] = (v[k] - m) * r * w[k] + b[k];
    store8(y + i, v);
  }
  if (lane == 0) mean[row] = m, rstd[row] = r;
}

// dinp = dresidual + the norm's input gradient (dresidual may be dinp: accumulate).
template <typename S>
__global__ void layernorm_dinp_kernel(S* dinp, const S* dresidual, const S* dout, const S* inp,
                                      const float* weight, const float* mean, const float* rstd,
                                      std::int64_t rows, int c) {
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
                                                const S* inp, const S* dres, const float* mean,
                                                const float* rstd, std::int64_t rows, std::int64_t c,
                                                std::int64_t chunk_rows) {
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

// The backward in one pass over the rows (see the top of this file): kGroups groups of eight
// channels a lane (c <= 256 kGroups). Warp w of block b takes rows (b kWarps + w) + k gridDim.x
// kWarps; partials [gridDim.x, count c]: the block's sums of dout xhat, dout and (count 3) dres.
// Dynamic shared memory: kBackwardWarps x c floats (the warps' sums of one quantity at a time).
constexpr int kBackwardWarps = 4, kBackwardBlocks = 256;
template <typename S, int kGroups>
__global__ void layernorm_backward_kernel(S* dinp, const S* dres, float* partials, const S* dout,
                                          const S* inp, const float* weight, const float* mean,
                                          const float* rstd, std::int64_t rows, int c, int count) {
  extern __shared__ float warp_sums[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float dw[kGroups][8] = {}, db[kGroups][8] = {}, rs[kGroups][8] = {};
  for (std::int64_t row = std::int64_t{blockIdx.x} * kBackwardWarps + warp; row < rows;
       row += std::int64_t{gridDim.x} * kBackwardWarps) {
    const S* x = inp + row * c;
    const S* dy = dout + row * c;
    const float m = mean[row], r = rstd[row];
    float xv[8], dv[8], wv[8];
    float g_sum = 0, gx_sum = 0;
    for (int k = 0; k < kGroups; ++k) {
      const int i = (lane + 32 * k) * 8;
      if (i >= c) break;
      load8(x + i, xv);
      load8(dy + i, dv);
      load8(weight + i, wv);
      for (int e = 0; e < 8; ++e) {
        const float g = dv[e] * wv[e];
        g_sum += g;
        gx_sum += g * ((xv[e] - m) * r);
      }
    }
    const float g_mean = warp_sum(g_sum) / static_cast<float>(c);
    const float gx_mean = warp_sum(gx_sum) / static_cast<float>(c);
    S* dx = dinp + row * c;
    const S* dr = dres + row * c;
    for (int k = 0; k < kGroups; ++k) {
      const int i = (lane + 32 * k) * 8;
      if (i >= c) break;
      float rv[8];
      load8(x + i, xv);
      load8(dy + i, dv);
      load8(weight + i, wv);
      load8(dr + i, rv);  // before dx is written: dres may be dinp
      for (int e = 0; e < 8; ++e) {
        const float xhat = (xv[e] - m) * r;
        dw[k][e] += dv[e] * xhat;
        db[k][e] += dv[e];
        rs[k][e] += rv[e];
        rv[e] = rv[e] + r * (dv[e] * wv[e] - g_mean - xhat * gx_mean);
      }
      store8(dx + i, rv);
    }
  }
  // The block's sums of each quantity: the warps' in warp order, one row of partials.
  for (int q = 0; q < count; ++q) {
    for (int k = 0; k < kGroups; ++k) {
      const int i = (lane + 32 * k) * 8;
      if (i >= c) break;
      for (int e = 0; e < 8; ++e)
        warp_sums[warp * c + i + e] = q == 0 ? dw[k][e] : q == 1 ? db[k][e] : rs[k][e];
    }
    __syncthreads();
    for (int i = threadIdx.x * 4; i < c; i += blockDim.x * 4) {
      float4 t = *reinterpret_cast<const float4*>(warp_sums + i);
      for (int w = 1; w < kBackwardWarps; ++w) {
        const float4 u = *reinterpret_cast<const float4*>(warp_sums + w * c + i);
        t.x = __fadd_rn(t.x, u.x), t.y = __fadd_rn(t.y, u.y), t.z = __fadd_rn(t.z, u.z),
        t.w = __fadd_rn(t.w, u.w);
      }
      *reinterpret_cast<float4*>(partials + std::int64_t{blockIdx.x} * count * c + q * c + i) = t;
    }
    __syncthreads();
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
  const bool vec = channels % 8 == 0 && is_aligned16(out) && is_aligned16(inp) && is_aligned16(weight) &&
                   is_aligned16(bias) && (add == nullptr || (is_aligned16(add) && is_aligned16(residual))) &&
                   (x_bias == nullptr || is_aligned16(x_bias));
  if (vec)
    layernorm_forward_vec_kernel<S, D><<<row_blocks(rows), kWarpsPerBlock * 32, 0, compute_stream()>>>(
        out, mean, rstd, residual, inp, add, x_bias, weight, bias, rows, static_cast<int>(channels), eps);
  else
    layernorm_forward_kernel<S, D><<<row_blocks(rows), kWarpsPerBlock * 32, 0, compute_stream()>>>(
        out, mean, rstd, residual, inp, add, x_bias, weight, bias, rows, static_cast<int>(channels), eps);
  check_launch(what);
}

template <typename S, int kGroups>
void backward_pass(S* dinp, const S* dres, float* partials, const S* dout, const S* inp, const float* weight,
                   const float* mean, const float* rstd, std::int64_t rows, int c, int count,
                   unsigned blocks) {
  // At most 4 x 2048 floats: 32 KiB, under the 48 KiB a kernel gets without asking.
  const std::size_t shared =
      static_cast<std::size_t>(kBackwardWarps) * static_cast<std::size_t>(c) * sizeof(float);
  layernorm_backward_kernel<S, kGroups><<<blocks, kBackwardWarps * 32, shared, compute_stream()>>>(
      dinp, dres, partials, dout, inp, weight, mean, rstd, rows, c, count);
}

// The column sums first (dresidual may be dinp, which the second kernel writes).
template <typename S>
void backward(S* dinp, const S* dresidual, float* dresidual_sums, float* dweight, float* dbias, const S* dout,
              const S* inp, const float* weight, const float* mean, const float* rstd, std::int64_t rows,
              std::int64_t channels) {
  if (rows <= 0 || channels <= 0) return;
  const S* dres = dresidual != nullptr ? dresidual : dinp;
  const int count = dresidual_sums != nullptr ? 3 : 2;
  float* const sums[3] = {dweight, dbias, dresidual_sums};
  const bool vec = channels % 8 == 0 && channels <= 2048 && is_aligned16(dinp) && is_aligned16(dres) &&
                   is_aligned16(dout) && is_aligned16(inp) && is_aligned16(weight);
  if (vec) {
    const int c = static_cast<int>(channels), groups = (c + 255) / 256;
    const std::int64_t wanted = (rows + kBackwardWarps - 1) / kBackwardWarps;
    const auto blocks = static_cast<unsigned>(wanted < kBackwardBlocks ? wanted : kBackwardBlocks);
    DeviceBuffer partials(static_cast<std::size_t>(blocks) * static_cast<std::size_t>(count * c) *
                          sizeof(float));
    auto* p = static_cast<float*>(partials.data());
    if (groups == 1)
      backward_pass<S, 1>(dinp, dres, p, dout, inp, weight, mean, rstd, rows, c, count, blocks);
    else if (groups == 2)
      backward_pass<S, 2>(dinp, dres, p, dout, inp, weight, mean, rstd, rows, c, count, blocks);
    else if (groups == 3)
      backward_pass<S, 3>(dinp, dres, p, dout, inp, weight, mean, rstd, rows, c, count, blocks);
    else if (groups == 4)
      backward_pass<S, 4>(dinp, dres, p, dout, inp, weight, mean, rstd, rows, c, count, blocks);
    else
      backward_pass<S, 8>(dinp, dres, p, dout, inp, weight, mean, rstd, rows, c, count, blocks);
    check_launch("layernorm_backward");
    detail::column_sums(sums, count, p, blocks, channels);
    return;
  }
  const std::int64_t chunk_rows = detail::column_chunk_rows(rows),
                     chunks = (rows + chunk_rows - 1) / chunk_rows;
  DeviceBuffer partials(static_cast<std::size_t>(count * chunks * channels) * sizeof(float));
  float* dw_part = static_cast<float*>(partials.data());
  float* db_part = dw_part + chunks * channels;
  float* rs_part = dresidual_sums != nullptr ? db_part + chunks * channels : nullptr;
  const dim3 grid(static_cast<unsigned>((channels + kColTile - 1) / kColTile), static_cast<unsigned>(chunks));
  layernorm_param_partials_kernel<S><<<grid, dim3(kColTile, kRowLanes), 0, compute_stream()>>>(
      dw_part, db_part, rs_part, dout, inp, dresidual_sums != nullptr ? dres : nullptr, mean, rstd, rows,
      channels, chunk_rows);
  check_launch("layernorm_backward (weight and bias)");
  for (int q = 0; q < count; ++q)
    detail::column_sums(sums + q, 1, dw_part + q * chunks * channels, chunks, channels);
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

void residual_layernorm_forward(BFloat16* residual, BFloat16* out, float* mean, float* rstd,
                                const BFloat16* x, const BFloat16* r, const float* weight, const float* bias,
                                std::int64_t rows, std::int64_t channels, float eps, const float* x_bias) {
  forward<Bf16Bits, Bf16Bits>(bits(out), mean, rstd, bits(residual), bits(x), bits(r), weight, bias, rows,
                              channels, eps, "residual_layernorm_forward (bf16)", x_bias);
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, std::int64_t rows,
                        std::int64_t channels, const float* dresidual, float* dresidual_sums) {
  backward<float>(dinp, dresidual, dresidual_sums, dweight, dbias, dout, inp, weight, mean, rstd, rows,
                  channels);
}

void layernorm_backward(BFloat16* dinp, float* dweight, float* dbias, const BFloat16* dout,
                        const BFloat16* inp, const float* weight, const float* mean, const float* rstd,
                        std::int64_t rows, std::int64_t channels) {
  backward<Bf16Bits>(bits(dinp), nullptr, nullptr, dweight, dbias, bits(dout), bits(inp), weight, mean, rstd,
                     rows, channels);
}

}  // namespace ndmesh::cuda
