// nn::CrossEntropy on the device (cuda_ops.hpp): fused softmax + loss, and the gradient.
//
// Forward, one block per row: a first pass keeps a running (max, sum of exp(z - max)) per
// thread (online softmax), merged over the block; the target's logit is read before the
// block barrier that precedes any write, so probs may alias logits; a second pass writes
// probs = exp(z - max) / sum. The logits are read twice and the probabilities written
// once: nothing is materialised twice. loss = log(sum) - (z_target - max), exact even
// when the target's probability underflows. The mean loss is cuda::sum of the losses
// (double, deterministic) over rows.
//
// Backward: dlogits += probs * scale, then dlogits[target] -= scale, with the _rn
// intrinsics (no FMA): the CPU loop's arithmetic bit for bit.
//
// classifier_forward_backward: both in one kernel, in place on the (padded) logits, fp32 or
// bf16; no probs buffer, the per-row losses stay on the device. It and the forward run 1024
// threads a row and read eight columns at a time (16-byte loads where the rows allow).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "ndmesh/nn/cuda_ops.hpp"
#include "tensor/cuda/common.cuh"

namespace ndmesh::cuda {

namespace {

using detail::check_launch;
using detail::compute_stream;

constexpr int kThreads = 512;      // the vocabulary-parallel passes
constexpr int kRowThreads = 1024;  // cross_entropy_forward and the classifier

struct MaxSum {
  float max, sum;
};

// The (max, sum) of the union of two parts, each sum taken relative to its own max.
__device__ MaxSum merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.max, b.max);
  if (m == -INFINITY) return {m, 0.0f};
  return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

// The online (max, sum of exp(z - max)) of columns [0, valid) of a row, over the block: thread
// t takes the groups of eight columns t, t + kRowThreads, ... (columns 8 g .. 8 g + 7 in order),
// with one 16-byte load a group where `vec` (the row 16-byte aligned, its width a multiple of
// 8), else column by column: the same values in the same order either way, so that the fused
// classifier and cross_entropy_forward agree bit for bit. Then the lanes' parts merged in a
// shuffle tree and the warps' in warp order. Every thread gets the row's (max, sum).
template <typename S>
__device__ MaxSum row_max_sum(const S* z, std::int64_t valid, bool vec) {
  __shared__ MaxSum warp_parts[kRowThreads / 32];
  MaxSum part{-INFINITY, 0.0f};
  for (std::int64_t g = threadIdx.x; 8 * g < valid; g += kRowThreads) {
    float v[8];
    if (vec)
      detail::load8(z + 8 * g, v);
    else
      for (int e = 0; e < 8; ++e) v[e] = 8 * g + e < valid ? detail::load(z + 8 * g + e) : -INFINITY;
    for (int e = 0; e < 8 && 8 * g + e < valid; ++e) {
      if (v[e] > part.max) {
        part.sum = part.sum * expf(part.max - v[e]) + 1.0f;
        part.max = v[e];
      } else if (v[e] != -INFINITY) {  // a masked logit adds nothing (and -inf - -inf is NaN)
        part.sum += expf(v[e] - part.max);
      }
    }
  }
  for (int o = 16; o > 0; o >>= 1)
    part =
        merge(part, {__shfl_xor_sync(0xffffffffu, part.max, o), __shfl_xor_sync(0xffffffffu, part.sum, o)});
  if (threadIdx.x % 32 == 0) warp_parts[threadIdx.x / 32] = part;
  __syncthreads();
  MaxSum all = warp_parts[0];
  for (int w = 1; w < kRowThreads / 32; ++w) all = merge(all, warp_parts[w]);
  return all;
}

__global__ void cross_entropy_forward_kernel(float* probs, float* losses, const float* logits,
                                             const std::int32_t* targets, std::int64_t vocab, bool vec) {
  __shared__ float z_target;
  const std::int64_t row = blockIdx.x;
  const float* z = logits + row * vocab;
  float* p = probs + row * vocab;
  const std::int32_t target = targets[row];
  if (threadIdx.x == 0) z_target = target >= 0 && target < vocab ? z[target] : NAN;
  // row_max_sum's barrier also orders the read of z_target before any write of p.
  const MaxSum all = row_max_sum(z, vocab, vec);
  const float inv = 1.0f / all.sum;
  for (std::int64_t i = threadIdx.x; i < vocab; i += kRowThreads) p[i] = expf(z[i] - all.max) * inv;
  if (threadIdx.x == 0) losses[row] = logf(all.sum) - (z_target - all.max);
}

// The classifier: the forward above and the backward below in one kernel, in place on the
// logits (S: float, or bfloat16 bits), without a probs buffer, rows in reverse order (the last
// rows the LM head's product wrote are the likeliest still in L2). Columns [valid, width) are
// padding: never read for the softmax, their gradient written 0. Each thread reads and then
// overwrites only its own groups of eight columns, after the barrier that orders the target's
// read; 16-byte loads and stores where the rows allow (`vec`). d = p scale - [i == target]
// scale with the backward's operations: the float twin writes what cross_entropy_forward then
// cross_entropy_backward into zeros write, bit for bit.
template <typename S>
__global__ void classifier_kernel(S* logits, float* losses, const std::int32_t* targets, std::int64_t rows,
                                  std::int64_t valid, std::int64_t width, float scale, bool vec) {
  __shared__ float z_target;
  __shared__ std::int32_t row_target;
  const std::int64_t row = rows - 1 - std::int64_t{blockIdx.x};
  S* z = logits + row * width;
  if (threadIdx.x == 0) {  // read once for the block; row_max_sum's barrier publishes them
    row_target = targets[row];
    z_target = row_target >= 0 && row_target < valid ? detail::load(z + row_target) : NAN;
  }
  const MaxSum all = row_max_sum(z, valid, vec);
  const std::int32_t target = row_target;
  const float inv = 1.0f / all.sum;
  for (std::int64_t g = threadIdx.x; 8 * g < width; g += kRowThreads) {
    float v[8];
    if (vec)
      detail::load8(z + 8 * g, v);
    else
      for (int e = 0; e < 8; ++e) v[e] = 8 * g + e < valid ? detail::load(z + 8 * g + e) : 0.0f;
    for (int e = 0; e < 8; ++e) {
      const std::int64_t i = 8 * g + e;
      float d = 0.0f;
      if (i < valid) {
        d = __fmul_rn(expf(v[e] - all.max) * inv, scale);
        if (i == target) d = __fsub_rn(d, scale);
      }
      v[e] = d;
    }
    if (vec)
      detail::store8(z + 8 * g, v);
    else
      for (int e = 0; e < 8 && 8 * g + e < width; ++e) detail::store(z + 8 * g + e, v[e]);
  }
  if (threadIdx.x == 0) losses[row] = logf(all.sum) - (z_target - all.max);
}

constexpr int kBackwardThreads = 256, kPerThread = 4;

// kInPlace: dlogits is probs, each element read then written by its own thread; the
// product alone is what adding it to a zeroed buffer gives (0 + x = x for x >= +0).
template <bool kInPlace>
__global__ void cross_entropy_backward_kernel(float* dlogits, const float* probs, const std::int32_t* targets,
                                              std::int64_t rows, std::int64_t vocab, float scale,
                                              std::int64_t vocab_start) {
  for (std::int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const std::int64_t target = targets[row] - vocab_start;
    const float* p = probs + row * vocab;
    float* d = dlogits + row * vocab;
    const std::int64_t begin = std::int64_t{blockIdx.x} * kBackwardThreads * kPerThread + threadIdx.x;
    for (int k = 0; k < kPerThread; ++k) {
      const std::int64_t i = begin + std::int64_t{k} * kBackwardThreads;
      if (i >= vocab) break;
      float v = kInPlace ? __fmul_rn(p[i], scale) : __fadd_rn(d[i], __fmul_rn(p[i], scale));
      if (i == target) v = __fsub_rn(v, scale);
      d[i] = v;
    }
  }
}

// The vocabulary-parallel passes, one block per row (the caller all-reduces between them).
__device__ float block_max(float v) {
  __shared__ float parts[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (threadIdx.x % 32 == 0) parts[threadIdx.x / 32] = v;
  __syncthreads();
  float all = parts[0];
  for (int w = 1; w < kThreads / 32; ++w) all = fmaxf(all, parts[w]);
  return all;
}

__device__ float block_sum(float v) {
  __shared__ float parts[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) parts[threadIdx.x / 32] = v;
  __syncthreads();
  float all = parts[0];
  for (int w = 1; w < kThreads / 32; ++w) all += parts[w];
  return all;
}

__global__ void row_max_kernel(float* row_max, const float* logits, std::int64_t local_vocab) {
  const float* z = logits + blockIdx.x * local_vocab;
  float m = -INFINITY;
  for (std::int64_t i = threadIdx.x; i < local_vocab; i += kThreads) m = fmaxf(m, z[i]);
  m = block_max(m);
  if (threadIdx.x == 0) row_max[blockIdx.x] = m;
}

__global__ void row_sums_kernel(float* sums, const float* logits, const float* row_max,
                                const std::int32_t* targets, std::int64_t rows, std::int64_t local_vocab,
                                std::int64_t vocab_start) {
  const std::int64_t row = blockIdx.x;
  const float* z = logits + row * local_vocab;
  const float m = row_max[row];
  float s = 0.0f;
  for (std::int64_t i = threadIdx.x; i < local_vocab; i += kThreads) s += expf(z[i] - m);
  s = block_sum(s);
  if (threadIdx.x == 0) {
    const std::int64_t t = targets[row] - vocab_start;
    sums[row] = s;
    sums[rows + row] = t >= 0 && t < local_vocab ? z[t] - m : 0.0f;
  }
}

__global__ void finish_kernel(float* probs, float* losses, const float* logits, const float* row_max,
                              const float* sums, std::int64_t rows, std::int64_t local_vocab) {
  const std::int64_t row = blockIdx.x;
  const float* z = logits + row * local_vocab;
  float* p = probs + row * local_vocab;
  const float m = row_max[row], sum = sums[row], inv = 1.0f / sum;
  for (std::int64_t i = threadIdx.x; i < local_vocab; i += kThreads) p[i] = expf(z[i] - m) * inv;
  if (threadIdx.x == 0) losses[row] = logf(sum) - sums[rows + row];
}

template <typename S>
void classifier(S* logits, float* losses, const std::int32_t* targets, std::int64_t rows, std::int64_t vocab,
                std::int64_t padded_vocab, float scale) {
  if (rows <= 0) return;
  if (padded_vocab < vocab || vocab <= 0)
    detail::fail_error("classifier_forward_backward: the valid vocabulary " + std::to_string(vocab) +
                       " must be positive and at most the row width " + std::to_string(padded_vocab));
  const bool vec = padded_vocab % 8 == 0 && detail::is_aligned16(logits);
  classifier_kernel<S><<<static_cast<unsigned>(rows), kRowThreads, 0, compute_stream()>>>(
      logits, losses, targets, rows, vocab, padded_vocab, scale, vec);
  check_launch("classifier_forward_backward");
}

}  // namespace

void classifier_forward_backward(float* logits, float* losses, const std::int32_t* targets, std::int64_t rows,
                                 std::int64_t vocab, std::int64_t padded_vocab, float scale) {
  classifier(logits, losses, targets, rows, vocab, padded_vocab, scale);
}

void classifier_forward_backward(BFloat16* logits, float* losses, const std::int32_t* targets, std::int64_t rows,
                                 std::int64_t vocab, std::int64_t padded_vocab, float scale) {
  classifier(detail::bits(logits), losses, targets, rows, vocab, padded_vocab, scale);
}

void cross_entropy_forward(float* probs, float* losses, const float* logits, const std::int32_t* targets,
                           std::int64_t rows, std::int64_t vocab) {
  if (rows <= 0) return;
  cross_entropy_forward_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, compute_stream()>>>(
      probs, losses, logits, targets, vocab, vocab % 8 == 0 && detail::is_aligned16(logits));
  check_launch("cross_entropy_forward");
}

void cross_entropy_row_max(float* row_max, const float* logits, std::int64_t rows, std::int64_t local_vocab) {
  if (rows <= 0) return;
  row_max_kernel<<<static_cast<unsigned>(rows), kThreads, 0, compute_stream()>>>(row_max, logits, local_vocab);
  check_launch("cross_entropy_row_max");
}

void cross_entropy_row_sums(float* sums, const float* logits, const float* row_max, const std::int32_t* targets,
                            std::int64_t rows, std::int64_t local_vocab, std::int64_t vocab_start) {
  if (rows <= 0) return;
  row_sums_kernel<<<static_cast<unsigned>(rows), kThreads, 0, compute_stream()>>>(sums, logits, row_max, targets,
                                                                                  rows, local_vocab, vocab_start);
  check_launch("cross_entropy_row_sums");
}

void cross_entropy_finish(float* probs, float* losses, const float* logits, const float* row_max,
                          const float* sums, std::int64_t rows, std::int64_t local_vocab) {
  if (rows <= 0) return;
  finish_kernel<<<static_cast<unsigned>(rows), kThreads, 0, compute_stream()>>>(probs, losses, logits, row_max,
                                                                                sums, rows, local_vocab);
  check_launch("cross_entropy_finish");
}

void cross_entropy_backward(float* dlogits, const float* probs, const std::int32_t* targets,
                            std::int64_t rows, std::int64_t vocab, float scale, std::int64_t vocab_start) {
  if (rows <= 0 || vocab <= 0) return;
  const std::int64_t per_block = kBackwardThreads * kPerThread;
  const dim3 grid(static_cast<unsigned>((vocab + per_block - 1) / per_block),
                  static_cast<unsigned>(rows < 65535 ? rows : 65535));
  if (dlogits == probs) {
    cross_entropy_backward_kernel<true><<<grid, kBackwardThreads, 0, compute_stream()>>>(dlogits, probs, targets,
                                                                                       rows, vocab, scale, vocab_start);
    check_launch("cross_entropy_backward (in place)");
  } else {
    cross_entropy_backward_kernel<false><<<grid, kBackwardThreads, 0, compute_stream()>>>(
        dlogits, probs, targets, rows, vocab, scale, vocab_start);
    check_launch("cross_entropy_backward");
  }
}

}  // namespace ndmesh::cuda
