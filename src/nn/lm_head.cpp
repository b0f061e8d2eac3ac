#include "ndmesh/nn/lm_head.hpp"

namespace ndmesh::nn {

template <typename T>
LmHead<T>::LmHead(ParamStore<T>& store, LmHeadOptions options)
    : options_(std::move(options)),
      proj_(store, {.in = options_.channels,
                    .out = options_.vocab / options_.tp.size,
                    .bias = false,
                    .name = options_.name,
                    .shared_weight = options_.tied_weight,
                    .weight_shard = options_.tp.rows({options_.vocab, options_.channels})}) {}

template class LmHead<float>;
template class LmHead<double>;

}  // namespace ndmesh::nn
