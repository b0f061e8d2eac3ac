// What `ndmesh calibrate --device cuda` times on this process's GPU: matrix products as the
// layers run them (fp32 through cuda::gemm, bf16 operands through cuda::gemm_bf16 with fp32
// accumulation) and copies (inside the device memory, and between it and pinned host memory).
// Each object owns its operands (non-zero values: zeros run faster than real data); run()
// enqueues the work on the compute stream `times` times and waits for it, so the caller's
// clock around run() measures it. Without CUDA (or a GPU) the constructors throw ConfigError
// with cuda::unavailable_reason().
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <memory>

#include "ndmesh/tensor/device.hpp"

namespace ndmesh::nn {

/// C[m, n] = A[m, k] B[n, k]^T, the product of nn::Linear's forward (the weight is [n, k]).
class GpuProduct {
 public:
  GpuProduct(std::int64_t m, std::int64_t n, std::int64_t k, bool bf16);
  void run(int times) const;
  /// 2 m n k.
  double flops() const {
    return 2.0 * static_cast<double>(m_) * static_cast<double>(n_) * static_cast<double>(k_);
  }

 private:
  std::int64_t m_, n_, k_;
  bool bf16_;
  DeviceBuffer a_, b_, c_;
};

/// The attention core of a layer (forward then backward, causal, heads of hidden / heads), as
/// nn::Attention runs it on `batch` sequences of `seq` tokens: the fp32 flash kernel
/// (cuda::attention_forward / attention_backward), or with `cudnn` cuDNN's fused flash
/// attention, what --precision bf16 runs (cuda::attention_forward_cudnn / _backward_cudnn;
/// an Error where it cannot run: ask cudnn_unavailable_reason() first).
class GpuAttention {
 public:
  GpuAttention(std::int64_t batch, std::int64_t seq, std::int64_t hidden, std::int64_t heads, bool cudnn = false);
  /// One forward and one backward per time.
  void run(int times) const;
  /// Empty when the cuDNN kernel can run here, else why not.
  static std::string cudnn_unavailable_reason();

 private:
  std::int64_t batch_, seq_, heads_, head_dim_;
  bool cudnn_;
  DeviceBuffer qkv_, out_, lse_, dout_, dqkv_;
};

/// Which way a GpuCopy moves its bytes.
enum class CopyKind { kDeviceToDevice, kHostToDevice, kDeviceToHost };

/// A copy of `bytes` (the host side pinned: cuda::alloc_pinned).
class GpuCopy {
 public:
  GpuCopy(CopyKind kind, std::size_t bytes);
  void run(int times) const;
  std::size_t bytes() const { return bytes_; }

 private:
  CopyKind kind_;
  std::size_t bytes_;
  DeviceBuffer from_, to_;
  std::unique_ptr<void, void (*)(void*)> host_{nullptr, [](void* p) { cuda::free_pinned(p); }};
};

}  // namespace ndmesh::nn
