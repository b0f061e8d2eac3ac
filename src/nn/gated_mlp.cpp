#include "ndmesh/nn/gated_mlp.hpp"

#include <type_traits>

#include "feed_forward_passes.hpp"
#include "ndmesh/core/error.hpp"
#include "ndmesh/nn/mlp.hpp"
#include "ndmesh/nn/swiglu.hpp"
#include "ndmesh/tensor/ops.hpp"

namespace ndmesh::nn {

namespace {
const MlpOptions& checked(const MlpOptions& o) {
  NDMESH_CHECK(o.ffn % o.tp.size == 0, "nn", "mlp '{}': tp={} does not divide ffn={}", o.name, o.tp.size,
               o.ffn);
  return o;
}
}  // namespace

template <typename T>
GatedMlp<T>::GatedMlp(ParamStore<T>& store, MlpOptions options)
    : options_(checked(options)),
      // gate rows [0, F), up rows [F, 2F): each rank holds its slice of both.
      fc_(store, {.in = options_.channels,
                  .out = 2 * options_.ffn / options_.tp.size,
                  .bias = options_.bias,
                  .name = options_.name + ".fc",
                  .weight_shard = options_.tp.rows({2 * options_.ffn, options_.channels},
                                                   {{0, options_.ffn}, {options_.ffn, options_.ffn}}),
                  .bias_shard = options_.tp.rows({2 * options_.ffn},
                                                 {{0, options_.ffn}, {options_.ffn, options_.ffn}})}),
      proj_(store, {.in = options_.ffn / options_.tp.size,
                    .out = options_.channels,
                    .bias = options_.bias,
                    .name = options_.name + ".proj",
                    .weight_shard = options_.tp.columns({options_.channels, options_.ffn}),
                    .bias_shard = options_.tp.replicated(),
                    .deferred_bias = true}) {}

template <typename T>
template <typename In>
void GatedMlp<T>::forward_from(const In* inp, T* out, MlpActivations<T>& acts, std::int64_t rows) const {
  const std::int64_t f = this->local_ffn();
  if (this->hidden_in_bf16()) {
    // [gate | up] written in bf16 by fc's product (each rounded once, its bias added before),
    // then the activation from those stored values, rounded once.
    NDMESH_CHECK(acts.pre16.numel() >= rows * 2 * f && acts.hidden16.numel() >= rows * f, "nn",
                 "mlp '{}': the bf16 activations hold {} and {} elements for {} rows", options_.name,
                 acts.pre16.numel(), acts.hidden16.numel(), rows);
    fc_.forward(inp, acts.pre16.data(), rows);
    Swiglu<T>::forward(acts.pre16.data(), acts.hidden16.data(), rows, f, fc_.device());
    proj_.forward(acts.hidden16.data(), out, rows);
    return;
  }
  fc_.forward(inp, acts.pre.data(), rows);
  Swiglu<T>::forward(acts.pre.data(), acts.hidden.data(), rows, f, fc_.device());
  proj_.forward(acts.hidden.data(), out, rows);
}

template <typename T>
template <typename In, typename S>
void GatedMlp<T>::backward_from(const T* dout, const In* inp, const MlpActivations<T>& acts, T* dinp,
                                S* scratch, std::int64_t rows) const {
  constexpr bool kBf16Scratch = std::is_same_v<S, BFloat16>;
  NDMESH_CHECK(kBf16Scratch == this->hidden_in_bf16(), "nn",
               "mlp '{}': the backward's scratch is bfloat16 under bf16 products and T otherwise",
               options_.name);
  const std::int64_t f = this->local_ffn();
  S* dhidden = scratch;          // [rows, F]
  S* dpre = scratch + rows * f;  // [rows, 2F]
  if constexpr (kBf16Scratch) {
    proj_.backward(dout, acts.hidden16.data(), dhidden, rows);  // written in bf16, rounded once
    Swiglu<T>::backward(dhidden, acts.pre16.data(), dpre, rows, f, fc_.device());
    if constexpr (std::is_same_v<In, BFloat16>)
      fc_.backward(dpre, inp, dinp, rows, GradInto::kSet);
    else
      fc_.backward(dpre, 2 * f, inp, dinp, rows, GradInto::kSet);
  } else {
    proj_.backward(dout, acts.hidden.data(), dhidden, rows, GradInto::kSet);
    Swiglu<T>::backward(dhidden, acts.pre.data(), dpre, rows, f, fc_.device());
    fc_.backward(dpre, inp, dinp, rows, GradInto::kSet);
  }
}

template <typename T>
std::unique_ptr<FeedForward<T>> make_feed_forward(MlpKind kind, ParamStore<T>& store, MlpOptions options) {
  if (kind == MlpKind::kSwiglu) return std::make_unique<GatedMlp<T>>(store, std::move(options));
  return std::make_unique<Mlp<T>>(store, std::move(options));
}

template class GatedMlp<float>;
template class GatedMlp<double>;
// The passes of the interface (feed_forward_passes.hpp) over this MLP's templates.
template class FeedForwardPasses<GatedMlp<float>, float>;
template class FeedForwardPasses<GatedMlp<double>, double>;
template std::unique_ptr<FeedForward<float>> make_feed_forward(MlpKind, ParamStore<float>&, MlpOptions);
template std::unique_ptr<FeedForward<double>> make_feed_forward(MlpKind, ParamStore<double>&, MlpOptions);

}  // namespace ndmesh::nn
