// Learning-rate schedules (parallel/lr_schedule.hpp) against their closed forms: the warmup,
// the endpoints of each decay, WSD's stable phase and its start, and the cosine of every
// earlier ndmesh unchanged bit for bit.
#include <cmath>
#include <numbers>

#include <gtest/gtest.h>

#include "ndmesh/parallel/lr_schedule.hpp"

namespace ndmesh::parallel {
namespace {

LrScheduleOptions opts(LrSchedule s) {
  return {.schedule = s, .lr = 1.0, .warmup = 10, .steps = 110, .min_lr_ratio = 0.1, .decay_fraction = 0.2};
}

TEST(LrSchedule, WarmupIsTheSameForEvery) {
  for (LrSchedule s : {LrSchedule::kCosine, LrSchedule::kLinear, LrSchedule::kWsd, LrSchedule::kConstant})
    for (std::int64_t step = 0; step < 10; ++step)
      EXPECT_DOUBLE_EQ(learning_rate(opts(s), step), (step + 1) / 10.0) << lr_schedule_name(s);
}

TEST(LrSchedule, CosineIsTheEarlierFormula) {
  const LrScheduleOptions o = opts(LrSchedule::kCosine);
  for (std::int64_t step = 10; step < 200; ++step) {
    const double p = std::min(1.0, static_cast<double>(step - 10) / 100.0);
    EXPECT_EQ(learning_rate(o, step), 0.1 + 0.9 * 0.5 * (1.0 + std::cos(std::numbers::pi * p))) << step;
  }
}

TEST(LrSchedule, LinearAndConstant) {
  EXPECT_DOUBLE_EQ(learning_rate(opts(LrSchedule::kLinear), 10), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(opts(LrSchedule::kLinear), 60), 0.55);
  EXPECT_DOUBLE_EQ(learning_rate(opts(LrSchedule::kLinear), 110), 0.1);
  EXPECT_DOUBLE_EQ(learning_rate(opts(LrSchedule::kLinear), 500), 0.1);
  for (std::int64_t step : {10, 50, 109, 400})
    EXPECT_EQ(learning_rate(opts(LrSchedule::kConstant), step), 1.0);
}

TEST(LrSchedule, WsdIsStableThenDecaysToTheFloorAtTheLastStep) {
  const LrScheduleOptions o = opts(LrSchedule::kWsd);
  EXPECT_EQ(wsd_decay_start(o), 88);  // 110 - round(0.2 * 110)
  for (std::int64_t step = 10; step < 88; ++step) EXPECT_EQ(learning_rate(o, step), 1.0) << step;
  EXPECT_DOUBLE_EQ(learning_rate(o, 88), 1.0 - 0.9 / 22);
  EXPECT_DOUBLE_EQ(learning_rate(o, 98), 1.0 - 0.9 * 11 / 22);
  EXPECT_DOUBLE_EQ(learning_rate(o, 109), 0.1);
  // A decay longer than what follows the warmup starts right after it.
  LrScheduleOptions all = o;
  all.decay_fraction = 1.0;
  EXPECT_EQ(wsd_decay_start(all), 10);
  EXPECT_DOUBLE_EQ(learning_rate(all, 109), 0.1);
}

TEST(LrSchedule, Names) {
  for (LrSchedule s : {LrSchedule::kCosine, LrSchedule::kLinear, LrSchedule::kWsd, LrSchedule::kConstant})
    EXPECT_EQ(parse_lr_schedule(lr_schedule_name(s)), s);
  EXPECT_FALSE(parse_lr_schedule("step").has_value());
}

}  // namespace
}  // namespace ndmesh::parallel
