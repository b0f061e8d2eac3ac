// Every collective and point-to-point operation of Communicator, for every element type
// and for counts 0, 1, 1000 and 1,000,003, checked against closed-form values: rank r
// contributes values built from r and the element index, so each result element has a
// formula in the group size n. Run under mpirun, and on in-process jobs of 1 to 4 ranks
// (tests/unit/comm/test_inproc_collectives.cpp, see tests/support/worlds.hpp).
#include <cstdint>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "ndmesh/comm/communicator.hpp"
#include "ndmesh/core/error.hpp"
#include "support/worlds.hpp"

namespace ndmesh::comm {
namespace {

using testing_support::for_each_world;
using testing_support::kInproc;

// In-process jobs copy in memory: the large count is smaller there, to keep each test short.
constexpr std::size_t kCounts[] = {0, 1, 1000, kInproc ? 100003 : 1000003};
constexpr std::int64_t kBig = std::int64_t{1} << 40;  // exercises the upper bits of int64

template <typename T>
T offset() {
  if constexpr (std::is_same_v<T, std::int64_t>) return kBig;
  return 0;
}

template <typename T>
class Collectives : public ::testing::Test {};
using Types = ::testing::Types<float, double, std::int32_t, std::int64_t>;
TYPED_TEST_SUITE(Collectives, Types);

TYPED_TEST(Collectives, AllReduceSumMaxMinAvg) {
  using T = TypeParam;
  for_each_world([&](const Communicator& world) {
    const std::int64_t n = world.size(), r = world.rank();
    for (std::size_t count : kCounts) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kAvg}) {
        if (op == ReduceOp::kAvg && !std::is_floating_point_v<T>) continue;
        std::vector<T> data(count);
        for (std::size_t i = 0; i < count; ++i)
          data[i] = static_cast<T>((r + 1) * static_cast<std::int64_t>(i % 7 + 1)) + offset<T>();
        world.all_reduce(std::span<T>(data), {.op = op});
        std::size_t bad = 0;
        for (std::size_t i = 0; i < count; ++i) {
          std::int64_t k = static_cast<std::int64_t>(i % 7 + 1);
          double expected = 0;
          switch (op) {
            case ReduceOp::kSum:
              expected = static_cast<double>(k * n * (n + 1) / 2) + static_cast<double>(n * offset<T>());
              break;
            case ReduceOp::kMax:
              expected = static_cast<double>(k * n + offset<T>());
              break;
            case ReduceOp::kMin:
              expected = static_cast<double>(k + offset<T>());
              break;
            case ReduceOp::kAvg:
              expected = static_cast<double>(k) * static_cast<double>(n + 1) / 2.0;
              break;
          }
          if (static_cast<double>(data[i]) != expected && bad++ < 3)
            ADD_FAILURE() << reduce_op_name(op) << " count " << count << " element " << i << ": got "
                          << data[i] << " expected " << expected;
        }
        EXPECT_EQ(bad, 0u) << reduce_op_name(op) << " count " << count;
      }
    }
  });
}

TYPED_TEST(Collectives, Broadcast) {
  using T = TypeParam;
  for_each_world([&](const Communicator& world) {
    const int root = world.size() - 1;
    for (std::size_t count : kCounts) {
      std::vector<T> data(count, static_cast<T>(-1));
      if (world.rank() == root)
        for (std::size_t i = 0; i < count; ++i) data[i] = static_cast<T>(i % 1000 + 7) + offset<T>();
      world.broadcast(std::span<T>(data), root);
      std::size_t bad = 0;
      for (std::size_t i = 0; i < count; ++i) bad += data[i] != static_cast<T>(i % 1000 + 7) + offset<T>();
      EXPECT_EQ(bad, 0u) << "count " << count;
    }
  });
}

TYPED_TEST(Collectives, ReduceScatterSumAndAvg) {
  using T = TypeParam;
  for_each_world([&](const Communicator& world) {
    const std::int64_t n = world.size(), r = world.rank();
    for (std::size_t count : kCounts) {
      // Block j of rank r holds (r+1)*(j+1) + i%5: member j receives (j+1)*n(n+1)/2 + n*(i%5).
      std::vector<T> in(count * static_cast<std::size_t>(n));
      for (std::int64_t j = 0; j < n; ++j)
        for (std::size_t i = 0; i < count; ++i)
          in[static_cast<std::size_t>(j) * count + i] =
              static_cast<T>((r + 1) * (j + 1) + static_cast<std::int64_t>(i % 5));
      std::vector<T> out(count, static_cast<T>(-1));
      world.reduce_scatter(std::span<const T>(in), std::span<T>(out));
      std::size_t bad = 0;
      for (std::size_t i = 0; i < count; ++i)
        bad += out[i] != static_cast<T>((r + 1) * n * (n + 1) / 2 + n * static_cast<std::int64_t>(i % 5));
      EXPECT_EQ(bad, 0u) << "sum, count " << count;
      if constexpr (std::is_floating_point_v<T>) {
        world.reduce_scatter(std::span<const T>(in), std::span<T>(out), {.op = ReduceOp::kAvg});
        bad = 0;
        for (std::size_t i = 0; i < count; ++i)
          bad += out[i] != static_cast<T>(static_cast<double>(r + 1) * static_cast<double>(n + 1) / 2.0 +
                                          static_cast<double>(i % 5));
        EXPECT_EQ(bad, 0u) << "avg, count " << count;
      }
    }
  });
}

// Every reduce-scatter algorithm of the Gloo backend (testing::set_gloo_reduce_scatter;
// other backends ignore the choice) gives the same values, and leaves the group usable:
// each call is followed by a point-to-point ring and an all-gather on the same group, and
// an async reduce-scatter overlaps a point-to-point exchange (Gloo's halving-doubling,
// made per call on the group's own context, hung there in the sends that followed it).
TYPED_TEST(Collectives, GlooReduceScatterAlgorithmsAgree) {
  using T = TypeParam;
  using Algorithm = testing::GlooReduceScatter;
  for_each_world([&](const Communicator& world) {
    const std::int64_t n = world.size(), r = world.rank();
    const int next = static_cast<int>((r + 1) % n), prev = static_cast<int>((r + n - 1) % n);
    for (Algorithm algorithm :
         {Algorithm::kAllReduce, Algorithm::kHalvingDoubling, Algorithm::kRing, Algorithm::kAuto}) {
      testing::set_gloo_reduce_scatter(algorithm);  // the same on every rank (a global of the process)
      for (std::size_t count : {std::size_t{1}, std::size_t{7}, kCounts[2], kCounts[3]}) {
        std::vector<T> in(count * static_cast<std::size_t>(n));
        for (std::int64_t j = 0; j < n; ++j)
          for (std::size_t i = 0; i < count; ++i)
            in[static_cast<std::size_t>(j) * count + i] =
                static_cast<T>((r + 1) * (j + 1) + static_cast<std::int64_t>(i % 5));
        auto expected = [&](std::size_t i) {
          return static_cast<T>((r + 1) * n * (n + 1) / 2 + n * static_cast<std::int64_t>(i % 5));
        };
        std::vector<T> out(count, static_cast<T>(-1)), ring_out(count), ring_in(count);
        for (std::size_t i = 0; i < count; ++i) ring_out[i] = static_cast<T>(r * 3 + static_cast<int>(i % 11));
        // Async, overlapping a point-to-point exchange on the same group.
        Work rs = world.reduce_scatter_async(std::span<const T>(in), std::span<T>(out));
        Work sent = world.send_async(std::span<const T>(ring_out), next, {.tag = 9});
        world.recv(std::span<T>(ring_in), prev, {.tag = 9});
        sent.wait();
        rs.wait();
        std::size_t bad = 0;
        for (std::size_t i = 0; i < count; ++i) bad += out[i] != expected(i);
        EXPECT_EQ(bad, 0u) << "async, algorithm " << static_cast<int>(algorithm) << ", count " << count;
        // Blocking, in place, then a ring and an all-gather.
        std::vector<T> data = in;
        world.reduce_scatter_in_place(std::span<T>(data));
        bad = 0;
        for (std::size_t i = 0; i < count; ++i) bad += data[static_cast<std::size_t>(r) * count + i] != expected(i);
        EXPECT_EQ(bad, 0u) << "in place, algorithm " << static_cast<int>(algorithm) << ", count " << count;
        sent = world.send_async(std::span<const T>(ring_out), next, {.tag = 9});
        world.recv(std::span<T>(ring_in), prev, {.tag = 9});
        sent.wait();
        bad = 0;
        for (std::size_t i = 0; i < count; ++i) bad += ring_in[i] != static_cast<T>(prev * 3 + static_cast<int>(i % 11));
        EXPECT_EQ(bad, 0u) << "ring after, algorithm " << static_cast<int>(algorithm) << ", count " << count;
        std::vector<T> all(count * static_cast<std::size_t>(n));
        world.all_gather(std::span<const T>(out), std::span<T>(all));
        EXPECT_EQ(all[static_cast<std::size_t>(r) * count], expected(0));
      }
      // Max goes through the all-reduce on the ring's choice, through Gloo's own on halving-doubling.
      std::vector<T> in(3 * static_cast<std::size_t>(n));
      for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<T>((static_cast<std::int64_t>(i) + r) % n);
      std::vector<T> out(3);
      world.reduce_scatter(std::span<const T>(in), std::span<T>(out), {.op = ReduceOp::kMax});
      for (T v : out) EXPECT_EQ(v, static_cast<T>(n - 1));
    }
    testing::set_gloo_reduce_scatter(Algorithm::kAuto);
  });
}

TYPED_TEST(Collectives, AllGather) {
  using T = TypeParam;
  for_each_world([&](const Communicator& world) {
    const std::int64_t n = world.size(), r = world.rank();
    for (std::size_t count : kCounts) {
      std::vector<T> in(count);
      for (std::size_t i = 0; i < count; ++i)
        in[i] = static_cast<T>(r * 1000 + static_cast<std::int64_t>(i % 1000)) + offset<T>();
      std::vector<T> out(count * static_cast<std::size_t>(n), static_cast<T>(-1));
      world.all_gather(std::span<const T>(in), std::span<T>(out));
      std::size_t bad = 0;
      for (std::int64_t j = 0; j < n; ++j)
        for (std::size_t i = 0; i < count; ++i)
          bad += out[static_cast<std::size_t>(j) * count + i] !=
                 static_cast<T>(j * 1000 + static_cast<std::int64_t>(i % 1000)) + offset<T>();
      EXPECT_EQ(bad, 0u) << "count " << count;
    }
  });
}

TYPED_TEST(Collectives, AllToAll) {
  using T = TypeParam;
  for_each_world([&](const Communicator& world) {
    const std::int64_t n = world.size(), r = world.rank();
    for (std::size_t count : kCounts) {
      // Block j sent by rank r holds r*100 + j + 10000*(i%3); rank r's block j comes from rank j.
      std::vector<T> in(count * static_cast<std::size_t>(n));
      for (std::int64_t j = 0; j < n; ++j)
        for (std::size_t i = 0; i < count; ++i)
          in[static_cast<std::size_t>(j) * count + i] =
              static_cast<T>(r * 100 + j + 10000 * static_cast<std::int64_t>(i % 3));
      std::vector<T> out(in.size(), static_cast<T>(-1));
      world.all_to_all(std::span<const T>(in), std::span<T>(out));
      std::size_t bad = 0;
      for (std::int64_t j = 0; j < n; ++j)
        for (std::size_t i = 0; i < count; ++i)
          bad += out[static_cast<std::size_t>(j) * count + i] !=
                 static_cast<T>(j * 100 + r + 10000 * static_cast<std::int64_t>(i % 3));
      EXPECT_EQ(bad, 0u) << "count " << count;
    }
  });
}

TYPED_TEST(Collectives, AllToAllVUnevenAndZeroCounts) {
  using T = TypeParam;
  for_each_world([&](const Communicator& world) {
    const std::int64_t n = world.size(), r = world.rank();
    // Rank s sends ((3s + j) % 4) * unit elements to rank j: uneven, and zero for some pairs
    // (every pair when unit is 0). Element i of the block s -> j holds s*100 + j + 10000*(i%3).
    auto sent = [](std::int64_t s, std::int64_t j, std::int64_t unit) { return ((3 * s + j) % 4) * unit; };
    for (std::int64_t unit : {std::int64_t{0}, std::int64_t{1}, std::int64_t{1000}}) {
      std::vector<std::int64_t> send_counts(static_cast<std::size_t>(n)), recv_counts(send_counts.size());
      std::vector<T> in;
      for (std::int64_t j = 0; j < n; ++j) {
        send_counts[static_cast<std::size_t>(j)] = sent(r, j, unit);
        recv_counts[static_cast<std::size_t>(j)] = sent(j, r, unit);
        for (std::int64_t i = 0; i < sent(r, j, unit); ++i) in.push_back(static_cast<T>(r * 100 + j + 10000 * (i % 3)));
      }
      const auto total = std::accumulate(recv_counts.begin(), recv_counts.end(), std::int64_t{0});
      std::vector<T> out(static_cast<std::size_t>(total), static_cast<T>(-1));
      world.all_to_all_v(std::span<const T>(in), std::span<const std::int64_t>(send_counts), std::span<T>(out),
                         std::span<const std::int64_t>(recv_counts));
      std::size_t bad = 0, at = 0;
      for (std::int64_t s = 0; s < n; ++s)
        for (std::int64_t i = 0; i < sent(s, r, unit); ++i) bad += out[at++] != static_cast<T>(s * 100 + r + 10000 * (i % 3));
      EXPECT_EQ(bad, 0u) << "unit " << unit;
      // The same exchange as an awaited operation.
      std::vector<T> out2(out.size(), static_cast<T>(-1));
      world
          .all_to_all_v_async(std::span<const T>(in), std::span<const std::int64_t>(send_counts), std::span<T>(out2),
                              std::span<const std::int64_t>(recv_counts))
          .wait();
      EXPECT_EQ(out2, out) << "unit " << unit;
    }
  });
}

TEST(Communicator, AllToAllVCountsMustMatchTheBuffers) {
  for_each_world([&](const Communicator& world) {
    const auto n = static_cast<std::size_t>(world.size());
    std::vector<float> in(n), out(n);
    std::vector<std::int64_t> ones(n, 1), twos(n, 2);
    auto call = [&](std::span<const std::int64_t> sc, std::span<const std::int64_t> rc) {
      world.all_to_all_v(std::span<const float>(in), sc, std::span<float>(out), rc);
    };
    EXPECT_THROW(call(twos, ones), Error);  // the send counts sum past the input
    EXPECT_THROW(call(ones, std::span<const std::int64_t>(ones).first(n - 1)), Error);  // one count short
    call(ones, ones);  // the group is still usable
  });
}

TYPED_TEST(Collectives, SendRecvRing) {
  using T = TypeParam;
  for_each_world([&](const Communicator& world) {
    const int n = world.size(), r = world.rank();
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    for (std::size_t count : kCounts) {
      std::vector<T> out(count), in(count, static_cast<T>(-1));
      for (std::size_t i = 0; i < count; ++i)
        out[i] = static_cast<T>(r * 3 + static_cast<int>(i % 11)) + offset<T>();
      Work sent = world.send_async(std::span<const T>(out), next, {.tag = 7});
      world.recv(std::span<T>(in), prev, {.tag = 7});
      sent.wait();
      std::size_t bad = 0;
      for (std::size_t i = 0; i < count; ++i)
        bad += in[i] != static_cast<T>(prev * 3 + static_cast<int>(i % 11)) + offset<T>();
      EXPECT_EQ(bad, 0u) << "count " << count;
    }
  });
}

TEST(Communicator, AsyncOperationsOverlapAndTestPolls) {
  for_each_world([&](const Communicator& world) {
    const std::int64_t n = world.size(), r = world.rank();
    std::vector<double> a(1000, static_cast<double>(r));
    std::vector<std::int32_t> mine{static_cast<std::int32_t>(r)};
    std::vector<std::int32_t> all(static_cast<std::size_t>(n));
    Work w1 = world.all_reduce_async(std::span<double>(a), {.op = ReduceOp::kMax});
    Work w2 = world.all_gather_async(std::span<const std::int32_t>(mine), std::span<std::int32_t>(all));
    while (!w2.test()) {
    }
    EXPECT_TRUE(w2.test());  // stays complete
    w1.wait();
    w1.wait();  // idempotent
    for (double v : a) EXPECT_EQ(v, static_cast<double>(n - 1));
    for (std::int64_t j = 0; j < n; ++j) EXPECT_EQ(all[static_cast<std::size_t>(j)], j);
    world.barrier({.timeout_s = 60});
  });
}

TEST(Communicator, LargeCountsAreChunkedBelowTheCallLimit) {
  if (kInproc) GTEST_SKIP() << "the in-process backend has no call limit to chunk below";
  for_each_world([&](const Communicator& world) {
    const std::int64_t n = world.size(), r = world.rank();
    testing::set_max_count_per_call(1000);  // 1,000,003 elements: 1001 calls of <= 1000
    std::vector<float> data(1000003);
    for (std::size_t i = 0; i < data.size(); ++i)
      data[i] = static_cast<float>(r + static_cast<std::int64_t>(i % 13));
    world.all_reduce(std::span<float>(data));
    std::size_t bad = 0;
    for (std::size_t i = 0; i < data.size(); ++i)
      bad += data[i] != static_cast<float>(n * (n - 1) / 2 + n * static_cast<std::int64_t>(i % 13));
    EXPECT_EQ(bad, 0u);

    std::vector<std::int64_t> msg(2503, r);
    std::vector<std::int64_t> got(2503, -1);
    const int next = static_cast<int>((r + 1) % n), prev = static_cast<int>((r + n - 1) % n);
    Work sent = world.send_async(std::span<const std::int64_t>(msg), next);
    world.recv(std::span<std::int64_t>(got), prev);
    sent.wait();
    for (auto v : got) ASSERT_EQ(v, prev);

    // The block collectives refuse a block above the limit, on every rank alike.
    std::vector<float> in(1001), out(1001 * static_cast<std::size_t>(n));
    try {
      world.all_gather(std::span<const float>(in), std::span<float>(out));
      ADD_FAILURE() << "all_gather above the call limit must be refused";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("all_gather of 1001 elements per rank exceeds the 1000 elements"),
                std::string::npos)
          << e.what();
    }
    testing::set_max_count_per_call(0);
    world.barrier();
  });
}

TEST(Communicator, BadArgumentsAreErrorsNotCrashes) {
  for_each_world([&](const Communicator& world) {
    std::vector<std::int32_t> ints(4);
    EXPECT_THROW(world.all_reduce(std::span<std::int32_t>(ints), {.op = ReduceOp::kAvg}), Error);
    std::vector<float> in(3), out(3 * static_cast<std::size_t>(world.size() + 1));
    EXPECT_THROW(world.all_gather(std::span<const float>(in), std::span<float>(out)), Error);
    EXPECT_THROW(world.broadcast(std::span<float>(in), world.size()), Error);
    EXPECT_THROW(world.send(std::span<const float>(in), -1), Error);
    Communicator none;
    EXPECT_FALSE(none.valid());
    EXPECT_EQ(none.rank(), -1);
    EXPECT_EQ(none.size(), 0);
    try {
      none.barrier();
      ADD_FAILURE() << "barrier on the empty handle must throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("empty communicator"), std::string::npos) << e.what();
    }
  });
}

TEST(Communicator, SplitOrdersByKeyAndGivesNoColorAnEmptyHandle) {
  for_each_world([&](const Communicator& world) {
    const int n = world.size(), r = world.rank();
    // Rank 0 takes no color; the others form two halves ordered by descending rank.
    std::optional<std::int64_t> color;
    if (r != 0) color = r < n / 2 ? 0 : 1;
    Communicator half = world.split(color, -r, "half");
    if (r == 0) {
      EXPECT_FALSE(half.valid());
    } else {
      ASSERT_TRUE(half.valid());
      EXPECT_EQ(half.name(), "half");
      std::vector<std::int64_t> expected;
      for (int q = n - 1; q >= 1; --q)
        if ((q < n / 2) == (r < n / 2)) expected.push_back(q);
      EXPECT_EQ(half.members(), expected);
      EXPECT_EQ(half.size(), static_cast<int>(expected.size()));
      EXPECT_EQ(half.members()[static_cast<std::size_t>(half.rank())], r);
      std::int64_t sum = r;
      half.all_reduce(std::span<std::int64_t>(&sum, 1));
      EXPECT_EQ(sum, std::accumulate(expected.begin(), expected.end(), std::int64_t{0}));
    }
    world.barrier();
  });
}

TEST(Communicator, MembersStringAndNames) {
  for_each_world([&](const Communicator& world) {
    EXPECT_EQ(world.name(), "world");
    // inproc in the in-process variant; under a launcher, mpi for mpirun and gloo for a
    // launch with torchrun's variables (tests/store).
    EXPECT_EQ(world.backend(),
              kInproc ? "inproc"
                      : (ndmesh::LaunchEnv::detect().launcher == ndmesh::Launcher::kTorchrun ? "gloo"
                                                                                              : "mpi"));
    Communicator tp = world.named("tp");
    EXPECT_EQ(tp.name(), "tp");
    EXPECT_EQ(tp.size(), world.size());
    if (world.size() == 2) {
      EXPECT_EQ(world.members_string(), "ranks 0,1");
    }
  });
}

}  // namespace
}  // namespace ndmesh::comm
