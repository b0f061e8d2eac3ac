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

// One element's update in place (w, m, v the new values; grad read).
__device__ __forceinline__ void adamw_values(float& w, float grad, float& m, float& v, const AdamWStep& s) {
  const double g = __dmul_rn(static_cast<double>(grad), s.clip);
  const double mi = __dadd_rn(__dmul_rn(s.beta1, static_cast<double>(m)), __dmul_rn(s.one_minus_beta1, g));
  const double vi =
      __dadd_rn(__dmul_rn(s.beta2, static_cast<double>(v)), __dmul_rn(__dmul_rn(s.one_minus_beta2, g), g));
  m = static_cast<float>(mi);
  v = static_cast<float>(vi);
  const double wi = w;
  const double denom = __dadd_rn(__dsqrt_rn(__ddiv_rn(vi, s.c2)), s.eps);
  const double step = __dadd_rn(__ddiv_rn(__ddiv_rn(mi, s.c1), denom), __dmul_rn(s.decay, wi));
  w = static_cast<float>(__dsub_rn(wi, __dmul_rn(s.lr, step)));
}

// Element i of one step; w_bf16 (may be null) gets the new weight rounded to bfloat16.
__device__ __forceinline__ void adamw_element(float* w, detail::Bf16Bits* w_bf16, const float* grad, float* m,
                                              float* v, std::int64_t i, const AdamWStep& s) {
  float wi = w[i], mi = m[i], vi = v[i];
  adamw_values(wi, grad[i], mi, vi, s);
  m[i] = mi;
  v[i] = vi;
  w[i] = wi;
  if (w_bf16 != nullptr) w_bf16[i] = detail::to_bf16(wi);
}

// Multi-tensor: block b handles chunk b of the table (a segment and a range of its elements);
// the segments' decays differ, nothing else. A chunk is at most kChunk elements; the chunks
// after a segment's first start where the parameter's element is a multiple of 8 (where its
// rows of w, grad, m, v and the bf16 copy are 16-byte aligned when the segment's offsets agree
// modulo 8), so that a thread updates eight elements at a time with 16-byte loads and stores
// (two float4 of each fp32 array, one pack of eight bf16), then the chunk's tail one by one.
constexpr std::int64_t kChunk = 4096;
struct Chunk {
  std::int32_t segment;
  std::int64_t begin, end;  // within the segment
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
    float* sw = w + seg.param;
    detail::Bf16Bits* sb = w_bf16 ? w_bf16 + seg.param : nullptr;
    const float* sg = grad + seg.grad;
    float* sm = m + seg.state;
    float* sv = v + seg.state;
    const auto aligned = [&](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
    const bool vec = aligned(sw + ch.begin) && aligned(sg + ch.begin) && aligned(sm + ch.begin) &&
                     aligned(sv + ch.begin) && (sb == nullptr || aligned(sb + ch.begin));
    std::int64_t i = ch.begin + threadIdx.x;
    if (vec) {
      const std::int64_t groups = (ch.end - ch.begin) / 8;
      for (std::int64_t k = threadIdx.x; k < groups; k += blockDim.x) {
        const std::int64_t at = ch.begin + 8 * k;
        float wv[8], gv[8], mv[8], vv[8];
        detail::load8(sw + at, wv);
        detail::load8(sg + at, gv);
        detail::load8(sm + at, mv);
        detail::load8(sv + at, vv);
        for (int e = 0; e < 8; ++e) adamw_values(wv[e], gv[e], mv[e], vv[e], step);
        detail::store8(sw + at, wv);
        detail::store8(sm + at, mv);
        detail::store8(sv + at, vv);
        if (sb != nullptr) detail::store8(sb + at, wv);
      }
      i = ch.begin + groups * 8 + threadIdx.x;
    }
    for (; i < ch.end; i += blockDim.x) adamw_element(sw, sb, sg, sm, sv, i, step);
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
  for (int i = 0; i < n; ++i) {
    const std::int64_t count = segments[i].count;
    // The first chunk ends where the parameter's element is next a multiple of 8 (or kChunk
    // elements after that); the rest are kChunk long.
    std::int64_t b = 0, first = (8 - segments[i].param % 8) % 8;
    for (std::int64_t e = first > 0 ? first : kChunk; b < count; b = e, e += kChunk)
      chunks.push_back({i, b, e < count ? e : count});
  }
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
