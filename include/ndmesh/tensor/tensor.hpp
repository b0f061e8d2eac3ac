// Tensor: a contiguous, row-major array of float or double with a shape.
//
// The layers in ndmesh/nn work on raw pointers into buffers like this one (llm.c style);
// Tensor only owns memory and remembers the shape, so that buffers can be named after
// what they hold and sized once. Scalars are float for training and double for the
// finite-difference checks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

#include "ndmesh/core/error.hpp"

namespace ndmesh {

/// Product of a shape's sizes (1 for an empty shape).
inline std::int64_t shape_numel(const std::vector<std::int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>());
}

/// An owning, contiguous, zero-initialised tensor of T (float or double).
template <typename T>
class Tensor {
 public:
  Tensor() = default;
  /// A zero tensor of the given shape.
  explicit Tensor(std::vector<std::int64_t> shape) { resize(std::move(shape)); }

  /// Reshapes and zeroes; reallocates only when the element count grows.
  void resize(std::vector<std::int64_t> shape) {
    for (auto s : shape) NDMESH_CHECK(s >= 0, "tensor", "negative size {} in a shape", s);
    shape_ = std::move(shape);
    data_.assign(static_cast<std::size_t>(shape_numel(shape_)), T(0));
  }
  /// Sets every element to zero.
  void zero() { std::fill(data_.begin(), data_.end(), T(0)); }

  /// The sizes, outermost first.
  const std::vector<std::int64_t>& shape() const { return shape_; }
  /// Size of dimension `d`.
  std::int64_t size(std::size_t d) const { return shape_.at(d); }
  /// Number of elements.
  std::int64_t numel() const { return static_cast<std::int64_t>(data_.size()); }

  /// The elements, row-major.
  T* data() { return data_.data(); }
  const T* data() const { return data_.data(); }
  /// The elements as a span (for ElementSpan::of and range loops).
  std::span<T> span() { return data_; }
  std::span<const T> span() const { return data_; }
  /// Element i of the flat (row-major) storage.
  T& operator[](std::int64_t i) { return data_[static_cast<std::size_t>(i)]; }
  const T& operator[](std::int64_t i) const { return data_[static_cast<std::size_t>(i)]; }

 private:
  std::vector<std::int64_t> shape_;
  std::vector<T> data_;
};

}  // namespace ndmesh
