#include "ndmesh/parallel/grad_sync.hpp"

#include <algorithm>
#include <array>
#include <cmath>

#include "ndmesh/core/error.hpp"
#include "ndmesh/tensor/ops.hpp"

namespace ndmesh::parallel {

GradSync::GradSync(RankModel& model, ProcessGroups& groups, const DataParallelOptions& options)
    : world_(groups.world()),
      grad_(model.plan.grad_group),
      tp_(model.plan.tp),
      tokens_(static_cast<double>(model.plan.batch.global_batch * model.plan.batch.seq)),
      expert_data_(model.plan.expert_data) {
  for (std::size_t c = 0; c < model.chunks.size(); ++c) {
    model::Model& g = *model.chunks[c];
    chunks_.push_back(&g);
    // ZeRO 2 and 3 reduce unit by unit where the units are padded to shards (apply.cpp).
    const std::int64_t dense = g.params().expert_offset();
    reducers_.push_back(std::make_unique<GradReducer>(
        grad_, dense, options, model.plan.store.pad_units ? g.unit_ranges() : std::vector<nn::Segment>{},
        g.device()));
    // The experts this rank stores: over the ranks that store the same ones, in buckets; under
    // ZeRO-3 (the expert units padded to edp: apply.cpp) one bucket per MoE block's experts,
    // their parameters sharded on the same blocks and gathered with the block (below).
    expert_offsets_.push_back(dense);
    const bool expert_units = options.zero == 3 && model.plan.store.expert_keep_parts > 1;
    std::vector<nn::Segment> expert_ranges;  // inside the expert partition
    if (expert_units)
      for (const nn::Segment& e : g.expert_ranges()) expert_ranges.push_back({e.offset - dense, e.count});
    DataParallelOptions expert_options = options;
    expert_options.zero = expert_units ? 3 : std::min(options.zero, 2);
    expert_reducers_.push_back(dense < g.params().size()
                                   ? std::make_unique<GradReducer>(expert_data_, g.params().size() - dense,
                                                                   expert_options, expert_ranges, g.device())
                                   : nullptr);
    owned_grads_.emplace_back();
    GradReducer* r = reducers_.back().get();
    GradReducer* er = expert_reducers_.back().get();
    g.set_grads_final_hook([r](std::int64_t from) { r->grads_final(from); });
    if (r->zero() == 3) {
      NDMESH_CHECK(!g.params().keeps_bf16_copy(), "train",
                   "ZeRO-3 runs without a bfloat16 copy of the parameters (it would need gathering too)");
      // On a GPU the parameters are in mappable memory (ModelPlan::mappable_params).
      gatherers_.push_back(std::make_unique<ParamGatherer>(grad_, g.params().params().data(), g.unit_ranges(),
                                                           g.units(), g.backward_units(), options.zero3,
                                                           g.device()));
    }
    // The expert partition's gatherer over edp: its ranges are the MoE blocks' experts, its
    // units the model's (a unit without experts gathers nothing), driven by the same hook.
    std::unique_ptr<ParamGatherer> expert_gatherer;
    if (er != nullptr && er->zero() == 3) {
      std::vector<model::ParamUnit> units = g.units();
      for (model::ParamUnit& u : units) {
        u.ranges.clear();
        if (u.expert_range >= 0) u.ranges.push_back(u.expert_range);
      }
      expert_gatherer =
          std::make_unique<ParamGatherer>(expert_data_, g.params().params().data() + dense, expert_ranges,
                                          std::move(units), g.backward_units(), options.zero3, g.device());
    }
    NDMESH_CHECK(!expert_gatherer || r->per_unit(), "train",
                 "the experts' ZeRO-3 gathers need the dense part's unit hook (ZeRO-3 over 2 or more ranks)");
    expert_gatherers_.push_back(std::move(expert_gatherer));
    // Per unit the work space is written one unit at a time: none of it resident until then
    // (on a GPU in mappable memory: a unit's chunks are backed when its backward begins).
    if (r->per_unit()) {
      r->own_workspace(g.params().grads().data(), model.plan.store.mappable_grads);
      // (The expert partition is no unit's: its reducer goes in buckets, after the backward.)
      g.set_grads_write_hook([r, dense](std::int64_t at) {
        if (at < dense) r->writes_at(at);
      });
      ParamGatherer* pg = r->zero() == 3 ? gatherers_.back().get() : nullptr;
      ParamGatherer* epg = expert_gatherers_.back().get();
      g.set_unit_hook([pg, epg, r, &g](model::UnitEvent e, int unit) {
        if (pg != nullptr) pg->on_unit(e, unit);
        if (epg != nullptr) epg->on_unit(e, unit);
        if (e == model::UnitEvent::kBackwardBegin)
          r->begin_unit_backward(g.units()[static_cast<std::size_t>(unit)].ranges);
      });
    }
  }
  embedding_ = groups.embedding();  // collective over the world, on every rank
  // The step's loss and norm sums, made now: on a GPU a first allocation inside the first step
  // would take a cached block a later step's transient needs (a driver allocation in step 2).
  sums_ = ops::Scratch<double>(2, chunks_.empty() ? Device::kCpu : chunks_.front()->device());
}

void GradSync::params_updated() {
  for (auto& g : gatherers_) g->free_all();
  for (auto& g : expert_gatherers_)
    if (g) g->free_all();
}

void GradSync::start_step() {
  for (std::size_t c = 0; c < chunks_.size(); ++c) {
    if (!reducers_[c]->per_unit()) {
      chunks_[c]->params().zero_grad();
    } else {  // zeros without touching the pages (the backward writes one unit at a time)
      reducers_[c]->release_workspace();
      auto grads = chunks_[c]->params().grads();  // the expert partition after the dense part
      ops::zero(grads.data() + expert_offsets_[c],
                static_cast<std::int64_t>(grads.size()) - expert_offsets_[c], chunks_[c]->device());
    }
    if (!gatherers_.empty()) gatherers_[c]->reset_timers();
    if (expert_gatherers_[c]) expert_gatherers_[c]->reset_timers();
    for (GradReducer* r : {reducers_[c].get(), expert_reducers_[c].get()}) {
      if (r == nullptr) continue;
      r->zero_shard_grads();
      r->reset_timers();
    }
  }
}

std::vector<nn::Segment> GradSync::owned_segments(std::size_t c) const {
  std::vector<nn::Segment> out = reducers_[c]->shard();
  if (const GradReducer* e = expert_reducers_[c].get())
    for (const nn::Segment& seg : e->shard()) out.push_back({seg.offset + expert_offsets_[c], seg.count});
  return out;
}

const float* GradSync::owned_grads(std::size_t c) {
  GradReducer& r = *reducers_[c];
  const GradReducer* e = expert_reducers_[c].get();
  // The expert group is no larger than the dp-cp group: ZeRO-2 there means ZeRO-2 here.
  if (e == nullptr || r.zero() < 2) return r.shard_grads();
  // The dense shard's gradients (kept apart), then the expert partition's (kept apart under
  // ZeRO 2/3 over edp, or in the flat buffer where edp is one rank), one after another.
  const Device device = chunks_[c]->device();
  std::int64_t dense = 0, total = 0;
  for (const nn::Segment& seg : r.shard()) dense += seg.count;
  total = dense;
  for (const nn::Segment& seg : e->shard()) total += seg.count;
  Tensor<float>& out = owned_grads_[c];
  out.set_device(device);
  out.resize({total});
  ops::copy(out.data(), r.shard_grads(), dense, device);
  const float* flat = chunks_[c]->params().grads().data() + expert_offsets_[c];
  std::int64_t at = 0;
  for (const nn::Segment& seg : e->shard()) {
    ops::copy(out.data() + dense + at,
              e->shard_grads() != nullptr ? e->shard_grads() + at : flat + seg.offset, seg.count, device);
    at += seg.count;
  }
  return out.data();
}

void GradSync::gather_params(std::size_t c, ParamStore<float>& store) {
  // Only a gather asks for the writable parameters (which makes their bf16 copy stale).
  if (reducers_[c]->gathers_params()) reducers_[c]->gather_params(store.params().data());
  if (GradReducer* e = expert_reducers_[c].get(); e != nullptr && e->gathers_params())
    e->gather_params(store.params().data() + expert_offsets_[c]);
}

void GradSync::begin_backward(int chunk, bool last) {
  const auto c = static_cast<std::size_t>(chunk);
  reducers_[c]->begin_backward(chunks_[c]->params().grads().data(), last);
  if (GradReducer* e = expert_reducers_[c].get())
    e->begin_backward(chunks_[c]->params().grads().data() + expert_offsets_[c], last);
}

void GradSync::end_backward(int chunk) {
  const auto c = static_cast<std::size_t>(chunk);
  reducers_[c]->finish_backward();
  if (GradReducer* e = expert_reducers_[c].get()) e->finish_backward();
}

void GradSync::progress(int chunk) {
  const auto c = static_cast<std::size_t>(chunk);
  reducers_[c]->progress();
  if (GradReducer* e = expert_reducers_[c].get()) e->progress();
  if (!gatherers_.empty()) gatherers_[c]->poll();
  if (expert_gatherers_[c]) expert_gatherers_[c]->poll();
}

template <typename F>
void GradSync::for_each_owned_tied_grad(std::size_t c, const ParamView& view, F&& f) {
  model::Model& g = *chunks_[c];
  reducers_[c]->for_each_owned(g.params().grads().data(), view.offset, view.numel, f);
}

void GradSync::sum_tied(std::size_t c, const ParamView& view) {
  model::Model& g = *chunks_[c];
  if (reducers_[c]->zero() == 0) {
    embedding_.all_reduce(
        std::span<float>(g.params().grads().data() + view.offset, static_cast<std::size_t>(view.numel)));
    return;
  }
  // Under ZeRO each element has one owner in the gradient group: a zero-filled tensor with
  // this rank's owned runs, summed over the group, is the whole tensor's gradient (where the
  // gradients live: device memory on CUDA).
  const Device device = g.device();
  Tensor<float> whole({view.numel}, device);
  for_each_owned_tied_grad(c, view, [&](float* p, std::int64_t n, std::int64_t at) {
    ops::copy(whole.data() + at, p, n, device);
  });
  const std::span<float> all(whole.data(), static_cast<std::size_t>(view.numel));
  grad_.all_reduce(all);
  embedding_.all_reduce(all);
  for_each_owned_tied_grad(c, view, [&](float* p, std::int64_t n, std::int64_t at) {
    ops::copy(p, whole.data() + at, n, device);
  });
}

void GradSync::sum_tied_weights() {
  // The copy on a later stage first, then the owner (every member of the embedding group
  // calls its all-reduces in the order of its chunks: a rank holds one side at most).
  for (const Tied side : {Tied::kCopy, Tied::kOwner})
    for (std::size_t c = 0; c < chunks_.size(); ++c)
      for (const ParamView& v : chunks_[c]->params().views())
        if (v.tied == side) sum_tied(c, v);
}

void GradSync::sum_replicated_over_tp() {
  std::vector<ParamStore<float>*> stores;
  for (model::Model* g : chunks_) stores.push_back(&g->params());
  parallel::sum_replicated_over_tp<float>(
      tp_, stores,
      [&](std::size_t c, const ParamView& v, auto&& f) {
        for_each_owned_of(c, v, stores[c]->grads().data(), f);
      },
      work_);
}

std::vector<std::pair<const float*, std::int64_t>> GradSync::counted_runs() const {
  const bool tp_lead = tp_.rank() == 0;
  // Every counted run, summed in this order (on CUDA in one pass, not a host sync per tensor).
  std::vector<std::pair<const float*, std::int64_t>> runs;
  for (std::size_t c = 0; c < chunks_.size(); ++c) {
    model::Model& g = *chunks_[c];
    for (const ParamView& v : g.params().views()) {
      if (!v.shard.sharded() && !tp_lead) continue;  // replicated over tp: counted on tp rank 0
      if (v.tied == Tied::kCopy) continue;             // the owner's copy counts
      for_each_counted_of(c, v, g.params().grads().data(),
                          [&](const float* x, std::int64_t n, std::int64_t) { runs.emplace_back(x, n); });
    }
  }
  return runs;
}

double GradSync::counted_square_sum() const {
  return chunks_.empty() ? 0.0 : ops::square_sum_many<float>(counted_runs(), chunks_.front()->device());
}

StepSums GradSync::host_sums(double loss_sum, double square_sum) const {
  // Every tp rank computes the same loss (the vocabulary-parallel loss reduces over tp):
  // tp rank 0 counts it.
  std::array<double, 2> sums = {tp_.rank() == 0 ? loss_sum : 0.0, square_sum};
  if (world_.size() > 1) world_.all_reduce(std::span<double>(sums));
  return from_world_sums(sums[0], sums[1]);
}

StepSums GradSync::from_world_sums(double loss_sum, double square_sum) const {
  return {.loss = loss_sum / tokens_, .grad_norm = std::sqrt(std::max(0.0, square_sum))};
}

void GradSync::sum_over_replicas(double& loss_sum) {
  replica_failure_.clear();
  if (!replicas_.group.valid()) return;
  if (replicas_.on_start) replicas_.on_start();
  try {
    for (std::size_t c = 0; c < chunks_.size(); ++c) {
      auto all = chunks_[c]->params().grads();
      const Device device = chunks_[c]->device();
      for (GradReducer* r : {reducers_[c].get(), expert_reducers_[c].get()}) {
        if (r == nullptr) continue;
        // What this rank updates: its part of the flat buffer (the dense part, or the expert
        // partition), or under ZeRO 2 and 3 its shard's sums, kept apart (the segments back
        // to back).
        const std::int64_t base = r == reducers_[c].get() ? 0 : expert_offsets_[c];
        const std::int64_t end =
            r == reducers_[c].get() ? expert_offsets_[c] : static_cast<std::int64_t>(all.size());
        float* grads = all.data() + base;
        std::int64_t n = end - base;
        if (r->zero() >= 2) {
          grads = r->shard_grads();
          n = 0;
          for (const nn::Segment& seg : r->shard()) n += seg.count;
        }
        if (device == Device::kCpu) {
          replicas_.group.all_reduce(std::span<float>(grads, static_cast<std::size_t>(n)));
          continue;
        }
        // On a GPU, staged through host memory around the group's all-reduce: the group is
        // the comm layer's host group over the coordinator's store (abortable, with its
        // timeouts), and the replicas' link is the slow one (PCIe is not). copy_to_host waits
        // for the compute stream, so the replica's own reductions are complete.
        replica_host_.resize(static_cast<std::size_t>(n));
        ops::copy_to_host(replica_host_.data(), grads, n, device);
        replicas_.group.all_reduce(std::span<float>(replica_host_));
        ops::copy_from_host(grads, replica_host_.data(), n, device);
      }
    }
    replicas_.group.all_reduce(std::span<double>(&loss_sum, 1));
  } catch (const std::exception& e) {
    replica_failure_ = e.what();
  }
}

StepSums GradSync::finish_step(double loss_sum) {
  sum_tied_weights();
  sum_replicated_over_tp();
  sum_over_replicas(loss_sum);
  return host_sums(loss_sum, counted_square_sum());
}

StepSums GradSync::finish_step_from_heads(bool leave_pending) {
  // The replicas' sum comes in between and needs the loss before the norm: read here.
  if (replicas_.group.valid()) {
    double loss_sum = 0;
    for (model::Model* c : chunks_)
      if (c->has_head()) loss_sum += c->take_loss_sum();
    return finish_step(loss_sum);
  }
  sum_tied_weights();
  sum_replicated_over_tp();
  const Device device = chunks_.empty() ? Device::kCpu : chunks_.front()->device();
  if (sums_.size() == 0) sums_ = ops::Scratch<double>(2, device);
  double* sums = sums_.data();
  // One rank holds at most one head (the last virtual stage).
  model::Model* head = nullptr;
  for (model::Model* c : chunks_)
    if (c->has_head()) head = c;
  if (head != nullptr)
    head->take_loss_sum_into(sums);
  else
    sums_.zero();
  ops::square_sum_many_into<float>(sums + 1, counted_runs(), device);
  if (world_.size() > 1) {
    // Summed where they are (host_sums' all-reduce, without reading them first): every tp
    // rank computes the same loss (the vocabulary-parallel loss reduces over tp), tp rank 0
    // counts it.
    if (tp_.rank() != 0) sums_.zero(0, 1);
    world_.all_reduce(std::span<double>(sums, 2));
  }
  StepSums out{.pending = sums};
  if (!leave_pending) read_sums(out);
  return out;
}

void GradSync::read_sums(StepSums& s) const {
  if (s.pending == nullptr) return;
  const std::vector<double> host = sums_.to_host();
  const StepSums read = from_world_sums(host[0], host[1]);
  s.loss = read.loss;
  s.grad_norm = read.grad_norm;
  s.pending = nullptr;
}

double GradSync::global_loss(double loss_sum, double tokens) const {
  double sum = tp_.rank() == 0 ? loss_sum : 0.0;
  if (world_.size() > 1) world_.all_reduce(std::span<double>(&sum, 1));
  return tokens > 0 ? sum / tokens : 0.0;
}

void GradSync::sum_over_world(std::span<double> values) const {
  if (tp_.rank() != 0) std::fill(values.begin(), values.end(), 0.0);
  if (world_.size() > 1) world_.all_reduce(values);
}

double GradSync::comm_seconds() const {
  double s = 0;
  for (const auto& r : reducers_) s += r->comm_seconds();
  for (const auto& r : expert_reducers_)
    if (r) s += r->comm_seconds();
  return s;
}

double GradSync::exposed_seconds() const {
  double s = 0;
  for (const auto& r : reducers_) s += r->exposed_seconds();
  for (const auto& r : expert_reducers_)
    if (r) s += r->exposed_seconds();
  return s;
}

std::int64_t GradSync::reduced_bytes() const {
  std::int64_t b = 0;
  for (const auto& r : reducers_) b += r->reduced_bytes();
  for (const auto& r : expert_reducers_)
    if (r) b += r->reduced_bytes();
  return b;
}

}  // namespace ndmesh::parallel
