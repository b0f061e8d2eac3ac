#include "ndmesh/nn/cross_entropy.hpp"

#include <algorithm>
#include <cmath>

#include "ndmesh/core/error.hpp"

namespace ndmesh::nn {

template <typename T>
double CrossEntropy<T>::forward(const T* logits, const std::int32_t* targets, T* probs, T* losses,
                                std::int64_t rows, std::int64_t vocab) {
  double total = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* z = logits + r * vocab;
    T* p = probs + r * vocab;
    std::int32_t target = targets[r];
    NDMESH_CHECK(target >= 0 && target < vocab, "nn", "target {} at row {} is outside [0, {})", target, r,
                 vocab);
    T mx = *std::max_element(z, z + vocab);
    const T z_target = z[target];  // read before probs (which may alias logits) is written
    T sum = 0;
    for (std::int64_t i = 0; i < vocab; ++i) {
      p[i] = std::exp(z[i] - mx);
      sum += p[i];
    }
    T inv = T(1) / sum;
    for (std::int64_t i = 0; i < vocab; ++i) p[i] *= inv;
    // -log p[target] from the logits directly: exact even when p[target] underflows.
    losses[r] = std::log(sum) - (z_target - mx);
    total += static_cast<double>(losses[r]);
  }
  return rows > 0 ? total / static_cast<double>(rows) : 0.0;
}

template <typename T>
void CrossEntropy<T>::backward(const T* probs, const std::int32_t* targets, T* dlogits, std::int64_t rows,
                               std::int64_t vocab, T scale) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* p = probs + r * vocab;
    T* d = dlogits + r * vocab;
    for (std::int64_t i = 0; i < vocab; ++i) d[i] += p[i] * scale;
    d[targets[r]] -= scale;
  }
}

template struct CrossEntropy<float>;
template struct CrossEntropy<double>;

}  // namespace ndmesh::nn
