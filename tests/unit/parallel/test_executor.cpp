// The pipeline executor on in-process jobs (comm/inproc.hpp): every schedule (gpipe, 1f1b,
// zb-h1, interleaved) on 2, 3 and 4 stages with 1 to 8 micro-batches runs the stages' model
// chunks to the serial run's loss and gradients (each chunk compared by parameter name,
// naming the first differing tensor), holds the activations the simulator predicts (and
// GPipe's m, 1F1B's min(p - r, m)), and evaluates to the same loss. Mismatched schedules end with a message
// naming the pp group, the stage and the action, not a hang: a stage that leaves out a send or a receive,
// stages that disagree on the number of micro-batches. And the executor's transfers do not take a foreign
// message of their tags on a shared pp group.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "ndmesh/comm/inproc.hpp"
#include "ndmesh/config/partition.hpp"
#include "ndmesh/parallel/pp/executor.hpp"
#include "ndmesh/parallel/pp/simulate.hpp"
#include "support/model_fixtures.hpp"

namespace ndmesh::pp {
namespace {

using comm::Communicator;
using testing_support::Batch;

struct Case {
  Schedule schedule = Schedule::k1F1B;
  int stages = 2, microbatches = 1, chunks = 1;
};

std::string name_of(const Case& c) {
  std::string s = fmt::format("{}_pp{}_m{}", schedule_name(c.schedule), c.stages, c.microbatches);
  for (char& ch : s)
    if (ch == '-') ch = '_';
  return s;
}
void PrintTo(const Case& c, std::ostream* os) { *os << name_of(c); }

// One stage: its model chunks (blocks of a balanced partition, one sequence per
// micro-batch, untied head: the tied-embedding sum belongs to the gradient sync) and an
// executor over `pp`.
struct Stage {
  std::vector<std::unique_ptr<model::Model>> chunks;
  std::unique_ptr<Executor> executor;
  StageHooks hooks;

  Stage(const ModelSpec& spec, const PipelineSchedule& schedule, const Communicator& pp, const Batch& batch,
        double timeout_s = 0) {
    const auto partition = balanced_partition(spec.layers, schedule.stages, schedule.chunks);
    std::vector<model::Model*> raw;
    for (int c = 0; c < schedule.chunks; ++c) {
      const int vs = schedule.virtual_stage(pp.rank(), c);
      std::int64_t first = 0;
      for (int k = 0; k < vs; ++k) first += partition[static_cast<std::size_t>(k)];
      chunks.push_back(model::build<float>(
          spec, {.batch = 1},
          model::UnitRange::blocks(first, first + partition[static_cast<std::size_t>(vs)], spec.layers)));
      chunks.back()->set_loss_weight(1.0 / static_cast<double>(batch.sequences * spec.seq));
      chunks.back()->params().zero_grad();
      raw.push_back(chunks.back().get());
    }
    executor = std::make_unique<Executor>(schedule, pp, raw, ExecutorOptions{.timeout_s = timeout_s});
    hooks.data = [&batch](int mb, std::int32_t* tokens, std::int32_t* targets) {
      const Batch b = batch.slice(mb, 1);
      std::copy(b.tokens.begin(), b.tokens.end(), tokens);
      std::copy(b.targets.begin(), b.targets.end(), targets);
    };
  }
};

class ExecutorSchedules : public ::testing::TestWithParam<Case> {};

TEST_P(ExecutorSchedules, ChunksReachTheSerialLossAndGradientsByName) {
  const Case& c = GetParam();
  const ModelSpec spec = testing_support::tiny_spec(2 * c.stages * c.chunks, /*tied=*/false);
  const Batch batch = testing_support::make_batch(spec, c.microbatches, 11);
  const testing_support::SerialReference ref(spec, batch);
  const PipelineSchedule schedule = make_schedule(
      {.schedule = c.schedule, .stages = c.stages, .microbatches = c.microbatches, .chunks = c.chunks});
  const std::vector<int> expected_peak = simulate(schedule).peak_in_flight_chunks;
  comm::inproc::run(c.stages, [&](const Communicator& world) {
    testing_support::single_blas_thread();
    const Communicator pp = world.named("pp");
    Stage stage(spec, schedule, pp, batch);
    const WalkResult walk = stage.executor->train_step(stage.hooks);
    // The mean loss over the batch: the last stage's head saw every token.
    double loss = walk.loss_sum / static_cast<double>(batch.sequences * spec.seq);
    pp.all_reduce(std::span<double>(&loss, 1));
    EXPECT_NEAR(loss, ref.loss(), 1e-6 * ref.loss());
    for (std::size_t k = 0; k < stage.chunks.size(); ++k)
      EXPECT_TRUE(testing_support::same_grads(*stage.chunks[k], ref.model()))
          << name_of(c) << ", stage " << pp.rank() << ", chunk " << k;
    // The simulator's peak, and the closed forms the schedules promise: GPipe holds all m
    // micro-batches, 1F1B at most min(p - r, m) on stage r.
    const int r = pp.rank(), peak = stage.executor->peak_live_activations();
    EXPECT_EQ(peak, expected_peak[static_cast<std::size_t>(r)]) << "stage " << r;
    if (c.schedule == Schedule::kGpipe) {
      EXPECT_EQ(peak, c.microbatches) << "stage " << r;
    }
    if (c.schedule == Schedule::k1F1B) {
      EXPECT_EQ(peak, std::min(c.stages - r, c.microbatches)) << "stage " << r;
    }
    EXPECT_EQ(walk.timings.size(), schedule.actions[static_cast<std::size_t>(pp.rank())].size());
    // Evaluation: forward passes only, the same loss.
    const WalkResult eval = stage.executor->evaluate(stage.hooks);
    double eval_loss = eval.loss_sum / static_cast<double>(batch.sequences * spec.seq);
    pp.all_reduce(std::span<double>(&eval_loss, 1));
    EXPECT_NEAR(eval_loss, ref.loss(), 1e-6 * ref.loss());
  });
}

std::vector<Case> all_cases() {
  std::vector<Case> out;
  for (int p : {2, 4})
    for (Schedule s : {Schedule::kGpipe, Schedule::k1F1B, Schedule::kZbH1})
      for (int m : {1, 2, 4, 8}) out.push_back({s, p, m, 1});
  for (auto [p, m] : {std::pair{2, 2}, {2, 4}, {2, 8}, {4, 4}, {4, 8}})
    out.push_back({Schedule::kInterleaved, p, m, 2});
  out.push_back({Schedule::kGpipe, 3, 2, 1});
  out.push_back({Schedule::k1F1B, 3, 5, 1});
  out.push_back({Schedule::kZbH1, 3, 4, 1});
  out.push_back({Schedule::kInterleaved, 3, 6, 2});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Every, ExecutorSchedules, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case>& param_info) { return name_of(param_info.param); });

// The message of the first failure of a 2-stage 1F1B job of 8 micro-batches in which
// stage `stage` leaves out action `index`, or whose stage 1 runs `m1` micro-batches.
// Stage 0 waits `patience0` seconds before it reports a transfer that never came, stage 1
// 0.3 s (the stage whose timeout the test expects to see first is the impatient one).
std::string mismatch(int stage, int index, int m1 = 8, double patience0 = 0.3) {
  const ModelSpec spec = testing_support::tiny_spec(4, false);
  const Batch batch = testing_support::make_batch(spec, 8, 3);
  try {
    comm::inproc::run(2, [&](const Communicator& world) {
      testing_support::single_blas_thread();
      const int m = world.rank() == 1 ? m1 : 8;
      const PipelineSchedule schedule =
          make_schedule({.schedule = Schedule::k1F1B, .stages = 2, .microbatches = m});
      Stage s(spec, schedule, world.named("pp"), batch, /*timeout_s=*/world.rank() == 0 ? patience0 : 0.3);
      if (world.rank() == stage) s.executor->drop_action(index);
      s.executor->train_step(s.hooks);
    });
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no failure";
}

TEST(ExecutorMismatch, AStageWithoutItsSendEndsWithTheGroupAndTheAction) {
  // Stage 0's action 1 is the send of micro-batch 0; stage 0 then waits for a gradient that
  // cannot come either, with more patience, so that stage 1 reports first.
  const std::string msg = mismatch(0, 1, 8, /*patience0=*/10);
  EXPECT_EQ(
      msg,
      "[pp] stage 1 action 0 (recv-activation mb 0 chunk 0 from stage 0) on group pp (ranks 0,1) timed out "
      "after 0.3 s: the peer stage never posted the matching transfer; do all stages run the same schedule?");
}

TEST(ExecutorMismatch, AStageWithoutItsReceiveIsAnErrorNamingTheAction) {
  const std::string msg = mismatch(1, 0);
  EXPECT_NE(msg.find("stage 1 action 1 (forward mb 0 chunk 0): its input was never received"),
            std::string::npos)
      << msg;
}

TEST(ExecutorMismatch, StagesDisagreeingOnTheMicroBatchesEndWithAMessage) {
  const std::string msg = mismatch(-1, 0, /*m1=*/6);
  EXPECT_NE(msg.find("on group pp (ranks 0,1) timed out after 0.3 s"), std::string::npos) << msg;
}

TEST(ExecutorTags, AForeignMessageOfItsTagOnTheSharedGroupIsNotTaken) {
  // The pp group is the world here, as ProcessGroups makes it for a mesh of pp alone. A
  // message of the size of a stage's activation, tagged as stage 1's first receive (tag =
  // virtual stage 1 * m + micro-batch 0), is in flight on it during the step; the
  // executor, on its own duplicate, neither takes it nor is disturbed.
  const ModelSpec spec = testing_support::tiny_spec(4, false);
  const Batch batch = testing_support::make_batch(spec, 4, 9);
  const testing_support::SerialReference ref(spec, batch);
  const PipelineSchedule schedule =
      make_schedule({.schedule = Schedule::k1F1B, .stages = 2, .microbatches = 4});
  comm::inproc::run(2, [&](const Communicator& world) {
    testing_support::single_blas_thread();
    const Communicator pp = world.named("pp");
    std::vector<float> foreign(static_cast<std::size_t>(spec.seq * spec.hidden), 7.0f), got(foreign.size());
    comm::Work sent;
    if (pp.rank() == 0) sent = pp.send_async(std::span<const float>(foreign), 1, {.tag = 1 * 4 + 0});
    Stage stage(spec, schedule, pp, batch);
    stage.executor->train_step(stage.hooks);
    if (pp.rank() == 1) {
      pp.recv(std::span<float>(got), 0, {.tag = 4});
      EXPECT_EQ(got, foreign);
    }
    sent.wait();
    for (std::size_t k = 0; k < stage.chunks.size(); ++k)
      EXPECT_TRUE(testing_support::same_grads(*stage.chunks[k], ref.model())) << "stage " << pp.rank();
  });
}

}  // namespace
}  // namespace ndmesh::pp
