// The GPU work `ndmesh calibrate --device cuda` times (nn/device_rates.hpp).
#include "ndmesh/nn/device_rates.hpp"

#include <cstring>
#include <vector>

#include "ndmesh/core/dtype.hpp"
#include "ndmesh/core/error.hpp"
#if NDMESH_WITH_CUDA
#include "ndmesh/nn/cuda_ops.hpp"
#endif

namespace ndmesh::nn {
namespace {

// Says why CUDA cannot run here, before any buffer is asked for.
void require_cuda() {
  const std::string why = cuda::unavailable_reason();
  if (!why.empty()) fail<ConfigError>("cuda", "{}", why);
  if (!cuda::built()) fail<ConfigError>("cuda", "this ndmesh was built without CUDA");
}

// `count` elements of `T` on the device, values in [-1, 1) from a fixed linear congruence.
template <typename T>
DeviceBuffer filled(std::int64_t count) {
  std::vector<T> host(static_cast<std::size_t>(count));
  std::uint32_t x = 12345;
  for (T& v : host) {
    x = x * 1664525u + 1013904223u;
    v = T(static_cast<float>(x >> 8) * 0x1.0p-23f - 1.0f);
  }
  DeviceBuffer b(host.size() * sizeof(T));
  cuda::copy_to_device(b.data(), host.data(), b.bytes());
  cuda::synchronize();
  return b;
}

}  // namespace

GpuProduct::GpuProduct(std::int64_t m, std::int64_t n, std::int64_t k, bool bf16)
    : m_(m), n_(n), k_(k), bf16_(bf16) {
  require_cuda();
  if (bf16) {
    a_ = filled<BFloat16>(m * k), b_ = filled<BFloat16>(n * k), c_ = filled<BFloat16>(m * n);
  } else {
    a_ = filled<float>(m * k), b_ = filled<float>(n * k), c_ = filled<float>(m * n);
  }
}

void GpuProduct::run(int times) const {
#if NDMESH_WITH_CUDA
  for (int i = 0; i < times; ++i) {
    if (bf16_)
      cuda::gemm_bf16(false, true, m_, n_, k_, 1.0f, static_cast<const BFloat16*>(a_.data()), k_,
                      static_cast<const BFloat16*>(b_.data()), k_, 0.0f, static_cast<BFloat16*>(c_.data()),
                      n_);
    else
      cuda::gemm(false, true, m_, n_, k_, 1.0f, static_cast<const float*>(a_.data()), k_,
                 static_cast<const float*>(b_.data()), k_, 0.0f, static_cast<float*>(c_.data()), n_);
  }
  cuda::synchronize();
#else
  (void)times;
#endif
}

GpuAttention::GpuAttention(std::int64_t batch, std::int64_t seq, std::int64_t hidden, std::int64_t heads,
                           bool cudnn)
    : batch_(batch), seq_(seq), heads_(heads), head_dim_(hidden / heads), cudnn_(cudnn) {
  require_cuda();
  const std::int64_t tokens = batch * seq;
  qkv_ = filled<float>(tokens * 3 * hidden), out_ = filled<float>(tokens * hidden);
  lse_ = filled<float>(batch * heads * seq), dout_ = filled<float>(tokens * hidden);
  dqkv_ = filled<float>(tokens * 3 * hidden);
}

std::string GpuAttention::cudnn_unavailable_reason() {
#if NDMESH_WITH_CUDA
  return cuda::attention_cudnn_unavailable_reason();
#else
  return "this ndmesh was built without CUDA";
#endif
}

void GpuAttention::run(int times) const {
#if NDMESH_WITH_CUDA
  for (int i = 0; cudnn_ && i < times; ++i) {
    // required: cuDNN's absence or a shape without an engine is an Error, not the flash kernel.
    cuda::attention_forward_cudnn(static_cast<float*>(out_.data()), static_cast<float*>(lse_.data()),
                                  static_cast<const float*>(qkv_.data()), batch_, seq_, heads_, heads_, head_dim_,
                                  true);
    cuda::attention_backward_cudnn(static_cast<float*>(dqkv_.data()), static_cast<const float*>(dout_.data()),
                                   static_cast<const float*>(qkv_.data()), static_cast<const float*>(out_.data()),
                                   static_cast<const float*>(lse_.data()), batch_, seq_, heads_, heads_, head_dim_,
                                   true);
  }
  for (int i = 0; !cudnn_ && i < times; ++i) {
    cuda::attention_forward(static_cast<float*>(out_.data()), static_cast<float*>(lse_.data()),
                            static_cast<const float*>(qkv_.data()), batch_, seq_, heads_, heads_, head_dim_,
                            nullptr);
    cuda::attention_backward(static_cast<float*>(dqkv_.data()), static_cast<const float*>(dout_.data()),
                             static_cast<const float*>(qkv_.data()), static_cast<const float*>(out_.data()),
                             static_cast<const float*>(lse_.data()), batch_, seq_, heads_, heads_, head_dim_,
                             nullptr);
  }
  cuda::synchronize();
#else
  (void)times;
#endif
}

GpuCopy::GpuCopy(CopyKind kind, std::size_t bytes) : kind_(kind), bytes_(bytes) {
  require_cuda();
  const auto floats = static_cast<std::int64_t>(bytes / sizeof(float));
  if (kind != CopyKind::kHostToDevice) from_ = filled<float>(floats);
  if (kind != CopyKind::kDeviceToHost) to_ = DeviceBuffer(bytes);
  if (kind != CopyKind::kDeviceToDevice) {
    host_.reset(cuda::alloc_pinned(bytes));
    std::memset(host_.get(), 1, bytes);
  }
}

void GpuCopy::run(int times) const {
  for (int i = 0; i < times; ++i) {
    switch (kind_) {
      case CopyKind::kDeviceToDevice:
        cuda::copy_device(to_.data(), from_.data(), bytes_);
        break;
      case CopyKind::kHostToDevice:
        cuda::copy_to_device(to_.data(), host_.get(), bytes_);
        break;
      case CopyKind::kDeviceToHost:
        cuda::copy_to_host(host_.get(), from_.data(), bytes_);  // waits for each copy
        break;
    }
  }
  cuda::synchronize();
}

}  // namespace ndmesh::nn
