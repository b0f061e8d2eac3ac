// The schedule checker: hand-made broken schedules are rejected with a message naming
// the stage, the action index and what was expected; every single-action deletion from
// a valid schedule is rejected too.
#include <random>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <gtest/gtest.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/parallel/pp/check.hpp"
#include "ndmesh/parallel/pp/schedule.hpp"

namespace ndmesh::pp {
namespace {

using K = ActionKind;
Action F(int mb, int chunk = 0) { return {.kind = K::kForward, .microbatch = mb, .chunk = chunk}; }
Action B(int mb, int chunk = 0) { return {.kind = K::kBackward, .microbatch = mb, .chunk = chunk}; }
Action Bi(int mb) { return {.kind = K::kBackwardInput, .microbatch = mb}; }
Action W(int mb) { return {.kind = K::kBackwardWeight, .microbatch = mb}; }
Action sA(int mb, int peer, int chunk = 0) {
  return {.kind = K::kSendActivation, .microbatch = mb, .chunk = chunk, .peer = peer};
}
Action rA(int mb, int peer, int chunk = 0) {
  return {.kind = K::kRecvActivation, .microbatch = mb, .chunk = chunk, .peer = peer};
}
Action sG(int mb, int peer, int chunk = 0) {
  return {.kind = K::kSendGradient, .microbatch = mb, .chunk = chunk, .peer = peer};
}
Action rG(int mb, int peer, int chunk = 0) {
  return {.kind = K::kRecvGradient, .microbatch = mb, .chunk = chunk, .peer = peer};
}

PipelineSchedule two_stages(int m, std::vector<Action> stage0, std::vector<Action> stage1) {
  PipelineSchedule s;
  s.stages = 2;
  s.microbatches = m;
  s.actions = {std::move(stage0), std::move(stage1)};
  return s;
}

// A correct 2-stage, 2-micro-batch 1F1B, written out by hand.
PipelineSchedule good() {
  return two_stages(2, {F(0), sA(0, 1), F(1), sA(1, 1), rG(0, 1), B(0), rG(1, 1), B(1)},
                    {rA(0, 0), F(0), rA(1, 0), B(0), sG(0, 0), F(1), B(1), sG(1, 0)});
}

void expect_problem(const PipelineSchedule& s, const std::vector<std::string>& parts) {
  auto problem = schedule_problem(s);
  ASSERT_TRUE(problem) << "expected the checker to reject the schedule";
  for (const auto& part : parts) EXPECT_NE(problem->find(part), std::string::npos) << *problem;
  EXPECT_THROW(check_schedule(s), Error);
}

TEST(PpCheck, AcceptsHandWrittenSchedule) {
  EXPECT_FALSE(schedule_problem(good()));
  EXPECT_NO_THROW(check_schedule(good()));
}

TEST(PpCheck, MissingBackward) {
  auto s = good();
  s.actions[0].pop_back();  // B(1) on stage 0
  expect_problem(s, {"stage 0", "backward of mb 1 chunk 0", "its forward is action 2"});
}

TEST(PpCheck, MissingForward) {
  auto s = good();
  s.actions[1].erase(s.actions[1].begin() + 5);  // F(1) on stage 1
  expect_problem(s, {"stage 1", "forward of mb 1 chunk 0"});
}

TEST(PpCheck, BackwardBeforeForward) {
  auto s = two_stages(1, {F(0), sA(0, 1), rG(0, 1), B(0)}, {rA(0, 0), B(0), F(0), sG(0, 0)});
  expect_problem(s, {"stage 1 action 1", "backward mb 0 chunk 0", "runs before its forward",
                     "expected forward mb 0 chunk 0 earlier on stage 1"});
}

TEST(PpCheck, ForwardBeforeItsInputArrives) {
  auto s = two_stages(1, {F(0), sA(0, 1), rG(0, 1), B(0)}, {F(0), rA(0, 0), B(0), sG(0, 0)});
  expect_problem(s, {"stage 1 action 0", "input has not arrived", "recv-activation"});
}

TEST(PpCheck, MismatchedSendRecvOrder) {
  // Stage 1 receives micro-batch 1 first while stage 0 sends micro-batch 0 first.
  auto s = two_stages(2, {F(0), sA(0, 1), F(1), sA(1, 1), rG(0, 1), B(0), rG(1, 1), B(1)},
                      {rA(1, 0), rA(0, 0), F(0), B(0), sG(0, 0), F(1), B(1), sG(1, 0)});
  expect_problem(s, {"stage 0 action 1", "stage 1 action 0", "out of order",
                     "expected stage 1 to post recv-activation mb 0 chunk 0 from stage 0"});
}

TEST(PpCheck, DeadlockCycle) {
  // The naive blocking 1F1B: stage 0 sends activation 1 while stage 1 sends gradient 0;
  // with rendezvous both wait forever.
  auto s = two_stages(2, {F(0), sA(0, 1), F(1), sA(1, 1), rG(0, 1), B(0), rG(1, 1), B(1)},
                      {rA(0, 0), F(0), B(0), sG(0, 0), rA(1, 0), F(1), B(1), sG(1, 0)});
  expect_problem(s, {"deadlock", "stage 0 action 3", "stage 1 action 3", "a cycle"});
}

TEST(PpCheck, ReceiveBeforeSendDeadlock) {
  PipelineSchedule s = make_schedule({.schedule = Schedule::kGpipe, .stages = 3, .microbatches = 1});
  // Stage 0 first waits for the gradient, before sending its activation.
  auto& a = s.actions[0];
  ASSERT_EQ(a[1].kind, K::kSendActivation);
  std::swap(a[1], a[2]);  // F0, rG0, sA0, B0
  expect_problem(s,
                 {"deadlock", "stage 0 action 1 (recv-gradient mb 0 chunk 0 from stage 1) waits for stage 1",
                  "stage 1 action 0 (recv-activation mb 0 chunk 0 from stage 0) waits for stage 0"});
}

TEST(PpCheck, ReceiveWithoutSend) {
  auto s = good();
  s.actions[1].push_back(rA(1, 0));
  expect_problem(s, {"repeated"});
  auto t = two_stages(1, {F(0), sA(0, 1), rG(0, 1), B(0)}, {rA(0, 0), F(0), B(0)});
  expect_problem(t, {"deadlock", "stage 0 action 2", "which has finished"});
}

TEST(PpCheck, SendBeforeCompute) {
  auto s = two_stages(1, {sA(0, 1), F(0), rG(0, 1), B(0)}, {rA(0, 0), F(0), B(0), sG(0, 0)});
  expect_problem(s, {"stage 0 action 0", "sends before the forward"});
}

TEST(PpCheck, WrongPeerAndRanges) {
  auto s = good();
  s.actions[0][1].peer = 0;
  expect_problem(s, {"stage 0 action 1", "wrong peer", "stage 1"});
  s = good();
  s.actions[1][3].microbatch = 7;
  expect_problem(s, {"stage 1 action 3", "micro-batch out of range", "0..1"});
  s = good();
  s.actions[1][3].chunk = 1;
  expect_problem(s, {"stage 1 action 3", "chunk out of range"});
  s = good();
  s.actions[0][0].peer = 1;
  expect_problem(s, {"stage 0 action 0", "compute action has peer 1"});
  s = good();
  s.actions[1][1] = sA(0, 0);  // the last virtual stage has nothing to send forward
  expect_problem(s, {"stage 1 action 1", "no next virtual stage"});
}

TEST(PpCheck, SplitBackwardRules) {
  // Weight gradient before its input gradient, on a single stage.
  PipelineSchedule s;
  s.stages = 1;
  s.microbatches = 1;
  s.actions = {{F(0), W(0), Bi(0)}};
  expect_problem(s, {"stage 0 action 1", "before its backward-input"});
  s.actions = {{F(0), Bi(0)}};
  expect_problem(s, {"1 backward-input but 0 backward-weight"});
  s.actions = {{F(0), Bi(0), B(0), W(0)}};
  expect_problem(s, {"stage 0 action 2", "mixes a full backward"});
  s.actions = {{F(0), Bi(0), W(0)}};
  EXPECT_FALSE(schedule_problem(s));
}

TEST(PpCheck, DuplicateForward) {
  auto s = good();
  s.actions[0].insert(s.actions[0].begin() + 1, F(0));
  expect_problem(s, {"stage 0 action 1", "forward mb 0 chunk 0", "repeated"});
}

TEST(PpCheck, WrongStageCount) {
  auto s = good();
  s.stages = 3;
  expect_problem(s, {"2 stages", "pp=3"});
}

// Deleting any one action from a valid schedule must be caught: each action is needed.
TEST(PpCheck, EverySingleDeletionIsRejected) {
  for (Schedule k : {Schedule::kGpipe, Schedule::k1F1B, Schedule::kInterleaved, Schedule::kZbH1}) {
    const int v = k == Schedule::kInterleaved ? 2 : 1;
    const auto s = make_schedule({.schedule = k, .stages = 3, .microbatches = 3, .chunks = v});
    for (int r = 0; r < 3; ++r)
      for (std::size_t i = 0; i < s.actions[r].size(); ++i) {
        auto broken = s;
        broken.actions[r].erase(broken.actions[r].begin() + static_cast<std::ptrdiff_t>(i));
        EXPECT_TRUE(schedule_problem(broken)) << schedule_name(k) << " stage " << r << " action " << i << " ("
                                              << to_string(s.actions[r][i]) << ") deleted";
      }
  }
}

// Moving any send to just before the compute that produces its data is rejected.
TEST(PpCheck, SendMovedBeforeItsProducerIsRejected) {
  const auto s = make_schedule({.schedule = Schedule::k1F1B, .stages = 4, .microbatches = 4});
  int moved = 0;
  for (int r = 0; r < 4; ++r)
    for (std::size_t i = 0; i < s.actions[r].size(); ++i) {
      const Action& send = s.actions[r][i];
      if (!is_send(send.kind)) continue;
      const K producer = send.kind == K::kSendActivation ? K::kForward : K::kBackward;
      std::size_t j = 0;
      while (!(s.actions[r][j].kind == producer && s.actions[r][j].microbatch == send.microbatch)) ++j;
      ASSERT_LT(j, i);
      auto broken = s;
      broken.actions[r].erase(broken.actions[r].begin() + static_cast<std::ptrdiff_t>(i));
      broken.actions[r].insert(broken.actions[r].begin() + static_cast<std::ptrdiff_t>(j), send);
      auto problem = schedule_problem(broken);
      ASSERT_TRUE(problem) << "stage " << r << " action " << i;
      EXPECT_NE(problem->find(fmt::format("stage {} action {}", r, j)), std::string::npos) << *problem;
      EXPECT_NE(problem->find("sends before"), std::string::npos) << *problem;
      ++moved;
    }
  EXPECT_EQ(moved, 2 * 3 * 4);  // every stage boundary, both directions, every micro-batch
}

// Any compute order that could run (each stage's part of one random topological order of
// the forward/backward dependency graph) gets its sends and receives placed by
// with_communication() so that the checker finds no deadlock and no order mismatch.
TEST(PpCheck, RandomComputeOrdersGetDeadlockFreeCommunication) {
  std::mt19937 rng(12345);
  for (int trial = 0; trial < 300; ++trial) {
    const int p = 1 + static_cast<int>(rng() % 5), m = 1 + static_cast<int>(rng() % 6);
    const int v = 1 + static_cast<int>(rng() % 3);
    const bool split = rng() % 2 == 0;
    const int nv = p * v;
    // Node (kind, mb, virtual stage); kinds: 0 forward, 1 backward or B, 2 W.
    struct Node {
      int kind, mb, vs;
    };
    std::vector<Node> ready;
    for (int mb = 0; mb < m; ++mb) ready.push_back({0, mb, 0});
    std::vector<std::vector<Action>> compute(p);
    while (!ready.empty()) {
      const std::size_t pick = rng() % ready.size();
      const Node n = ready[pick];
      ready.erase(ready.begin() + static_cast<std::ptrdiff_t>(pick));
      const K kind = n.kind == 0   ? K::kForward
                     : n.kind == 2 ? K::kBackwardWeight
                     : split       ? K::kBackwardInput
                                   : K::kBackward;
      compute[n.vs % p].push_back({.kind = kind, .microbatch = n.mb, .chunk = n.vs / p});
      if (n.kind == 0) ready.push_back(n.vs + 1 < nv ? Node{0, n.mb, n.vs + 1} : Node{1, n.mb, n.vs});
      if (n.kind == 1 && n.vs > 0) ready.push_back({1, n.mb, n.vs - 1});
      if (n.kind == 1 && split) ready.push_back({2, n.mb, n.vs});
    }
    const auto s = with_communication(Schedule::k1F1B, p, m, v, compute);
    auto problem = schedule_problem(s);
    EXPECT_FALSE(problem) << "trial " << trial << " p=" << p << " m=" << m << " v=" << v << ": " << *problem;
  }
}

}  // namespace
}  // namespace ndmesh::pp
