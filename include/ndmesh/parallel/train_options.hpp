// The options of a training run: what `ndmesh train`'s flags set, and what parallelize(),
// the batch source, the gradient synchronisation and the trainer read.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ndmesh/config/config.hpp"
#include "ndmesh/nn/adamw.hpp"
#include "ndmesh/nn/block.hpp"
#include "ndmesh/parallel/cp/ring_attention.hpp"
#include "ndmesh/parallel/dp/grad_reducer.hpp"
#include "ndmesh/parallel/lr_schedule.hpp"
#include "ndmesh/parallel/pp/schedule.hpp"
#include "ndmesh/tensor/device.hpp"

namespace ndmesh::parallel {

/// How the pipeline runs (used when the mesh has pp > 1; pp = 1 runs a one-stage schedule).
struct PipelineOptions {
  Schedule schedule = Schedule::k1F1B;  ///< --schedule
  std::int64_t virtual_stages = 1;      ///< --virtual-stages: chunks per rank (interleaved)
  std::string layers;                   ///< --pp-layers "3,3,2": blocks per chunk; empty: balanced
  double timeout_s = 0;                 ///< point-to-point timeout; 0: NDMESH_TIMEOUT_S
  std::string drop_action;              ///< test hook "STAGE:INDEX": that stage skips that action
  std::int64_t trace_steps = 32;        ///< --trace-steps: the pipeline trace keeps the last this many steps
};

/// Arithmetic of a run: fp32 everywhere (the CPU reference and its CUDA twin), or bf16 mixed
/// precision at the matrix products: the linears and the LM head take their operands rounded
/// to bfloat16 and accumulate in fp32 (ModelPlan::matmul); weights, AdamW state, activations,
/// the attention core, reductions and the loss stay fp32. (bf16 activation storage is the
/// next step.)
enum class Precision { kFp32, kBf16 };
/// "fp32", "bf16".
const char* precision_name(Precision p);

/// What lives in files instead of memory (--offload): nothing, or the optimizer state (the
/// AdamW moments of what the rank updates; in fp32 the parameters are their own master
/// copy). The parameters too (optimizer+params): the ZeRO-3 shard of the parameters, which
/// needs ZeRO-3 over a gradient group of 2 or more. With --device cuda, optimizer moves the
/// moments and an fp32 master copy to pinned host memory instead (ZeRO-Offload; no files).
enum class Offload { kNone, kOptimizer, kOptimizerParams };
/// "none", "optimizer", "optimizer+params".
const char* offload_name(Offload o);
/// The mode of a --offload value, or nullopt.
std::optional<Offload> parse_offload(std::string_view text);

/// Where the offloaded state lives: --offload and --offload-dir.
struct OffloadOptions {
  Offload what = Offload::kNone;
  std::string dir;                  ///< the folder of the state files (one per rank and model chunk)
  std::int64_t chunk_elements = 0;  ///< elements per streamed chunk; 0: nn::OffloadFile's default
};

/// Options of a training run.
struct TrainOptions {
  ModelSpec model;
  std::int64_t batch = 8;        ///< global batch: sequences per step over all ranks
  std::int64_t micro_batch = 0;  ///< sequences per micro-batch per dp rank; 0: the whole local batch
  std::int64_t steps = 100;      ///< total steps of the run (the schedule's length)
  double lr = 3e-3;              ///< peak learning rate
  std::int64_t warmup = 0;       ///< linear warmup steps
  double min_lr_ratio = 0.1;     ///< the decay ends at lr * min_lr_ratio at `steps`
  LrSchedule lr_schedule = LrSchedule::kCosine;  ///< --lr-schedule (parallel/lr_schedule.hpp)
  double decay_fraction = 0.2;   ///< --decay-fraction: wsd's final decay, a share of `steps`
  nn::AdamWOptions adamw;
  std::uint64_t seed = 1;  ///< model initialisation seed
  DataParallelOptions dp;
  PipelineOptions pp;
  CpLayout cp_layout = CpLayout::kZigzag;  ///< which chunks of each sequence a cp rank holds
  /// Expert parallelism of a MoE model (--ep), folded into dp x cp: each expert runs on one
  /// rank of every expert group of ep ranks, which exchange tokens (ParallelConfig::folded_ep).
  std::int64_t ep = 1;
  /// With tp > 1: norms and residuals hold 1/tp of the tokens (--sequence-parallel).
  bool sequence_parallel = false;
  /// Activation recomputation (--recompute; see nn::Recompute): the same losses bit for bit.
  nn::Recompute recompute = nn::Recompute::kNone;
  /// Where the model runs (--device): the CPU reference, or one GPU per rank.
  Device device = Device::kCpu;
  Precision precision = Precision::kFp32;  ///< --precision
  OffloadOptions offload;                  ///< --offload, --offload-dir

  /// What the learning-rate schedule depends on.
  LrScheduleOptions lr_schedule_options() const {
    return {.schedule = lr_schedule,
            .lr = lr,
            .warmup = warmup,
            .steps = steps,
            .min_lr_ratio = min_lr_ratio,
            .decay_fraction = decay_fraction};
  }
};

/// Every problem with the values of `options` that no layout changes (one line each naming
/// the flag, the value and the fix): the steps, learning-rate schedule, AdamW, micro-batch,
/// data-parallel and pipeline options. The layout-dependent rules (what divides what) are
/// checked by parallelize(). `ndmesh train` calls this before it starts, parallelize() again.
std::vector<std::string> train_option_problems(const TrainOptions& options);

}  // namespace ndmesh::parallel
