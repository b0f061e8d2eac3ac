#include "ndmesh/nn/lm_head.hpp"

namespace ndmesh::nn {

template <typename T>
LmHead<T>::LmHead(ParamStore<T>& store, LmHeadOptions options)
    : options_(std::move(options)),
      proj_(store, {.in = options_.channels,
                    .out = options_.vocab,
                    .bias = false,
                    .name = options_.name,
                    .shared_weight = options_.tied_weight}) {}

template class LmHead<float>;
template class LmHead<double>;

}  // namespace ndmesh::nn
