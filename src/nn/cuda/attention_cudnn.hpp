// Internal: cuDNN attention (attention_cudnn.cpp), reached only through the cuda_ops.hpp entry
// points that attention.cu defines (attention_forward_cudnn, ...), so that a build whose
// attention.cu is translated for the CUDA emulator never needs this file's object.
#pragma once

#include <cstdint>
#include <string>

#include "ndmesh/core/dtype.hpp"

namespace ndmesh::cuda::detail {

/// attention_forward_cudnn, attention_backward_cudnn and attention_cudnn_unavailable_reason
/// where cuDNN attention is built (NDMESH_WITH_CUDNN).
bool cudnn_forward(float* out, float* lse, const float* qkv, std::int64_t batch, std::int64_t seq,
                   std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim, bool required);
bool cudnn_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                    std::int64_t batch, std::int64_t seq, std::int64_t heads, std::int64_t kv_heads,
                    std::int64_t head_dim, bool required);
bool cudnn_forward(BFloat16* out, float* lse, const BFloat16* qkv, std::int64_t batch, std::int64_t seq,
                   std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim, bool required);
bool cudnn_backward(BFloat16* dqkv, const BFloat16* dout, const BFloat16* qkv, const BFloat16* out,
                    const float* lse, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                    std::int64_t kv_heads, std::int64_t head_dim, bool required);
std::string cudnn_unavailable_reason();

}  // namespace ndmesh::cuda::detail
