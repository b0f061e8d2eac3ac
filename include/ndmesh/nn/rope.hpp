// Rotary position embedding (Su et al. 2021, RoFormer), in Hugging Face's rotate-half
// convention (the one Llama checkpoints on the Hub are stored for): within each head of
// size d, the pair (i, i + d/2) at position p is rotated by the angle p * inv_freq[i],
//   y[i]       = x[i] cos - x[i + d/2] sin,
//   y[i + d/2] = x[i + d/2] cos + x[i] sin,
// inv_freq[i] = 1 / theta^(2i / d) (optionally rescaled by Llama 3's rule). Applied to the
// query and key heads of the fused qkv rows at each row's global position, before the
// attention core: a context-parallel ring and its zigzag chunks see rotated queries and keys
// and need nothing else. The backward is the inverse rotation of their gradients.
#pragma once

#include <cstdint>
#include <vector>

#include "ndmesh/core/arch.hpp"
#include "ndmesh/core/dtype.hpp"
#include "ndmesh/tensor/device.hpp"
#include "ndmesh/tensor/tensor.hpp"

namespace ndmesh::nn {

/// The rotation's settings.
struct RopeOptions {
  std::int64_t head_dim = 0;  ///< d (even)
  double theta = 10000;
  RopeScaling scaling;
};

/// HF's inverse frequencies in float (d/2 of them): 1 / theta^(2i / d), then Llama 3's
/// scaling when its factor is set.
std::vector<float> rope_inv_freq(const RopeOptions& options);

/// The rotation of the first `heads` heads (the queries, then the keys) of rows [batch * seq,
/// width]; no parameters.
template <typename T>
class Rope {
 public:
  /// ConfigError for an odd or zero head size or a theta <= 0.
  explicit Rope(RopeOptions options);
  /// Rotates in place rows of S (T, or bfloat16 under bf16 products); row r is at
  /// positions[r % seq] (nullptr: r % seq). On CUDA x and positions are device memory.
  template <typename S>
  void forward(S* x, std::int64_t rows, std::int64_t seq, std::int64_t width, std::int64_t heads,
               const std::int64_t* positions, Device device) const {
    rotate(x, rows, seq, width, heads, positions, device, false);
  }
  /// The inverse rotation in place (the gradient of forward()).
  template <typename S>
  void backward(S* dx, std::int64_t rows, std::int64_t seq, std::int64_t width, std::int64_t heads,
                const std::int64_t* positions, Device device) const {
    rotate(dx, rows, seq, width, heads, positions, device, true);
  }
  const RopeOptions& options() const { return options_; }

 private:
  template <typename S>
  void rotate(S* x, std::int64_t rows, std::int64_t seq, std::int64_t width, std::int64_t heads,
              const std::int64_t* positions, Device device, bool inverse) const;
  RopeOptions options_;
  std::vector<float> inv_freq_;            // float, as HF computes them
  std::vector<double> inv_freq_double_;    // the same rule in double (the finite-difference model)
  mutable Tensor<float> inv_freq_device_;  // CUDA: inv_freq_ on the device, made at first use
};

}  // namespace ndmesh::nn
