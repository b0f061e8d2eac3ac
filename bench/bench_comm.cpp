// Communicator overhead against the raw engine, run under mpirun (bench/bench_comm.sh):
//  - set-up: every single-dim communicator of the 16-rank mesh dp2 pp2 cp2 tp2 through
//    ProcessGroups (one agreement all_gather on mesh and kinds, one split per dim, a
//    member check) against a plain loop of MPI_Comm_split with the same colors and keys;
//  - all_reduce of float32 at 4 B, 64 KiB and 16 MiB: Communicator::all_reduce against a
//    raw MPI_Allreduce, and for reference the engine's nonblocking MPI_Iallreduce +
//    MPI_Wait (what an awaited Work costs at least).
// This machine is shared and noisy, so each benchmark iteration runs a block of the
// candidate and a block of the baseline back to back, alternating which goes first,
// and reports both times and their ratio (median over the iterations' ratios). Every
// rank runs the same fixed iteration counts (collectives must match across ranks); rank
// 0 reports.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

#include "ndmesh/comm/communicator.hpp"
#include "ndmesh/comm/process_groups.hpp"
#include "ratio_reporter.hpp"

namespace {

using ndmesh::comm::Communicator;
using Clock = std::chrono::steady_clock;

const ndmesh::Mesh& mesh16() {
  static const ndmesh::Mesh kMesh{{"dp", 2}, {"pp", 2}, {"cp", 2}, {"tp", 2}};
  return kMesh;
}

std::vector<ndmesh::DimSet> single_dims() {
  std::vector<ndmesh::DimSet> out;
  for (int i = 0; i < mesh16().ndims(); ++i) out.push_back(ndmesh::DimSet::single(i));
  return out;
}

double time_block(const std::function<void()>& f, int reps) {
  auto t0 = Clock::now();
  for (int i = 0; i < reps; ++i) f();
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / reps;
}

// Alternating blocks of `candidate` and `baseline`; counters in ns per operation.
void paired(benchmark::State& state, const std::function<void()>& candidate,
            const std::function<void()>& baseline, int block) {
  std::vector<double> ratios;
  double cand_sum = 0, base_sum = 0;
  bool candidate_first = false;
  for (auto _ : state) {
    candidate_first = !candidate_first;
    double c = 0, b = 0;
    if (candidate_first) {
      c = time_block(candidate, block);
      b = time_block(baseline, block);
    } else {
      b = time_block(baseline, block);
      c = time_block(candidate, block);
    }
    cand_sum += c;
    base_sum += b;
    ratios.push_back(c / b);
  }
  std::sort(ratios.begin(), ratios.end());
  auto n = static_cast<double>(ratios.size());
  state.counters["cand_ns"] = cand_sum / n;
  state.counters["base_ns"] = base_sum / n;
  state.counters["ratio"] = ratios[ratios.size() / 2];
}

void BM_Split_ProcessGroups_vs_MpiCommSplit(benchmark::State& state) {
  Communicator world = Communicator::world();
  int rank = world.rank();
  auto kinds = single_dims();
  std::vector<MPI_Comm> comms(kinds.size());
  paired(
      state,
      [&] {
        ndmesh::ProcessGroups pg(mesh16(), world, kinds);
        benchmark::DoNotOptimize(pg.splits());
      },
      [&] {
        for (std::size_t i = 0; i < kinds.size(); ++i)
          MPI_Comm_split(MPI_COMM_WORLD, static_cast<int>(mesh16().color(rank, kinds[i])),
                         static_cast<int>(mesh16().key(rank, kinds[i])), &comms[i]);
        for (auto& c : comms) MPI_Comm_free(&c);
      },
      5);
}

void BM_AllReduce_Communicator_vs_MpiAllreduce(benchmark::State& state) {
  Communicator world = Communicator::world();
  std::vector<float> data(static_cast<std::size_t>(state.range(0)) / sizeof(float), 1.0f);
  int block = state.range(0) <= 4 ? 400 : state.range(0) <= (64 << 10) ? 20 : 1;
  paired(
      state, [&] { world.all_reduce(std::span<float>(data)); },
      [&] {
        MPI_Allreduce(MPI_IN_PLACE, data.data(), static_cast<int>(data.size()), MPI_FLOAT, MPI_SUM,
                      MPI_COMM_WORLD);
      },
      block);
}

void BM_AllReduce_MpiIallreduceWait_vs_MpiAllreduce(benchmark::State& state) {
  Communicator world = Communicator::world();
  std::vector<float> data(static_cast<std::size_t>(state.range(0)) / sizeof(float), 1.0f);
  int block = state.range(0) <= 4 ? 400 : state.range(0) <= (64 << 10) ? 20 : 1;
  paired(
      state,
      [&] {
        MPI_Request req;
        MPI_Iallreduce(MPI_IN_PLACE, data.data(), static_cast<int>(data.size()), MPI_FLOAT, MPI_SUM,
                       MPI_COMM_WORLD, &req);
        MPI_Wait(&req, MPI_STATUS_IGNORE);
      },
      [&] {
        MPI_Allreduce(MPI_IN_PLACE, data.data(), static_cast<int>(data.size()), MPI_FLOAT, MPI_SUM,
                      MPI_COMM_WORLD);
      },
      block);
}

BENCHMARK(BM_Split_ProcessGroups_vs_MpiCommSplit)->Iterations(30)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AllReduce_Communicator_vs_MpiAllreduce)
    ->Arg(4)
    ->Arg(64 << 10)
    ->Arg(16 << 20)
    ->Iterations(60)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AllReduce_MpiIallreduceWait_vs_MpiAllreduce)
    ->Arg(4)
    ->Arg(64 << 10)
    ->Arg(16 << 20)
    ->Iterations(30)
    ->Unit(benchmark::kMillisecond);

// Ranks other than 0 report nothing.
class SilentReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

// Rank 0: the usual table, then one line per benchmark with its ratio.
class PairReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const auto& run : runs) {
      auto get = [&](const char* k) {
        auto it = run.counters.find(k);
        return it == run.counters.end() ? -1.0 : static_cast<double>(it->second);
      };
      lines_.push_back(fmt::format("{:<58} {:>14.0f} {:>14.0f} {:>8.3f}", run.benchmark_name(),
                                   get("cand_ns"), get("base_ns"), get("ratio")));
    }
    ConsoleReporter::ReportRuns(runs);
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    fmt::print("\n{:<58} {:>14} {:>14} {:>8}\n", "candidate vs baseline (alternating blocks)", "cand ns/op",
               "base ns/op", "ratio");
    for (const auto& l : lines_) fmt::print("{}\n", l);
  }

 private:
  std::vector<std::string> lines_;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  Communicator world = Communicator::world();
  if (world.rank() != 0) {
    SilentReporter silent;
    benchmark::RunSpecifiedBenchmarks(&silent);
  } else {
    fmt::print("ranks: {}\n", world.size());
    PairReporter reporter;
    benchmark::RunSpecifiedBenchmarks(&reporter);
  }
  benchmark::Shutdown();
  return 0;
}
