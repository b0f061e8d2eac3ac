#include "ndmesh/nn/mlp.hpp"

#include <algorithm>
#include <type_traits>

#include "feed_forward_passes.hpp"
#include "ndmesh/core/error.hpp"
#include "ndmesh/nn/gelu.hpp"
#include "ndmesh/tensor/ops.hpp"

namespace ndmesh::nn {

template <typename T>
Mlp<T>::Mlp(ParamStore<T>& store, MlpOptions options)
    : options_(std::move(options)),
      fc_(store, {.in = options_.channels,
                  .out = options_.ffn / options_.tp.size,
                  .bias = options_.bias,
                  .name = options_.name + ".fc",
                  .weight_shard = options_.tp.rows({options_.ffn, options_.channels}),
                  .bias_shard = options_.tp.rows({options_.ffn})}),
      proj_(store, {.in = options_.ffn / options_.tp.size,
                    .out = options_.channels,
                    .bias = options_.bias,
                    .name = options_.name + ".proj",
                    .weight_shard = options_.tp.columns({options_.channels, options_.ffn}),
                    .bias_shard = options_.tp.replicated(),
                    .deferred_bias = true}) {
  NDMESH_CHECK(options_.ffn % options_.tp.size == 0, "nn", "mlp '{}': tp={} does not divide ffn={}",
               options_.name, options_.tp.size, options_.ffn);
}

template <typename T>
template <typename In>
void Mlp<T>::forward_from(const In* inp, T* out, MlpActivations<T>& acts, std::int64_t rows) const {
  const std::int64_t n = rows * this->local_ffn();
  if (this->hidden_in_bf16()) {
    // fc and GELU into bf16, each rounded once (on a GPU in fc's product: the GELU epilogue
    // with its aux): the pre-activation the backward reads and the operand of proj's products.
    NDMESH_CHECK(acts.hidden16.numel() >= n && acts.pre16.numel() >= n, "nn",
                 "mlp '{}': the bf16 activations hold {} and {} of {} elements", options_.name,
                 acts.pre16.numel(), acts.hidden16.numel(), n);
    if (fc_.bias_id() >= 0) {
      fc_.forward_gelu(inp, acts.pre16.data(), acts.hidden16.data(), rows);
    } else {
      // Without a bias there is no GELU_AUX_BIAS epilogue: the same values from the fp32
      // product, the pre-activation and GELU of it each rounded once.
      ops::Scratch<T> p(n, fc_.device());
      fc_.forward(inp, p.data(), rows);
      Gelu<T>::forward(p.data(), acts.hidden16.data(), n, fc_.device());
      if constexpr (std::is_same_v<T, float>)
        ops::cast(acts.pre16.data(), p.data(), n, fc_.device());
      else
        for (std::int64_t i = 0; i < n; ++i) acts.pre16.data()[i] = BFloat16(static_cast<float>(p.data()[i]));
    }
    proj_.forward(acts.hidden16.data(), out, rows);
    return;
  }
  // fp32 products: fc, then GELU.
  fc_.forward(inp, acts.pre.data(), rows);
  Gelu<T>::forward(acts.pre.data(), acts.hidden.data(), n, fc_.device());
  proj_.forward(acts.hidden.data(), out, rows);
}

template <typename T>
template <typename In, typename S>
void Mlp<T>::backward_from(const T* dout, const In* inp, const MlpActivations<T>& acts, T* dinp, S* scratch,
                           std::int64_t rows) const {
  constexpr bool kBf16Scratch = std::is_same_v<S, BFloat16>;
  NDMESH_CHECK(kBf16Scratch == this->hidden_in_bf16(), "nn",
               "mlp '{}': the backward's scratch is bfloat16 under bf16 products and T otherwise",
               options_.name);
  if constexpr (std::is_same_v<S, BFloat16>) {
    // d pre = (dout · W) ⊙ gelu'(pre) written in bf16 (on a GPU by proj's product: the dGELU
    // epilogue), the output gradient fc's two products read as it lies.
    proj_.backward_gelu(dout, acts.hidden16.data(), acts.pre16.data(), scratch, rows);
    if constexpr (std::is_same_v<In, BFloat16>)
      fc_.backward(scratch, inp, dinp, rows, GradInto::kSet);
    else
      fc_.backward(scratch, this->local_ffn(), inp, dinp, rows, GradInto::kSet);
  } else {
    // One buffer, nothing zeroed: d gelu written over it, then d fc over d gelu in place.
    proj_.backward(dout, acts.hidden.data(), scratch, rows, GradInto::kSet);
    Gelu<T>::backward(scratch, acts.pre.data(), scratch, rows * this->local_ffn(), fc_.device());
    fc_.backward(scratch, inp, dinp, rows, GradInto::kSet);
  }
}

template class Mlp<float>;
template class Mlp<double>;
// The passes of the interface (feed_forward_passes.hpp) over this MLP's templates.
template class FeedForwardPasses<Mlp<float>, float>;
template class FeedForwardPasses<Mlp<double>, double>;

}  // namespace ndmesh::nn
