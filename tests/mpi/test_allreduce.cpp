// The all-reduce algorithms (ring, tree, hierarchical, adaptive) against closed forms and
// against MPI, for sizes 0, 1, primes and sizes the group does not divide, on every
// dtype, exactly (the values are small integers, so float sums are exact too); plus the
// communicator additions they and data parallelism need: in-place reduce_scatter and
// all_gather, bfloat16, wait_all and the aliasing check. Run with 1..16 ranks under
// mpirun, and on in-process jobs of as many (tests/unit/comm/test_inproc_allreduce.cpp).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ndmesh/comm/allreduce.hpp"
#include "ndmesh/comm/communicator.hpp"
#include "ndmesh/core/error.hpp"
#include "support/worlds.hpp"

namespace ndmesh::comm {
namespace {

using testing_support::for_each_world;

// 150001 spans several tree segments (64 Ki elements of float each).
const std::vector<std::size_t> kSizes = {0, 1, 2, 3, 7, 13, 97, 1000, 4099, 150001};

// Element i of rank r: a small integer, so every sum is exact in any type.
std::int64_t value(std::int64_t rank, std::size_t i) {
  return (rank * 7 + static_cast<std::int64_t>(i) * 3) % 11 - 5;
}

template <typename T>
void check_algorithm(AllReducer& reducer, const char* what) {
  const Communicator& g = reducer.group();
  // value(r, i) depends on i only through i mod 11: the sums over the group, once.
  std::int64_t sums[11] = {};
  for (std::size_t k = 0; k < 11; ++k)
    for (std::int64_t r = 0; r < g.size(); ++r) sums[k] += value(r, k);
  for (std::size_t n : kSizes) {
    std::vector<T> data(n), mpi(n);
    for (std::size_t i = 0; i < n; ++i) data[i] = mpi[i] = static_cast<T>(value(g.rank(), i));
    reducer.all_reduce(std::span<T>(data));
    g.all_reduce(std::span<T>(mpi));
    for (std::size_t i = 0; i < n; ++i) {
      const std::int64_t expected = sums[i % 11];
      ASSERT_EQ(data[i], static_cast<T>(expected))
          << what << " n=" << n << " i=" << i << " ranks=" << g.size();
      ASSERT_EQ(data[i], mpi[i]) << what << " differs from MPI at n=" << n << " i=" << i;
    }
  }
}

template <typename T>
void check_all(const Communicator& world, AllReducerOptions options, const char* what) {
  AllReducer reducer(world, options);
  check_algorithm<T>(reducer, what);
}

TEST(AllReduce, EveryAlgorithmEqualsMpiExactlyOnEveryDtype) {
  for_each_world([&](const Communicator& world) {
    for (auto a : {AllReduceAlgorithm::kMpi, AllReduceAlgorithm::kRing, AllReduceAlgorithm::kTree,
                   AllReduceAlgorithm::kHierarchical, AllReduceAlgorithm::kAdaptive}) {
      std::string name(algorithm_name(a));
      check_all<float>(world, {.algorithm = a}, name.c_str());
      check_all<double>(world, {.algorithm = a}, name.c_str());
      check_all<std::int32_t>(world, {.algorithm = a}, name.c_str());
      check_all<std::int64_t>(world, {.algorithm = a}, name.c_str());
    }
  });
}

// ring_reduce_scatter (the Gloo backend's reduce-scatter) leaves on every rank exactly the
// engine's reduce-scatter of its block, for every dtype and block size (1 element
// included), on a duplicate of the group as the backend uses it.
TEST(AllReduce, RingReduceScatterEqualsTheEnginesExactly) {
  for_each_world([&](const Communicator& world) {
    const Communicator ring = world.dup("ring-rs");
    const auto p = static_cast<std::size_t>(world.size()), r = static_cast<std::size_t>(world.rank());
    auto check = [&]<typename T>(T) {
      for (std::size_t block : {std::size_t{1}, std::size_t{2}, std::size_t{13}, std::size_t{4099}}) {
        std::vector<T> data(block * p);
        for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<T>(value(world.rank(), i));
        const std::vector<T> in = data;
        std::vector<T> engine(block);
        world.reduce_scatter(std::span<const T>(in), std::span<T>(engine));
        ring_reduce_scatter(ring, ElementSpan::of(std::span<T>(data)));
        for (std::size_t i = 0; i < block; ++i)
          ASSERT_EQ(data[r * block + i], engine[i]) << "block " << block << " i=" << i << " ranks=" << p;
      }
    };
    check(float{});
    check(double{});
    check(std::int32_t{});
    check(std::int64_t{});
    check(BFloat16{});
  });
}

TEST(AllReduce, HierarchicalOnSimulatedNodes) {
  for_each_world([&](const Communicator& world) {
    // Two, three and one rank per node: uneven last nodes included.
    for (std::int64_t rpn : {1, 2, 3}) {
      AllReducer h(world, {.algorithm = AllReduceAlgorithm::kHierarchical, .ranks_per_node = rpn});
      const std::int64_t nodes = (world.size() + rpn - 1) / rpn;
      EXPECT_EQ(h.spans_nodes(), nodes > 1);
      check_algorithm<std::int64_t>(h, "hierarchical");
      check_algorithm<float>(h, "hierarchical");
      AllReducer adaptive(world, {.algorithm = AllReduceAlgorithm::kAdaptive, .ranks_per_node = rpn});
      EXPECT_EQ(adaptive.choose(100), AllReduceAlgorithm::kTree);
      const bool hier = nodes > 1 && nodes < world.size();
      EXPECT_EQ(adaptive.choose(1 << 20),
                hier ? AllReduceAlgorithm::kHierarchical : AllReduceAlgorithm::kRing);
      check_algorithm<double>(adaptive, "adaptive");
    }
  });
}

TEST(AllReduce, PipelinedSegmentsAcrossNodes) {
  // The tree and hierarchical programs run their in-node part, the ring across nodes and
  // the in-node spreading side by side on segments (2 MiB with a leader per node, 4 MiB with
  // rings on nodes of equal size): 1100001 elements make two to five of them, the last
  // partial, with 1, 2 and 3 ranks per node (equal or uneven nodes with most world sizes).
  const Communicator world = Communicator::world();
  const std::size_t n = 1100001;
  std::vector<std::int64_t> expected(n, 0);
  for (std::size_t i = 0; i < n; ++i)
    for (std::int64_t r = 0; r < world.size(); ++r) expected[i] += value(r, i);
  auto check = [&](AllReducerOptions options) {
    AllReducer reducer(world, options);
    std::vector<float> f(n);
    std::vector<std::int64_t> l(n);
    for (std::size_t i = 0; i < n; ++i) f[i] = static_cast<float>(l[i] = value(world.rank(), i));
    reducer.all_reduce(std::span<float>(f));
    reducer.all_reduce(std::span<std::int64_t>(l));
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_EQ(l[i], expected[i]) << algorithm_name(options.algorithm) << " rpn=" << options.ranks_per_node;
      ASSERT_EQ(f[i], static_cast<float>(expected[i])) << algorithm_name(options.algorithm);
    }
  };
  check({.algorithm = AllReduceAlgorithm::kTree});
  for (std::int64_t rpn : {1, 2, 3})
    check({.algorithm = AllReduceAlgorithm::kHierarchical, .ranks_per_node = rpn});
}

TEST(AllReduce, ManyInFlightAtOnceOnOneGroup) {
  for_each_world([&](const Communicator& world) {
    // Buckets of data parallelism: several reductions started before any is waited for,
    // polled in turn, completed in any order.
    for (auto a : {AllReduceAlgorithm::kRing, AllReduceAlgorithm::kTree, AllReduceAlgorithm::kHierarchical}) {
      AllReducer reducer(world, {.algorithm = a, .ranks_per_node = 2});
      const int rank = world.rank(), size = world.size();
      std::vector<std::vector<std::int32_t>> bufs;
      for (std::size_t k = 0; k < 6; ++k)
        bufs.emplace_back(kSizes[k + 2], static_cast<std::int32_t>(rank + k));
      std::vector<PendingAllReduce> pending;
      for (auto& b : bufs) pending.push_back(reducer.start(std::span<std::int32_t>(b)));
      for (int round = 0; round < 3; ++round)
        for (auto& p : pending) p.test();
      for (auto it = pending.rbegin(); it != pending.rend(); ++it) it->wait();
      for (std::size_t k = 0; k < bufs.size(); ++k)
        for (auto v : bufs[k])
          ASSERT_EQ(v, size * (size - 1) / 2 + static_cast<int>(k) * size) << algorithm_name(a);
    }
  });
}

TEST(Communicator, InPlaceReduceScatterAndAllGather) {
  for_each_world([&](const Communicator& world) {
    const int p = world.size(), r = world.rank();
    for (std::size_t block : {0, 1, 5, 64}) {
      std::vector<double> data(block * static_cast<std::size_t>(p));
      for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<double>(value(r, i));
      world.reduce_scatter_in_place_async(std::span<double>(data)).wait();
      for (std::size_t i = 0; i < block; ++i) {
        const std::size_t at = static_cast<std::size_t>(r) * block + i;
        double expected = 0;
        for (int q = 0; q < p; ++q) expected += static_cast<double>(value(q, at));
        ASSERT_EQ(data[at], expected) << "block " << block << " i " << i;
      }
      std::vector<std::int64_t> gathered(block * static_cast<std::size_t>(p), -1);
      for (std::size_t i = 0; i < block; ++i)
        gathered[static_cast<std::size_t>(r) * block + i] = r * 1000 + static_cast<std::int64_t>(i);
      world.all_gather_in_place(std::span<std::int64_t>(gathered));
      for (int q = 0; q < p; ++q)
        for (std::size_t i = 0; i < block; ++i)
          ASSERT_EQ(gathered[static_cast<std::size_t>(q) * block + i],
                    q * 1000 + static_cast<std::int64_t>(i));
    }
    // Out-of-place calls on overlapping buffers are refused, not undefined.
    std::vector<float> buf(static_cast<std::size_t>(2 * p), 1.0f);
    EXPECT_THROW(world.reduce_scatter(std::span<const float>(buf.data(), static_cast<std::size_t>(p)),
                                      std::span<float>(buf.data(), 1)),
                 Error);
  });
}

TEST(Communicator, BFloat16SumsAndWaitAll) {
  for_each_world([&](const Communicator& world) {
    const int p = world.size();
    std::vector<BFloat16> a(33), b(7);
    for (auto& x : a) x = BFloat16(1.5f);
    for (auto& x : b) x = BFloat16(static_cast<float>(world.rank()));
    std::vector<Work> works;
    works.push_back(world.all_reduce_async(std::span<BFloat16>(a)));
    works.push_back(world.all_reduce_async(std::span<BFloat16>(b)));
    wait_all(works);
    for (auto x : a) ASSERT_EQ(static_cast<float>(x), 1.5f * static_cast<float>(p));  // exact: small values
    for (auto x : b) ASSERT_EQ(static_cast<float>(x), static_cast<float>(p * (p - 1) / 2));
    EXPECT_TRUE(works[0].done() && works[1].done());
    // Rounding to nearest even, NaN kept.
    EXPECT_EQ(static_cast<float>(BFloat16(1.0f + 1.0f / 256)), 1.0f);
    EXPECT_EQ(static_cast<float>(BFloat16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
    EXPECT_TRUE(std::isnan(static_cast<float>(BFloat16(std::nanf("")))));
  });
}

// bfloat16 reductions of signed random values (the shape of gradients) against the exact
// sum of the fp32 inputs, for every algorithm: each of the p inputs is rounded to bf16 once
// and each of the p - 1 additions rounds once (u = 2^-8, bf16's 8 significand bits), so
// |bf16 sum - exact| <= gamma_p * sum of |x_r| with gamma_p = p u / (1 - p u) (Higham's
// bound for recursive summation, with the input rounding as one more term).
TEST(AllReduce, BFloat16SumsWithinTheRoundingBound) {
  for_each_world([&](const Communicator& world) {
    const int p = world.size();
    const double u = std::ldexp(1.0, -8), gamma = p * u / (1 - p * u);
    const std::size_t n = 4099;
    auto x = [](std::int64_t rank, std::size_t i) {  // in [-1, 1), different on every rank
      const std::uint64_t h =
          (static_cast<std::uint64_t>(rank) * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull) >> 11;
      return static_cast<float>(static_cast<double>(h) / 4503599627370496.0 * 2 - 1);
    };
    for (auto a : {AllReduceAlgorithm::kMpi, AllReduceAlgorithm::kRing, AllReduceAlgorithm::kTree,
                   AllReduceAlgorithm::kHierarchical}) {
      AllReducer reducer(world, {.algorithm = a, .ranks_per_node = 2});
      std::vector<BFloat16> data(n);
      for (std::size_t i = 0; i < n; ++i) data[i] = BFloat16(x(world.rank(), i));
      reducer.all_reduce(std::span<BFloat16>(data));
      double worst = 0;  // the largest error as a fraction of the bound
      for (std::size_t i = 0; i < n; ++i) {
        double exact = 0, magnitude = 0;
        for (std::int64_t r = 0; r < p; ++r) {
          exact += static_cast<double>(x(r, i));
          magnitude += std::abs(static_cast<double>(x(r, i)));
        }
        const double error = std::abs(static_cast<double>(static_cast<float>(data[i])) - exact);
        ASSERT_LE(error, gamma * magnitude)
            << algorithm_name(a) << " element " << i << " on " << p << " ranks";
        worst = std::max(worst, error / (gamma * magnitude));
      }
      if (world.rank() == 0)
        std::printf("bf16 %s on %d ranks: largest error %.2f of the bound gamma_p = %.4f\n",
                    std::string(algorithm_name(a)).c_str(), p, worst, gamma);
    }
  });
}

TEST(Communicator, WaitAnyReturnsOnceOneIsComplete) {
  // Rank 1 waits for either of two messages of rank 0; only the first is sent before the
  // barrier, so wait_any must return with it done and the other still pending.
  auto world = Communicator::world();
  if (world.size() < 2) GTEST_SKIP() << "needs two ranks";
  std::int64_t first = 0, second = 0;
  if (world.rank() == 0) {
    world.send(std::span<const std::int64_t>(&(first = 11), 1), 1, {.tag = 51});
    world.barrier();
    world.send(std::span<const std::int64_t>(&(second = 22), 1), 1, {.tag = 52});
  } else if (world.rank() == 1) {
    std::vector<Work> works;
    works.push_back(world.recv_async(std::span<std::int64_t>(&second, 1), 0, {.tag = 52}));
    works.push_back(world.recv_async(std::span<std::int64_t>(&first, 1), 0, {.tag = 51}));
    wait_any(works);
    EXPECT_TRUE(works[1].done());
    EXPECT_FALSE(works[0].done());
    EXPECT_EQ(first, 11);
    world.barrier();
    wait_any(works);  // returns at once: one is done already
    wait_all(works);
    EXPECT_EQ(second, 22);
  } else {
    world.barrier();
  }
  wait_any(std::span<Work>());  // nothing to wait for
}

}  // namespace
}  // namespace ndmesh::comm
