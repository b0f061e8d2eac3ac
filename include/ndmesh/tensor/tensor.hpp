// Tensor: a contiguous, row-major array of elements with a shape, on a device.
//
// The layers in ndmesh/nn work on raw pointers into buffers like this one (llm.c style);
// Tensor only owns memory and remembers the shape and the device, so that buffers can be
// named after what they hold and sized once. Scalars are float for training and double for
// the finite-difference checks; bfloat16 (BFloat16) for the activations of bf16 mixed
// precision. The element type is part of the tensor (dtype()). On the CPU the elements are a
// vector over calloc'd memory (ZeroedVector): a tensor allocated and not yet written holds the
// kernel's zero pages, so a ZeRO-3 rank's full-size flat buffers cost only what it writes; on
// CUDA (tensor/device.hpp) they are device memory from the caching allocator, addressed by
// data() but not by operator[] or span().
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

#include "ndmesh/core/dtype.hpp"
#include "ndmesh/core/error.hpp"
#include "ndmesh/tensor/device.hpp"
#include "ndmesh/tensor/zeroed_allocator.hpp"

namespace ndmesh {

/// Product of a shape's sizes (1 for an empty shape).
inline std::int64_t shape_numel(const std::vector<std::int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>());
}

/// An owning, contiguous, zero-initialised tensor of T (float, double, BFloat16, or the
/// integers of tokens and positions).
template <typename T>
class Tensor {
 public:
  Tensor() = default;
  /// A zero tensor of the given shape on `device`.
  explicit Tensor(std::vector<std::int64_t> shape, Device device = Device::kCpu) : device_(device) {
    resize(std::move(shape));
  }

  /// Reshapes and zeroes; reallocates only when the element count grows. On the CPU a
  /// reallocation is fresh zero memory that is not written (its pages are taken when first
  /// written); otherwise the elements are set to zero in place.
  void resize(std::vector<std::int64_t> shape) {
    for (auto s : shape) NDMESH_CHECK(s >= 0, "tensor", "negative size {} in a shape", s);
    shape_ = std::move(shape);
    const auto n = static_cast<std::size_t>(shape_numel(shape_));
    if (device_ == Device::kCpu) {
      if (n > data_.capacity()) {
        ZeroedVector<T>().swap(data_);  // the old storage goes first
        data_ = ZeroedVector<T>(n);
      } else {
        // Within the capacity the elements past the old size hold what they held (the
        // allocator's value-initialisation writes nothing): zero them all.
        data_.resize(n);
        std::fill(data_.begin(), data_.end(), T(0));
      }
      return;
    }
    if (mappable_) {  // none of it backed: its owner backs and fills what it uses
      if (n * sizeof(T) > device_data_.bytes()) device_data_ = DeviceBuffer::mappable(n * sizeof(T), false);
      numel_ = static_cast<std::int64_t>(n);
      return;
    }
    if (n * sizeof(T) > device_data_.bytes()) device_data_ = DeviceBuffer(n * sizeof(T));
    numel_ = static_cast<std::int64_t>(n);
    cuda::memset_zero(device_data_.data(), n * sizeof(T));
  }
  /// Sets every element to zero.
  void zero() {
    if (device_ == Device::kCpu)
      std::fill(data_.begin(), data_.end(), T(0));
    else
      cuda::memset_zero(device_data_.data(), static_cast<std::size_t>(numel_) * sizeof(T));
  }
  /// Moves the (zeroed) storage to `device`: an empty tensor, or a resize() that follows,
  /// allocates there. Used once, when a model is placed on its device.
  /// With `mappable` (CUDA) the storage is cuda::alloc_mappable memory, whose pages can be
  /// given back and taken again in place (ZeRO-3's parameters, ZeRO 2/3's gradients): none
  /// of it backed and nothing zeroed, so that its owner backs (cuda::map_pages, DevicePages)
  /// only what it uses; zero() and host copies of it are the owner's to avoid.
  void set_device(Device device, bool mappable = false) {
    if (device == device_) return;
    device_ = device;
    mappable_ = mappable && device == Device::kCuda;
    data_.clear();
    data_.shrink_to_fit();
    device_data_ = DeviceBuffer();
    numel_ = 0;
    if (!shape_.empty()) resize(shape_);
  }

  /// Where the elements live.
  Device device() const { return device_; }
  /// True for CUDA storage from cuda::alloc_mappable (set_device's `mappable`).
  bool mappable() const { return mappable_; }
  /// The element type.
  static constexpr DType dtype() { return DTypeOf<T>::value; }
  /// The sizes, outermost first.
  const std::vector<std::int64_t>& shape() const { return shape_; }
  /// Size of dimension `d`.
  std::int64_t size(std::size_t d) const { return shape_.at(d); }
  /// Number of elements.
  std::int64_t numel() const { return device_ == Device::kCpu ? static_cast<std::int64_t>(data_.size()) : numel_; }

  /// The elements, row-major (device memory on CUDA).
  T* data() { return device_ == Device::kCpu ? data_.data() : static_cast<T*>(device_data_.data()); }
  const T* data() const {
    return device_ == Device::kCpu ? data_.data() : static_cast<const T*>(device_data_.data());
  }
  /// The elements as a span (CPU only: for ElementSpan::of and range loops).
  std::span<T> span() { return data_; }
  std::span<const T> span() const { return data_; }
  /// Element i of the flat (row-major) storage (CPU only).
  T& operator[](std::int64_t i) { return data_[static_cast<std::size_t>(i)]; }
  const T& operator[](std::int64_t i) const { return data_[static_cast<std::size_t>(i)]; }
  /// A copy of the elements on the host (any device).
  std::vector<T> to_host() const {
    if (device_ == Device::kCpu) return std::vector<T>(data_.begin(), data_.end());
    std::vector<T> host(static_cast<std::size_t>(numel_));
    cuda::copy_to_host(host.data(), device_data_.data(), host.size() * sizeof(T));
    return host;
  }

 private:
  Device device_ = Device::kCpu;
  std::vector<std::int64_t> shape_;
  ZeroedVector<T> data_;      // CPU: fresh elements are untouched zero pages
  DeviceBuffer device_data_;  // CUDA: at least numel_ elements
  std::int64_t numel_ = 0;    // CUDA
  bool mappable_ = false;     // CUDA: device_data_ from cuda::alloc_mappable
};

}  // namespace ndmesh
