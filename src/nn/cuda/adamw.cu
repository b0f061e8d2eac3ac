// nn::AdamW::update on the device (cuda_ops.hpp): one fused pass over a flat range of
// parameters, gradients and both moments. Every element is computed in double exactly as
// the CPU loop writes it, with the _rn intrinsics so that nvcc contracts nothing into an
// FMA: IEEE double operations in the same order give the CPU's result bit for bit, and the
// float parameters and moments round the same way. The gradient-norm clipping factor and
// the bias corrections c1, c2 come from the caller (the norm is cuda::square_sum over the
// gradients, all-reduced first in a parallel run).
//
// adamw_update_multi: the same element update over a list of parameter tensors (each its
// own decay) in one launch, through a chunk table uploaded once per list; it also writes the
// bf16 copy of the new weights that the bf16 forward reads, and it can take the clipping
// factor from the gradients' square sum in device memory (no host wait for the norm).
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "ndmesh/nn/cuda_ops.hpp"
#include "tensor/cuda/common.cuh"

namespace ndmesh::cuda {

namespace {

struct AdamWStep {
  double lr, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, decay, clip, c1, c2;
  const double* square_sum;  // when set, clip comes from it and clip_norm (clip_factor)
  double clip_norm;
};

// The clipping factor as nn::AdamW::update computes it on the host from the norm
// sqrt(max(0, square sum)): the same correctly rounded square root and division.
__device__ __forceinline__ double clip_factor(const AdamWStep& s) {
  if (s.square_sum == nullptr) return s.clip;
  const double square = *s.square_sum;
  const double norm = __dsqrt_rn(0.0 < square ? square : 0.0);
  return s.clip_norm > 0 && norm > s.clip_norm ? __ddiv_rn(s.clip_norm, norm) : 1.0;
}

// Element i of one step; w_bf16 (may be null) gets the new weight rounded to bfloat16.
__device__ __forceinline__ void adamw_element(float* w, detail::Bf16Bits* w_bf16, const float* grad, float* m,
                                              float* v, std::int64_t i, const AdamWStep& s) {
  const double g = __dmul_rn(static_cast<double>(grad[i]), s.clip);
  const double mi = __dadd_rn(__dmul_rn(s.beta1, static_cast<double>(m[i])), __dmul_rn(s.one_minus_beta1, g));
  const double vi =
      __dadd_rn(__dmul_rn(s.beta2, static_cast<double>(v[i])), __dmul_rn(__dmul_rn(s.one_minus_beta2, g), g));
  m[i] = static_cast<float>(mi);
  v[i] = static_cast<float>(vi);
  const double wi = w[i];
  const double denom = __dadd_rn(__dsqrt_rn(__ddiv_rn(vi, s.c2)), s.eps);
  const double step = __dadd_rn(__ddiv_rn(__ddiv_rn(mi, s.c1), denom), __dmul_rn(s.decay, wi));
  const float updated = static_cast<float>(__dsub_rn(wi, __dmul_rn(s.lr, step)));
  w[i] = updated;
  if (w_bf16 != nullptr) w_bf16[i] = detail::to_bf16(updated);
}

// Multi-tensor: block b handles chunk b of the table (a segment and its first element);
// the segments' decays differ, nothing else.
constexpr std::int64_t kChunk = 4096;
struct Chunk {
  std::int32_t segment;
  std::int64_t begin;  // within the segment
};
__global__ void adamw_multi_kernel(float* w, detail::Bf16Bits* w_bf16, const float* grad, float* m, float* v,
                                   const AdamWSegment* segments, const Chunk* chunks, std::int64_t chunk_count,
                                   AdamWStep s) {
  AdamWStep step = s;
  step.clip = clip_factor(s);
  for (std::int64_t c = blockIdx.x; c < chunk_count; c += gridDim.x) {
    const Chunk ch = chunks[c];
    const AdamWSegment seg = segments[ch.segment];
    step.decay = seg.decay;
    const std::int64_t end = ch.begin + kChunk < seg.count ? ch.begin + kChunk : seg.count;
    for (std::int64_t i = ch.begin + threadIdx.x; i < end; i += blockDim.x)
      adamw_element(w + seg.param, w_bf16 ? w_bf16 + seg.param : nullptr, grad + seg.grad, m + seg.state,
                    v + seg.state, i, step);
  }
}

__global__ void adamw_kernel(float* w, const float* grad, float* m, float* v, std::int64_t n, AdamWStep s) {
  const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
  for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    const double g = __dmul_rn(static_cast<double>(grad[i]), s.clip);
    const double mi =
        __dadd_rn(__dmul_rn(s.beta1, static_cast<double>(m[i])), __dmul_rn(s.one_minus_beta1, g));
    const double vi = __dadd_rn(__dmul_rn(s.beta2, static_cast<double>(v[i])),
                                __dmul_rn(__dmul_rn(s.one_minus_beta2, g), g));
    m[i] = static_cast<float>(mi);
    v[i] = static_cast<float>(vi);
    const double wi = w[i];
    const double denom = __dadd_rn(__dsqrt_rn(__ddiv_rn(vi, s.c2)), s.eps);
    const double step = __dadd_rn(__ddiv_rn(__ddiv_rn(mi, s.c1), denom), __dmul_rn(s.decay, wi));
    w[i] = static_cast<float>(__dsub_rn(wi, __dmul_rn(s.lr, step)));
  }
}

// The segment and chunk tables of a list, in device memory (kept for the process: a
// training run passes the same lists every step).
struct MultiTables {
  std::vector<AdamWSegment> segments;
  DeviceBuffer device_segments, device_chunks;
  std::int64_t chunk_count = 0;
};

bool same(const std::vector<AdamWSegment>& a, const AdamWSegment* b, int n) {
  if (a.size() != static_cast<std::size_t>(n)) return false;
  for (int i = 0; i < n; ++i) {
    const AdamWSegment& x = a[static_cast<std::size_t>(i)];
    if (x.param != b[i].param || x.grad != b[i].grad || x.state != b[i].state || x.count != b[i].count ||
        x.decay != b[i].decay)
      return false;
  }
  return true;
}

const MultiTables& tables_for(const AdamWSegment* segments, int n) {
  // One table per list, per host thread: a rank with several model chunks (the interleaved
  // pipeline's virtual stages) passes one list per chunk every step, and ranks that are
  // threads of one process (the emulator's in-process tests) each pass their own. A table
  // evicted while a kernel may read it is freed in stream order (tensor/device.hpp).
  constexpr std::size_t kKept = 16;
  thread_local auto* kept = new std::vector<std::unique_ptr<MultiTables>>();  // never freed: outlives the allocator
  for (const auto& t : *kept)
    if (same(t->segments, segments, n)) return *t;
  if (kept->size() == kKept) kept->erase(kept->begin());
  auto t = std::make_unique<MultiTables>();
  std::vector<Chunk> chunks;
  for (int i = 0; i < n; ++i)
    for (std::int64_t b = 0; b < segments[i].count; b += kChunk) chunks.push_back({i, b});
  t->segments.assign(segments, segments + n);
  t->chunk_count = static_cast<std::int64_t>(chunks.size());
  t->device_segments = DeviceBuffer(static_cast<std::size_t>(n) * sizeof(AdamWSegment));
  t->device_chunks = DeviceBuffer(chunks.size() * sizeof(Chunk));
  if (n > 0) copy_to_device(t->device_segments.data(), segments, static_cast<std::size_t>(n) * sizeof(AdamWSegment));
  if (!chunks.empty()) copy_to_device(t->device_chunks.data(), chunks.data(), chunks.size() * sizeof(Chunk));
  kept->push_back(std::move(t));
  return *kept->back();
}

}  // namespace

void adamw_update_multi(float* w, BFloat16* w_bf16, const float* grad, float* m, float* v,
                        const AdamWSegment* segments, int segment_count, double lr, double beta1, double beta2,
                        double eps, double clip, double c1, double c2, const double* square_sum,
                        double clip_norm) {
  const MultiTables& t = tables_for(segments, segment_count);
  if (t.chunk_count == 0) return;
  const AdamWStep s{lr, beta1, beta2, 1 - beta1, 1 - beta2, eps, 0.0, clip, c1, c2, square_sum, clip_norm};
  const unsigned blocks = static_cast<unsigned>(t.chunk_count < 65535 ? t.chunk_count : 65535);
  adamw_multi_kernel<<<blocks, detail::kThreads, 0, detail::compute_stream()>>>(
      w, w_bf16 ? detail::bits(w_bf16) : nullptr, grad, m, v,
      static_cast<const AdamWSegment*>(t.device_segments.data()),
      static_cast<const Chunk*>(t.device_chunks.data()), t.chunk_count, s);
  detail::check_launch("adamw_update_multi");
}

void adamw_update(float* w, const float* grad, float* m, float* v, std::int64_t n, double lr, double beta1,
                  double beta2, double eps, double decay, double clip, double c1, double c2) {
  if (n <= 0) return;
  // 1 - b1 and 1 - b2 as the CPU computes them (in double, once).
  const AdamWStep s{lr, beta1, beta2, 1 - beta1, 1 - beta2, eps, decay, clip, c1, c2, nullptr, 0.0};
  adamw_kernel<<<detail::blocks_for(n), detail::kThreads, 0, detail::compute_stream()>>>(w, grad, m, v, n, s);
  detail::check_launch("adamw_update");
}

}  // namespace ndmesh::cuda
