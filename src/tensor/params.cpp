#include "ndmesh/tensor/params.hpp"

#include <algorithm>

#include "ndmesh/core/error.hpp"
#include "ndmesh/tensor/tensor.hpp"

namespace ndmesh {

template <typename T>
int ParamStore<T>::add(std::string name, std::vector<std::int64_t> shape, bool decay) {
  NDMESH_CHECK(params_.empty(), "nn", "parameter '{}' declared after the store was allocated", name);
  NDMESH_CHECK(find(name) < 0, "nn", "parameter '{}' declared twice", name);
  std::int64_t numel = shape_numel(shape);
  NDMESH_CHECK(numel > 0, "nn", "parameter '{}' has no elements", name);
  views_.push_back({std::move(name), size_, std::move(shape), numel, decay});
  size_ += (numel + kParamAlign - 1) / kParamAlign * kParamAlign;
  return static_cast<int>(views_.size()) - 1;
}

template <typename T>
void ParamStore<T>::allocate(std::int64_t multiple) {
  NDMESH_CHECK(params_.empty(), "nn", "parameter store allocated twice");
  NDMESH_CHECK(multiple >= 1, "nn", "padding multiple {} must be at least 1", multiple);
  size_ = (size_ + multiple - 1) / multiple * multiple;
  params_.assign(static_cast<std::size_t>(size_), T(0));
  grads_.assign(static_cast<std::size_t>(size_), T(0));
}

template <typename T>
int ParamStore<T>::find(std::string_view name) const {
  for (std::size_t i = 0; i < views_.size(); ++i)
    if (views_[i].name == name) return static_cast<int>(i);
  return -1;
}

template <typename T>
std::int64_t ParamStore<T>::parameter_count() const {
  std::int64_t n = 0;
  for (const auto& v : views_) n += v.numel;
  return n;
}

template <typename T>
void ParamStore<T>::zero_grad() {
  std::fill(grads_.begin(), grads_.end(), T(0));
}

template class ParamStore<float>;
template class ParamStore<double>;

}  // namespace ndmesh
