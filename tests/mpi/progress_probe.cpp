// The data-parallel progress thread under mpirun (issue 22 item 4), on 2 ranks:
//   progress_probe gap          NDMESH_TIMEOUT_S=2: a step, an idle gap of 3 s (longer than
//                               the timeout), a step whose buckets only the progress thread
//                               polls; it must complete them (a thread whose clock ran through
//                               the gap gives up at its first poll).
//   progress_probe serialized   the host initialises MPI itself at MPI_THREAD_SERIALIZED (as
//                               mpi4py can) before ndmesh: the reducer runs without the thread
//                               and says so; the reduction is still right.
// Exits 0 and prints "ok" on success, 1 with a line saying what differed otherwise.
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "ndmesh/comm/communicator.hpp"
#include "ndmesh/parallel/dp/grad_reducer.hpp"

namespace {

using ndmesh::comm::Communicator;
using ndmesh::parallel::GradReducer;

int failures = 0;
void expect(bool ok, const std::string& what) {
  if (ok) return;
  std::fprintf(stderr, "progress_probe: %s\n", what.c_str());
  ++failures;
}

float local_grad(int r, std::int64_t i) { return static_cast<float>((r + 1) * ((i % 7) - 3)); }

// One step of 4 buckets, started at once; `alone`: the thread must complete them before
// finish_backward polls (waiting up to 60 s for it without touching MPI).
void step(GradReducer& reducer, const Communicator& world, int index, bool alone) {
  const int r = world.rank(), p = world.size();
  const std::int64_t n = 4096;
  std::vector<float> g(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) g[static_cast<std::size_t>(i)] = local_grad(r, i);
  const std::int64_t before = reducer.thread_completions();
  reducer.begin_backward(g.data(), true);
  reducer.grads_final(0);
  if (alone) {
    const auto t0 = std::chrono::steady_clock::now();
    while (reducer.thread_completions() < before + 4 &&
           std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    expect(reducer.thread_completions() == before + 4,
           "rank " + std::to_string(r) + " step " + std::to_string(index) +
               ": the progress thread completed " + std::to_string(reducer.thread_completions() - before) +
               " of 4 buckets by itself");
  }
  reducer.finish_backward();
  std::int64_t bad = 0;
  for (std::int64_t i = 0; i < n; ++i)
    bad += g[static_cast<std::size_t>(i)] != static_cast<float>(p * (p + 1) / 2 * ((i % 7) - 3));
  expect(bad == 0, "rank " + std::to_string(r) + " step " + std::to_string(index) + ": " +
                       std::to_string(bad) + " elements differ from the sum");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "gap";
  if (mode == "serialized") {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    if (provided >= MPI_THREAD_MULTIPLE) {
      std::printf("skipped: this MPI gives MPI_THREAD_MULTIPLE when asked for MPI_THREAD_SERIALIZED\n");
      MPI_Finalize();
      return 0;
    }
  }
  {
    Communicator world = Communicator::world();
    GradReducer reducer(world, 4096, {.bucket_mb = 1024.0 * 4 / (1024 * 1024)});  // 4 buckets
    if (mode == "serialized") {
      expect(world.thread_limit().find(
                 "MPI provides MPI_THREAD_SERIALIZED (MPI was initialised by the host program "
                 "before ndmesh)") == 0,
             "thread_limit() is '" + world.thread_limit() + "'");
      expect(!reducer.progress_thread(), "the progress thread is on below MPI_THREAD_MULTIPLE");
      step(reducer, world, 0, false);
    } else {
      expect(world.thread_limit().empty(), "thread_limit() is '" + world.thread_limit() + "'");
      expect(reducer.progress_thread(), "no progress thread at MPI_THREAD_MULTIPLE");
      step(reducer, world, 0, true);
      world.barrier();
      // The gap: longer than NDMESH_TIMEOUT_S; rank 1 starts the next step later still, so
      // rank 0's thread polls before its peer has started.
      std::this_thread::sleep_for(std::chrono::milliseconds(world.rank() == 1 ? 3500 : 3000));
      step(reducer, world, 1, true);
    }
    world.barrier();
    if (world.rank() == 0 && failures == 0) std::printf("ok\n");
  }
  if (mode == "serialized") MPI_Finalize();
  return failures == 0 ? 0 : 1;
}
