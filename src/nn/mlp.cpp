#include "ndmesh/nn/mlp.hpp"

#include <algorithm>

#include "ndmesh/nn/gelu.hpp"

namespace ndmesh::nn {

template <typename T>
Mlp<T>::Mlp(ParamStore<T>& store, MlpOptions options)
    : options_(std::move(options)),
      fc_(store, {.in = options_.channels, .out = options_.ffn, .name = options_.name + ".fc"}),
      proj_(store, {.in = options_.ffn, .out = options_.channels, .name = options_.name + ".proj"}) {}

template <typename T>
void Mlp<T>::forward(const T* inp, T* out, MlpActivations<T>& acts, std::int64_t rows) const {
  fc_.forward(inp, acts.fc.data(), rows);
  Gelu<T>::forward(acts.fc.data(), acts.gelu.data(), rows * options_.ffn);
  proj_.forward(acts.gelu.data(), out, rows);
}

template <typename T>
void Mlp<T>::backward(const T* dout, const T* inp, const MlpActivations<T>& acts, T* dinp, T* scratch,
                      std::int64_t rows) const {
  const std::int64_t n = rows * options_.ffn;
  T* dgelu = scratch;
  T* dfc = scratch + n;
  std::fill(scratch, scratch + 2 * n, T(0));
  proj_.backward(dout, acts.gelu.data(), dgelu, rows);
  Gelu<T>::backward(dgelu, acts.fc.data(), dfc, n);
  fc_.backward(dfc, inp, dinp, rows);
}

template class Mlp<float>;
template class Mlp<double>;

}  // namespace ndmesh::nn
