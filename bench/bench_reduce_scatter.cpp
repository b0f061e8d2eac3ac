// Reduce-scatter of the world's backend against an all-reduce of the same input and a
// copy of this rank's block (what the Gloo backend did before it ran Gloo's
// ReduceScatterHalvingDoubling), in one run, float32, 4 KiB to 64 MiB of input. Rank 0
// prints one JSON line per size; bench/bench_reduce_scatter.sh runs it under
// `ndmesh launch --store` (Gloo) and prints the ratios.
//   bench_reduce_scatter [max input bytes]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "ndmesh/comm/communicator.hpp"

int main(int argc, char** argv) {
  using ndmesh::comm::Communicator;
  using Clock = std::chrono::steady_clock;
  const std::size_t max_bytes = argc > 1 ? std::stoull(argv[1]) : std::size_t{64} << 20;
  Communicator world = Communicator::world();
  const auto n = static_cast<std::size_t>(world.size());
  std::vector<float> in(max_bytes / sizeof(float), 1.0f), scratch(in.size()), out(in.size() / n + 1);
  for (std::size_t bytes = 4096; bytes <= max_bytes; bytes *= 4) {
    const std::size_t count = bytes / sizeof(float) / n * n, block = count / n;
    std::span<const float> input(in.data(), count);
    std::span<float> output(out.data(), block);
    const int reps = static_cast<int>(std::clamp<std::size_t>((std::size_t{32} << 20) / bytes, 3, 500));
    auto time = [&](auto&& op) {
      op();  // warm-up
      world.barrier();
      const auto start = Clock::now();
      for (int i = 0; i < reps; ++i) op();
      double t = std::chrono::duration<double>(Clock::now() - start).count() / reps;
      world.all_reduce(std::span<double>(&t, 1), {.op = ndmesh::comm::ReduceOp::kMax});
      return t;
    };
    // Alternated twice, the better of each, so that neither always runs second.
    double rs = 1e30, ar = 1e30;
    for (int round = 0; round < 2; ++round) {
      rs = std::min(rs, time([&] { world.reduce_scatter(input, output); }));
      ar = std::min(ar, time([&] {
        std::copy(input.begin(), input.end(), scratch.begin());
        world.all_reduce(std::span<float>(scratch.data(), count));
        std::memcpy(out.data(), scratch.data() + static_cast<std::size_t>(world.rank()) * block,
                    block * sizeof(float));
      }));
    }
    if (world.rank() == 0)
      std::printf(
          "{\"backend\":\"%s\",\"ranks\":%zu,\"bytes\":%zu,\"reduce_scatter_s\":%.3e,\"all_reduce_copy_s\":%.3e,"
          "\"ratio\":%.3f}\n",
          std::string(world.backend()).c_str(), n, count * sizeof(float), rs, ar, ar / rs);
  }
  return 0;
}
