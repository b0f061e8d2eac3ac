// The coordinator's rules (elastic/quorum.hpp) on a fake clock: quorum, commit, abort and
// redo, joiners healing at a step boundary, heartbeat expiry, fencing of a silent member,
// replaced incarnations, split brain, and a restart from the persisted state.
#include <gtest/gtest.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/elastic/quorum.hpp"

namespace ndmesh::elastic {
namespace {

constexpr double kTimeout = 2.0;

std::vector<int> replicas(const Generation& g) {
  std::vector<int> out;
  for (const Member& m : g.members) out.push_back(m.replica);
  return out;
}

// Every member of the current generation votes `ok` on the running attempt.
void vote_all(Quorum& q, bool ok, double now) {
  for (const Member& m : q.current()->members)
    q.vote(q.current()->id, q.state().committed, m.replica, ok, now);
}

TEST(Quorum, FormsOnlyWithMinReplicasAndAMajority) {
  Quorum q(2, kTimeout);
  q.join(0, 1, 0, 0.0);
  EXPECT_FALSE(q.tick(0.1).generation);  // one replica < --min-replicas 2
  q.join(1, 2, 0, 0.2);
  const auto ev = q.tick(0.3);
  ASSERT_TRUE(ev.generation);
  EXPECT_EQ(ev.generation->id, 1);
  EXPECT_EQ(replicas(*ev.generation), (std::vector<int>{0, 1}));
  EXPECT_FALSE(ev.generation->heal);
  EXPECT_FALSE(ev.decision);
}

TEST(Quorum, CommitsWhenEveryMemberVotedOkAndKeepsTheGeneration) {
  Quorum q(2, kTimeout);
  q.join(0, 1, 0, 0);
  q.join(1, 2, 0, 0);
  q.tick(0.1);
  q.vote(1, 0, 0, true, 0.2);
  EXPECT_FALSE(q.tick(0.2).decision);  // replica 1 has not voted yet
  q.vote(1, 0, 1, true, 0.3);
  const auto ev = q.tick(0.3);
  ASSERT_TRUE(ev.decision);
  EXPECT_TRUE(ev.decision->commit);
  EXPECT_EQ(ev.decision->step, 0);
  EXPECT_EQ(ev.decision->next_generation, 1);
  EXPECT_FALSE(ev.generation);
  EXPECT_EQ(q.state().committed, 1);
  q.vote(1, 0, 0, false, 0.4);  // a vote on an attempt already decided is ignored
  q.heartbeat(0, 0.4);
  q.heartbeat(1, 0.4);
  EXPECT_FALSE(q.tick(0.4).decision);
}

TEST(Quorum, AFailedVoteAbortsAndTheStepIsRedoneInTheNextGeneration) {
  Quorum q(2, kTimeout);
  for (int r = 0; r < 3; ++r) q.join(r, r + 1, 0, 0);
  q.tick(0.1);
  q.vote(1, 0, 0, false, 0.2);
  q.vote(1, 0, 1, false, 0.2);
  // Replica 2 (killed: no vote, heartbeat still fresh) is waited for up to the grace period.
  EXPECT_FALSE(q.tick(0.5).decision);
  const auto ev = q.tick(1.3);
  ASSERT_TRUE(ev.decision);
  EXPECT_FALSE(ev.decision->commit);
  EXPECT_EQ(ev.decision->next_generation, 2);
  ASSERT_TRUE(ev.generation);
  EXPECT_EQ(replicas(*ev.generation), (std::vector<int>{0, 1}));  // the silent member is fenced
  EXPECT_EQ(ev.generation->step, 0);                              // the same step again
  EXPECT_EQ(q.state().committed, 0);
  ASSERT_EQ(q.fenced().size(), 1u);
  EXPECT_EQ(q.fenced()[0].replica, 2);
  // Its heartbeat still runs (a dying process): no candidate at the next step boundary.
  for (int r = 0; r < 3; ++r) q.heartbeat(r, 1.5);
  vote_all(q, true, 1.5);
  auto next = q.tick(1.5);
  ASSERT_TRUE(next.decision);
  EXPECT_TRUE(next.decision->commit);
  EXPECT_EQ(next.decision->next_generation, 2);  // unchanged
  EXPECT_FALSE(next.generation);
  // It votes late on the attempt it missed (it was slow): a candidate again, at the next boundary.
  q.vote(1, 0, 2, false, 1.6);
  EXPECT_TRUE(q.fenced().empty());
  vote_all(q, true, 1.7);
  next = q.tick(1.7);
  ASSERT_TRUE(next.generation);
  EXPECT_EQ(replicas(*next.generation), (std::vector<int>{0, 1, 2}));
  EXPECT_TRUE(next.generation->heal);
}

TEST(Quorum, AFencedReplicaRestartedIsACandidateAgain) {
  Quorum q(2, kTimeout);
  for (int r = 0; r < 3; ++r) q.join(r, r + 1, 0, 0);
  q.tick(0);
  q.vote(1, 0, 0, false, 0.1);
  q.vote(1, 0, 1, false, 0.1);
  ASSERT_TRUE(q.tick(1.2).generation);  // without replica 2, fenced
  q.join(2, 4, 0, 1.3);                 // its new process
  vote_all(q, true, 1.4);
  const auto ev = q.tick(1.4);
  ASSERT_TRUE(ev.generation);
  EXPECT_EQ(replicas(*ev.generation), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(ev.generation->members[2].incarnation, 4);
}

TEST(Quorum, AJoinerEntersAtTheNextStepBoundaryAndHealsFromAnUpToDateMember) {
  Quorum q(2, kTimeout);
  q.join(0, 1, 0, 0);
  q.join(1, 2, 0, 0);
  q.tick(0);
  vote_all(q, true, 0.1);
  q.tick(0.1);                           // step 1 committed
  q.join(2, 3, 0, 0.2);                  // a restarted replica: no state
  EXPECT_FALSE(q.tick(0.2).generation);  // not in the middle of an attempt
  vote_all(q, true, 0.3);
  const auto ev = q.tick(0.3);
  ASSERT_TRUE(ev.decision);
  EXPECT_TRUE(ev.decision->commit);
  EXPECT_EQ(ev.decision->next_generation, 2);
  ASSERT_TRUE(ev.generation);
  const Generation& g = *ev.generation;
  EXPECT_EQ(replicas(g), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(g.step, 2);
  EXPECT_TRUE(g.heal);
  EXPECT_EQ(g.members[static_cast<std::size_t>(g.root)].step, 2);
  EXPECT_EQ(g.members[2].step, 0);
}

TEST(Quorum, ASilentMemberIsDeadAfterTheHeartbeatTimeoutAndTheAttemptAborts) {
  Quorum q(1, kTimeout);
  for (int r = 0; r < 3; ++r) q.join(r, r + 1, 0, 0);
  q.tick(0);
  q.vote(1, 0, 0, true, 0.5);
  q.vote(1, 0, 1, true, 0.5);
  for (int r : {0, 1}) q.heartbeat(r, 1.5);
  EXPECT_FALSE(q.tick(1.5).decision);  // replica 2 (stopped) is still within the timeout
  for (int r : {0, 1}) q.heartbeat(r, 2.5);
  const auto ev = q.tick(2.5);
  ASSERT_TRUE(ev.decision);
  EXPECT_FALSE(ev.decision->commit);  // never committed without every member's vote
  ASSERT_TRUE(ev.generation);
  EXPECT_EQ(replicas(*ev.generation), (std::vector<int>{0, 1}));
  // Replica 2 resumes: its late vote on the old attempt counts for nothing; it is a joiner.
  q.vote(1, 0, 2, true, 3.0);
  for (int r : {0, 1, 2}) q.heartbeat(r, 3.0);
  vote_all(q, true, 3.0);
  const auto next = q.tick(3.0);
  ASSERT_TRUE(next.decision);
  EXPECT_TRUE(next.decision->commit);
  ASSERT_TRUE(next.generation);
  EXPECT_EQ(replicas(*next.generation), (std::vector<int>{0, 1, 2}));
  EXPECT_TRUE(next.generation->heal);  // it is one step behind
  EXPECT_EQ(next.generation->members[2].step, 0);
}

TEST(Quorum, ANewIncarnationOfAMemberFailsTheRunningAttempt) {
  Quorum q(2, kTimeout);
  for (int r = 0; r < 3; ++r) q.join(r, r + 1, 0, 0);
  q.tick(0);
  q.vote(1, 0, 0, true, 0.1);
  q.vote(1, 0, 1, true, 0.1);
  q.join(2, 4, 0, 0.2);  // replica 2 restarted before it voted
  const auto ev = q.tick(0.2);
  ASSERT_TRUE(ev.decision);
  EXPECT_FALSE(ev.decision->commit);
  ASSERT_TRUE(ev.generation);
  EXPECT_EQ(ev.generation->members.back().incarnation, 4);
}

TEST(Quorum, TwoHalvesOfAPartitionCannotBothTrain) {
  Quorum q(1, kTimeout);
  for (int r = 0; r < 4; ++r) q.join(r, r + 1, 0, 0);
  q.tick(0);
  EXPECT_TRUE(q.quorum(3));
  EXPECT_FALSE(q.quorum(2));  // half of the 4 heard from is not a majority
  for (double t = 0.5; t < 3; t += 0.5) {
    q.heartbeat(0, t);
    q.heartbeat(1, t);
  }
  q.vote(1, 0, 0, false, 3.0);  // their reductions failed
  q.vote(1, 0, 1, false, 3.0);
  const auto ev = q.tick(3.0);  // 2 and 3 silent: the attempt aborts, no generation forms
  ASSERT_TRUE(ev.decision);
  EXPECT_FALSE(ev.decision->commit);
  EXPECT_FALSE(ev.generation);
}

TEST(Quorum, ARestartedCoordinatorResumesFromItsState) {
  PersistedState s;
  s.generation = 7;
  s.committed = 12;
  s.heard = {0, 1, 2};
  const PersistedState back = PersistedState::from_json(s.to_json());
  EXPECT_EQ(back.generation, 7);
  EXPECT_EQ(back.committed, 12);
  EXPECT_EQ(back.heard, s.heard);
  Quorum q(2, kTimeout, back);
  q.join(0, 1, 12, 0);
  EXPECT_FALSE(q.tick(0).generation);  // 1 of the 3 heard from
  q.join(1, 2, 11, 0);                 // a commit it never applied before the coordinator died
  const auto ev = q.tick(0.1);
  ASSERT_TRUE(ev.generation);
  EXPECT_EQ(ev.generation->id, 8);  // generations never go back
  EXPECT_EQ(ev.generation->step, 12);
  EXPECT_TRUE(ev.generation->heal);
  EXPECT_EQ(ev.generation->root, 0);
  EXPECT_THROW(PersistedState::from_json("{\"generation\": 1}"), ConfigError);
}

TEST(Quorum, RecordsRoundTrip) {
  Generation g{.id = 3, .step = 5, .members = {{0, 1, 5}, {2, 7, 0}}, .root = 0, .heal = true};
  const Generation back = Generation::decode(g.encode());
  EXPECT_EQ(back.id, 3);
  EXPECT_EQ(back.step, 5);
  EXPECT_EQ(back.members, g.members);
  EXPECT_TRUE(back.heal);
  EXPECT_EQ(back.position(2, 7), 1);
  EXPECT_FALSE(back.position(2, 6));
  const Decision d = Decision::decode(3, 5, Decision{.commit = true, .next_generation = 4}.encode());
  EXPECT_TRUE(d.commit);
  EXPECT_EQ(d.next_generation, 4);
  EXPECT_THROW(Generation::decode("3 5 0"), Error);
}

}  // namespace
}  // namespace ndmesh::elastic
