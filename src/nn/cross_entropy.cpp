#include "ndmesh/nn/cross_entropy.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "ndmesh/core/error.hpp"
#include "tensor/cuda_twin.hpp"

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
  backward(probs, targets, dlogits, rows, vocab, 0, scale);  // the whole vocabulary on this rank
}

template <typename T>
double CrossEntropy<T>::forward(const T* logits, const std::int32_t* targets, T* probs, T* losses,
                                std::int64_t rows, std::int64_t local_vocab, std::int64_t vocab_start,
                                std::int64_t vocab, TpComm<T>& comm) {
  std::vector<T> mx(static_cast<std::size_t>(rows)), sums(static_cast<std::size_t>(2 * rows));
  for (std::int64_t r = 0; r < rows; ++r) {
    NDMESH_CHECK(targets[r] >= 0 && targets[r] < vocab, "nn", "target {} at row {} is outside [0, {})",
                 targets[r], r, vocab);
    const T* z = logits + r * local_vocab;
    mx[static_cast<std::size_t>(r)] = *std::max_element(z, z + local_vocab);
  }
  comm.all_reduce_max(mx.data(), rows);
  // [sum of exp(z - max) | the target's z - max (0 on the ranks without it)]
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* z = logits + r * local_vocab;
    T* p = probs + r * local_vocab;
    const T m = mx[static_cast<std::size_t>(r)];
    const std::int64_t t = targets[r] - vocab_start;
    const T z_target = t >= 0 && t < local_vocab ? z[t] - m : T(0);  // read before probs is written
    T sum = 0;
    for (std::int64_t i = 0; i < local_vocab; ++i) {
      p[i] = std::exp(z[i] - m);
      sum += p[i];
    }
    sums[static_cast<std::size_t>(r)] = sum;
    sums[static_cast<std::size_t>(rows + r)] = z_target;
  }
  comm.all_reduce_sum(sums.data(), 2 * rows);
  double total = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    const T sum = sums[static_cast<std::size_t>(r)];
    const T inv = T(1) / sum;
    T* p = probs + r * local_vocab;
    for (std::int64_t i = 0; i < local_vocab; ++i) p[i] *= inv;
    losses[r] = std::log(sum) - sums[static_cast<std::size_t>(rows + r)];
    total += static_cast<double>(losses[r]);
  }
  return rows > 0 ? total / static_cast<double>(rows) : 0.0;
}

template <typename T>
void CrossEntropy<T>::backward(const T* probs, const std::int32_t* targets, T* dlogits, std::int64_t rows,
                               std::int64_t local_vocab, std::int64_t vocab_start, T scale) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* p = probs + r * local_vocab;
    T* d = dlogits + r * local_vocab;
    if (dlogits == probs)  // in place: 0 + x is x (x >= +0 here), what the zeroed buffer got
      for (std::int64_t i = 0; i < local_vocab; ++i) d[i] = p[i] * scale;
    else
      for (std::int64_t i = 0; i < local_vocab; ++i) d[i] += p[i] * scale;
    const std::int64_t t = targets[r] - vocab_start;
    if (t >= 0 && t < local_vocab) d[t] -= scale;
  }
}

template <typename T>
void CrossEntropy<T>::forward(Device device, const T* logits, const std::int32_t* targets, T* probs, T* losses,
                              std::int64_t rows, std::int64_t local_vocab, std::int64_t vocab_start,
                              std::int64_t vocab, TpComm<T>& comm) {
  NDMESH_CUDA_TWIN(device, {
    if (comm.size() == 1) return cuda::cross_entropy_forward(probs, losses, logits, targets, rows, local_vocab);
    // The vocabulary split over tp: the CPU's passes, with the two all-reduces on device
    // buffers (the group's device communicator).
    DeviceBuffer row_max(static_cast<std::size_t>(rows) * sizeof(float)),
        sums(static_cast<std::size_t>(2 * rows) * sizeof(float));
    auto* mx = static_cast<float*>(row_max.data());
    auto* s = static_cast<float*>(sums.data());
    cuda::cross_entropy_row_max(mx, logits, rows, local_vocab);
    comm.all_reduce_max(mx, rows);
    cuda::cross_entropy_row_sums(s, logits, mx, targets, rows, local_vocab, vocab_start);
    comm.all_reduce_sum(s, 2 * rows);
    cuda::cross_entropy_finish(probs, losses, logits, mx, s, rows, local_vocab);
  })
  forward(logits, targets, probs, losses, rows, local_vocab, vocab_start, vocab, comm);
}

template <typename T>
void CrossEntropy<T>::backward(Device device, const T* probs, const std::int32_t* targets, T* dlogits,
                               std::int64_t rows, std::int64_t local_vocab, std::int64_t vocab_start, T scale) {
  NDMESH_CUDA_TWIN(device,
                   cuda::cross_entropy_backward(dlogits, probs, targets, rows, local_vocab, scale, vocab_start))
  backward(probs, targets, dlogits, rows, local_vocab, vocab_start, scale);
}

template struct CrossEntropy<float>;
template struct CrossEntropy<double>;

}  // namespace ndmesh::nn
