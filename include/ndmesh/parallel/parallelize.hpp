// parallelize: (options, process groups) -> the model chunks this rank runs.
//
// A layout is a view of one logical model (docs/internals/runtime.md). A
// ModelPlan starts as the serial model over this rank's batch layout, and one ordered
// transformation per strategy edits it, each in its strategy's folder and each validating
// its own options (a ConfigError naming the flag, the value and the fix), in the spirit of
// torchtitan's parallelize_* functions:
//   1. tensor parallelism (parallel/tp/apply.cpp): the tp group every layer splits over,
//      sequence parallelism;
//   2. context parallelism (parallel/cp/apply.cpp): ring attention as the attention core;
//      then expert parallelism (parallel/ep/apply.cpp): the MoE layers' expert group, folded
//      into dp x cp;
//   3. pipeline parallelism (parallel/pp/apply.cpp): the partition of the blocks into
//      chunks, the schedule, which chunks this rank holds;
//   4. data parallelism (parallel/dp/apply.cpp): the gradient group (dp, or dp x cp) and the
//      ZeRO padding of the flat buffers;
//   5. activation recompute (parallel/recompute.cpp);
//   6. the device (parallel/device.cpp): where the chunks run, and what a GPU run supports.
// Then one model chunk per local chunk plan is built (model::build over its unit range). Adding a strategy adds a
// transformation and the fields it sets; it edits no other strategy's code.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ndmesh/comm/process_groups.hpp"
#include "ndmesh/model/model.hpp"
#include "ndmesh/parallel/batch_source.hpp"
#include "ndmesh/parallel/cp/ring_attention.hpp"
#include "ndmesh/parallel/ep/ep_comm.hpp"
#include "ndmesh/parallel/pp/schedule.hpp"
#include "ndmesh/parallel/tp/tp_comm.hpp"
#include "ndmesh/parallel/train_options.hpp"

namespace ndmesh::parallel {

/// One local model chunk: virtual stage `virtual_stage`, blocks [first_block, last_block).
struct ChunkPlan {
  int virtual_stage = 0;
  std::int64_t first_block = 0, last_block = 0;
};

/// What the transformations decide; the serial model before any of them.
struct ModelPlan {
  ModelSpec spec;
  std::uint64_t seed = 1;
  BatchLayout batch;  ///< the rows each chunk runs: micro_batch x local_seq
  /// The weight of each token's loss in the gradient: 1 / (global batch tokens), so the
  /// gradients summed over micro-batches and ranks are those of the mean over the batch.
  double loss_weight = 1;

  // Tensor parallelism: the group the layers split over (default: of one), counted.
  nn::TpContext<float> tp;
  std::shared_ptr<TpCommStats> tp_stats = std::make_shared<TpCommStats>();
  // Context parallelism: the ring that is the blocks' attention core with cp > 1 (nullptr:
  // the local kernel on the local rows); its stats count what it sends.
  std::shared_ptr<RingAttention<float>> ring;
  // Expert parallelism: the MoE layers' expert group (nullptr: of one), its stats.
  std::shared_ptr<nn::EpComm> ep;
  std::shared_ptr<EpCommStats> ep_stats = std::make_shared<EpCommStats>();
  /// The expert-data-parallel group (the ranks that hold the same experts: what remains of
  /// dp x cp once ep is folded out); of one without expert parallelism.
  comm::Communicator expert_data;
  /// Each rank stores only its E/ep experts (model::ModelOptions::shard_experts), whose
  /// gradients GradSync sums over expert_data; not under ZeRO-3, which gathers the serial
  /// layout (every rank stores every expert there).
  bool shard_experts = false;
  // Pipeline parallelism: blocks per virtual stage, the schedule, this rank's chunks.
  std::vector<std::int64_t> partition;
  pp::PipelineSchedule schedule;
  std::vector<ChunkPlan> chunks;
  comm::Communicator pp;  ///< the pipeline group (of one without pipeline parallelism)
  /// The schedule splits backwards into input and weight halves: each micro-batch's
  /// activations keep what the deferred weight half reads (model::ActivationOptions).
  bool split_backward = false;
  // Data parallelism: the group replicated parameters' gradients are summed over.
  comm::Communicator grad_group;
  /// How the chunks' flat buffers are laid out and placed: padded to equal ZeRO shards
  /// (pad_to), unit by unit for ZeRO 2/3 (pad_units), and on a GPU in mappable memory for
  /// ZeRO-3's parameters and ZeRO 2/3's per-unit gradient work space (GradReducer::
  /// own_workspace gives their chunks back unit by unit).
  StoreOptions store;
  /// A block's closing add left to the next norm (model::ModelOptions::fuse_closing_add):
  /// not where ZeRO 2/3 give a unit's parameters back after its block.
  bool fuse_closing_add = true;
  // Activation recompute.
  nn::Recompute recompute = nn::Recompute::kNone;
  // Where the chunks run.
  Device device = Device::kCpu;
  // The operands of the linears' and the head's products (--precision bf16: bfloat16).
  MatmulPrecision matmul = MatmulPrecision::kFp32;
};

/// This rank's part of the model: the plan and one model chunk per local chunk.
struct RankModel {
  ModelPlan plan;
  std::vector<std::unique_ptr<model::Model>> chunks;
};

/// Every layout problem the runtime has with `mesh` before building anything: dims it
/// does not implement yet (one line each naming the dim, its size and the fix).
std::vector<std::string> unsupported_layout(const Mesh& mesh);

/// Plans and builds this rank's model chunks for `options` over `groups` (collective over
/// the world: groups are created on first use). ConfigError naming the flag, the value and
/// the fix for any option or layout the runtime cannot run.
RankModel parallelize(const TrainOptions& options, ProcessGroups& groups);

// The transformations, in the order parallelize() applies them; each is defined in its
// strategy's folder and sets only its own fields of the plan.
void apply_tensor_parallel(ModelPlan& plan, ProcessGroups& groups, const TrainOptions& options);
void apply_context_parallel(ModelPlan& plan, ProcessGroups& groups, const TrainOptions& options);
void apply_expert_parallel(ModelPlan& plan, ProcessGroups& groups, const TrainOptions& options);
void apply_pipeline_parallel(ModelPlan& plan, ProcessGroups& groups, const TrainOptions& options);
void apply_data_parallel(ModelPlan& plan, ProcessGroups& groups, const TrainOptions& options);
void apply_recompute(ModelPlan& plan, const TrainOptions& options);
void apply_device(ModelPlan& plan, ProcessGroups& groups, const TrainOptions& options);

/// The world that a run on `device` makes its groups from: `world` itself on the CPU or on
/// one rank; on several GPU ranks a device communicator over it (NCCL; with NDMESH_BACKEND=mpi
/// or gloo, that backend with device buffers staged through pinned host memory), whose
/// splits and duplicates carry device buffers too (docs/gpu.md). ConfigError where this
/// ndmesh has no such communicator.
comm::Communicator device_communicator(const comm::Communicator& world, Device device);

/// One model chunk per chunk of the plan (the chunks of a rank share one recompute workspace).
std::vector<std::unique_ptr<model::Model>> build_chunks(const ModelPlan& plan);

}  // namespace ndmesh::parallel
