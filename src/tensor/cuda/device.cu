// The CUDA side of tensor/device.hpp: GPU selection, the compute stream and the caching
// allocator. Blocks are rounded up to a size class (512 B below 1 MiB, 2 MiB above) and a
// freed block waits in its class's free list for the next request of that class. With one
// compute stream per process, reusing a block is ordered after every earlier use of it, so
// no event is needed. When the driver refuses a request the cache is released and the
// request retried once.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <vector>

#include "ndmesh/tensor/device.hpp"
#include "tensor/cuda/errors.hpp"

namespace ndmesh::cuda {

namespace {

using detail::check;

std::string mib(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MiB", bytes / (1 << 20));
  return text;
}

struct State {
  std::mutex mutex;
  int device = -1;
  cudaStream_t stream = nullptr;
  std::map<std::size_t, std::vector<void*>> free_blocks;  // by size class
  std::map<void*, std::size_t> sizes;                     // every block obtained from the driver
  AllocatorStats stats;
};

State& state() {
  static State s;
  return s;
}

std::size_t size_class(std::size_t bytes) {
  constexpr std::size_t kSmall = 512, kLarge = std::size_t{2} << 20, kSplit = std::size_t{1} << 20;
  const std::size_t unit = bytes < kSplit ? kSmall : kLarge;
  return (bytes + unit - 1) / unit * unit;
}

// Gives every cached block back to the driver (caller holds the mutex).
void release_cache(State& s) {
  for (auto& [size, blocks] : s.free_blocks)
    for (void* p : blocks) {
      cudaFree(p);
      s.sizes.erase(p);
      s.stats.reserved_bytes -= static_cast<std::int64_t>(size);
    }
  s.free_blocks.clear();
}

}  // namespace

bool built() { return true; }

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

std::string unavailable_reason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string("no usable CUDA GPU here (") + cudaGetErrorName(e) + ": " + cudaGetErrorString(e) +
           "); run on a machine with an NVIDIA GPU and driver, or use --device cpu";
  }
  if (n == 0)
    return "the CUDA driver sees no GPU here; run on a machine with an NVIDIA GPU, or use --device cpu";
  return "";
}

void init(int local_rank) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.device >= 0) return;
  const std::string why = unavailable_reason();
  if (!why.empty()) detail::fail_config(why);
  const int n = device_count();
  const int device = local_rank % n;
  check(cudaSetDevice(device), "cudaSetDevice");
  check(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking), "cudaStreamCreate");
  s.device = device;
}

int current_device() { return state().device; }

void* stream() {
  State& s = state();
  if (s.device < 0) detail::fail_error("the compute stream is used before cuda::init()");
  return s.stream;
}

void synchronize() {
  State& s = state();
  if (s.device < 0) return;
  check(cudaStreamSynchronize(s.stream), "a kernel on the compute stream");
}

void* alloc(std::size_t bytes) {
  State& s = state();
  if (s.device < 0) detail::fail_error("device memory is allocated before cuda::init()");
  const std::size_t size = size_class(bytes);
  std::lock_guard<std::mutex> lock(s.mutex);
  void* p = nullptr;
  auto it = s.free_blocks.find(size);
  if (it != s.free_blocks.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
  } else {
    cudaError_t e = cudaMalloc(&p, size);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      release_cache(s);
      e = cudaMalloc(&p, size);
    }
    if (e != cudaSuccess)
      detail::fail_error("out of GPU memory: asked for " + mib(static_cast<double>(size)) + " with " +
                         mib(static_cast<double>(s.stats.allocated_bytes)) + " in use (" +
                         cudaGetErrorString(e) +
                         "); lower --batch, --micro-batch or --seq, or use --recompute");
    s.sizes[p] = size;
    s.stats.reserved_bytes += static_cast<std::int64_t>(size);
    ++s.stats.driver_allocations;
  }
  s.stats.allocated_bytes += static_cast<std::int64_t>(size);
  s.stats.peak_allocated_bytes = std::max(s.stats.peak_allocated_bytes, s.stats.allocated_bytes);
  return p;
}

void free(void* p) noexcept {
  if (p == nullptr) return;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  auto it = s.sizes.find(p);
  if (it == s.sizes.end()) return;  // not ours: never happens through DeviceBuffer
  s.free_blocks[it->second].push_back(p);
  s.stats.allocated_bytes -= static_cast<std::int64_t>(it->second);
}

AllocatorStats allocator_stats() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.stats;
}

void copy_to_device(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream())),
        "cudaMemcpyAsync (to the device)");
}

void copy_to_host(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(stream())),
        "cudaMemcpyAsync (to the host)");
  synchronize();
}

void copy_device(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream())),
        "cudaMemcpyAsync (on the device)");
}

void memset_zero(void* dst, std::size_t bytes) {
  if (bytes == 0) return;
  check(cudaMemsetAsync(dst, 0, bytes, static_cast<cudaStream_t>(stream())), "cudaMemsetAsync");
}

}  // namespace ndmesh::cuda
