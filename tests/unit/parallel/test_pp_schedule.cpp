// Pipeline schedule generators: exact shapes on small cases written out by hand, and the
// closed-form bubble fractions and activation peaks of the literature over many shapes.
#include <algorithm>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <gtest/gtest.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/parallel/pp/check.hpp"
#include "ndmesh/parallel/pp/schedule.hpp"
#include "ndmesh/parallel/pp/simulate.hpp"

namespace ndmesh::pp {
namespace {

// Compact text of a stage's compute actions: "F0 F1 B0 ..." (b/w for split backward,
// chunk as a suffix ".1" when the schedule has several).
std::string compute_text(const PipelineSchedule& s, int stage) {
  std::string out;
  for (const Action& a : s.actions[stage]) {
    const char* k = nullptr;
    switch (a.kind) {
      case ActionKind::kForward:
        k = "F";
        break;
      case ActionKind::kBackward:
        k = "B";
        break;
      case ActionKind::kBackwardInput:
        k = "b";
        break;
      case ActionKind::kBackwardWeight:
        k = "w";
        break;
      default:
        continue;
    }
    if (!out.empty()) out += ' ';
    out += fmt::format("{}{}", k, a.microbatch);
    if (s.chunks > 1) out += fmt::format(".{}", a.chunk);
  }
  return out;
}

PipelineSchedule make(Schedule kind, int p, int m, int v = 1) {
  return make_schedule({.schedule = kind, .stages = p, .microbatches = m, .chunks = v});
}

TEST(PpSchedule, GpipeShape) {
  auto s = make(Schedule::kGpipe, 3, 4);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(compute_text(s, r), "F0 F1 F2 F3 B0 B1 B2 B3") << "stage " << r;
}

TEST(PpSchedule, OneFOneBShapeMatchesMegatron) {
  // p=4, m=6: stage r has p-r-1 warm-up forwards, then F/B pairs, then the drain.
  auto s = make(Schedule::k1F1B, 4, 6);
  EXPECT_EQ(compute_text(s, 0), "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  EXPECT_EQ(compute_text(s, 1), "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5");
  EXPECT_EQ(compute_text(s, 2), "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5");
  EXPECT_EQ(compute_text(s, 3), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
}

TEST(PpSchedule, OneFOneBFewerMicrobatchesThanStages) {
  auto s = make(Schedule::k1F1B, 4, 2);
  EXPECT_EQ(compute_text(s, 0), "F0 F1 B0 B1");
  EXPECT_EQ(compute_text(s, 3), "F0 B0 F1 B1");
}

TEST(PpSchedule, InterleavedShapeMatchesMegatron) {
  // p=2, v=2, m=4: virtual micro-batch k runs chunk (k%4)/2 of micro-batch (k/4)*2+k%2;
  // warm-up on stage r is (p-r-1)*2 + (v-1)*p forwards.
  auto s = make(Schedule::kInterleaved, 2, 4, 2);
  EXPECT_EQ(compute_text(s, 0),
            "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
  EXPECT_EQ(compute_text(s, 1),
            "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0");
}

TEST(PpSchedule, ZbH1Shape) {
  // p=3, m=4, traced by hand with unit costs: a free stage runs B if its gradient is
  // there, else F if its input is there and fewer than p-r are in flight, else a W.
  auto s = make(Schedule::kZbH1, 3, 4);
  EXPECT_EQ(compute_text(s, 0), "F0 F1 F2 b0 F3 b1 w0 b2 w1 b3 w2 w3");
  EXPECT_EQ(compute_text(s, 1), "F0 F1 b0 F2 b1 F3 b2 w0 b3 w1 w2 w3");
  EXPECT_EQ(compute_text(s, 2), "F0 b0 F1 b1 F2 b2 F3 b3 w0 w1 w2 w3");
}

TEST(PpSchedule, TwoStageOneFOneBCommunicationOrder) {
  // Written out by hand: sends sit right after the compute that produces the data,
  // receives just before the compute that needs it, in the same order on both sides.
  auto s = make(Schedule::k1F1B, 2, 2);
  auto F = [](int mb) { return Action{.kind = ActionKind::kForward, .microbatch = mb}; };
  auto B = [](int mb) { return Action{.kind = ActionKind::kBackward, .microbatch = mb}; };
  auto act = [](ActionKind k, int mb, int peer) { return Action{.kind = k, .microbatch = mb, .peer = peer}; };
  using K = ActionKind;
  std::vector<Action> stage0 = {
      F(0), act(K::kSendActivation, 0, 1), F(1), act(K::kSendActivation, 1, 1), act(K::kRecvGradient, 0, 1),
      B(0), act(K::kRecvGradient, 1, 1),   B(1)};
  std::vector<Action> stage1 = {act(K::kRecvActivation, 0, 0),
                                F(0),
                                act(K::kRecvActivation, 1, 0),
                                B(0),
                                act(K::kSendGradient, 0, 0),
                                F(1),
                                B(1),
                                act(K::kSendGradient, 1, 0)};
  EXPECT_EQ(s.actions[0], stage0);
  EXPECT_EQ(s.actions[1], stage1);
}

TEST(PpSchedule, InterleavedSendsWrapFromLastStageToFirst) {
  auto s = make(Schedule::kInterleaved, 4, 4, 2);
  // The last stage's chunk 0 is virtual stage 3; its output feeds virtual stage 4 =
  // stage 0 chunk 1.
  bool wrap_send = false, wrap_recv = false;
  for (const Action& a : s.actions[3])
    wrap_send |= a.kind == ActionKind::kSendActivation && a.chunk == 0 && a.peer == 0;
  for (const Action& a : s.actions[0])
    wrap_recv |= a.kind == ActionKind::kRecvActivation && a.chunk == 1 && a.peer == 3;
  EXPECT_TRUE(wrap_send);
  EXPECT_TRUE(wrap_recv);
}

// Every generated schedule passes the checker, for many shapes including p=1, m=1, m<p.
TEST(PpSchedule, AllGeneratedSchedulesPassTheChecker) {
  for (int p : {1, 2, 3, 4, 5, 8})
    for (int m : {1, 2, 3, 4, 7, 8, 12, 16}) {
      for (Schedule k : {Schedule::kGpipe, Schedule::k1F1B, Schedule::kZbH1}) {
        auto problem = schedule_problem(make(k, p, m));
        EXPECT_FALSE(problem) << schedule_name(k) << " p=" << p << " m=" << m << ": " << *problem;
      }
      if (p > 1 && m % p == 0)
        for (int v : {2, 3, 4}) {
          auto problem = schedule_problem(make(Schedule::kInterleaved, p, m, v));
          EXPECT_FALSE(problem) << "interleaved p=" << p << " m=" << m << " v=" << v << ": " << *problem;
        }
    }
}

TEST(PpSchedule, GpipeAndOneFOneBBubbleIsClosedForm) {
  for (Schedule k : {Schedule::kGpipe, Schedule::k1F1B})
    for (int p = 1; p <= 8; ++p)
      for (int m = 1; m <= 16; ++m) {
        auto sim = simulate(make(k, p, m));
        const double expected = static_cast<double>(p - 1) / (m + p - 1);
        EXPECT_NEAR(sim.bubble_fraction, expected, 1e-12) << schedule_name(k) << " p=" << p << " m=" << m;
        // F + B + W = 3 per micro-batch per stage, m+p-1 slots.
        EXPECT_NEAR(sim.makespan, 3.0 * (m + p - 1), 1e-12) << schedule_name(k) << " p=" << p << " m=" << m;
      }
}

TEST(PpSchedule, InterleavedBubbleIsClosedForm) {
  for (int p = 2; p <= 6; ++p)
    for (int v = 2; v <= 4; ++v)
      for (int m = p; m <= 4 * p; m += p) {
        auto sim = simulate(make(Schedule::kInterleaved, p, m, v));
        const double b = static_cast<double>(p - 1) / v;
        EXPECT_NEAR(sim.bubble_fraction, b / (m + b), 1e-12) << "p=" << p << " m=" << m << " v=" << v;
        EXPECT_NEAR(sim.makespan, 3.0 * (m + b), 1e-9) << "p=" << p << " m=" << m << " v=" << v;
      }
}

TEST(PpSchedule, ZbH1BubbleIsOneThirdOfOneFOneB) {
  // Qi et al.: with F = B = W the 1F1B bubble (p-1)(F+B+W) per stage shrinks to
  // (p-1)(F+B-W) = p-1, when there are at least p micro-batches.
  for (int p = 2; p <= 8; ++p)
    for (int m = p; m <= 3 * p; ++m) {
      auto zb = simulate(make(Schedule::kZbH1, p, m));
      auto ofob = simulate(make(Schedule::k1F1B, p, m));
      EXPECT_LT(zb.bubble_fraction, ofob.bubble_fraction) << "p=" << p << " m=" << m;
      EXPECT_NEAR(zb.makespan, 3.0 * m + (p - 1), 1e-12) << "p=" << p << " m=" << m;
      EXPECT_NEAR(zb.bubble_fraction, static_cast<double>(p - 1) / (3 * m + p - 1), 1e-12)
          << "p=" << p << " m=" << m;
    }
}

TEST(PpSchedule, ZbH1NeverWorseThanOneFOneBWithFewMicrobatches) {
  for (int p = 2; p <= 8; ++p)
    for (int m = 1; m < p; ++m) {
      auto zb = simulate(make(Schedule::kZbH1, p, m));
      auto ofob = simulate(make(Schedule::k1F1B, p, m));
      EXPECT_LT(zb.bubble_fraction, ofob.bubble_fraction) << "p=" << p << " m=" << m;
    }
}

TEST(PpSchedule, PeakInFlight) {
  for (int p = 1; p <= 8; ++p)
    for (int m = 1; m <= 12; ++m) {
      auto gpipe = simulate(make(Schedule::kGpipe, p, m));
      auto ofob = simulate(make(Schedule::k1F1B, p, m));
      auto zb = simulate(make(Schedule::kZbH1, p, m));
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(gpipe.peak_in_flight_chunks[r], m) << "gpipe p=" << p << " m=" << m << " stage " << r;
        EXPECT_EQ(ofob.peak_in_flight_chunks[r], std::min(p - r, m))
            << "1f1b p=" << p << " m=" << m << " r=" << r;
        EXPECT_EQ(zb.peak_in_flight_chunks[r], std::min(p - r, m))
            << "zb-h1 p=" << p << " m=" << m << " r=" << r;
        EXPECT_DOUBLE_EQ(ofob.peak_in_flight[r], std::min(p - r, m));
      }
    }
}

TEST(PpSchedule, InterleavedPeakInFlight) {
  // Megatron's warm-up (p-r-1)*2 + (v-1)*p forwards plus the first steady forward, all
  // forwards when m == p; each chunk holds 1/v of a stage's activations.
  for (int p = 2; p <= 6; ++p)
    for (int v = 2; v <= 4; ++v)
      for (int m = p; m <= 3 * p; m += p) {
        auto sim = simulate(make(Schedule::kInterleaved, p, m, v));
        for (int r = 0; r < p; ++r) {
          const int expected = m == p ? m * v : std::min((p - r - 1) * 2 + (v - 1) * p + 1, m * v);
          EXPECT_EQ(sim.peak_in_flight_chunks[r], expected)
              << "p=" << p << " m=" << m << " v=" << v << " r=" << r;
          EXPECT_DOUBLE_EQ(sim.peak_in_flight[r], static_cast<double>(expected) / v);
        }
      }
}

TEST(PpSchedule, EveryActionCountedOnce) {
  // p*v*m forwards and as many backwards; sends equal receives.
  auto s = make(Schedule::kInterleaved, 3, 6, 2);
  int f = 0, b = 0, sends = 0, recvs = 0;
  for (const auto& stage : s.actions)
    for (const Action& a : stage) {
      f += a.kind == ActionKind::kForward;
      b += a.kind == ActionKind::kBackward;
      sends += is_send(a.kind);
      recvs += is_recv(a.kind);
    }
  EXPECT_EQ(f, 3 * 2 * 6);
  EXPECT_EQ(b, 3 * 2 * 6);
  // (p*v - 1) boundaries between virtual stages, each crossed once forward and once back.
  EXPECT_EQ(sends, 2 * (3 * 2 - 1) * 6);
  EXPECT_EQ(recvs, sends);
}

TEST(PpSchedule, BadOptionsNameFieldValueAndFix) {
  auto expect_error = [](ScheduleOptions o, const std::vector<std::string>& parts) {
    try {
      make_schedule(o);
      ADD_FAILURE() << "expected ConfigError";
    } catch (const ConfigError& e) {
      std::string msg = e.what();
      for (const auto& part : parts) EXPECT_NE(msg.find(part), std::string::npos) << msg;
    }
  };
  expect_error({.schedule = Schedule::kInterleaved, .stages = 4, .microbatches = 6, .chunks = 2},
               {"microbatches=6", "pp=4", "microbatches=8"});
  expect_error({.schedule = Schedule::kInterleaved, .stages = 4, .microbatches = 8, .chunks = 1},
               {"vpp=1", "vpp=2"});
  expect_error({.schedule = Schedule::k1F1B, .stages = 4, .microbatches = 8, .chunks = 2},
               {"vpp=2", "interleaved"});
  expect_error({.schedule = Schedule::kInterleaved, .stages = 1, .microbatches = 4, .chunks = 2},
               {"pp=1", "1f1b"});
  expect_error({.schedule = Schedule::kGpipe, .stages = 0, .microbatches = 8}, {"pp=0"});
  expect_error({.schedule = Schedule::kGpipe, .stages = 2, .microbatches = 0}, {"microbatches=0"});
  expect_error({.schedule = Schedule::kGpipe, .stages = 200, .microbatches = 10000}, {"exceeds"});
}

// fuzz_schedule found that pp=964 with one micro-batch took seconds and 600 MB: the
// stage count is bounded.
TEST(PpSchedule, StageCountIsBounded) {
  auto problems = schedule_option_problems({.schedule = Schedule::kZbH1, .stages = 964, .microbatches = 1});
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("pp=964 is above the limit of 256"), std::string::npos) << problems[0];
  EXPECT_TRUE(schedule_option_problems({.schedule = Schedule::k1F1B, .stages = 256, .microbatches = 1}).empty());
}

// fuzz_schedule: rounding microbatches near INT_MAX up to a multiple of pp overflowed int.
TEST(PpSchedule, InterleavedRoundingUpDoesNotOverflow) {
  auto problems = schedule_option_problems(
      {.schedule = Schedule::kInterleaved, .stages = 4, .microbatches = 2147483647, .chunks = 2});
  ASSERT_FALSE(problems.empty());
  EXPECT_NE(problems[0].find("microbatches=2147483648"), std::string::npos) << problems[0];
}

}  // namespace
}  // namespace ndmesh::pp
