// Parts of the training runtime under mpirun (every rank of the world):
//  - agree_or_throw: whatever one rank throws (an ndmesh Error or not), every rank leaves
//    the agreement at once: the failing rank with its own exception, the others with an
//    IoError counting the failures (a library caller's peers are never left waiting);
//  - GradReducer with bf16 gradients and ZeRO widens only this rank's block of each bucket
//    back into the fp32 buffer: the rest of the buffer keeps the local gradients untouched.
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ndmesh/comm/communicator.hpp"
#include "ndmesh/core/error.hpp"
#include "ndmesh/parallel/checkpoint_io.hpp"
#include "ndmesh/parallel/dp/grad_reducer.hpp"

namespace ndmesh::parallel {
namespace {

using comm::Communicator;

TEST(AgreeOrThrow, AnyExceptionOnOneRankEndsThePhaseOnEvery) {
  const Communicator world = Communicator::world();
  // Nobody fails: every rank returns.
  agree_or_throw(world, "nothing", [] {});
  // The last rank throws something that is not an ndmesh Error.
  const int culprit = world.size() - 1;
  try {
    agree_or_throw(world, "saving 'x'", [&] {
      if (world.rank() == culprit) throw std::runtime_error("disk on fire");
    });
    FAIL() << "no rank may return when one failed";
  } catch (const IoError& e) {
    EXPECT_NE(world.rank(), culprit);
    EXPECT_NE(std::string(e.what()).find("saving 'x': 1 other rank(s) failed"), std::string::npos) << e.what();
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(world.rank(), culprit);
    EXPECT_STREQ(e.what(), "disk on fire");
  }
  // And the group is usable afterwards: nobody is stuck in a half-done collective.
  std::int64_t one = 1;
  world.all_reduce(std::span<std::int64_t>(&one, 1));
  EXPECT_EQ(one, world.size());
}

TEST(GradReducer, Bf16WithZeroWidensOnlyTheOwnedBlock) {
  const Communicator world = Communicator::world();
  const int p = world.size(), r = world.rank();
  const std::int64_t n = 64 * p;  // a multiple of the group size (ZeRO pads to it)
  for (int zero : {1, 2}) {
    GradReducer reducer(world, n, {.bucket_mb = 1e-4, .zero = zero, .bf16 = true});
    std::vector<float> grads(static_cast<std::size_t>(n));
    // Values bf16 cannot hold exactly, different on every rank.
    for (std::int64_t i = 0; i < n; ++i) grads[static_cast<std::size_t>(i)] = 1.0f + std::ldexp(1.0f, -12) * static_cast<float>(i + r);
    const std::vector<float> local = grads;
    reducer.zero_shard_grads();
    reducer.begin_backward(grads.data(), true);
    reducer.grads_final(0);
    reducer.finish_backward();
    std::vector<bool> owned(static_cast<std::size_t>(n), false);
    for (const nn::Segment& s : reducer.shard())
      for (std::int64_t i = s.offset; i < s.offset + s.count; ++i) owned[static_cast<std::size_t>(i)] = true;
    const float* reduced = zero == 2 ? reducer.shard_grads() : grads.data();
    std::int64_t at = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const auto k = static_cast<std::size_t>(i);
      if (owned[k]) {
        // The sum of the p bf16-rounded inputs, within bf16's rounding of each addition.
        double expected = 0;
        for (int q = 0; q < p; ++q)
          expected += static_cast<double>(static_cast<float>(BFloat16(1.0f + std::ldexp(1.0f, -12) * static_cast<float>(i + q))));
        const float got = zero == 2 ? reduced[at++] : reduced[k];
        EXPECT_NEAR(got, expected, p * std::ldexp(1.0, -8) * expected) << "zero " << zero << " element " << i;
      } else if (zero == 1) {
        // Not this rank's: untouched, still the local fp32 gradient.
        ASSERT_EQ(grads[k], local[k]) << "ZeRO 1 bf16: element " << i << " outside the shard was overwritten";
      }
    }
  }
}

}  // namespace
}  // namespace ndmesh::parallel
