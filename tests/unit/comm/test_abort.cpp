// Communicator::abort() and the groups over a store (connect_store_group) whose failures
// stay inside them: an abort ends the operations waiting on it, on the aborting rank and
// on its peers, and a timeout is a TimeoutError naming the group, with the process going on.
// In-process ranks (threads) for the inproc backend; threads of this process, each a member
// of a Gloo group met at an in-process TCP store, for the groups over a store.
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "ndmesh/comm/communicator.hpp"
#include "ndmesh/comm/inproc.hpp"
#include "ndmesh/launch/store.hpp"

namespace ndmesh::comm {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

TEST(Abort, InprocEndsTheGroupOnEveryMemberAndLeavesTheJob) {
  inproc::run(3, [](const Communicator& world) {
    Communicator group = world.dup("replicas");
    std::vector<float> x(4, 1.0f);
    group.all_reduce(std::span<float>(x));
    EXPECT_EQ(x[0], 3.0f);
    if (world.rank() == 0) {
      // Ranks 1 and 2 are already waiting for rank 0 in this all_reduce: they end at once.
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      group.abort("replica 0 is gone");
      EXPECT_THROW(group.all_reduce(std::span<float>(x)), Aborted);
    } else {
      const auto t0 = Clock::now();
      try {
        group.all_reduce(std::span<float>(x));
        ADD_FAILURE() << "the all_reduce of an aborted group completed";
      } catch (const Aborted& e) {
        EXPECT_NE(std::string(e.what()).find("group replicas was aborted: replica 0 is gone"), std::string::npos)
            << e.what();
      }
      EXPECT_LT(seconds_since(t0), 5.0);  // not the job's 30 s timeout
      EXPECT_THROW(group.barrier(), Aborted);
    }
    // The job and its other groups go on.
    std::int64_t one = 1;
    world.all_reduce(std::span<std::int64_t>(&one, 1));
    EXPECT_EQ(one, 3);
  });
}

// Runs body(rank) on `n` threads, each a member of a group of `n` over one in-process store,
// and rethrows the first failure.
template <typename F>
void store_group(int n, double timeout_s, F body) {
  launch::StoreServer server("127.0.0.1", 0);
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        const auto store = launch::Store::connect("127.0.0.1", server.port(), 10).prefixed("g1/");
        Communicator group;
        try {
          group = connect_store_group(store, r, n, {.name = "replicas-g1", .timeout_s = timeout_s});
        } catch (const ConfigError& e) {
          if (r == 0) fmt::print(stderr, "{}\n", e.what());
          return;
        }
        body(group);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
}

TEST(StoreGroup, SumsBroadcastsAndRefusesWhatItHasNot) {
  store_group(3, 10, [](const Communicator& group) {
    EXPECT_EQ(group.size(), 3);
    EXPECT_EQ(group.backend(), "gloo");
    std::vector<float> x = {static_cast<float>(group.rank()), 1.0f, 0.5f};
    group.all_reduce(std::span<float>(x));
    EXPECT_EQ(x, (std::vector<float>{3.0f, 3.0f, 1.5f}));
    double loss = group.rank() + 0.25;
    group.all_reduce(std::span<double>(&loss, 1));
    EXPECT_EQ(loss, 3.75);
    std::vector<std::int64_t> v(5, group.rank() == 2 ? 7 : -1);
    group.broadcast(std::span<std::int64_t>(v), 2);
    EXPECT_EQ(v, std::vector<std::int64_t>(5, 7));
    group.barrier();
    std::vector<float> all(3);
    try {
      group.all_gather(std::span<const float>(x.data(), 1), std::span<float>(all));
      ADD_FAILURE() << "all_gather on a group over a store";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("all_gather is not available on a group over a store"), std::string::npos)
          << e.what();
    }
  });
}

TEST(StoreGroup, AnAbortEndsTheWaitsHereAndAtThePeers) {
  store_group(3, 20, [](const Communicator& group) {
    std::vector<float> x(1000, 1.0f);
    group.all_reduce(std::span<float>(x));
    const auto t0 = Clock::now();
    if (group.rank() == 1) {
      // Member 1 aborts while waiting itself (from another thread, as a watcher does).
      std::thread watcher([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        group.abort("generation 1 lost a member");
      });
      try {
        group.all_reduce(std::span<float>(x));  // member 2 never comes: only the abort ends it
        ADD_FAILURE() << "completed";
      } catch (const Aborted& e) {
        EXPECT_NE(std::string(e.what()).find("generation 1 lost a member"), std::string::npos) << e.what();
      }
      watcher.join();
      EXPECT_THROW(group.all_reduce(std::span<float>(x)), Aborted);
    } else if (group.rank() == 0) {
      // Member 0 waits for member 1's part: the closed connection ends it.
      EXPECT_THROW(group.all_reduce(std::span<float>(x)), Error);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
    EXPECT_LT(seconds_since(t0), 10.0);  // not the group's 20 s timeout
  });
}

TEST(StoreGroup, ATimeoutIsATimeoutErrorNamingTheGroupAndTheProcessGoesOn) {
  store_group(2, 0.3, [](const Communicator& group) {
    if (group.rank() == 1) {  // alive (a peer that exits fails the others at once) but never joins
      std::this_thread::sleep_for(std::chrono::milliseconds(800));
      return;
    }
    std::vector<float> x(8, 1.0f);
    try {
      group.all_reduce(std::span<float>(x));
      ADD_FAILURE() << "completed without its peer";
    } catch (const TimeoutError& e) {
      EXPECT_NE(std::string(e.what()).find("all_reduce on group replicas-g1 (ranks 0,1) timed out after 0.3 s"),
                std::string::npos)
          << e.what();
    }
    EXPECT_THROW(group.barrier(), TimeoutError);  // the group stays ended
  });
}

}  // namespace
}  // namespace ndmesh::comm
