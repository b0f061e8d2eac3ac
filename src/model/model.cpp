#include "ndmesh/model/model.hpp"

#include <limits>

#include "ndmesh/core/error.hpp"
#include "ndmesh/model/decoder.hpp"

namespace ndmesh::model {

template <typename T>
std::vector<int> ModelT<T>::backward_units() const {
  std::vector<int> out;
  for (std::size_t u = units_.size(); u-- > 0;)
    if (units_[u].kind != UnitKind::kEmbedding) out.push_back(static_cast<int>(u));
  return out;  // the embedding's backward reads no parameter
}

template <typename T>
int ModelT<T>::add_unit(std::string name, UnitKind kind, std::int64_t begin, std::int64_t end) {
  const int id = static_cast<int>(units_.size());
  unit_ranges_.push_back({begin, end - begin});
  units_.push_back({.name = std::move(name), .kind = kind, .ranges = {id}});
  return id;
}

template <typename T>
double ModelT<T>::forward(Activations& acts, const std::int32_t* tokens, const T* input,
                          const std::int32_t* targets) {
  forward_summed(acts, tokens, input, targets);
  if (!has_head() || targets == nullptr) return std::numeric_limits<double>::quiet_NaN();
  return take_loss_sum() / static_cast<double>(batch_ * seq_);
}

template <typename T>
double ModelT<T>::forward(const std::int32_t* tokens, const std::int32_t* targets) {
  NDMESH_CHECK(has_embedding() && has_head(), "model", "forward(tokens, targets) runs a whole model only");
  if (!whole_) whole_ = make_activations();
  return forward(*whole_, tokens, nullptr, targets);
}

template <typename T>
void ModelT<T>::backward() {
  NDMESH_CHECK(whole_ != nullptr, "model", "backward() before forward(tokens, targets)");
  backward(*whole_, nullptr);
}

template <typename T>
std::unique_ptr<ModelT<T>> build(const ModelSpec& spec, ModelOptions options, UnitRange range, nn::TpContext<T> tp,
                                 StoreOptions store) {
  return std::make_unique<DecoderT<T>>(spec, options, range, std::move(tp), store);
}

template class ModelT<float>;
template class ModelT<double>;
template std::unique_ptr<ModelT<float>> build(const ModelSpec&, ModelOptions, UnitRange, nn::TpContext<float>,
                                              StoreOptions);
template std::unique_ptr<ModelT<double>> build(const ModelSpec&, ModelOptions, UnitRange, nn::TpContext<double>,
                                               StoreOptions);

}  // namespace ndmesh::model
