// A job in which one rank fails its peers, for tests/mpi/expect_fail_fast.sh:
//   timeout_probe skip        rank 1 never joins the all_reduce of group tp (ranks 0,1)
//   timeout_probe skip-async  the same, rank 0 awaiting all_reduce_async (polled path)
//   timeout_probe skip-split  rank 1 never joins a split of the world
//   timeout_probe kill        rank 1 dies by SIGKILL before that all_reduce
// Every rank prints "enter <unix seconds>" when it reaches the point of failure, so the
// script can measure how long the job lives on after it.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>

#include "ndmesh/comm/communicator.hpp"

int main(int argc, char** argv) {
  using ndmesh::comm::Communicator;
  std::string mode = argc > 1 ? argv[1] : "skip";
  Communicator world = Communicator::world();
  // Pairs {0,1}, {2,3}, ... named tp, as the mesh dp=n/2,tp=2 would make them.
  Communicator tp = world.split(world.rank() / 2, world.rank() % 2, "tp");
  world.barrier();
  double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::printf("enter %.3f rank %d\n", now, world.rank());
  std::fflush(stdout);
  if (world.rank() == 1) {
    if (mode == "kill") std::raise(SIGKILL);
    std::this_thread::sleep_for(std::chrono::seconds(600));  // never joins
    return 0;
  }
  float x = 1;
  if (mode == "skip-split") {
    world.split(0, world.rank(), "again");
  } else if (mode == "skip-async") {
    tp.all_reduce_async(std::span<float>(&x, 1)).wait();
  } else {
    tp.all_reduce(std::span<float>(&x, 1));
  }
  // Ranks outside the failing pair are done; they wait for the job to be torn down, with
  // a long timeout so that the failing pair's rank 0 is the one that reports.
  world.barrier({.timeout_s = 60});
  return 0;
}
