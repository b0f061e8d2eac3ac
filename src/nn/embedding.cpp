#include "ndmesh/nn/embedding.hpp"

#include <algorithm>
#include <numeric>
#include <vector>

#include "ndmesh/core/error.hpp"
#include "tensor/cuda_twin.hpp"

namespace ndmesh::nn {

template <typename T>
Embedding<T>::Embedding(ParamStore<T>& store, EmbeddingOptions options, TpContext<T> tp)
    : store_(&store), options_(std::move(options)), tp_(std::move(tp)) {
  NDMESH_CHECK(options_.vocab > 0 && options_.channels > 0 && options_.max_seq >= 0, "nn",
               "embedding '{}' has vocab={} channels={} max_seq={}; vocab and channels must be positive",
               options_.name, options_.vocab, options_.channels, options_.max_seq);
  const std::int64_t rows = options_.padded_vocab > 0 ? options_.padded_vocab : options_.vocab;
  NDMESH_CHECK(rows >= options_.vocab && rows % tp_.size() == 0, "nn",
               "embedding '{}': tp={} does not divide the {} rows of the table (vocab={})", options_.name,
               tp_.size(), rows, options_.vocab);
  local_vocab_ = rows / tp_.size();
  vocab_start_ = local_vocab_ * tp_.rank();
  // The token table is a matrix (decayed, shared by a tied head); positions are too. The
  // logical table is [vocab, C]; padding rows past it are storage only (ParamShard).
  tokens_ = store.add(options_.name + ".tokens", {local_vocab_, options_.channels}, true,
                      tp_.shape().rows({options_.vocab, options_.channels}, {{0, rows}}));
  if (options_.max_seq > 0)
    positions_ = store.add(options_.name + ".positions", {options_.max_seq, options_.channels}, true,
                           ParamShard{.rank = tp_.rank(), .size = tp_.size()});
}

namespace {
std::vector<std::int64_t> offset_positions(std::int64_t offset, std::int64_t seq) {
  std::vector<std::int64_t> pos(static_cast<std::size_t>(seq));
  std::iota(pos.begin(), pos.end(), offset);
  return pos;
}
}  // namespace

template <typename T>
T* Embedding<T>::work(std::int64_t elements) const {
  work_.set_device(store_->device());
  work_.resize({elements});
  return work_.data();
}

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
  const std::int64_t c = options_.channels, n = batch * seq;
  const std::int64_t nl = tp_.local_rows(n), first = tp_.first_row(n);
  // On CUDA tokens and positions are device memory, checked by the caller on the host.
  NDMESH_CUDA_TWIN(store_->device(), {
    // The whole vocabulary and every row here: tokens and positions in one pass.
    if (tp_.size() == 1 && !tp_.sequence_parallel)
      return cuda::embedding_forward(out, tokens, store_->param(tokens_),
                                     positions_ >= 0 ? store_->param(positions_) : nullptr, positions, n, seq,
                                     c);
    // Every rank embeds the rows of its vocabulary shard (zeros for the others); g sums them
    // (under sequence parallelism into this rank's rows of the [N, C] partial).
    T* part = tp_.sequence_parallel ? work(n * c) : out;
    cuda::embedding_tokens_forward(part, tokens, store_->param(tokens_), n, c, vocab_start_, local_vocab_);
    tp_.g_forward(part, out, n, c);
    if (positions_ >= 0)
      cuda::embedding_positions_forward(out, store_->param(positions_), positions, first, nl, seq, c);
  })
  if (positions_ >= 0)
    for (std::int64_t t = 0; t < seq; ++t)
      NDMESH_CHECK(positions[t] >= 0 && positions[t] < options_.max_seq, "nn",
                   "position {} of row {} is outside the model's sequence length {}", positions[t], t,
                   options_.max_seq);
  const T* wte = store_->param(tokens_);
  // Every rank embeds the tokens of its vocabulary shard (zeros for the others); g sums them.
  T* part = tp_.sequence_parallel ? work(n * c) : out;
  for (std::int64_t r = 0; r < n; ++r) {
    const std::int32_t tok = tokens[r];
    NDMESH_CHECK(tok >= 0 && tok < options_.vocab, "nn",
                 "token {} at batch {} position {} is outside [0, {})", tok, r / seq, positions[r % seq],
                 options_.vocab);
    T* o = part + r * c;
    const std::int64_t local = tok - vocab_start_;
    if (local >= 0 && local < local_vocab_)
      std::copy(wte + local * c, wte + (local + 1) * c, o);
    else
      std::fill(o, o + c, T(0));
  }
  tp_.g_forward(part, out, n, c);
  if (positions_ < 0) return;
  const T* wpe = store_->param(positions_);
  for (std::int64_t i = 0; i < nl; ++i) {
    const T* p = wpe + positions[(first + i) % seq] * c;
    T* o = out + i * c;
    for (std::int64_t k = 0; k < c; ++k) o[k] += p[k];
  }
}

template <typename T>
void Embedding<T>::backward_at(const T* dout, const std::int32_t* tokens, std::int64_t batch,
                               std::int64_t seq, const std::int64_t* positions,
                               [[maybe_unused]] const std::int32_t* host_tokens,
                               [[maybe_unused]] const std::int64_t* host_positions) const {  // CUDA's only
  const std::int64_t c = options_.channels, n = batch * seq;
  // The full d output (gathered under sequence parallelism): every rank computes the
  // whole position gradient, so the replicated table needs no reduction.
  const T* full = tp_.g_backward(dout, tp_.sequence_parallel ? work(n * c) : nullptr, n, c);
  T* dwte = store_->grad(tokens_);
  T* dwpe = positions_ >= 0 ? store_->grad(positions_) : nullptr;  // none with rotary positions
  NDMESH_CUDA_TWIN(store_->device(), {
    // The kernels' buckets are made on the host, from the host's copies.
    std::vector<std::int32_t> tok;
    std::vector<std::int64_t> pos;
    if (host_tokens == nullptr) {
      tok.resize(static_cast<std::size_t>(n));
      cuda::copy_to_host(tok.data(), tokens, tok.size() * sizeof(std::int32_t));
      host_tokens = tok.data();
    }
    if (host_positions == nullptr) {
      pos.resize(static_cast<std::size_t>(seq));
      cuda::copy_to_host(pos.data(), positions, pos.size() * sizeof(std::int64_t));
      host_positions = pos.data();
    }
    cuda::embedding_backward(dwte, dwpe, full, host_tokens, host_positions, n, seq, c, vocab_start_,
                             local_vocab_);
  })

  for (std::int64_t r = 0; r < n; ++r) {
    const T* d = full + r * c;
    const std::int64_t local = tokens[r] - vocab_start_;
    if (dwpe == nullptr) {
      if (local >= 0 && local < local_vocab_) {
        T* e = dwte + local * c;
        for (std::int64_t i = 0; i < c; ++i) e[i] += d[i];
      }
      continue;
    }
    T* p = dwpe + positions[r % seq] * c;
    if (local >= 0 && local < local_vocab_) {
      T* e = dwte + local * c;
      for (std::int64_t i = 0; i < c; ++i) {
        e[i] += d[i];
        p[i] += d[i];
      }
    } else {
      for (std::int64_t i = 0; i < c; ++i) p[i] += d[i];
    }
  }
}

template class Embedding<float>;
template class Embedding<double>;

}  // namespace ndmesh::nn
