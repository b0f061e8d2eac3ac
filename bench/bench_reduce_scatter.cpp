// The Gloo backend's reduce-scatter algorithms against an all-reduce of the same input
// and a copy of this rank's block (the baseline), in one run: Gloo's
// ReduceScatterHalvingDoubling and the ring reduce-scatter (comm/allreduce.hpp), chosen
// with testing::set_gloo_reduce_scatter, float32, 64 KiB to 64 MiB of input. Rank 0
// prints one JSON line per size with each time and its ratio baseline / algorithm (above
// 1: faster than the baseline); bench/bench_reduce_scatter.sh runs it under
// `ndmesh launch --store` on 2, 3 and 4 ranks.
//   bench_reduce_scatter [max input bytes]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "ndmesh/comm/communicator.hpp"

int main(int argc, char** argv) {
  using ndmesh::comm::Communicator;
  using Algorithm = ndmesh::comm::testing::GlooReduceScatter;
  using Clock = std::chrono::steady_clock;
  const std::size_t max_bytes = argc > 1 ? std::stoull(argv[1]) : std::size_t{64} << 20;
  Communicator world = Communicator::world();
  const auto n = static_cast<std::size_t>(world.size());
  std::vector<float> in(max_bytes / sizeof(float), 1.0f), out(in.size() / n + 1);
  const Algorithm algorithms[] = {Algorithm::kAllReduce, Algorithm::kHalvingDoubling, Algorithm::kRing};
  for (std::size_t bytes = 64 << 10; bytes <= max_bytes; bytes *= 4) {
    const std::size_t count = bytes / sizeof(float) / n * n, block = count / n;
    std::span<const float> input(in.data(), count);
    std::span<float> output(out.data(), block);
    const int reps = static_cast<int>(std::clamp<std::size_t>((std::size_t{32} << 20) / bytes, 3, 100));
    double best[3] = {1e30, 1e30, 1e30};
    // Rounds alternate the algorithms, the best round of each counts, so that none
    // always runs first or after a given other.
    for (int round = 0; round < 3; ++round)
      for (int k = 0; k < 3; ++k) {
        const int a = (k + round) % 3;
        ndmesh::comm::testing::set_gloo_reduce_scatter(algorithms[a]);
        world.reduce_scatter(input, output);  // warm-up (the first one makes the group's duplicate)
        world.barrier();
        const auto start = Clock::now();
        for (int i = 0; i < reps; ++i) world.reduce_scatter(input, output);
        double t = std::chrono::duration<double>(Clock::now() - start).count() / reps;
        world.all_reduce(std::span<double>(&t, 1), {.op = ndmesh::comm::ReduceOp::kMax});
        best[a] = std::min(best[a], t);
      }
    if (world.rank() == 0)
      std::printf(
          "{\"backend\":\"%s\",\"ranks\":%zu,\"bytes\":%zu,\"all_reduce_copy_s\":%.3e,\"halving_doubling_s\":"
          "%.3e,"
          "\"ring_s\":%.3e,\"halving_doubling_ratio\":%.3f,\"ring_ratio\":%.3f}\n",
          std::string(world.backend()).c_str(), n, count * sizeof(float), best[0], best[1], best[2],
          best[0] / best[1], best[0] / best[2]);
  }
  return 0;
}
