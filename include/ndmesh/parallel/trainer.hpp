// Trainer: the step loop of the parallel training runtime. A layout of size 1 in every dim
// is the serial run, so `ndmesh train` without a launcher and with one is the same code.
//
// The trainer composes the parts of docs/internals/runtime.md and holds no rule of its own about how
// strategies combine:
//  - parallelize() (parallelize.hpp) turns the options and the process groups into this
//    rank's model chunks, validating every option and the layout once;
//  - the BatchSource (batch_source.hpp) gives each micro-batch's tokens: the dp slice of
//    the global batch, the cp positions of each sequence;
//  - the pipeline executor (pp/executor.hpp) runs every step's micro-batches through the
//    stage's list of a PipelineSchedule (pp = 1: a one-stage schedule), recording a bounded
//    trace window (pp/trace.hpp);
//  - GradSync (grad_sync.hpp) owns every gradient reduction (dp-cp buckets overlapped with
//    the backward, tp sums of replicated parameters, the tied embedding) and computes the
//    loss and the global gradient norm in one all-reduce;
//  - the Optimizer (optimizer.hpp) applies AdamW with clipping to what the rank updates
//    (ZeRO: its shard, then the parameters are gathered);
//  - checkpoints are the StateDict (state_dict.hpp) saved and loaded by checkpoint_io.hpp.
// One step: zero the gradients, walk the schedule (forwards, backwards, reductions started
// as gradients become final), finish the gradient synchronisation, update.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ndmesh/comm/process_groups.hpp"
#include "ndmesh/model/checkpoint_dir.hpp"
#include "ndmesh/model/data.hpp"
#include "ndmesh/model/model.hpp"
#include "ndmesh/parallel/batch_source.hpp"
#include "ndmesh/parallel/checkpoint_io.hpp"
#include "ndmesh/parallel/grad_sync.hpp"
#include "ndmesh/parallel/optimizer.hpp"
#include "ndmesh/parallel/parallelize.hpp"
#include "ndmesh/parallel/pp/executor.hpp"
#include "ndmesh/parallel/pp/simulate.hpp"
#include "ndmesh/parallel/pp/trace.hpp"
#include "ndmesh/parallel/tp/tp_comm.hpp"
#include "ndmesh/parallel/train_options.hpp"

namespace ndmesh::parallel {

class StateDict;

/// What the pipeline measured over the steps so far (filled on world rank 0 only).
struct PipelineReport {
  bool valid = false;
  double bubble_measured =
      0;  ///< idle share of stage time, mean over pipelines and steps (first step left out)
  double bubble_simulated = 0;         ///< simulate() of the schedule with the measured mean costs
  double bubble_simulated_stages = 0;  ///< the same with each stage's own measured costs
  pp::Costs costs;  ///< measured mean forward / backward-input / backward-weight of a stage, seconds
  std::vector<int> peak_activations;           ///< per stage: most live micro-batch activations (chunks)
  std::vector<int> expected_peak_activations;  ///< per stage: the schedule's (simulate())
  std::int64_t events = 0;                     ///< actions analysed (the trace window of every rank)
  int steps = 0;                               ///< steps analysed (at most --trace-steps)
};

/// What one step did (the same numbers on every rank).
struct StepStats {
  std::int64_t step = 0;  ///< 1-based index of the step just done
  double loss = 0;        ///< mean loss over the global batch, before the update
  double grad_norm = 0;   ///< global, before clipping
  double lr = 0;
  double seconds = 0;                ///< wall time of the step on this rank
  double comm_seconds = 0;           ///< first bucket start to last bucket done (see GradReducer)
  double exposed_comm_seconds = 0;   ///< the part the step waited for
  std::int64_t grad_comm_bytes = 0;  ///< gradient bytes this rank handed to the dp reductions
  TpCommStats tp_comm;               ///< what the step moved over the tp group (this rank)
  CommCount cp_kv;                   ///< key/value blocks the cp ring sent (this rank; forward + backward)
  CommCount cp_dkv;                  ///< dK/dV accumulators the cp ring sent (this rank)
  EpCommStats ep_comm;               ///< the MoE layers' exchanges over the expert group (this rank)
  /// Mixture of experts: the auxiliary load-balancing loss of the step (the mean over its
  /// micro-batches, summed over the MoE blocks; not in `loss`), and the tokens routed to each
  /// expert (MoE block by block, experts each), summed over the step. 0 and empty when dense.
  double aux_loss = 0;
  std::vector<double> expert_load;
};

/// Bytes one rank holds.
struct MemoryBytes {
  /// Parameters (ZeRO-3: this rank's shard plus params_gathered).
  double params = 0;
  /// ZeRO-3: the most parameter elements of other ranks' shards that were gathered at once
  /// (the units in use and the one prefetched), measured; 0 otherwise.
  double params_gathered = 0;
  /// --offload optimizer+params: this rank's shard of the parameters, in files instead.
  double params_offloaded = 0;
  double grads = 0;      ///< gradients kept between micro-batches (ZeRO 2/3: the shard)
  double optimizer = 0;  ///< AdamW moments (ZeRO 1-3: the shard)
  double optimizer_offloaded = 0;  ///< --offload optimizer: the moments' bytes in files (on a GPU: pinned host memory) instead
  /// --offload optimizer on a GPU: the pinned host bytes (moments, the fp32 master copy of the
  /// shard and the two gradient staging chunks); 0 otherwise.
  double optimizer_host = 0;
  /// Measured: the bytes of the micro-batch activations alive at once at this rank's peak
  /// (the pipeline executor's activations of every chunk) plus the recompute workspace.
  double activations = 0;
  /// Buffers beside them that hold nothing kept for the backward: the all-gathered norm
  /// outputs under sequence parallelism (gathered again in the backward), a stage's output
  /// before it is sent (full recompute: the recomputed block's output) and its input
  /// gradient before it is sent back.
  double activation_buffers = 0;
  /// ZeRO 2/3: the full-size buffer the backward writes into. ZeRO-3, and ZeRO-2 on the CPU,
  /// hand each unit's pages back to the system once its reduce-scatter completed: there it is
  /// the most bytes of the buffer that were resident at once, measured
  /// (GradReducer::peak_workspace_bytes).
  double grad_workspace = 0;
  /// --device cuda: the most device memory this process's allocator handed out at once
  /// (parameters, gradients, optimizer state, activations and work space); 0 on the CPU.
  double device_peak = 0;
};

/// The runtime of one rank: its model chunks, batches, gradient synchronisation,
/// optimizer and pipeline executor. Neither copyable nor movable: the chunks' hooks point
/// at its parts.
class Trainer {
 public:
  /// ConfigError when the options or the layout are not usable (a dim that is not
  /// implemented yet, a batch the layout does not divide, a bad model spec...).
  /// Collective over groups.world().
  Trainer(TrainOptions options, std::unique_ptr<model::DataSource> data, ProcessGroups& groups);
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;
  Trainer(Trainer&&) = delete;
  Trainer& operator=(Trainer&&) = delete;

  /// One optimizer step (collective): compute_step() then apply_step(). On CUDA nothing
  /// inside it waits for the device: the loss and the gradient norm stay there (summed over
  /// the ranks there, by NCCL) until the optimizer step is enqueued (its kernel clips with
  /// the norm where it is), and are read once at the end.
  StepStats step();
  /// The forward, backward and gradient synchronisation of the next step; nothing is
  /// updated, so it can be dropped and computed again (elastic data parallelism).
  StepStats compute_step();
  /// The optimizer step with what compute_step() returned; counts the step.
  void apply_step(StepStats& s);
  /// Elastic data parallelism: from now on this replica computes the share of replica
  /// `position` of `replicas` live ones that the batch source gives (BatchSource::set_replica;
  /// collective over the pipeline group the first time a share's micro-batch count is used:
  /// its schedule's executor is built). ConfigError when the global batch has fewer
  /// micro-batches than replicas.
  void set_replica(std::int64_t position, std::int64_t replicas);
  /// This rank's state dict (state_dict.hpp): with `gather_moments` its moments are gathered
  /// (collective over the gradient group), else zero, to be filled, committed, and followed
  /// by set_progress() (elastic healing).
  std::unique_ptr<StateDict> state_dict(bool gather_moments);
  /// Steps done and optimizer updates done, set after the state was copied from a peer.
  void set_progress(std::int64_t steps, std::int64_t adam_steps);
  GradSync& grad_sync() { return sync_; }
  const GradSync& grad_sync() const { return sync_; }
  Optimizer& optimizer() { return optimizer_; }
  /// Steps done so far.
  std::int64_t steps_done() const { return step_; }
  /// The learning rate of step `step` (0-based): the options' schedule (lr_schedule.hpp).
  double lr_at(std::int64_t step) const;
  /// Mean loss over `batches` evaluation batches (global batches of the evaluation
  /// stream), without updating (collective). The same batches at every call: batch b is
  /// batch b of the evaluation stream of the held-out data when set_eval_data() gave some,
  /// else of the training data.
  double evaluate(std::int64_t batches);
  /// Held-out data for evaluate(), read by every layout as the training data is. ConfigError
  /// when its vocabulary is not the model's or it cannot give sequences of --seq tokens.
  void set_eval_data(std::unique_ptr<model::DataSource> data);
  /// The held-out data, or nullptr.
  const model::DataSource* eval_data() const { return eval_data_.get(); }

  /// Writes checkpoint directory `dir` (model/checkpoint_dir.hpp, parallel/checkpoint_io.hpp;
  /// collective). IoError on every rank when any rank fails (the previous checkpoint then
  /// stays). With `keep` > 1 the previous checkpoint is kept beside it (--keep).
  void save(const std::string& dir, int keep = 1);
  /// Starts a save of the current state that a thread writes while training goes on
  /// (collective: the state is copied first); finish it with BackgroundSave::try_finish()
  /// or finish() before the next save.
  std::unique_ptr<BackgroundSave> save_in_background(const std::string& dir, int keep = 1);
  /// Restores a checkpoint directory written under any layout. Collective. ConfigError
  /// naming every difference when it was written by another model or data, or when `path`
  /// is a single-file checkpoint (with the command that converts it); IoError naming the
  /// file when it is incomplete or corrupt. Returns what the manifest says. `any_data`: the
  /// data it was trained on is not compared (evaluation).
  CheckpointInfo load(const std::string& path, bool any_data = false);

  /// The first local model chunk (the whole model without pipeline parallelism).
  model::Model& model() { return *model_.chunks.front(); }
  /// Every local model chunk, in local chunk order.
  const std::vector<std::unique_ptr<model::Model>>& chunks() const { return model_.chunks; }
  /// Blocks per pipeline chunk (pp * virtual stages entries).
  const std::vector<std::int64_t>& partition() const { return model_.plan.partition; }
  /// The schedule every step runs.
  const pp::PipelineSchedule& schedule() const { return executor_->schedule(); }
  /// Collective: gathers every rank's trace window to world rank 0, which analyses it and,
  /// when `trace_path` is not empty, writes it as Chrome trace-event JSON.
  PipelineReport pipeline_report(const std::string& trace_path);
  const model::DataSource& data() const { return batches_.data(); }
  const TrainOptions& options() const { return options_; }
  /// Tokens per step over all ranks (batch * seq).
  std::int64_t tokens_per_step() const { return options_.batch * options_.model.seq; }
  /// Micro-batches per step on each rank.
  std::int64_t microbatches() const { return model_.plan.batch.microbatches; }
  /// Bytes of parameters, gradients, optimizer state and activations on this rank.
  MemoryBytes memory() const;
  const Mesh& mesh() const { return groups_.mesh(); }
  /// The optimizer (its offload counters among others).
  const Optimizer& optimizer() const { return optimizer_; }

 private:
  model::CheckpointLayout checkpoint_layout() const;
  CheckpointInfo checkpoint_info() const;
  // compute_step(), leaving the loss and the norm pending where GradSync can
  // (sums_) for apply_step to clip with and read.
  StepStats compute_step(bool leave_sums_pending);

  TrainOptions options_;
  ProcessGroups& groups_;
  RankModel model_;
  BatchSource batches_;
  std::unique_ptr<model::DataSource> eval_data_;  // held-out data for evaluate(); null: the training data's
  GradSync sync_;
  Optimizer optimizer_;
  std::unique_ptr<pp::Executor> executor_;
  pp::Executor* active_ = nullptr;  // the executor of the step: executor_, or shares_'s
  std::map<std::int64_t, std::unique_ptr<pp::Executor>> shares_;  // elastic: by micro-batch count
  pp::TraceRecorder trace_;
  int pipeline_ = 0;  // this rank's pipeline (its pp group's color), for the trace
  std::int64_t step_ = 0, first_step_ = 0;
  StepSums sums_;  // what compute_step left for apply_step (pending, or the norm)
  std::vector<double> expert_load_;  // the step's summed routing loads, for apply_step's router biases
  // Mixture of experts: the step's auxiliary loss and loads from the chunks, summed over the
  // world, into s (and expert_load_).
  void take_moe_sums(StepStats& s);
};

}  // namespace ndmesh::parallel
