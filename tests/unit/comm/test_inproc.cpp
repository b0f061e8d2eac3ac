// The in-process backend's own contract (comm/inproc.hpp), beyond the operations the
// shared collectives tests cover: message matching by (peer, tag) in order, rendezvous
// sends, dup/self/split_node, mismatched collectives, and how a job ends: a timeout as a
// TimeoutError naming the group on every rank, a throwing rank, a rank that returns
// early, abort_job; and the per-thread "[rank r]" log prefix.
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "ndmesh/comm/communicator.hpp"
#include "ndmesh/comm/inproc.hpp"
#include "ndmesh/core/error.hpp"
#include "ndmesh/core/log.hpp"

namespace ndmesh::comm {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The message of what `f` throws as E; fails the test when it throws nothing or another type.
template <typename E, typename F>
std::string what_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw another type: " << e.what();
    return "";
  }
  ADD_FAILURE() << "threw nothing";
  return "";
}

TEST(Inproc, MessagesMatchOnPeerAndTagInPostingOrder) {
  inproc::run(3, [](const Communicator& world) {
    const int r = world.rank();
    if (r == 0) {
      // Sends complete only when received (rendezvous): asynchronous, since rank 1
      // receives them in another order.
      const int v[] = {1, 2, 3, 40};
      std::vector<Work> sent;
      for (int i = 0; i < 4; ++i)
        sent.push_back(world.send_async(std::span<const int>(&v[i], 1), 1, {.tag = i == 1 ? 8 : 7}));
      wait_all(sent);
    } else if (r == 1) {
      // A receive posted before its send, one of another tag in between, then two from the
      // same peer and tag in the order they were sent; and one from rank 2.
      int from2 = -1, a = -1, b = -1, c = -1, d = -1;
      Work early = world.recv_async(std::span<int>(&from2, 1), 2, {.tag = 7});
      world.recv(std::span<int>(&b, 1), 0, {.tag = 8});
      world.recv(std::span<int>(&a, 1), 0, {.tag = 7});
      world.recv(std::span<int>(&c, 1), 0, {.tag = 7});
      world.recv(std::span<int>(&d, 1), 0, {.tag = 7});
      early.wait();
      EXPECT_EQ(std::vector<int>({a, b, c, d, from2}), std::vector<int>({1, 2, 3, 40, 22}));
    } else {
      const int v = 22;
      world.send(std::span<const int>(&v, 1), 1, {.tag = 7});
    }
  });
}

// JobOptions::tagless (NCCL's semantics): the same posting as above matches in issue order
// per peer, whatever the tags.
TEST(Inproc, TaglessMessagesMatchInIssueOrderPerPeer) {
  inproc::run(
      3,
      [](const Communicator& world) {
        const int r = world.rank();
        if (r == 0) {
          const int v[] = {1, 2, 3, 40};
          std::vector<Work> sent;
          for (int i = 0; i < 4; ++i)
            sent.push_back(world.send_async(std::span<const int>(&v[i], 1), 1, {.tag = i == 1 ? 8 : 7}));
          wait_all(sent);
        } else if (r == 1) {
          int from2 = -1, a = -1, b = -1, c = -1, d = -1;
          Work early = world.recv_async(std::span<int>(&from2, 1), 2, {.tag = 7});
          world.recv(std::span<int>(&b, 1), 0, {.tag = 8});  // takes the first message of rank 0
          world.recv(std::span<int>(&a, 1), 0, {.tag = 7});
          world.recv(std::span<int>(&c, 1), 0, {.tag = 7});
          world.recv(std::span<int>(&d, 1), 0, {.tag = 9});
          early.wait();
          EXPECT_EQ(std::vector<int>({b, a, c, d, from2}), std::vector<int>({1, 2, 3, 40, 22}));
        } else {
          const int v = 22;
          world.send(std::span<const int>(&v, 1), 1, {.tag = 5});
        }
      },
      {.tagless = true});
}

TEST(Inproc, ASendCompletesOnlyWhenReceived) {
  inproc::run(2, [](const Communicator& world) {
    std::vector<double> data(100, 1.5);
    if (world.rank() == 0) {
      Work w = world.send_async(std::span<const double>(data), 1);
      EXPECT_FALSE(w.test());  // rank 1 receives only after the barrier
      world.barrier();
      w.wait();
    } else {
      world.barrier();
      std::vector<double> got(100);
      world.recv(std::span<double>(got), 0);
      EXPECT_EQ(got, data);
    }
  });
}

TEST(Inproc, AReceiveOfAnotherCountIsAnError) {
  inproc::run(2, [](const Communicator& world) {
    std::vector<float> data(5, 1.0f);
    if (world.rank() == 0) {
      world.send(std::span<const float>(data), 1);
    } else {
      std::vector<float> got(4);
      const std::string msg = what_of<Error>([&] { world.recv(std::span<float>(got), 0); });
      EXPECT_NE(msg.find("expected 4 float32 elements but the message held 5 float32"), std::string::npos)
          << msg;
    }
  });
}

// connect_peers names other ranks of the group only (on NCCL it makes the connections; here
// there is nothing to connect and messages flow as before).
TEST(Inproc, ConnectPeersChecksThePeersAndKeepsMessagesFlowing) {
  inproc::run(3, [](const Communicator& world) {
    const int r = world.rank(), next = (r + 1) % 3, prev = (r + 2) % 3;
    const std::vector<int> peers = {prev, next};
    world.connect_peers(peers);
    int got = -1;
    Work w = world.recv_async(std::span<int>(&got, 1), prev);
    world.send(std::span<const int>(&r, 1), next);
    w.wait();
    EXPECT_EQ(got, prev);
    for (const int bad : {r, 3, -1}) {
      const std::vector<int> wrong = {bad};
      const std::string msg = what_of<Error>([&] { world.connect_peers(wrong); });
      EXPECT_NE(msg.find("peer " + std::to_string(bad) + " is not another rank of its 3"), std::string::npos) << msg;
    }
  });
}

TEST(Inproc, DupSelfAndSplitNode) {
  inproc::run(5,
              [](const Communicator& world) {
                const int r = world.rank();
                // dup: the same members, and a message on the duplicate never matches one on the
                // original with the same tag, whatever the order they are posted in.
                Communicator mine = world.dup("mine");
                EXPECT_EQ(mine.members(), world.members());
                EXPECT_EQ(mine.name(), "mine");
                const int next = (r + 1) % 5, prev = (r + 4) % 5;
                int on_world = -1, on_dup = -1;
                Work a = world.recv_async(std::span<int>(&on_world, 1), prev, {.tag = 3});
                Work b = mine.recv_async(std::span<int>(&on_dup, 1), prev, {.tag = 3});
                const int x = 100 + r, y = 200 + r;
                mine.send(std::span<const int>(&y, 1), next, {.tag = 3});
                world.send(std::span<const int>(&x, 1), next, {.tag = 3});
                a.wait();
                b.wait();
                EXPECT_EQ(on_world, 100 + prev);
                EXPECT_EQ(on_dup, 200 + prev);
                // self: one member, no communication.
                Communicator self = world.self();
                EXPECT_EQ(self.size(), 1);
                EXPECT_EQ(self.members(), std::vector<std::int64_t>({r}));
                double v = 2.0;
                self.all_reduce(std::span<double>(&v, 1));
                EXPECT_EQ(v, 2.0);
                // Nodes of two ranks: {0,1}, {2,3}, {4}.
                Communicator node = world.split_node();
                const std::vector<std::vector<std::int64_t>> nodes = {{0, 1}, {0, 1}, {2, 3}, {2, 3}, {4}};
                EXPECT_EQ(node.members(), nodes[static_cast<std::size_t>(r)]);
                EXPECT_EQ(world.backend(), "inproc");
                EXPECT_EQ(world.thread_limit(), "");
              },
              {.ranks_per_node = 2});
}

TEST(Inproc, MismatchedCollectivesAreAnErrorOnEveryMember) {
  std::vector<std::string> seen(3);
  try {
    inproc::run(3, [&](const Communicator& world) {
      std::vector<float> data(4, 1.0f);
      try {
        if (world.rank() == 2)
          world.broadcast(std::span<float>(data), 0);
        else
          world.all_reduce(std::span<float>(data));
      } catch (const Error& e) {
        seen[static_cast<std::size_t>(world.rank())] = e.what();
        throw;
      }
    });
    FAIL() << "the job must fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "rank 0 calls all_reduce of 4 float32 (sum) but rank 2 calls broadcast of 4 "
                  "float32 from root 0"),
              std::string::npos)
        << e.what();
  }
  for (const std::string& s : seen)
    EXPECT_NE(s.find("collective #0 of the group of ranks 0,1,2"), std::string::npos) << s;
}

TEST(Inproc, ATimeoutIsATimeoutErrorNamingTheGroupOnEveryRank) {
  // Rank 1 never sends; rank 0's blocking recv (watched by the watchdog) times out after
  // 0.2 s, and rank 2, waiting in a barrier rank 0 never reaches, gets the same error.
  std::vector<std::string> seen(3);
  const auto t0 = Clock::now();
  const std::string msg = what_of<TimeoutError>([&] {
    inproc::run(3,
                [&](const Communicator& world) {
                  Communicator pp =
                      world.split(world.rank() < 2 ? 0 : 1, world.rank(), "pp", {.timeout_s = 30});
                  try {
                    if (world.rank() == 0) {
                      float x = 0;
                      pp.recv(std::span<float>(&x, 1), 1);
                    }
                    world.barrier({.timeout_s = 30});
                  } catch (const TimeoutError& e) {
                    seen[static_cast<std::size_t>(world.rank())] = e.what();
                    throw;
                  }
                },
                {.timeout_s = 0.2});
  });
  EXPECT_EQ(msg, "[comm] recv from rank 1 (world 1) on group pp (ranks 0,1) timed out after 0.2 s");
  for (const std::string& s : seen) EXPECT_EQ(s, msg);
  EXPECT_LT(seconds_since(t0), 10.0);  // the job ended at the timeout, not at the barrier's 30 s
}

TEST(Inproc, AnAwaitedOperationTimesOutAsATimeoutError) {
  const std::string msg = what_of<TimeoutError>([&] {
    inproc::run(2, [&](const Communicator& world) {
      float x = 1;
      if (world.rank() == 0)
        world.named("tp").all_reduce_async(std::span<float>(&x, 1), {.timeout_s = 0.1}).wait();
      else
        world.recv(std::span<float>(&x, 1), 0);  // never sent: ends with the job
    });
  });
  EXPECT_EQ(msg, "[comm] all_reduce on group tp (ranks 0,1) timed out after 0.1 s");
}

TEST(Inproc, AnAllToAllVTimesOutNamingTheGroup) {
  const std::string msg = what_of<TimeoutError>([&] {
    inproc::run(2, [&](const Communicator& world) {
      std::vector<float> in(2, 1), out(2);
      const std::int64_t counts[] = {1, 1};
      if (world.rank() == 0)
        world.named("ep").all_to_all_v(std::span<const float>(in), std::span<const std::int64_t>(counts),
                                       std::span<float>(out), std::span<const std::int64_t>(counts),
                                       {.timeout_s = 0.1});
      else
        world.recv(std::span<float>(out).first(1), 0);  // never sent: ends with the job
    });
  });
  EXPECT_EQ(msg, "[comm] all_to_all_v on group ep (ranks 0,1) timed out after 0.1 s");
}

TEST(Inproc, AllToAllVCountsThatDoNotPairAreAnErrorOnEveryMember) {
  // Rank 0 sends 2 elements to rank 1, which expects 1.
  std::vector<std::string> seen(2);
  what_of<Error>([&] {
    inproc::run(2, [&](const Communicator& world) {
      const bool zero = world.rank() == 0;
      const std::int64_t send[] = {1, zero ? 2 : 1}, recv[] = {1, 1};
      std::vector<float> in(zero ? 3 : 2), out(2);
      try {
        world.all_to_all_v(std::span<const float>(in), std::span<const std::int64_t>(send), std::span<float>(out),
                           std::span<const std::int64_t>(recv));
      } catch (const Error& e) {
        seen[static_cast<std::size_t>(world.rank())] = e.what();
        throw;
      }
    });
  });
  for (const std::string& s : seen)
    EXPECT_NE(s.find("rank 0 sends 2 elements to rank 1, which expects 1"), std::string::npos) << s;
}

TEST(Inproc, ASplitTimesOutToo) {
  const std::string msg = what_of<TimeoutError>([&] {
    inproc::run(2,
                [&](const Communicator& world) {
                  float x = 1;
                  if (world.rank() == 0)
                    world.split(0, 0, "again");
                  else
                    world.recv(std::span<float>(&x, 1), 0,
                               {.timeout_s = 30});  // never sent: ends with the job
                },
                {.timeout_s = 0.1});
  });
  EXPECT_EQ(msg, "[comm] split on group world (ranks 0,1) timed out after 0.1 s");
}

TEST(Inproc, ARankThatThrowsEndsTheJobAndItsErrorIsRethrown) {
  std::vector<std::string> seen(4);
  const auto t0 = Clock::now();
  const std::string msg = what_of<std::runtime_error>([&] {
    inproc::run(4, [&](const Communicator& world) {
      if (world.rank() == 3) throw std::runtime_error("rank 3 gives up");
      try {
        world.barrier({.timeout_s = 30});
      } catch (const JobAborted& e) {
        seen[static_cast<std::size_t>(world.rank())] = e.what();
        throw;
      }
    });
  });
  EXPECT_EQ(msg, "rank 3 gives up");
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(seen[static_cast<std::size_t>(r)],
              "[comm] the in-process job was ended by rank 3: rank 3 gives up");
  EXPECT_LT(seconds_since(t0), 10.0);
}

TEST(Inproc, ARankThatReturnsEarlyFailsItsPeersAtOnce) {
  const auto t0 = Clock::now();
  const std::string msg = what_of<Error>([&] {
    inproc::run(2, [&](const Communicator& world) {
      if (world.rank() == 1) return;  // as an ASSERT_* failure would
      double x = 0;
      world.recv(std::span<double>(&x, 1), 1, {.tag = 4});
    });
  });
  EXPECT_EQ(msg,
            "[comm] recv from rank 1 (world 1) with tag 4: that rank returned from its body without the "
            "matching send");
  const std::string coll = what_of<Error>([&] {
    inproc::run(3, [&](const Communicator& world) {
      if (world.rank() != 1) world.barrier();
    });
  });
  EXPECT_NE(
      coll.find("rank 1 of the group (world rank 1, group of ranks 0,1,2) returned from its body without "
                "joining collective #0 (barrier)"),
      std::string::npos)
      << coll;
  EXPECT_LT(seconds_since(t0), 10.0);
}

TEST(Inproc, AnUnwaitedSendWhosePeerReturnedStillFailsTheJob) {
  // The Work's destructor can only report its failure; the job still ends with it.
  ::testing::internal::CaptureStderr();
  const std::string msg = what_of<JobAborted>([&] {
    inproc::run(2, [&](const Communicator& world) {
      const float x = 1;
      if (world.rank() == 0) Work w = world.send_async(std::span<const float>(&x, 1), 1, {.tag = 2});
    });
  });
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(
      msg,
      "[comm] the in-process job was ended by rank 0: [comm] send to rank 1 (world 1) with tag 2: that rank "
      "returned from its body without the matching recv");
  EXPECT_NE(err.find("[rank 0] error: [comm] send to rank 1"), std::string::npos) << err;
}

TEST(Inproc, AbortJobThrowsOnEveryRank) {
  const std::string msg = what_of<TimeoutError>([&] {
    inproc::run(2, [&](const Communicator& world) {
      if (world.rank() == 1) world.abort_job(kTimeoutExitCode, "pp", "stage 1 waited too long");
      world.barrier();
    });
  });
  EXPECT_EQ(msg, "[pp] stage 1 waited too long");
  const std::string plain = what_of<JobAborted>([&] {
    inproc::run(2, [&](const Communicator& world) {
      if (world.rank() == 0) world.abort_job(3);
      world.barrier();
    });
  });
  EXPECT_EQ(plain, "[comm] rank 0 ended the job with exit status 3");
}

TEST(Inproc, EachRankThreadLogsWithItsOwnPrefix) {
  ::testing::internal::CaptureStderr();
  inproc::run(3, [](const Communicator& world) {
    log::error("hello from {}", world.rank());
    world.barrier();
  });
  const std::string err = ::testing::internal::GetCapturedStderr();
  for (int r = 0; r < 3; ++r)
    EXPECT_NE(err.find(fmt::format("[rank {}] error: hello from {}\n", r, r)), std::string::npos) << err;
  EXPECT_EQ(log::current_rank(), -1);  // the test's own thread has no rank
}

TEST(Inproc, ReductionsGiveEveryRankTheSameBitsInRankOrder) {
  // 0.1 + 0.2 + 0.3 in float depends on the order; every member gets the rank-order sum.
  inproc::run(3, [](const Communicator& world) {
    const float mine[] = {0.1f, 0.2f, 0.3f};
    float x = mine[world.rank()];
    world.all_reduce(std::span<float>(&x, 1));
    EXPECT_EQ(x, (0.1f + 0.2f) + 0.3f);
    BFloat16 b(1.0f);
    world.all_reduce(std::span<BFloat16>(&b, 1), {.op = ReduceOp::kMax});
    EXPECT_EQ(static_cast<float>(b), 1.0f);
  });
}

}  // namespace
}  // namespace ndmesh::comm
