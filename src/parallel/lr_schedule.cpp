#include "ndmesh/parallel/lr_schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace ndmesh::parallel {

const char* lr_schedule_name(LrSchedule s) {
  switch (s) {
    case LrSchedule::kLinear:
      return "linear";
    case LrSchedule::kWsd:
      return "wsd";
    case LrSchedule::kConstant:
      return "constant";
    case LrSchedule::kCosine:
      break;
  }
  return "cosine";
}

std::optional<LrSchedule> parse_lr_schedule(std::string_view text) {
  for (LrSchedule s : {LrSchedule::kCosine, LrSchedule::kLinear, LrSchedule::kWsd, LrSchedule::kConstant})
    if (text == lr_schedule_name(s)) return s;
  return std::nullopt;
}

std::int64_t wsd_decay_start(const LrScheduleOptions& o) {
  const auto decay = static_cast<std::int64_t>(std::llround(o.decay_fraction * static_cast<double>(o.steps)));
  return std::max(o.warmup, o.steps - decay);
}

double learning_rate(const LrScheduleOptions& o, std::int64_t step) {
  if (step < o.warmup) return o.lr * static_cast<double>(step + 1) / static_cast<double>(o.warmup);
  const double floor = o.lr * o.min_lr_ratio;
  // The share of the decay done at `step`, for a decay over [from, o.steps).
  auto progress = [&](std::int64_t from) {
    const double span = static_cast<double>(std::max<std::int64_t>(1, o.steps - from));
    return std::clamp(static_cast<double>(step - from) / span, 0.0, 1.0);
  };
  switch (o.schedule) {
    case LrSchedule::kConstant:
      return o.lr;
    case LrSchedule::kLinear:
      return floor + (o.lr - floor) * (1.0 - progress(o.warmup));
    case LrSchedule::kWsd: {
      // The decay's steps start..steps-1 take q = 1/D .. 1: the last step is at lr_min.
      const std::int64_t start = wsd_decay_start(o);
      if (step < start) return o.lr;
      const double span = static_cast<double>(std::max<std::int64_t>(1, o.steps - start));
      return floor + (o.lr - floor) * (1.0 - std::min(1.0, static_cast<double>(step - start + 1) / span));
    }
    case LrSchedule::kCosine:
      break;
  }
  // (The cosine of every earlier ndmesh: its rates are bit for bit the same.)
  const double span = static_cast<double>(std::max<std::int64_t>(1, o.steps - o.warmup));
  const double p = std::min(1.0, static_cast<double>(step - o.warmup) / span);
  return floor + (o.lr - floor) * 0.5 * (1.0 + std::cos(std::numbers::pi * p));
}

}  // namespace ndmesh::parallel
