// The stream-ordering state machine of device communicators (comm/stream_order.hpp) on a
// fake stream: a collective sees the kernels enqueued before it, the kernels enqueued after
// its join see its result, nothing waits on the host, and the watchdog's list names an
// operation that never passes.
#include "ndmesh/comm/stream_order.hpp"

#include <gtest/gtest.h>

#include "ndmesh/core/error.hpp"
#include "support/fake_streams.hpp"

namespace ndmesh::comm {
namespace {

using testing::FakeStreams;

TEST(StreamOrder, CollectiveRunsAfterEarlierKernelsAndBeforeLaterOnes) {
  FakeStreams fake;
  void* compute = fake.stream();
  void* comm = fake.stream();
  int x = 0, seen_by_collective = -1, seen_after = -1;
  fake.launch(compute, [&] { x = 1; });  // the backward writes the gradient
  StreamOrder op(fake, compute, comm);
  op.begin();
  fake.launch(comm, [&] {  // the all-reduce
    seen_by_collective = x;
    x = 10;
  });
  op.end();
  op.join();
  fake.launch(compute, [&] { seen_after = x; });  // the optimizer reads it

  // The communication stream runs first: it waits for the compute stream's event.
  EXPECT_EQ(fake.run(comm), 0);
  EXPECT_EQ(seen_by_collective, -1);
  EXPECT_FALSE(op.passed());
  // The compute stream runs its kernel, then waits for the collective.
  fake.run(compute);
  EXPECT_EQ(x, 1);
  EXPECT_EQ(seen_after, -1);
  EXPECT_GT(fake.queued(compute), 0u);
  fake.run(comm);
  EXPECT_EQ(seen_by_collective, 1);
  EXPECT_TRUE(op.passed());
  fake.run(compute);
  EXPECT_EQ(seen_after, 10);
  EXPECT_EQ(op.state(), StreamOrder::State::kJoined);
}

TEST(StreamOrder, OutOfOrderUseIsAnError) {
  FakeStreams fake;
  void* compute = fake.stream();
  void* comm = fake.stream();
  StreamOrder op(fake, compute, comm);
  EXPECT_THROW(op.join(), Error);
  EXPECT_THROW(op.end(), Error);
  op.begin();
  EXPECT_THROW(op.begin(), Error);
  op.end();
  op.join();
  op.join();                            // idempotent
  EXPECT_EQ(fake.queued(compute), 2u);  // one record, one wait: the second join added nothing
}

TEST(StreamOrder, EventsAreReleasedWithTheirLastHandle) {
  FakeStreams fake;
  void* compute = fake.stream();
  void* comm = fake.stream();
  {
    StreamOrder op(fake, compute, comm);
    op.begin();
    op.end();
    op.join();
    EXPECT_EQ(fake.live_events(), 1);  // the begin event went with its scope; the end event lives
  }
  fake.run_all();
  EXPECT_EQ(fake.live_events(), 0);
}

TEST(PendingOps, NamesTheOldestOperationPastItsTimeoutUntilItPasses) {
  FakeStreams fake;
  void* compute = fake.stream();
  void* comm = fake.stream();
  PendingOps pending(fake);
  const auto t0 = PendingOps::Clock::now();
  StreamOrder a(fake, compute, comm), b(fake, compute, comm);
  a.begin();
  a.end();
  pending.add({.done = a.done(), .op = "all_reduce", .start = t0, .timeout_s = 1.0});
  b.begin();
  b.end();
  pending.add(
      {.done = b.done(), .op = "all_gather", .start = t0 + std::chrono::seconds(1), .timeout_s = 1.0});
  EXPECT_FALSE(pending.expired(t0 + std::chrono::milliseconds(500)).has_value());
  auto late = pending.expired(t0 + std::chrono::milliseconds(1500));
  ASSERT_TRUE(late.has_value());
  EXPECT_EQ(late->op, "all_reduce");
  EXPECT_EQ(pending.size(), 2u);
  // The streams run: both pass, nothing is pending or expired any more.
  fake.run_all();
  EXPECT_FALSE(pending.expired(t0 + std::chrono::seconds(10)).has_value());
  EXPECT_EQ(pending.size(), 0u);
}

TEST(PendingOps, AStuckStreamKeepsItsOperationsPending) {
  FakeStreams fake;
  void* compute = fake.stream();
  void* comm = fake.stream();
  void* peer = fake.stream();  // stands for a peer rank that never arrives
  Event never = make_event(fake);
  fake.record(never.get(), peer);
  fake.wait(comm, never.get());  // the collective waits for the peer
  PendingOps pending(fake);
  StreamOrder op(fake, compute, comm);
  op.begin();
  op.end();
  op.join();
  const auto t0 = PendingOps::Clock::now();
  pending.add({.done = op.done(), .op = "reduce_scatter", .start = t0, .timeout_s = 0.5});
  fake.run(compute);
  fake.run(comm);
  auto late = pending.expired(t0 + std::chrono::seconds(1));
  ASSERT_TRUE(late.has_value());
  EXPECT_EQ(late->op, "reduce_scatter");
}

}  // namespace
}  // namespace ndmesh::comm
