// nn::AdamW::update on the device (cuda_ops.hpp): one fused pass over a flat range of
// parameters, gradients and both moments. Every element is computed in double exactly as
// the CPU loop writes it, with the _rn intrinsics so that nvcc contracts nothing into an
// FMA: IEEE double operations in the same order give the CPU's result bit for bit, and the
// float parameters and moments round the same way. The gradient-norm clipping factor and
// the bias corrections c1, c2 come from the caller (the norm is cuda::square_sum over the
// gradients, all-reduced first in a parallel run).
#include <cuda_runtime.h>

#include <cstdint>

#include "ndmesh/nn/cuda_ops.hpp"
#include "tensor/cuda/common.cuh"

namespace ndmesh::cuda {

namespace {

struct AdamWStep {
  double lr, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, decay, clip, c1, c2;
};

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

}  // namespace

void adamw_update(float* w, const float* grad, float* m, float* v, std::int64_t n, double lr, double beta1,
                  double beta2, double eps, double decay, double clip, double c1, double c2) {
  if (n <= 0) return;
  // 1 - b1 and 1 - b2 as the CPU computes them (in double, once).
  const AdamWStep s{lr, beta1, beta2, 1 - beta1, 1 - beta2, eps, decay, clip, c1, c2};
  adamw_kernel<<<detail::blocks_for(n), detail::kThreads, 0, detail::compute_stream()>>>(w, grad, m, v, n, s);
  detail::check_launch("adamw_update");
}

}  // namespace ndmesh::cuda
