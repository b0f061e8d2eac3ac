// Gradient synchronisation (Megatron-core's finalize_model_grads): every rule that turns
// the gradients a rank's backwards computed into the gradients of the mean loss over the
// global batch, and their global norm. The gradient rule (docs/internals/runtime.md: "summed over
// every dim where the parameter is replicated and the data differs") is here and nowhere
// else:
//  1. dp-cp: parameters are replicated over the gradient group (dp, or dp x cp). One
//     GradReducer per local chunk sums them in buckets overlapped with the backward (ZeRO:
//     reduce-scatters them into shards). Only a backward that completes a micro-batch's
//     gradients reduces (a whole backward, or the weight half of a split one), and only the
//     step's last, except under ZeRO 2, which keeps nothing but the shard between
//     micro-batches and so reduces every one.
//     Experts stored per ep rank (ModelPlan::shard_experts) are replicated over the
//     expert-data-parallel group only: a chunk's flat buffer is then two partitions, the
//     dense one [0, expert_offset) laid out alike on the whole dp-cp group, and the expert
//     partition [expert_offset, size) laid out alike on the edp group (ParamStore::
//     begin_experts). Each has its own GradReducer (the same options; ZeRO shards the expert
//     partition over edp), so every rule below sees, per parameter, the reducer of its
//     partition (ParamView::expert). The expert reducer starts its buckets after the
//     backward (the grads-final hook speaks of the dense part). Under ZeRO-3 over an edp
//     group of 2 or more its buckets are the MoE blocks' expert ranges (ModelT::
//     expert_ranges(), padded to edp), reduce-scattered as the dense units are; over one
//     rank the experts it stores are simply whole.
//  2. tp: parameters replicated over tp whose inputs differ on each tp rank (the norms and
//     row-parallel biases under sequence parallelism: ParamShard::grad_sum) are summed over
//     tp once per step, after the dp-cp reduction, on the elements this rank updates (the
//     sums commute, so how often the reducer ran does not matter; under ZeRO only the shard
//     is summed).
//  3. the embedding group: a tied head on the last stage and the embedding on the first
//     hold two copies of the token table (marked on the parameter: ParamView::tied); both
//     get the sum of the two gradients. Under ZeRO
//     the two stages cut their flat buffers differently: the owned parts are gathered over
//     the gradient group first (each element is owned once, so a sum gathers), summed over
//     the embedding group, and the owned parts written back.
//  4. across replicas (elastic data parallelism, docs/elastic.md): the outermost level, once
//     the replica's own sums are done and before the norm: the gradients and the loss are
//     summed over this rank's counterparts in the live replicas (set_replicas()). A failure
//     there does not end the step (the replica's ranks stay in step for their vote): it is
//     kept in replica_failure(). On a GPU the sum is staged through host memory around the
//     group's all-reduce (the group is a host group over the coordinator's store).
//  5. the norm: every element of the logical model is counted by exactly one rank (by one
//     member of the gradient group, an expert's by one member of its edp group; tp-sharded
//     parameters on every tp rank, replicated ones on tp rank 0; the tied copy of the table
//     not at all), and one all-reduce over the world sums the squares together with the loss.
//  6. ZeRO-3: the parameters are sharded on the reducers' blocks; one ParamGatherer per
//     chunk, on the chunk's unit hook, gathers each unit before use and frees it after, and
//     params_updated() frees every gathered copy once the optimizer changed the shards. The
//     expert partition has its own ParamGatherer over edp (the experts' blocks of the expert
//     reducer), on the same hook: a MoE block's stored experts are gathered with the block.
// Buffers: between begin_backward() and end_backward() the started buckets' ranges of a
// chunk's gradient buffer belong to the reductions (see GradReducer).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ndmesh/comm/process_groups.hpp"
#include "ndmesh/model/model.hpp"
#include "ndmesh/nn/adamw.hpp"
#include "ndmesh/parallel/dp/grad_reducer.hpp"
#include "ndmesh/parallel/dp/param_gatherer.hpp"
#include "ndmesh/parallel/parallelize.hpp"
#include "ndmesh/tensor/device.hpp"
#include "ndmesh/tensor/ops.hpp"
#include "ndmesh/tensor/tensor.hpp"

namespace ndmesh::parallel {

/// The outermost level of the gradient reduction of an elastic run (GradSync::set_replicas).
struct ReplicaSum {
  comm::Communicator group;      ///< this rank's counterparts in the live replicas; empty: none
  std::function<void()> on_start;  ///< runs just before the sum (the elastic tests' kill point)
};

/// The loss and the gradient norm of a step (the same on every rank).
struct StepSums {
  double loss = 0;       ///< mean over the global batch's tokens
  double grad_norm = 0;  ///< of the synchronised gradients, before clipping
  /// GradSync::finish_step_from_heads: the loss sum and the square of the norm over the
  /// world (summed where they are: NCCL on the stream on CUDA), two doubles where the
  /// gradients are (device memory on CUDA) not read yet (loss and grad_norm are 0 until
  /// GradSync::read_sums).
  const double* pending = nullptr;
  /// The norm the optimizer clips with: the square where it is, or grad_norm.
  nn::GradNorm norm() const {
    return pending != nullptr ? nn::GradNorm::of_square_sum(pending + 1) : nn::GradNorm(grad_norm);
  }
};

/// Rule 2 (tp) for any element type: sums over the tp group the gradients of the
/// parameters replicated over tp whose inputs differ on each tp rank (ParamShard::grad_sum)
/// in `stores`. `runs(c, view, f)` calls f(gradients, n, at) for each run of store c's
/// view whose gradient this rank updates (the whole view without ZeRO); the runs line up
/// on the tp ranks (same flat layout and shards), so one packed all-reduce sums them.
/// `work` is the packing buffer. GradSync applies it once per step; the double-precision
/// tp tests apply the same function to their models.
template <typename T, typename Runs>
void sum_replicated_over_tp(const nn::TpContext<T>& tp, std::span<ParamStore<T>* const> stores, Runs&& runs,
                            Tensor<T>& work) {
  if (tp.size() == 1 || stores.empty()) return;
  auto visit = [&](auto&& f) {
    for (std::size_t c = 0; c < stores.size(); ++c)
      for (const ParamView& v : stores[c]->views())
        if (v.shard.grad_sum) runs(c, v, f);
  };
  std::int64_t total = 0;
  visit([&](T*, std::int64_t n, std::int64_t) { total += n; });
  if (total == 0) return;  // no sequence parallelism (the same on every tp rank)
  // Packed where the gradients live (device memory on CUDA).
  const Device device = stores.front()->device();
  work.set_device(device);
  work.resize({total});
  std::int64_t at = 0;
  visit([&](T* p, std::int64_t n, std::int64_t) {
    ops::copy(work.data() + at, p, n, device);
    at += n;
  });
  tp.comm->all_reduce_sum(work.data(), total);
  at = 0;
  visit([&](T* p, std::int64_t n, std::int64_t) {
    ops::copy(p, work.data() + at, n, device);
    at += n;
  });
}

/// Owns every reduction of the gradients of one rank's model chunks.
class GradSync {
 public:
  /// Builds one reducer per chunk over the plan's gradient group and hooks it onto the
  /// chunk's grads-final hook. Collective over the gradient group (the hierarchical
  /// all-reduce builds node sub-groups) and over the world (the embedding group).
  GradSync(RankModel& model, ProcessGroups& groups, const DataParallelOptions& options);
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  /// Start of a step: zeroes every gradient, the ZeRO-2 shards and the timers.
  void start_step();
  /// Around a backward of chunk c that completes a micro-batch's gradients (the pipeline
  /// executor's hooks); `last` marks the chunk's last of the step.
  void begin_backward(int chunk, bool last);
  void end_backward(int chunk);
  /// Drives the reductions (and ZeRO-3 gathers) of chunk c in flight (between layers).
  void progress(int chunk);
  /// ZeRO-3: the shards changed (optimizer step, checkpoint load): every gathered copy is
  /// stale and is freed. Nothing otherwise.
  void params_updated();
  /// ZeRO-3: the gatherer of chunk c; nullptr otherwise.
  const ParamGatherer* gatherer(std::size_t chunk) const {
    return gatherers_.empty() ? nullptr : gatherers_[chunk].get();
  }
  ParamGatherer* gatherer(std::size_t chunk) { return gatherers_.empty() ? nullptr : gatherers_[chunk].get(); }
  /// ZeRO-3 of chunk c's expert partition over edp (2 or more ranks): its gatherer, on the
  /// partition's part of the flat buffer (from expert_offset(c)); nullptr otherwise.
  const ParamGatherer* expert_gatherer(std::size_t chunk) const { return expert_gatherers_[chunk].get(); }
  /// --offload optimizer+params: the own blocks of the parameters back in memory (before a
  /// checkpoint is written from them), and out again (after; `changed`: a load wrote them).
  void own_params_in() {
    for (auto& g : gatherers_) g->fetch_own();
  }
  void own_params_out(bool changed) {
    for (auto& g : gatherers_) g->release_own(changed);
  }
  /// After the step's backwards: the embedding-group and tp sums, then the loss and the
  /// norm in one all-reduce over the world. `loss_sum` is this rank's sum of per-token
  /// losses (its head's micro-batches; 0 on stages without the head). Collective.
  StepSums finish_step(double loss_sum);
  /// finish_step() with the loss taken from the heads here (the walk ran with
  /// StageHooks::take_loss false). The loss sum and the norm's square are written to two
  /// doubles where the gradients are (on CUDA: on the stream) and summed over the world
  /// there (one all-reduce of the two; on CUDA through NCCL, ordered on the stream, or the
  /// staged engine); with `leave_pending` nothing reads them: the optimizer clips with the
  /// square where it is (StepSums::norm; on CUDA its kernel reads it) and read_sums() reads
  /// both after the optimizer step is enqueued, so that nothing inside the step waits for
  /// the device, on one GPU or several. Without, they are read here (one host wait).
  StepSums finish_step_from_heads(bool leave_pending);
  /// Reads what finish_step_from_heads left pending into loss and grad_norm (waits for the
  /// stream on CUDA); nothing when nothing was left.
  void read_sums(StepSums& sums) const;
  /// Elastic data parallelism: from the next step on, the gradients and the loss are summed
  /// over `replicas.group` (this rank's counterparts in the live replicas, e.g. a
  /// comm::connect_store_group of the generation; the empty handle: no sum) as the last
  /// level of the reduction, before the norm; `replicas.on_start` runs just before that sum.
  void set_replicas(ReplicaSum replicas) { replicas_ = std::move(replicas); }
  /// Why the last step's sum over the replicas failed (a peer gone, a timeout, an abort):
  /// the step's gradients are then not the batch's and it must not be applied; empty when
  /// it did not fail or did not run.
  const std::string& replica_failure() const { return replica_failure_; }
  /// The mean loss over `tokens` tokens of a sum like finish_step's (evaluation; collective).
  double global_loss(double loss_sum, double tokens) const;
  /// Sums over the world, in place, values every tp rank computes alike (tp rank 0's count):
  /// a mixture of experts' auxiliary loss and routing loads (collective).
  void sum_over_world(std::span<double> values) const;

  /// The reducer of chunk c's dense part (all of it without an expert partition).
  GradReducer& reducer(std::size_t chunk) { return *reducers_[chunk]; }
  const GradReducer& reducer(std::size_t chunk) const { return *reducers_[chunk]; }
  /// The reducer of chunk c's expert partition (over the edp group, on the flat buffer from
  /// expert_offset(c)); nullptr when the chunk stores no expert partition.
  GradReducer* expert_reducer(std::size_t chunk) { return expert_reducers_[chunk].get(); }
  const GradReducer* expert_reducer(std::size_t chunk) const { return expert_reducers_[chunk].get(); }
  std::int64_t expert_offset(std::size_t chunk) const { return expert_offsets_[chunk]; }
  /// The expert-data-parallel group (of one without expert parallelism).
  const comm::Communicator& expert_group() const { return expert_data_; }
  /// The segments of chunk c's flat buffer whose reduced gradients this rank updates (both
  /// partitions' shards, in buffer order): what its optimizer owns.
  std::vector<nn::Segment> owned_segments(std::size_t chunk) const;
  /// The reduced gradients of owned_segments(c) one after another when ZeRO-2 keeps them
  /// apart from the flat buffer (AdamW::update's segment_grads); nullptr: in the flat buffer.
  const float* owned_grads(std::size_t chunk);
  /// ZeRO 1/2: all-gathers chunk c's updated parameters (both partitions; collective).
  void gather_params(std::size_t chunk, ParamStore<float>& store);
  int zero() const { return reducers_.front()->zero(); }
  const comm::Communicator& group() const { return grad_; }
  /// What the reductions of the last step cost (summed over the chunks).
  double comm_seconds() const;
  double exposed_seconds() const;
  std::int64_t reduced_bytes() const;

 private:
  // Calls f(gradients, n, at) for each run of chunk c's tied weight `view` whose reduced
  // gradient this rank updates.
  template <typename F>
  void for_each_owned_tied_grad(std::size_t c, const ParamView& view, F&& f);
  // The reducer of `view`'s partition in chunk c and where that partition starts.
  std::pair<GradReducer*, std::int64_t> reducer_of(std::size_t c, const ParamView& view) const {
    if (view.expert) return {expert_reducers_[c].get(), expert_offsets_[c]};
    return {reducers_[c].get(), 0};
  }
  // for_each_owned / for_each_counted of `view` in chunk c, with its partition's reducer.
  template <typename F>
  void for_each_owned_of(std::size_t c, const ParamView& view, float* grads, F&& f) const {
    auto [r, base] = reducer_of(c, view);
    r->for_each_owned(grads + base, view.offset - base, view.numel, f);
  }
  template <typename F>
  void for_each_counted_of(std::size_t c, const ParamView& view, float* grads, F&& f) const {
    auto [r, base] = reducer_of(c, view);
    r->for_each_counted(grads + base, view.offset - base, view.numel, f);
  }
  // Sums chunk c's copy `view` of a tied weight with the other copy (the embedding group).
  void sum_tied(std::size_t c, const ParamView& view);
  void sum_tied_weights();
  void sum_replicated_over_tp();
  // The runs of gradients the norm counts, in their order.
  std::vector<std::pair<const float*, std::int64_t>> counted_runs() const;
  double counted_square_sum() const;
  StepSums host_sums(double loss_sum, double square_sum) const;
  // The step's sums from the world's loss sum and norm square.
  StepSums from_world_sums(double loss_sum, double square_sum) const;

  std::vector<model::Model*> chunks_;
  comm::Communicator world_, grad_, embedding_;
  nn::TpContext<float> tp_;
  double tokens_;  // of a step's global batch
  std::vector<std::unique_ptr<GradReducer>> reducers_;
  // Per chunk: the expert partition's reducer (nullptr: none) and where it starts.
  comm::Communicator expert_data_;
  std::vector<std::unique_ptr<GradReducer>> expert_reducers_;
  std::vector<std::int64_t> expert_offsets_;
  std::vector<Tensor<float>> owned_grads_;                 // owned_grads(): both partitions' ZeRO-2 gradients
  std::vector<std::unique_ptr<ParamGatherer>> gatherers_;  // ZeRO-3, one per chunk
  std::vector<std::unique_ptr<ParamGatherer>> expert_gatherers_;  // per chunk: the experts' over edp, or null
  Tensor<float> work_;        // the tp sum's packed elements
  // The sum over the replicas (level 4); a failure there goes to replica_failure_.
  void sum_over_replicas(double& loss_sum);
  ReplicaSum replicas_;
  std::string replica_failure_;
  std::vector<float> replica_host_;  // on a device: the gradients summed over the replicas, staged
  ops::Scratch<double> sums_;  // the loss sum and the norm's square of finish_step_from_heads
};

}  // namespace ndmesh::parallel
