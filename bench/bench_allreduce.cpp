// Bus bandwidth of the all-reduce algorithms (comm/allreduce.hpp) against MPI_Allreduce,
// measured in the same run, from 4 B to 64 MiB of float32 (run under mpirun; 8 ranks in
// bench/bench_allreduce.sh). Bus bandwidth follows nccl-tests: bytes / time * 2 (p-1) / p,
// the rate each rank's link would need for the ring's traffic, so it is comparable
// across rank counts. Blocks of each algorithm and of the baseline alternate and the
// ratio reported is the median over rounds of candidate busbw / MPI busbw (these machines
// are shared and noisy), and hierarchical / ring the same way. Hierarchical and adaptive
// run with two simulated nodes (half the ranks each) by default: on one machine that
// changes which messages cross the "node" boundary, not the speed of any link;
// `--ranks-per-node 0` uses the real nodes (tests/multinode/harness.sh makes some).
//   bench_allreduce [seconds per size and algorithm] [--ranks-per-node R]
//                   [--min-bytes B] [--max-bytes B]
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "ndmesh/comm/allreduce.hpp"
#include "ndmesh/comm/communicator.hpp"
#include "ndmesh/mesh/mesh.hpp"

namespace {

using namespace ndmesh::comm;
using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  Communicator world = Communicator::world();
  const int p = world.size();
  double max_seconds = 0.3;  // per size and algorithm
  std::int64_t ranks_per_node = std::max(1, p / 2);
  std::size_t min_bytes = 4, max_bytes = std::size_t{64} << 20;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&] { return i + 1 < argc ? std::atoll(argv[++i]) : 0LL; };
    if (a == "--ranks-per-node")
      ranks_per_node = value();
    else if (a == "--min-bytes")
      min_bytes = static_cast<std::size_t>(std::max(4LL, value()));
    else if (a == "--max-bytes")
      max_bytes = static_cast<std::size_t>(std::max(4LL, value()));
    else
      max_seconds = std::atof(a.c_str());
  }
  struct Candidate {
    const char* name;
    AllReducer reducer;
  };
  std::vector<Candidate> candidates;
  candidates.push_back({"ring", AllReducer(world, {.algorithm = AllReduceAlgorithm::kRing})});
  candidates.push_back({"tree", AllReducer(world, {.algorithm = AllReduceAlgorithm::kTree})});
  candidates.push_back({"hierarchical", AllReducer(world, {.algorithm = AllReduceAlgorithm::kHierarchical,
                                                           .ranks_per_node = ranks_per_node})});
  candidates.push_back({"adaptive", AllReducer(world, {.algorithm = AllReduceAlgorithm::kAdaptive,
                                                       .ranks_per_node = ranks_per_node})});
  std::int64_t nodes = 0;
  {
    Communicator node =
        ranks_per_node > 0
            ? world.split(ndmesh::Mesh::placement(world.rank(), ranks_per_node).node, world.rank())
            : world.split_node();
    nodes = node.rank() == 0;
    world.all_reduce(std::span<std::int64_t>(&nodes, 1));
  }
  if (world.rank() == 0) {
    fmt::print(
        "all-reduce of float32 on {} ranks, {} {}node{}; bus bandwidth = bytes/time * 2(p-1)/p "
        "(nccl-tests)\n",
        p, nodes, ranks_per_node > 0 ? "simulated " : "", nodes == 1 ? "" : "s");
    fmt::print("{:>10} {:>12}", "bytes", "MPI GB/s");
    for (const auto& c : candidates) fmt::print(" {:>14}", c.name);
    fmt::print(" {:>14}   (each: busbw / MPI busbw; hier/ring: hierarchical / ring; medians of rounds)\n",
               "hier/ring");
  }
  for (std::size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
    const std::size_t n = bytes / sizeof(float);
    std::vector<float> data(n, 1.0f);
    // Iterations per block: agreed on by all ranks (rank 0's timing of one MPI call).
    auto t0 = Clock::now();
    MPI_Allreduce(MPI_IN_PLACE, data.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double one = std::chrono::duration<double>(Clock::now() - t0).count();
    int reps = static_cast<int>(std::clamp(max_seconds / 5 / std::max(one, 1e-7), 1.0, 2000.0));
    MPI_Bcast(&reps, 1, MPI_INT, 0, MPI_COMM_WORLD);
    const int rounds = 5;
    std::vector<double> mpi_bw;
    std::vector<std::vector<double>> ratios(candidates.size());
    std::vector<double> hier_vs_ring;
    auto busbw = [&](double seconds) {
      return static_cast<double>(bytes) / seconds * 2.0 * (p - 1) / p / 1e9;
    };
    for (int round = 0; round < rounds; ++round) {
      std::fill(data.begin(), data.end(), 1.0f);
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = Clock::now();
      for (int i = 0; i < reps; ++i)
        MPI_Allreduce(MPI_IN_PLACE, data.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      double base = std::chrono::duration<double>(Clock::now() - t0).count() / reps;
      MPI_Allreduce(MPI_IN_PLACE, &base, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      mpi_bw.push_back(busbw(base));
      for (std::size_t k = 0; k < candidates.size(); ++k) {
        std::fill(data.begin(), data.end(), 1.0f);
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = Clock::now();
        for (int i = 0; i < reps; ++i) candidates[k].reducer.all_reduce(std::span<float>(data));
        double t = std::chrono::duration<double>(Clock::now() - t0).count() / reps;
        MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        ratios[k].push_back(busbw(t) / busbw(base));
      }
      hier_vs_ring.push_back(ratios[2].back() / ratios[0].back());
    }
    if (world.rank() == 0) {
      fmt::print("{:>10} {:>12.4g}", bytes, median(mpi_bw));
      for (auto& r : ratios) fmt::print(" {:>14.3f}", median(r));
      fmt::print(" {:>14.3f}\n", median(hier_vs_ring));
      std::fflush(stdout);
    }
  }
  return 0;
}
