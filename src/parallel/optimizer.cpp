#include "ndmesh/parallel/optimizer.hpp"

namespace ndmesh::parallel {

Optimizer::Optimizer(RankModel& model, GradSync& sync, const nn::AdamWOptions& options) : sync_(sync) {
  for (std::size_t c = 0; c < model.chunks.size(); ++c) {
    chunks_.push_back(model.chunks[c].get());
    adams_.push_back(std::make_unique<nn::AdamW<float>>(model.chunks[c]->params(), options, sync.reducer(c).shard()));
  }
}

void Optimizer::step(double lr, double grad_norm) {
  for (std::size_t c = 0; c < adams_.size(); ++c) {
    GradReducer& r = sync_.reducer(c);
    adams_[c]->update(chunks_[c]->params(), lr, grad_norm, r.shard_grads());
    r.gather_params(chunks_[c]->params().params().data());
  }
  sync_.params_updated();
}

void Optimizer::set_steps(std::int64_t steps) {
  for (auto& a : adams_) a->set_steps(steps);
}

std::int64_t Optimizer::state_elements() const {
  std::int64_t n = 0;
  for (const auto& a : adams_) n += static_cast<std::int64_t>(a->m().size() + a->v().size());  // sizes: any device
  return n;
}

}  // namespace ndmesh::parallel
