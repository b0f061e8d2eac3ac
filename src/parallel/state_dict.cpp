#include "ndmesh/parallel/state_dict.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace ndmesh::parallel {

StateDict::StateDict(RankModel& model, Optimizer& optimizer, const GradSync& sync, bool gather_moments)
    : optimizer_(optimizer) {
  const int tp_rank = model.plan.tp.rank();
  const bool writer = sync.group().rank() == 0;
  const bool pipelined = model.plan.pp.size() > 1;
  m_.resize(model.chunks.size());
  v_.resize(model.chunks.size());
  for (std::size_t c = 0; c < model.chunks.size(); ++c) {
    model::Gpt& g = *model.chunks[c];
    const auto size = g.params().params().size();
    m_[c].assign(size, 0.0f);
    v_[c].assign(size, 0.0f);
    if (gather_moments) {
      const nn::AdamW<float>& adam = optimizer.adam(c);
      std::int64_t at = 0;
      for (const nn::Segment& seg : adam.segments()) {
        std::copy_n(adam.m().begin() + at, seg.count, m_[c].begin() + seg.offset);
        std::copy_n(adam.v().begin() + at, seg.count, v_[c].begin() + seg.offset);
        at += seg.count;
      }
      if (sync.zero() > 0) {  // each element is owned by one member of the group: a sum gathers
        sync.group().all_reduce(std::span<float>(m_[c]));
        sync.group().all_reduce(std::span<float>(v_[c]));
      }
    }
    const bool tied_copy = pipelined && model.plan.spec.tied_embeddings && g.has_head() && !g.has_embedding();
    float* p = g.params().params().data();
    for (const ParamView& view : g.params().views()) {
      const bool writes = writer && (view.shard.sharded() || tp_rank == 0) && !(tied_copy && view.name == "embed.tokens");
      entries_.push_back({.view = &view,
                          .params = p + view.offset,
                          .m = m_[c].data() + view.offset,
                          .v = v_[c].data() + view.offset,
                          .writes = writes});
    }
  }
  if (writer) file_ = fmt::format("shard-pp{:03}-tp{:03}.bin", model.plan.pp.rank(), tp_rank);
}

void StateDict::commit_moments() {
  for (std::size_t c = 0; c < m_.size(); ++c) {
    nn::AdamW<float>& adam = optimizer_.adam(c);
    std::int64_t at = 0;
    for (const nn::Segment& seg : adam.segments()) {
      std::copy_n(m_[c].begin() + seg.offset, seg.count, adam.m().begin() + at);
      std::copy_n(v_[c].begin() + seg.offset, seg.count, adam.v().begin() + at);
      at += seg.count;
    }
  }
}

}  // namespace ndmesh::parallel
