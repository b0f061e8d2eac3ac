#include "ndmesh/nn/lm_head.hpp"

#include <algorithm>
#include <limits>

#include "ndmesh/core/error.hpp"
#include "ndmesh/nn/cross_entropy.hpp"
#include "ndmesh/tensor/ops.hpp"
#include "tensor/cuda_twin.hpp"

namespace ndmesh::nn {

template <typename T>
LossSum<T>::LossSum(Device device) : device_(device) {
  if (device_ == Device::kCuda) {
    ops::check_device<T>(device_);
    on_device_ = DeviceBuffer(sizeof(double));
  }
}

template <typename T>
void LossSum<T>::add(const T* losses, std::int64_t n) {
  [[maybe_unused]] const bool first = !added_;
  added_ = true;
  // The first add after a take() writes the device's double (no zeroing pass).
  NDMESH_CUDA_TWIN(device_, cuda::sum_into(static_cast<double*>(on_device_.data()), losses, n, !first))
  for (std::int64_t i = 0; i < n; ++i) host_ += static_cast<double>(losses[i]);
}

template <typename T>
double LossSum<T>::take() {
  if (device_ == Device::kCuda && added_) cuda::copy_to_host(&host_, on_device_.data(), sizeof(double));
  const double sum = host_;
  host_ = 0;
  added_ = false;
  return sum;
}

template <typename T>
void LossSum<T>::take_into(double* result) {
  if (device_ == Device::kCuda) {
    if (added_)
      cuda::copy_device(result, on_device_.data(), sizeof(double));
    else
      cuda::memset_zero(result, sizeof(double));
    added_ = false;
    return;
  }
  *result = take();
}

template <typename T>
LmHead<T>::LmHead(ParamStore<T>& store, LmHeadOptions options)
    : options_(std::move(options)),
      proj_(store, {.in = options_.channels,
                    .out = rows() / options_.tp.size,
                    .bias = false,
                    .name = options_.name,
                    .shared_weight = options_.tied_weight,
                    .weight_shard = options_.tp.rows({options_.vocab, options_.channels}, {{0, rows()}})}) {}

template <typename T>
std::int64_t LmHead<T>::valid_vocab() const {
  return std::clamp<std::int64_t>(options_.vocab - local_vocab() * options_.tp.rank, 0, local_vocab());
}

template <typename T>
bool LmHead<T>::fuses(bool deferred) const {
  return proj_.device() == Device::kCuda && options_.tp.size == 1 && !deferred;
}

template <typename T>
void LmHead<T>::resize(ClassifierActivations<T>& a, std::int64_t rows, bool deferred) const {
  a.fused = fuses(deferred);
  const Device device = proj_.device();
  a.logits.set_device(device);
  a.logits16.set_device(device);
  a.losses.set_device(device);
  const bool bf16 = a.fused && proj_.matmul_precision() == MatmulPrecision::kBf16;
  a.logits.resize(bf16 ? std::vector<std::int64_t>{0} : std::vector<std::int64_t>{rows, local_vocab()});
  a.logits16.resize(bf16 ? std::vector<std::int64_t>{rows, padded_vocab()} : std::vector<std::int64_t>{0});
  a.losses.resize({rows});
}

template <typename T>
void LmHead<T>::forward_loss(const T* inp, const std::int32_t* targets, ClassifierActivations<T>& a,
                             std::int64_t rows, [[maybe_unused]] T scale, TpComm<T>& comm, LossSum<T>& sum) const {
  const Device device = proj_.device();
  const std::int64_t v = local_vocab();
  const bool bf16 = proj_.matmul_precision() == MatmulPrecision::kBf16, in_bf16 = a.fused && bf16;
  NDMESH_CHECK((in_bf16 ? a.logits16.numel() : a.logits.numel()) == rows * (in_bf16 ? padded_vocab() : v), "nn",
               "'{}': the classifier's activations were sized for another device, precision or batch; make them "
               "after ParamStore::to and set_matmul_precision",
               options_.name);
  if (a.fused) {
    NDMESH_CUDA_TWIN(device, {
      if (bf16) {
        proj_.forward(inp, a.logits16.data(), padded_vocab(), rows);
        cuda::classifier_forward_backward(a.logits16.data(), a.losses.data(), targets, rows, valid_vocab(),
                                          padded_vocab(), static_cast<float>(scale));
      } else {
        forward(inp, a.logits.data(), rows);
        cuda::classifier_forward_backward(a.logits.data(), a.losses.data(), targets, rows, valid_vocab(), v,
                                          static_cast<float>(scale));
      }
      sum.add(a.losses.data(), rows);
    })
  }
  forward(inp, a.logits.data(), rows);
  if (bf16) ops::round_to_bf16(a.logits.data(), rows * v, device);  // what the fused path stores
  // The padded vocabulary's columns out of the softmax: exp(-inf) adds an exact 0 to the
  // sums, leaves the maxima alone and gives those columns a probability, so a gradient, of 0.
  if (valid_vocab() < v)
    ops::fill_columns(a.logits.data(), rows, v, valid_vocab(), -std::numeric_limits<T>::infinity(), device);
  CrossEntropy<T>::forward(device, a.logits.data(), targets, a.logits.data(), a.losses.data(), rows, v,
                           v * options_.tp.rank, options_.vocab, comm);  // columns past vocab: padding
  sum.add(a.losses.data(), rows);
}

template <typename T>
void LmHead<T>::backward_loss(ClassifierActivations<T>& a, const std::int32_t* targets, const T* inp, T* dinp,
                              std::int64_t rows, T scale) const {
  const std::int64_t v = local_vocab();
  if (a.fused && a.logits16.numel() > 0)
    return proj_.backward(a.logits16.data(), padded_vocab(), inp, dinp, rows, GradInto::kSet);
  if (!a.fused)  // the gradient over the probabilities (fused: the forward wrote it)
    CrossEntropy<T>::backward(proj_.device(), a.logits.data(), targets, a.logits.data(), rows, v,
                              v * options_.tp.rank, scale);
  backward(a.logits.data(), inp, dinp, rows, GradInto::kSet);
}

template class LossSum<float>;
template class LossSum<double>;
template class LmHead<float>;
template class LmHead<double>;

}  // namespace ndmesh::nn
