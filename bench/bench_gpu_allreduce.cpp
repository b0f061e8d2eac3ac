// All-reduce bus bandwidth of device buffers on the device communicator (NCCL; staged through
// host memory with NDMESH_BACKEND=gloo) next to host buffers on the world's CPU backend (Gloo
// under a store launch), float32 from 4 KiB to 64 MiB, measured in the same run, in
// nccl-tests' convention: algbw = bytes / time, busbw = algbw * 2 (n - 1) / n. Rank 0 prints
// one JSON line per size and backend, then the ratio device / host per size. Run it with
// several ranks: `ndmesh launch --store -n 2 -- bench_gpu_allreduce`. Two ranks on one GPU
// (NCCL_HOSTID per rank over loopback) is a correctness arrangement, not a speed claim; on
// a multi-GPU node compare with nccl-tests' `all_reduce_perf -b 4K -e 64M -f 4 -g 1` under
// the same launcher.
//   bench_gpu_allreduce [max bytes]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "ndmesh/comm/communicator.hpp"
#include "ndmesh/launch/launch_env.hpp"
#include "ndmesh/parallel/parallelize.hpp"
#include "ndmesh/tensor/device.hpp"

namespace {

using Clock = std::chrono::steady_clock;

// Seconds per all-reduce of `data` (after a warm-up), the slowest rank's.
template <typename Sync>
double time_all_reduce(const ndmesh::comm::Communicator& c, const ndmesh::comm::Communicator& world,
                       std::span<float> data, const Sync& sync) {
  const int reps =
      static_cast<int>(std::clamp<std::size_t>((std::size_t{32} << 20) / data.size_bytes(), 5, 500));
  c.all_reduce(data);
  sync();
  world.barrier();
  auto start = Clock::now();
  for (int i = 0; i < reps; ++i) c.all_reduce(data);
  sync();
  double t = std::chrono::duration<double>(Clock::now() - start).count() / reps;
  world.all_reduce(std::span<double>(&t, 1), {.op = ndmesh::comm::ReduceOp::kMax});
  return t;
}

}  // namespace

int run(int argc, char** argv) {
  using namespace ndmesh;
  const std::size_t max_bytes = argc > 1 ? std::stoull(argv[1]) : std::size_t{64} << 20;
  comm::Communicator world = comm::Communicator::world();
  comm::Communicator device = parallel::device_communicator(world, Device::kCuda);
  const int n = world.size();
  std::vector<float> host(max_bytes / sizeof(float), 1.0f);
  DeviceBuffer buf(max_bytes);
  cuda::copy_to_device(buf.data(), host.data(), max_bytes);
  auto busbw = [n](std::size_t bytes, double t) {
    return static_cast<double>(bytes) / t / 1e9 * 2.0 * (n - 1) / n;
  };
  for (std::size_t bytes = 4096; bytes <= max_bytes; bytes *= 4) {
    const std::size_t count = bytes / sizeof(float);
    const double td = time_all_reduce(device, world, std::span<float>(static_cast<float*>(buf.data()), count),
                                      [] { cuda::synchronize(); });
    const double th = time_all_reduce(world, world, std::span<float>(host.data(), count), [] {});
    if (world.rank() == 0) {
      std::printf(
          "{\"backend\":\"%s\",\"device\":\"cuda\",\"ranks\":%d,\"bytes\":%zu,\"seconds\":%.3e,\"busbw_"
          "gbps\":%.4f}\n",
          std::string(device.backend()).c_str(), n, bytes, td, busbw(bytes, td));
      std::printf(
          "{\"backend\":\"%s\",\"device\":\"cpu\",\"ranks\":%d,\"bytes\":%zu,\"seconds\":%.3e,\"busbw_gbps\":"
          "%.4f}\n",
          std::string(world.backend()).c_str(), n, bytes, th, busbw(bytes, th));
      std::printf("{\"ratio\":\"%s cuda / %s cpu\",\"bytes\":%zu,\"busbw_ratio\":%.3f}\n",
                  std::string(device.backend()).c_str(), std::string(world.backend()).c_str(), bytes,
                  th / td);
      std::fflush(stdout);
    }
  }
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpu_allreduce: %s\n", e.what());
    return 2;
  }
}
