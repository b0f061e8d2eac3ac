// The bodies of nn::FeedForwardPasses (feed_forward.hpp): each pass calls the MLP's template
// for its input and scratch types. Included by the MLPs' sources, which instantiate them.
#pragma once

#include "ndmesh/nn/feed_forward.hpp"

namespace ndmesh::nn {

template <typename Derived, typename T>
void FeedForwardPasses<Derived, T>::forward(const T* inp, T* out, MlpActivations<T>& acts,
                                            std::int64_t rows) const {
  static_cast<const Derived&>(*this).forward_from(inp, out, acts, rows);
}

template <typename Derived, typename T>
void FeedForwardPasses<Derived, T>::forward(const BFloat16* inp, T* out, MlpActivations<T>& acts,
                                            std::int64_t rows) const {
  static_cast<const Derived&>(*this).forward_from(inp, out, acts, rows);
}

template <typename Derived, typename T>
void FeedForwardPasses<Derived, T>::backward(const T* dout, const T* inp, const MlpActivations<T>& acts,
                                             T* dinp, T* scratch, std::int64_t rows) const {
  static_cast<const Derived&>(*this).backward_from(dout, inp, acts, dinp, scratch, rows);
}

template <typename Derived, typename T>
void FeedForwardPasses<Derived, T>::backward(const T* dout, const T* inp, const MlpActivations<T>& acts,
                                             T* dinp, BFloat16* scratch, std::int64_t rows) const {
  static_cast<const Derived&>(*this).backward_from(dout, inp, acts, dinp, scratch, rows);
}

template <typename Derived, typename T>
void FeedForwardPasses<Derived, T>::backward(const T* dout, const BFloat16* inp,
                                             const MlpActivations<T>& acts, T* dinp, BFloat16* scratch,
                                             std::int64_t rows) const {
  static_cast<const Derived&>(*this).backward_from(dout, inp, acts, dinp, scratch, rows);
}

}  // namespace ndmesh::nn
