#include "ndmesh/nn/mlp.hpp"

#include <algorithm>

#include "ndmesh/core/error.hpp"
#include "ndmesh/nn/gelu.hpp"
#include "ndmesh/tensor/ops.hpp"

namespace ndmesh::nn {

template <typename T>
Mlp<T>::Mlp(ParamStore<T>& store, MlpOptions options)
    : options_(std::move(options)),
      fc_(store, {.in = options_.channels,
                  .out = options_.ffn / options_.tp.size,
                  .name = options_.name + ".fc",
                  .weight_shard = options_.tp.rows({options_.ffn, options_.channels}),
                  .bias_shard = options_.tp.rows({options_.ffn})}),
      proj_(store, {.in = options_.ffn / options_.tp.size,
                    .out = options_.channels,
                    .name = options_.name + ".proj",
                    .weight_shard = options_.tp.columns({options_.channels, options_.ffn}),
                    .bias_shard = options_.tp.replicated(),
                    .deferred_bias = true}) {
  NDMESH_CHECK(options_.ffn % options_.tp.size == 0, "nn", "mlp '{}': tp={} does not divide ffn={}",
               options_.name, options_.tp.size, options_.ffn);
}

template <typename T>
void Mlp<T>::forward(const T* inp, T* out, MlpActivations<T>& acts, std::int64_t rows) const {
  forward_from(inp, out, acts, rows);
}

template <typename T>
void Mlp<T>::forward(const BFloat16* inp, T* out, MlpActivations<T>& acts, std::int64_t rows) const {
  forward_from(inp, out, acts, rows);
}

template <typename T>
void Mlp<T>::backward(const T* dout, const T* inp, const MlpActivations<T>& acts, T* dinp, T* scratch,
                      std::int64_t rows) const {
  backward_from(dout, inp, acts, dinp, scratch, rows);
}

template <typename T>
void Mlp<T>::backward(const T* dout, const BFloat16* inp, const MlpActivations<T>& acts, T* dinp, T* scratch,
                      std::int64_t rows) const {
  backward_from(dout, inp, acts, dinp, scratch, rows);
}

template <typename T>
template <typename In>
void Mlp<T>::forward_from(const In* inp, T* out, MlpActivations<T>& acts, std::int64_t rows) const {
  const std::int64_t n = rows * local_ffn();
  if (hidden_in_bf16()) {
    // fc (its bias fused on a GPU), then GELU written in bf16 once: the operand proj's two
    // products read, never rounded again (GELU fused into fc's product would write fp32).
    NDMESH_CHECK(acts.gelu16.numel() >= n, "nn", "mlp '{}': the bf16 hidden activation holds {} of {} elements",
                 options_.name, acts.gelu16.numel(), n);
    fc_.forward(inp, acts.fc.data(), rows);
    Gelu<T>::forward(acts.fc.data(), acts.gelu16.data(), n, fc_.device());
    proj_.forward(acts.gelu16.data(), out, rows);
    return;
  }
  // fp32 products: fc, then GELU (Linear::forward_gelu fuses them only under bf16 products,
  // whose MLP keeps its hidden activation in bf16 instead, above).
  fc_.forward(inp, acts.fc.data(), rows);
  Gelu<T>::forward(acts.fc.data(), acts.gelu.data(), n, fc_.device());
  proj_.forward(acts.gelu.data(), out, rows);
}

template <typename T>
template <typename In>
void Mlp<T>::backward_from(const T* dout, const In* inp, const MlpActivations<T>& acts, T* dinp, T* scratch,
                           std::int64_t rows) const {
  // One buffer, nothing zeroed: d gelu written over it, then d fc over d gelu in place.
  T* dgelu = scratch;
  auto through_proj = [&](const auto* hidden) {
    if (!proj_.backward_gelu(dout, hidden, acts.fc.data(), dgelu, rows)) {  // GELU's derivative fused, else apart
      proj_.backward(dout, hidden, dgelu, rows, GradInto::kSet);
      Gelu<T>::backward(dgelu, acts.fc.data(), dgelu, rows * local_ffn(), fc_.device());
    }
  };
  if (hidden_in_bf16())
    through_proj(acts.gelu16.data());
  else
    through_proj(acts.gelu.data());
  fc_.backward(dgelu, inp, dinp, rows, GradInto::kSet);
}

template class Mlp<float>;
template class Mlp<double>;

}  // namespace ndmesh::nn
