// Attention as per-head matrix products addressed inside the packed qkv rows (leading
// dimension = qkv width), so no head is ever copied out. The masked upper triangle is
// computed by the product and then overwritten; for the sequence lengths used here a
// full product is faster than a triangular loop.
//
// Backward for one head, with dP = dout_h Vᵀ:
//   dV += Pᵀ dout_h,  dS = P ∘ (dP - rowsum(P ∘ dP)) / sqrt(hd),  dQ += dS K,  dK += dSᵀ Q.
#include "ndmesh/nn/attention.hpp"

#include <cmath>
#include <vector>

#include "ndmesh/core/error.hpp"
#include "ndmesh/tensor/blas.hpp"

namespace ndmesh::nn {

template <typename T>
Attention<T>::Attention(AttentionOptions options) : options_(options) {
  NDMESH_CHECK(options_.heads > 0 && options_.kv_heads > 0 && options_.head_dim > 0, "nn",
               "attention has heads={} kv_heads={} head_dim={}; all must be positive", options_.heads,
               options_.kv_heads, options_.head_dim);
  NDMESH_CHECK(options_.heads % options_.kv_heads == 0, "nn", "kv_heads={} does not divide heads={}",
               options_.kv_heads, options_.heads);
}

template <typename T>
void Attention<T>::forward(const T* qkv, T* out, T* att, std::int64_t batch, std::int64_t seq) const {
  const std::int64_t H = options_.heads, KV = options_.kv_heads, hd = options_.head_dim;
  const std::int64_t R = qkv_width(), O = out_width(), group = H / KV;
  const T scale = T(1) / std::sqrt(static_cast<T>(hd));
  for (std::int64_t b = 0; b < batch; ++b) {
    const T* row0 = qkv + b * seq * R;
    for (std::int64_t h = 0; h < H; ++h) {
      const std::int64_t g = h / group;
      const T* q = row0 + h * hd;
      const T* k = row0 + (H + g) * hd;
      const T* v = row0 + (H + KV + g) * hd;
      T* p = att + (b * H + h) * seq * seq;
      gemm<T>(false, true, seq, seq, hd, scale, q, R, k, R, T(0), p, seq);
      for (std::int64_t i = 0; i < seq; ++i) {
        T* pi = p + i * seq;
        T mx = pi[0];
        for (std::int64_t j = 1; j <= i; ++j) mx = std::max(mx, pi[j]);
        T sum = 0;
        for (std::int64_t j = 0; j <= i; ++j) {
          pi[j] = std::exp(pi[j] - mx);
          sum += pi[j];
        }
        T inv = T(1) / sum;
        for (std::int64_t j = 0; j <= i; ++j) pi[j] *= inv;
        for (std::int64_t j = i + 1; j < seq; ++j) pi[j] = T(0);
      }
      gemm<T>(false, false, seq, hd, seq, T(1), p, seq, v, R, T(0), out + b * seq * O + h * hd, O);
    }
  }
}

template <typename T>
void Attention<T>::backward(const T* dout, const T* qkv, const T* att, T* dqkv, std::int64_t batch,
                            std::int64_t seq) const {
  const std::int64_t H = options_.heads, KV = options_.kv_heads, hd = options_.head_dim;
  const std::int64_t R = qkv_width(), O = out_width(), group = H / KV;
  const T scale = T(1) / std::sqrt(static_cast<T>(hd));
  std::vector<T> ds(static_cast<std::size_t>(seq * seq));
  for (std::int64_t b = 0; b < batch; ++b) {
    const T* row0 = qkv + b * seq * R;
    T* drow0 = dqkv + b * seq * R;
    for (std::int64_t h = 0; h < H; ++h) {
      const std::int64_t g = h / group;
      const T* q = row0 + h * hd;
      const T* k = row0 + (H + g) * hd;
      const T* v = row0 + (H + KV + g) * hd;
      T* dq = drow0 + h * hd;
      T* dk = drow0 + (H + g) * hd;
      T* dv = drow0 + (H + KV + g) * hd;
      const T* p = att + (b * H + h) * seq * seq;
      const T* dy = dout + b * seq * O + h * hd;
      // ds <- dP = dout_h Vᵀ, then the softmax backward in place.
      gemm<T>(false, true, seq, seq, hd, T(1), dy, O, v, R, T(0), ds.data(), seq);
      gemm<T>(true, false, seq, hd, seq, T(1), p, seq, dy, O, T(1), dv, R);
      for (std::int64_t i = 0; i < seq; ++i) {
        const T* pi = p + i * seq;
        T* di = ds.data() + i * seq;
        T dot = 0;
        for (std::int64_t j = 0; j <= i; ++j) dot += pi[j] * di[j];
        for (std::int64_t j = 0; j <= i; ++j) di[j] = pi[j] * (di[j] - dot) * scale;
        for (std::int64_t j = i + 1; j < seq; ++j) di[j] = T(0);
      }
      gemm<T>(false, false, seq, hd, seq, T(1), ds.data(), seq, k, R, T(1), dq, R);
      gemm<T>(true, false, seq, hd, seq, T(1), ds.data(), seq, q, R, T(1), dk, R);
    }
  }
}

template class Attention<float>;
template class Attention<double>;

}  // namespace ndmesh::nn
