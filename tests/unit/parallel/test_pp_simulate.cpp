// The cost simulator: makespans worked out by hand for non-default costs and
// point-to-point time, and cost validation.
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/parallel/pp/schedule.hpp"
#include "ndmesh/parallel/pp/simulate.hpp"

namespace ndmesh::pp {
namespace {

PipelineSchedule make(Schedule kind, int p, int m, int v = 1) {
  return make_schedule({.schedule = kind, .stages = p, .microbatches = m, .chunks = v});
}

// Each stage with its own costs (a measured run with unequal stages): one micro-batch
// through two stages takes F0 + F1 + B1 + B0 by hand; equal stage costs give simulate().
TEST(PpSimulate, StageCostsByHand) {
  PipelineSchedule s = make_schedule({.schedule = Schedule::kGpipe, .stages = 2, .microbatches = 1});
  Simulation sim = simulate_stages(s, {Costs{.forward = 1, .backward_input = 1, .backward_weight = 1},
                                       Costs{.forward = 3, .backward_input = 2, .backward_weight = 2}});
  EXPECT_DOUBLE_EQ(sim.makespan, 1 + 3 + 4 + 2);
  EXPECT_DOUBLE_EQ(sim.busy[0], 3);
  EXPECT_DOUBLE_EQ(sim.busy[1], 7);
  PipelineSchedule g = make_schedule({.schedule = Schedule::k1F1B, .stages = 4, .microbatches = 8});
  const Costs c{.forward = 1.5, .backward_input = 2, .backward_weight = 0.5};
  EXPECT_DOUBLE_EQ(simulate_stages(g, std::vector<Costs>(4, c)).makespan, simulate(g, c).makespan);
  EXPECT_THROW(simulate_stages(g, std::vector<Costs>(3, c)), Error);
}

TEST(PpSimulate, GpipeMakespanWithAnyCosts) {
  // Forwards fill the pipe in (m+p-1) f, backwards drain it in (m+p-1)(b+w).
  for (double f : {0.5, 1.0, 2.0})
    for (double b : {1.0, 1.5})
      for (double w : {0.25, 1.0})
        for (int p : {1, 2, 4, 7})
          for (int m : {1, 3, 8}) {
            auto sim = simulate(make(Schedule::kGpipe, p, m),
                                {.forward = f, .backward_input = b, .backward_weight = w});
            EXPECT_NEAR(sim.makespan, (m + p - 1) * (f + b + w), 1e-9)
                << "f=" << f << " p=" << p << " m=" << m;
            EXPECT_NEAR(sim.bubble_fraction, (p - 1.0) / (m + p - 1), 1e-9);
          }
}

TEST(PpSimulate, OneFOneBMakespanWhenBackwardIsTwiceForward) {
  // With B+W = 2F every stage alternates F and B in lock-step: (m+p-1)(F+B+W).
  for (int p : {2, 3, 5})
    for (int m : {1, 4, 9}) {
      auto sim =
          simulate(make(Schedule::k1F1B, p, m), {.forward = 2, .backward_input = 3, .backward_weight = 1});
      EXPECT_NEAR(sim.makespan, (m + p - 1) * 6.0, 1e-9) << "p=" << p << " m=" << m;
    }
}

TEST(PpSimulate, PointToPointTimeByHand) {
  // p=2, m=1, p2p c: F(0) on 0 [0,1], send [1,1+c], F on 1 [1+c,2+c], B on 1 (cost 2)
  // [2+c,4+c], send [4+c,4+2c], B on 0 [4+2c,6+2c].
  for (double c : {0.0, 0.5, 3.0}) {
    auto sim = simulate(make(Schedule::k1F1B, 2, 1), {.p2p = c});
    EXPECT_NEAR(sim.makespan, 6 + 2 * c, 1e-12) << "c=" << c;
    // Busy 3 per stage out of 6+2c.
    EXPECT_NEAR(sim.bubble_fraction, 1 - 6.0 / (2 * (6 + 2 * c)), 1e-12);
    EXPECT_NEAR(sim.busy[0], 3.0, 1e-12);
    EXPECT_NEAR(sim.busy[1], 3.0, 1e-12);
  }
}

TEST(PpSimulate, InterleavedChunksCostAFractionOfAStage) {
  // Total compute per stage is m(F+B+W) whatever v is.
  auto sim = simulate(make(Schedule::kInterleaved, 4, 8, 2));
  for (double b : sim.busy) EXPECT_NEAR(b, 8 * 3.0, 1e-9);
  auto one = simulate(make(Schedule::k1F1B, 4, 8));
  EXPECT_LT(sim.makespan, one.makespan);
}

TEST(PpSimulate, SpansAreSequentialPerStage) {
  auto s = make(Schedule::kZbH1, 4, 8);
  auto sim = simulate(s, {.p2p = 0.25});
  for (int r = 0; r < 4; ++r) {
    double t = 0;
    for (const Span& span : sim.spans[r]) {
      EXPECT_GE(span.start, t - 1e-12);
      EXPECT_GE(span.end, span.start);
      t = span.end;
    }
    EXPECT_LE(t, sim.makespan + 1e-12);
  }
}

TEST(PpSimulate, SingleStageHasNoBubble) {
  for (Schedule k : {Schedule::kGpipe, Schedule::k1F1B, Schedule::kZbH1}) {
    auto sim = simulate(make(k, 1, 5));
    EXPECT_DOUBLE_EQ(sim.bubble_fraction, 0.0);
    EXPECT_DOUBLE_EQ(sim.makespan, 15.0);
  }
}

TEST(PpSimulate, BadCostsNameFieldAndFix) {
  auto s = make(Schedule::k1F1B, 2, 2);
  try {
    simulate(s, {.forward = 0});
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("cost-forward=0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cost-forward=1"), std::string::npos) << msg;
  }
  EXPECT_THROW(simulate(s, {.p2p = -1}), ConfigError);
  EXPECT_THROW(simulate(s, {.backward_weight = std::numeric_limits<double>::infinity()}), ConfigError);
  EXPECT_EQ(cost_problems({}).size(), 0u);
}

TEST(PpSimulate, UnrunnableScheduleIsAnError) {
  PipelineSchedule s;
  s.stages = 2;
  s.microbatches = 1;
  s.actions = {{Action{.kind = ActionKind::kRecvGradient, .peer = 1}},
               {Action{.kind = ActionKind::kRecvActivation, .peer = 0}}};
  EXPECT_THROW(simulate(s), Error);
}

}  // namespace
}  // namespace ndmesh::pp
