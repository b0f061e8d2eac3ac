// The rules a training run must meet on a layout: one set, checked by the Trainer, by
// `ndmesh train` before it builds anything, by `ndmesh mesh --config` (through problems())
// and by the planner's search, so `ndmesh plan` never ranks a layout `ndmesh train` refuses.
//
// They cover what the model and the options ask of the layout: the batch split over dp and
// micro-batches; tensor parallelism splitting heads, kv heads, the MLP width and the
// vocabulary; sequence parallelism splitting a micro-batch's token rows; context
// parallelism cutting each sequence into equal chunks; the pipeline schedule, its virtual
// stages and micro-batch count, a block for every chunk, and the executor's limits. Each
// problem is one line naming the flag (`ndmesh train`'s name; `ndmesh plan` and `ndmesh
// schedule` accept the same names), the value and the fix.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ndmesh/config/config.hpp"

namespace ndmesh {

/// The most pipeline stages the schedule generator and executor take (their state grows
/// with pp^2; pp = 1000 took 680 MB and 6 s).
inline constexpr std::int64_t kMaxPipelineStages = 256;
/// The most pp x micro-batches x virtual stages of one step's schedule.
inline constexpr std::int64_t kMaxPipelineWork = 1'000'000;
/// The highest ZeRO stage `ndmesh train` implements (optimizer states, gradients and
/// parameters sharded).
inline constexpr int kMaxTrainZero = 3;

/// A memory strategy (`--memory NAME`, `memory = "NAME"` in [training]): the concrete
/// flags it stands for. basic: nothing; standard: selective recompute; aggressive: full
/// recompute + ZeRO 2; extreme: full recompute + ZeRO 3 + the optimizer state offloaded to
/// disk. A flag given explicitly wins over the strategy's value.
struct MemoryStrategy {
  std::string_view name;
  std::string_view recompute;  ///< --recompute: none, selective or full
  int zero = 0;                ///< --zero
  bool offload = false;        ///< --offload optimizer
};
/// The strategy of `name`; ConfigError naming `flag`, the value and the names otherwise.
MemoryStrategy memory_strategy(std::string_view name, std::string_view flag = "--memory");

/// A training run as `ndmesh train` runs it: the sizes of the standard dims and the options
/// whose rules involve the layout or the model.
struct TrainingRun {
  std::int64_t dp = 1, cp = 1, tp = 1, pp = 1;
  std::int64_t vpp = 1;  ///< virtual stages per pipeline rank (--vpp, alias --virtual-stages)
  Schedule schedule = Schedule::k1F1B;
  std::int64_t global_batch = 0;  ///< sequences per step (--global-batch, alias --batch)
  std::int64_t micro_batch = 0;   ///< sequences per micro-batch; 0: the whole local batch
  bool sequence_parallel = false;
  bool recompute = false;      ///< any activation recompute (selective or full)
  int zero = 0;                ///< ZeRO stage over dp (ndmesh train: 0 to 3)
  bool cp_contiguous = false;  ///< --cp-layout contiguous: cp chunks (default zigzag: 2 cp)
  /// Entries of an explicit --pp-layers partition (0: the balanced partition, which needs
  /// layers >= pp x vpp); parse_partition() (config/partition.hpp) checks an explicit one.
  std::int64_t pp_layers_entries = 0;
};

/// The run of a ParallelConfig (sizes of dp, cp, tp, pp; its schedule, vpp, batches and
/// sequence parallelism); -1 sizes count as 1.
TrainingRun training_run(const ParallelConfig& config);

/// Every problem of `run` (and of `model` on it, when given), one line each; empty when
/// `ndmesh train` runs it. The model's own shape rules are model_problems(); these are the
/// rules of running it on the layout. No exceptions: the planner calls it per layout.
std::vector<std::string> training_problems(const TrainingRun& run, const ModelSpec* model = nullptr);

/// The ZeRO stages `ndmesh train` runs (0 to kMaxTrainZero): empty, or the one line.
/// training_problems() and the data-parallel options' check both ask it.
std::vector<std::string> zero_problems(int zero);

/// Tensor-parallel rules of the model alone: tp divides the heads, the kv heads (split, not
/// replicated: each rank holds whole groups of query heads), the MLP width and the
/// vocabulary; with sequence parallelism the `rows` token rows of a micro-batch.
std::vector<std::string> tp_problems(const ModelSpec& model, std::int64_t tp, bool sequence_parallel,
                                     std::int64_t rows);

/// Context-parallel rule: a sequence splits into 2 cp equal chunks (zigzag) or cp
/// (contiguous).
std::vector<std::string> cp_chunk_problems(std::int64_t seq, std::int64_t cp, bool contiguous);

}  // namespace ndmesh
