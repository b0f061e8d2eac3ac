#include "ndmesh/nn/norm.hpp"

#include "ndmesh/nn/layernorm.hpp"
#include "ndmesh/nn/rmsnorm.hpp"

namespace ndmesh::nn {

template <typename T>
std::unique_ptr<Norm<T>> make_norm(NormKind kind, ParamStore<T>& store, NormOptions options) {
  if (kind == NormKind::kRmsNorm) return std::make_unique<RmsNorm<T>>(store, std::move(options));
  return std::make_unique<LayerNorm<T>>(store, std::move(options));
}

template std::unique_ptr<Norm<float>> make_norm(NormKind, ParamStore<float>&, NormOptions);
template std::unique_ptr<Norm<double>> make_norm(NormKind, ParamStore<double>&, NormOptions);

}  // namespace ndmesh::nn
