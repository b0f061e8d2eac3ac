// All-reduce bus bandwidth of the world's backend (mpi under mpirun, gloo under a launch
// with torchrun's variables), float32 from 4 B to 64 MiB, in nccl-tests' convention:
// algbw = bytes / time, busbw = algbw * 2 (n - 1) / n. Rank 0 prints one JSON line per
// size; bench/bench_gloo.sh runs it under both launchers and prints the ratios.
//   bench_gloo [max bytes]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ndmesh/comm/communicator.hpp"

int main(int argc, char** argv) {
  using ndmesh::comm::Communicator;
  const std::size_t max_bytes = argc > 1 ? std::stoull(argv[1]) : std::size_t{64} << 20;
  Communicator world = Communicator::world();
  const int n = world.size();
  std::vector<float> buf(max_bytes / sizeof(float), 1.0f);
  for (std::size_t bytes = 4; bytes <= max_bytes; bytes *= 4) {
    std::span<float> data(buf.data(), bytes / sizeof(float));
    // Enough repetitions for about 0.2 s of the slower sizes, at least 5.
    const int reps = static_cast<int>(std::clamp<std::size_t>((std::size_t{32} << 20) / bytes, 5, 2000));
    world.all_reduce(data);  // warm-up
    world.barrier();
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) world.all_reduce(data);
    double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / reps;
    world.all_reduce(std::span<double>(&t, 1), {.op = ndmesh::comm::ReduceOp::kMax});
    double algbw = static_cast<double>(bytes) / t / 1e9;
    if (world.rank() == 0)
      std::printf(
          "{\"backend\":\"%s\",\"ranks\":%d,\"bytes\":%zu,\"seconds\":%.3e,\"algbw_gbps\":%.4f,\"busbw_"
          "gbps\":%.4f}\n",
          std::string(world.backend()).c_str(), n, bytes, t, algbw, algbw * 2.0 * (n - 1) / n);
  }
  return 0;
}
