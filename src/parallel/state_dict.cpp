#include "ndmesh/parallel/state_dict.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "ndmesh/tensor/ops.hpp"

namespace ndmesh::parallel {

StateDict::StateDict(RankModel& model, Optimizer& optimizer, const GradSync& sync, bool gather_moments)
    : optimizer_(optimizer), sync_(sync) {
  const int tp_rank = model.plan.tp.rank();
  const bool writer = sync.group().rank() == 0;
  const bool expert_writer = sync.expert_group().rank() == 0;
  bool writes_experts = false;
  m_.resize(model.chunks.size());
  v_.resize(model.chunks.size());
  host_params_.resize(model.chunks.size());
  for (auto& c : model.chunks) chunks_.push_back(c.get());
  for (std::size_t c = 0; c < model.chunks.size(); ++c) {
    model::Model& g = *model.chunks[c];
    const auto size = g.params().params().size();
    m_[c] = ZeroedVector<float>(size);  // fresh zero pages: a load writes only what it fills
    v_[c] = ZeroedVector<float>(size);
    if (gather_moments) {
      const nn::AdamW<float>& adam = optimizer.adam(c);
      std::vector<float> am, av;  // the owned segments one after another, on the host
      adam.moments_to_host(am, av);
      std::int64_t at = 0;
      for (const nn::Segment& seg : adam.segments()) {
        std::copy_n(am.begin() + at, seg.count, m_[c].begin() + seg.offset);
        std::copy_n(av.begin() + at, seg.count, v_[c].begin() + seg.offset);
        at += seg.count;
      }
      // Each element is owned by one member of its partition's group: a sum gathers (the
      // dense part over the gradient group, the experts this rank stores over edp).
      const auto dense = static_cast<std::size_t>(sync.expert_offset(c));
      if (sync.zero() > 0) {
        sync.group().all_reduce(std::span<float>(m_[c]).first(dense));
        sync.group().all_reduce(std::span<float>(v_[c]).first(dense));
      }
      if (const GradReducer* e = sync.expert_reducer(c); e != nullptr && e->zero() > 0) {
        e->group().all_reduce(std::span<float>(m_[c]).subspan(dense));
        e->group().all_reduce(std::span<float>(v_[c]).subspan(dense));
      }
    }
    // On a device the entries point into a host copy of the parameters (downloaded here
    // for a save; commit() uploads it after a load).
    float* p = g.params().params().data();
    if (sync.zero() == 3) {
      // ZeRO-3: each rank holds its blocks of the parameters (the rest is freed): a sum over
      // the gradient group gathers them, as for the moments; a load fills the copy and
      // commit() writes the own blocks back.
      host_params_[c] = ZeroedVector<float>(size);
      if (gather_moments) {
        const auto dense = static_cast<std::size_t>(sync.expert_offset(c));
        for (const nn::Segment& seg : sync.reducer(c).shard())
          ops::copy_to_host(host_params_[c].data() + seg.offset, p + seg.offset, seg.count,
                            g.params().device());
        sync.group().all_reduce(std::span<float>(host_params_[c]).first(dense));
        if (const GradReducer* e = sync.expert_reducer(c); e != nullptr && e->zero() == 3) {
          // The experts this rank stores, sharded over edp: gathered by a sum over edp.
          for (const nn::Segment& seg : e->shard())
            ops::copy_to_host(host_params_[c].data() + dense + seg.offset, p + dense + seg.offset, seg.count,
                              g.params().device());
          e->group().all_reduce(std::span<float>(host_params_[c]).subspan(dense));
        } else {  // whole on this rank (edp of one)
          ops::copy_to_host(host_params_[c].data() + dense, p + dense,
                            static_cast<std::int64_t>(size - dense), g.params().device());
        }
      }
      p = host_params_[c].data();
    } else if (g.params().device() != Device::kCpu) {
      host_params_[c] = ZeroedVector<float>(size);
      if (gather_moments)
        ops::copy_to_host(host_params_[c].data(), p, static_cast<std::int64_t>(size), g.params().device());
      p = host_params_[c].data();
    }
    for (const ParamView& view : g.params().views()) {
      // The copy of a tied weight is the owner's (ParamView::tied): written once, by the owner.
      // An expert a rank stores is written by the first member of its edp group.
      const bool writes = (view.expert ? expert_writer : writer) && (view.shard.sharded() || tp_rank == 0) &&
                          view.tied != Tied::kCopy;
      writes_experts = writes_experts || (writes && view.expert);
      std::vector<std::pair<std::int64_t, std::int64_t>> keeps;
      const GradReducer* e = sync.expert_reducer(c);
      const bool sharded_expert = view.expert && e != nullptr && e->zero() == 3;
      if (sync.zero() == 3 && (!view.expert || sharded_expert)) {
        const std::int64_t base = view.expert ? sync.expert_offset(c) : 0;
        for (const nn::Segment& seg : view.expert ? e->shard() : sync.reducer(c).shard()) {
          const std::int64_t lo = std::max(base + seg.offset, view.offset);
          const std::int64_t hi = std::min(base + seg.offset + seg.count, view.offset + view.numel);
          if (lo < hi) keeps.emplace_back(lo - view.offset, hi - view.offset);
        }
        std::sort(keeps.begin(), keeps.end());
      } else {
        keeps.emplace_back(0, view.numel);
      }
      entries_.push_back({.view = &view,
                          .params = p + view.offset,
                          .m = m_[c].data() + view.offset,
                          .v = v_[c].data() + view.offset,
                          .writes = writes,
                          .keeps = std::move(keeps)});
    }
  }
  if (writer) {
    file_ = fmt::format("shard-pp{:03}-tp{:03}.bin", model.plan.pp.rank(), tp_rank);
  } else if (writes_experts) {
    // The experts of the other ep ranks (the writer above holds ep rank 0's): one file each.
    file_ = fmt::format("shard-pp{:03}-tp{:03}-ep{:03}.bin", model.plan.pp.rank(), tp_rank,
                        model.plan.ep->rank());
  }
}

void StateDict::commit() {
  for (std::size_t c = 0; c < m_.size(); ++c) {
    nn::AdamW<float>& adam = optimizer_.adam(c);
    std::vector<float> am, av;  // the owned segments one after another
    for (const nn::Segment& seg : adam.segments()) {
      am.insert(am.end(), m_[c].begin() + seg.offset, m_[c].begin() + seg.offset + seg.count);
      av.insert(av.end(), v_[c].begin() + seg.offset, v_[c].begin() + seg.offset + seg.count);
    }
    adam.moments_from_host(am.data(), av.data());
    if (host_params_[c].empty()) continue;
    if (sync_.zero() == 3) {  // the own blocks only: the rest of the buffer stays freed
      float* p = chunks_[c]->params().params().data();
      for (const nn::Segment& seg : sync_.reducer(c).shard())
        ops::copy_from_host(p + seg.offset, host_params_[c].data() + seg.offset, seg.count,
                            chunks_[c]->params().device());
      const std::int64_t dense = sync_.expert_offset(c);
      if (const GradReducer* e = sync_.expert_reducer(c); e != nullptr && e->zero() == 3) {
        for (const nn::Segment& seg : e->shard())  // the experts' own blocks
          ops::copy_from_host(p + dense + seg.offset, host_params_[c].data() + dense + seg.offset, seg.count,
                              chunks_[c]->params().device());
      } else {  // the experts it stores: whole
        ops::copy_from_host(p + dense, host_params_[c].data() + dense,
                            static_cast<std::int64_t>(host_params_[c].size()) - dense,
                            chunks_[c]->params().device());
      }
    } else {
      chunks_[c]->params().params_from_host(host_params_[c].data());
    }
  }
}

}  // namespace ndmesh::parallel
