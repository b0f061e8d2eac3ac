// Learning-rate schedules: the rate of every step as a pure function of the step and the
// options, so a run resumed from a checkpoint (which records the step) continues the same
// curve. All four start with the same linear warmup, lr * (step + 1) / warmup over the first
// `warmup` steps (0-based step), then:
//
//   cosine    lr_min + (lr - lr_min) (1 + cos(pi p)) / 2,  p = (step - warmup) / (steps - warmup)
//   linear    lr_min + (lr - lr_min) (1 - p)
//   constant  lr
//   wsd       warmup, stable, decay (Hu et al. 2024, MiniCPM; Hagele et al. 2024): lr until the
//             last decay_fraction * steps steps, then linearly down to lr_min at the last step:
//             lr_min + (lr - lr_min) (1 - q), q = (step + 1 - start) / (steps - start),
//             start = max(warmup, steps - round(decay_fraction * steps))
//
// with lr_min = lr * min_lr_ratio and p, q clamped to [0, 1].
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace ndmesh::parallel {

/// --lr-schedule.
enum class LrSchedule { kCosine, kLinear, kWsd, kConstant };
/// "cosine", "linear", "wsd", "constant".
const char* lr_schedule_name(LrSchedule s);
/// The schedule of a --lr-schedule value, or nullopt.
std::optional<LrSchedule> parse_lr_schedule(std::string_view text);

/// What a schedule depends on (TrainOptions holds these).
struct LrScheduleOptions {
  LrSchedule schedule = LrSchedule::kCosine;
  double lr = 3e-3;             ///< peak
  std::int64_t warmup = 0;      ///< linear warmup steps
  std::int64_t steps = 100;     ///< the run's length (the schedule spans it whatever --until says)
  double min_lr_ratio = 0.1;    ///< the decays end at lr * min_lr_ratio
  double decay_fraction = 0.2;  ///< wsd: the share of `steps` the final decay takes
};

/// The learning rate of step `step` (0-based).
double learning_rate(const LrScheduleOptions& o, std::int64_t step);
/// wsd: the first step (0-based) of the final decay.
std::int64_t wsd_decay_start(const LrScheduleOptions& o);

}  // namespace ndmesh::parallel
