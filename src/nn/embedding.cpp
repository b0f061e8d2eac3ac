#include "ndmesh/nn/embedding.hpp"

#include <numeric>
#include <vector>

#include "ndmesh/core/error.hpp"

namespace ndmesh::nn {

template <typename T>
Embedding<T>::Embedding(ParamStore<T>& store, EmbeddingOptions options)
    : store_(&store), options_(std::move(options)) {
  NDMESH_CHECK(options_.vocab > 0 && options_.channels > 0 && options_.max_seq > 0, "nn",
               "embedding '{}' has vocab={} channels={} max_seq={}; all must be positive", options_.name,
               options_.vocab, options_.channels, options_.max_seq);
  // The token table is a matrix (decayed, shared by a tied head); positions are too.
  tokens_ = store.add(options_.name + ".tokens", {options_.vocab, options_.channels}, true);
  positions_ = store.add(options_.name + ".positions", {options_.max_seq, options_.channels}, true);
}

namespace {
std::vector<std::int64_t> offset_positions(std::int64_t offset, std::int64_t seq) {
  std::vector<std::int64_t> pos(static_cast<std::size_t>(seq));
  std::iota(pos.begin(), pos.end(), offset);
  return pos;
}
}  // namespace

template <typename T>
void Embedding<T>::forward(const std::int32_t* tokens, T* out, std::int64_t batch, std::int64_t seq,
                           std::int64_t position_offset) const {
  forward_at(tokens, out, batch, seq, offset_positions(position_offset, seq).data());
}

template <typename T>
void Embedding<T>::backward(const T* dout, const std::int32_t* tokens, std::int64_t batch, std::int64_t seq,
                            std::int64_t position_offset) const {
  backward_at(dout, tokens, batch, seq, offset_positions(position_offset, seq).data());
}

template <typename T>
void Embedding<T>::forward_at(const std::int32_t* tokens, T* out, std::int64_t batch, std::int64_t seq,
                              const std::int64_t* positions) const {
  const std::int64_t c = options_.channels;
  for (std::int64_t t = 0; t < seq; ++t)
    NDMESH_CHECK(positions[t] >= 0 && positions[t] < options_.max_seq, "nn",
                 "position {} of row {} is outside the model's sequence length {}", positions[t], t,
                 options_.max_seq);
  const T* wte = store_->param(tokens_);
  const T* wpe = store_->param(positions_);
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t t = 0; t < seq; ++t) {
      std::int32_t tok = tokens[b * seq + t];
      NDMESH_CHECK(tok >= 0 && tok < options_.vocab, "nn",
                   "token {} at batch {} position {} is outside [0, {})", tok, b, positions[t], options_.vocab);
      const T* e = wte + tok * c;
      const T* p = wpe + positions[t] * c;
      T* o = out + (b * seq + t) * c;
      for (std::int64_t i = 0; i < c; ++i) o[i] = e[i] + p[i];
    }
  }
}

template <typename T>
void Embedding<T>::backward_at(const T* dout, const std::int32_t* tokens, std::int64_t batch, std::int64_t seq,
                               const std::int64_t* positions) const {
  const std::int64_t c = options_.channels;
  T* dwte = store_->grad(tokens_);
  T* dwpe = store_->grad(positions_);
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t t = 0; t < seq; ++t) {
      const T* d = dout + (b * seq + t) * c;
      T* e = dwte + tokens[b * seq + t] * c;
      T* p = dwpe + positions[t] * c;
      for (std::int64_t i = 0; i < c; ++i) {
        e[i] += d[i];
        p[i] += d[i];
      }
    }
  }
}

template class Embedding<float>;
template class Embedding<double>;

}  // namespace ndmesh::nn
