// Trainer: the parallel training runtime. A layout of size 1 in every dim is the serial
// run, so `ndmesh train` without a launcher and with one is the same code.
//
// One step s, data flowing down (ARCHITECTURE.md, "Parallel training"):
//  1. the global batch of step s is a pure function of (data seed, s, sequence index);
//  2. dp picks this rank's contiguous slice of sequences; --micro-batch cuts it into
//     micro-batches whose gradients accumulate locally (no reduction until the last);
//  3. each micro-batch runs forward and backward; every token's loss weighs
//     1 / (global tokens), so the gradients summed over micro-batches and ranks are those
//     of the mean loss over the whole global batch, whatever the layout;
//  4. the GradReducer sums gradients over the dp group in buckets overlapped with the
//     backward (ZeRO: reduce-scatter to shards);
//  5. the gradient norm is global (summed over every shard), then AdamW with clipping at
//     the step's learning rate (ZeRO: on the shard, then the parameters are gathered).
// Pipeline parallelism runs every step's micro-batches through pp::Executor, which walks
// the stage's list of a PipelineSchedule; pp = 1 is the same executor with a one-stage
// schedule (forward and backward of each micro-batch in turn). A rank holds one Gpt per
// local model chunk (blocks from the one partition function the planner also uses), each
// with its own reducer and optimizer; a tied token embedding held by the first and the
// last stage has its gradient summed over the embedding group.
// Context parallelism (--cp) splits each sequence: a cp rank keeps its positions of every
// sequence of its dp slice (zigzag or contiguous chunks, parallel/cp/ring_attention.hpp),
// runs the model on those tokens with RingAttention as the attention core, and the
// GradReducer (and the loss sum) work over the dp-cp group instead of dp.
// Tensor parallelism builds the model over the mesh's tp group (parallel/tp; the layers
// do the Megatron split), gathers the gradient norm over tp (sharded parameters count on
// every tp rank, replicated ones once). Checkpoints are directories of shard files with a
// manifest of the logical model (model/checkpoint_dir.hpp): any layout reads any other's.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ndmesh/comm/process_groups.hpp"
#include "ndmesh/config/config.hpp"
#include "ndmesh/model/checkpoint_dir.hpp"
#include "ndmesh/model/data.hpp"
#include "ndmesh/model/gpt.hpp"
#include "ndmesh/nn/adamw.hpp"
#include "ndmesh/parallel/cp/ring_attention.hpp"
#include "ndmesh/parallel/dp/grad_reducer.hpp"
#include "ndmesh/parallel/tp/tp_comm.hpp"
#include "ndmesh/parallel/pp/executor.hpp"
#include "ndmesh/parallel/pp/simulate.hpp"

namespace ndmesh::parallel {

/// How the pipeline runs (used when the mesh has pp > 1; pp = 1 runs a one-stage schedule).
struct PipelineOptions {
  Schedule schedule = Schedule::k1F1B;  ///< --schedule
  std::int64_t virtual_stages = 1;      ///< --virtual-stages: chunks per rank (interleaved)
  std::string layers;                   ///< --pp-layers "3,3,2": blocks per chunk; empty: balanced
  double timeout_s = 0;                 ///< point-to-point timeout; 0: NDMESH_TIMEOUT_S
  std::string drop_action;              ///< test hook "STAGE:INDEX": that stage skips that action
};

/// Options of a training run.
struct TrainOptions {
  ModelSpec model;
  std::int64_t batch = 8;        ///< global batch: sequences per step over all ranks
  std::int64_t micro_batch = 0;  ///< sequences per micro-batch per dp rank; 0: the whole local batch
  std::int64_t steps = 100;      ///< total steps of the run (the schedule's length)
  double lr = 3e-3;              ///< peak learning rate
  std::int64_t warmup = 0;       ///< linear warmup steps
  double min_lr_ratio = 0.1;     ///< the cosine decays to lr * min_lr_ratio at `steps`
  nn::AdamWOptions adamw;
  std::uint64_t seed = 1;  ///< model initialisation seed
  DataParallelOptions dp;
  PipelineOptions pp;
  CpLayout cp_layout = CpLayout::kZigzag;  ///< which chunks of each sequence a cp rank holds
  /// With tp > 1: norms and residuals hold 1/tp of the tokens (--sequence-parallel).
  bool sequence_parallel = false;
  /// Activation recomputation (--recompute; see nn::Recompute): the same losses bit for bit.
  nn::Recompute recompute = nn::Recompute::kNone;
};

/// What the pipeline measured over the steps so far (filled on world rank 0 only).
struct PipelineReport {
  bool valid = false;
  double bubble_measured =
      0;  ///< idle share of stage time, mean over pipelines and steps (first step left out)
  double bubble_simulated = 0;  ///< simulate() of the schedule with the measured mean costs
  double bubble_simulated_stages = 0;  ///< the same with each stage's own measured costs
  pp::Costs costs;  ///< measured mean forward / backward-input / backward-weight of a stage, seconds
  std::vector<int> peak_activations;           ///< per stage: most live micro-batch activations (chunks)
  std::vector<int> expected_peak_activations;  ///< per stage: the schedule's (simulate())
  std::int64_t events = 0;                     ///< actions recorded
};

/// What one step did (the same numbers on every rank).
struct StepStats {
  std::int64_t step = 0;  ///< 1-based index of the step just done
  double loss = 0;        ///< mean loss over the global batch, before the update
  double grad_norm = 0;   ///< global, before clipping
  double lr = 0;
  double seconds = 0;               ///< wall time of the step on this rank
  double comm_seconds = 0;          ///< first bucket start to last bucket done (see GradReducer)
  double exposed_comm_seconds = 0;  ///< the part the step waited for
  std::int64_t grad_comm_bytes = 0;  ///< gradient bytes this rank handed to the dp reductions
  TpCommStats tp_comm;              ///< what the step moved over the tp group (this rank)
};

/// Bytes one rank holds.
struct MemoryBytes {
  double params = 0;
  double grads = 0;      ///< gradients kept between micro-batches (ZeRO-2: the shard)
  double optimizer = 0;  ///< AdamW moments (ZeRO 1/2: the shard)
  /// Measured: the bytes of the micro-batch activations alive at once at this rank's peak
  /// (the pipeline executor's GptActivations of every chunk) plus the recompute workspace.
  double activations = 0;
  /// Buffers beside them that hold nothing kept for the backward: the all-gathered norm
  /// outputs under sequence parallelism (gathered again in the backward), a stage's output
  /// before it is sent (full recompute: the recomputed block's output) and its input
  /// gradient before it is sent back.
  double activation_buffers = 0;
  double grad_workspace = 0;  ///< ZeRO-2: the full-size buffer the backward writes into
};

/// The runtime of one rank: mesh, groups, model shard, data slice, reductions, optimizer.
class Trainer {
 public:
  /// ConfigError when the options or the layout are not usable (a dim that is not
  /// implemented yet, a batch the layout does not divide, a bad model spec...).
  /// Collective over groups.world().
  Trainer(TrainOptions options, std::unique_ptr<model::DataSource> data, ProcessGroups& groups);

  /// One optimizer step (collective).
  StepStats step();
  /// Steps done so far.
  std::int64_t steps_done() const { return step_; }
  /// The learning rate of step `step` (0-based).
  double lr_at(std::int64_t step) const;
  /// Mean loss over `batches` evaluation batches (global batches of the evaluation
  /// stream), without updating (collective).
  double evaluate(std::int64_t batches);

  /// Writes checkpoint directory `dir` (model/checkpoint_dir.hpp; collective): the rank
  /// at dp = cp = 0 of each (stage, tp rank) writes its shard file, rank 0 the manifest,
  /// then the directory replaces the previous one in one rename. IoError on every rank
  /// when any rank fails (the previous checkpoint then stays).
  void save(const std::string& dir);
  /// Restores a checkpoint directory written under any layout (each rank reads the
  /// slices of its parameters), or a single-file checkpoint (format 2, pp = 1 only).
  /// Collective. ConfigError naming every difference when it was written by another
  /// model or data; IoError naming the file when it is incomplete or corrupt.
  void load(const std::string& path);

  /// The first local model chunk (the whole model without pipeline parallelism).
  model::Gpt& model() { return *chunks_.front(); }
  /// Every local model chunk, in local chunk order.
  const std::vector<std::unique_ptr<model::Gpt>>& chunks() const { return chunks_; }
  /// Blocks per pipeline chunk (pp * virtual stages entries).
  const std::vector<std::int64_t>& partition() const { return partition_; }
  /// The schedule every step runs.
  const pp::PipelineSchedule& schedule() const { return executor_->schedule(); }
  /// Collective: gathers every action's timing to world rank 0, which computes the report
  /// and, when `trace_path` is not empty, writes them as Chrome trace-event JSON.
  PipelineReport pipeline_report(const std::string& trace_path);
  const model::DataSource& data() const { return *data_; }
  const TrainOptions& options() const { return options_; }
  /// Tokens per step over all ranks (batch * seq).
  std::int64_t tokens_per_step() const { return options_.batch * options_.model.seq; }
  /// Micro-batches per step on each rank.
  std::int64_t microbatches() const { return microbatches_; }
  /// Bytes of parameters, gradients, optimizer state and activations on this rank.
  MemoryBytes memory() const;
  const Mesh& mesh() const { return groups_.mesh(); }

 private:
  // Cuts the model into chunks, builds this rank's chunks, reducers, optimizers and executor.
  void build_pipeline(std::int64_t micro, std::int64_t local_seq);
  // Sum over the gradient group (dp-cp) of a few doubles (in place).
  void sum_over_dp(std::span<double> values);
  // Squared gradient norm of what this rank owns of local chunk `chunk`: its shard of dp
  // (ZeRO), of which the tp-sharded parameters and, on tp rank 0 only, the replicated ones.
  double owned_grad_square_sum(std::size_t chunk) const;
  // Calls f(gradients, count, offset in the table) for each run of the token table's
  // reduced gradient that this rank owns in local chunk c (all of it without ZeRO; the
  // shard's part with ZeRO: in the flat buffer for stage 1, the shard buffer for stage 2).
  void for_each_owned_table_grad(std::size_t c, const std::function<void(float*, std::int64_t, std::int64_t)>& f);
  // Sums the token table's gradient of local chunk c over the embedding group (the tied
  // copies of the first and the last stage).
  void sum_tied_table(std::size_t c);
  // ConfigError naming every difference between a checkpoint's model and data and the run's.
  void check_matches(const std::string& path, const ModelSpec& spec, const std::string& data) const;
  // Single-file checkpoints (format 2, the logical flat buffer).
  void load_file(const std::string& path);
  // Throws on every rank when `error` is set on any (collective over the world): the
  // failing ranks rethrow theirs, the others say that another rank failed.
  void agree(const std::exception_ptr& error, const std::string& what);
  // Local chunk c's AdamW moments laid out like its flat buffer, ZeRO shards gathered
  // (collective over the gradient group); and back into the optimizer's segments.
  void full_moments(std::size_t c, std::vector<float>& m, std::vector<float>& v);
  void set_moments(std::size_t c, const std::vector<float>& m, const std::vector<float>& v);
  model::CheckpointLayout checkpoint_layout() const;
  // A buffer in the logical (serial) layout -> this rank's slices in its flat layout.
  void from_logical(const std::vector<float>& logical, std::span<float> local) const;
  // Fetches the micro-batch of sequences [first, first + count) of `stream` and keeps
  // this cp rank's positions of each in tokens_ / targets_.
  void load_batch(std::uint64_t stream, std::int64_t index, std::int64_t first, std::int64_t count);

  TrainOptions options_;
  std::unique_ptr<model::DataSource> data_;
  ProcessGroups& groups_;
  comm::Communicator dp_;
  std::int64_t dp_rank_ = 0, dp_size_ = 1;
  comm::Communicator tp_;
  std::shared_ptr<TpCommStats> tp_stats_ = std::make_shared<TpCommStats>();
  std::unique_ptr<CommunicatorTpComm<double>> tp_double_;
  std::int64_t local_batch_ = 0, microbatches_ = 1;
  comm::Communicator pp_, embedding_;
  int stage_ = 0, stages_ = 1;
  std::vector<std::int64_t> partition_;
  std::vector<std::unique_ptr<model::Gpt>> chunks_;  // local chunks
  std::vector<std::unique_ptr<GradReducer>> reducers_;
  std::vector<std::unique_ptr<nn::AdamW<float>>> adams_;
  std::unique_ptr<pp::Executor> executor_;
  int tied_copy_chunk_ = -1;   // local chunk holding the token table for a tied head on another rank
  int tied_main_chunk_ = -1;   // local chunk holding the embedding whose table is tied to a remote head
  std::vector<double> trace_;  // 8 doubles per action: pipeline, stage, step, kind, mb, chunk, start, end
  comm::Communicator grad_;  // dp-cp: parameters are replicated over it, gradients summed
  std::int64_t grad_size_ = 1, cp_size_ = 1;
  std::vector<std::int64_t> positions_;  // this cp rank's positions of each sequence
  std::shared_ptr<RingAttention<float>> ring_;
  std::vector<std::int32_t> full_tokens_, full_targets_;
  std::vector<std::int32_t> tokens_, targets_;
  std::int64_t step_ = 0;
};

/// Every layout problem the runtime has with `mesh` before building anything: dims it
/// does not implement yet (one line each naming the dim, its size and the fix).
std::vector<std::string> unsupported_layout(const Mesh& mesh);

}  // namespace ndmesh::parallel
