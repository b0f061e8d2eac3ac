// cuDNN's fused attention for the CUDA emulator (src/nn/cuda/attention_cudnn.cpp's functions,
// which the translated attention.cu calls: it is compiled with NDMESH_WITH_CUDNN here). cuDNN
// does not run on the CPU, so it is unavailable, as on a machine without libcudnn.so.9 (the
// caller runs the flash kernel), except in the account's count-only mode (account.hpp), where a
// call is recorded and "runs": what a GPU run does under --precision bf16. The emulated build
// renames the three functions (emulated_cudnn_forward, ...: tests/gpu/CMakeLists.txt), so that
// they never meet the library's.
#include <string>

#include "account_hooks.hpp"
#include "ndmesh/core/dtype.hpp"
#include "nn/cuda/attention_cudnn.hpp"
#include "tensor/cuda/errors.hpp"

namespace ndmesh::cuda::detail {

namespace {
const char* const kNoCudnn = "the CUDA emulator runs no cuDNN";

bool call(bool backward, int element_bytes, std::int64_t batch, std::int64_t seq, std::int64_t heads,
          std::int64_t kv_heads, std::int64_t head_dim, bool required) {
  if (!emu::account_count_only()) {
    if (required)
      fail_config(std::string(backward ? "attention_backward_cudnn" : "attention_forward_cudnn") +
                  " under NDMESH_ATTENTION=cudnn: " + kNoCudnn);
    return false;
  }
  // The name attention_cudnn.cpp gives the call in the kernel times.
  const std::string name = std::string(backward ? "attention_backward_cudnn" : "attention_forward_cudnn") +
                           " (batch=" + std::to_string(batch) + " seq=" + std::to_string(seq) +
                           " heads=" + std::to_string(heads) + " kv_heads=" + std::to_string(kv_heads) +
                           " head_dim=" + std::to_string(head_dim) + ")";
  emu::account_cudnn({.name = name,
                      .backward = backward,
                      .batch = batch,
                      .seq = seq,
                      .heads = heads,
                      .kv_heads = kv_heads,
                      .head_dim = head_dim,
                      .element_bytes = element_bytes});
  timed(name.c_str());
  return true;
}
}  // namespace

std::string cudnn_unavailable_reason() { return emu::account_count_only() ? "" : kNoCudnn; }

bool cudnn_forward(float*, float*, const float*, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                   std::int64_t kv_heads, std::int64_t head_dim, bool required) {
  return call(false, 4, batch, seq, heads, kv_heads, head_dim, required);
}
bool cudnn_backward(float*, const float*, const float*, const float*, const float*, std::int64_t batch,
                    std::int64_t seq, std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim,
                    bool required) {
  return call(true, 4, batch, seq, heads, kv_heads, head_dim, required);
}
bool cudnn_forward(BFloat16*, float*, const BFloat16*, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                   std::int64_t kv_heads, std::int64_t head_dim, bool required) {
  return call(false, 2, batch, seq, heads, kv_heads, head_dim, required);
}
bool cudnn_backward(BFloat16*, const BFloat16*, const BFloat16*, const BFloat16*, const float*, std::int64_t batch,
                    std::int64_t seq, std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim,
                    bool required) {
  return call(true, 2, batch, seq, heads, kv_heads, head_dim, required);
}

}  // namespace ndmesh::cuda::detail
