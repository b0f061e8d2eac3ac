// The CUDA side of tensor/device.hpp: GPU selection, the compute stream and the caching
// allocator. Blocks are rounded up to a size class (512 B below 1 MiB, 2 MiB above) and a
// freed block waits in its class's free list for the next request of that class. With one
// compute stream per process, reusing a block is ordered after every earlier use of it, so
// no event is needed, except for blocks that work on another stream used (record_stream: the
// communication streams of NCCL): those wait for an event of that stream before they are
// handed out again (tensor/block_cache.hpp). When the driver refuses a request the cache is
// released and the request retried once.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <vector>

#include "ndmesh/tensor/block_cache.hpp"
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
  BlockCache cache{nullptr, nullptr};   // the free blocks, by size class
  std::map<void*, std::size_t> sizes;  // every block obtained from the driver
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
  for (auto [p, size] : s.cache.drain()) {
    cudaFree(p);
    s.sizes.erase(p);
    s.stats.reserved_bytes -= static_cast<std::int64_t>(size);
  }
}

class CudaStreamOps final : public StreamOps {
 public:
  void* create_event() override {
    cudaEvent_t e = nullptr;
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    return e;
  }
  void destroy_event(void* e) noexcept override { cudaEventDestroy(static_cast<cudaEvent_t>(e)); }
  void record(void* e, void* stream) override {
    check(cudaEventRecord(static_cast<cudaEvent_t>(e), static_cast<cudaStream_t>(stream)), "cudaEventRecord");
  }
  void wait(void* stream, void* e) override {
    check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(e), 0),
          "cudaStreamWaitEvent");
  }
  bool query(void* e) override {
    const cudaError_t r = cudaEventQuery(static_cast<cudaEvent_t>(e));
    if (r == cudaErrorNotReady) return false;
    check(r, "a kernel before an event (cudaEventQuery)");
    return true;
  }
};

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
  s.cache.set_streams(&stream_ops(), s.stream);
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
  void* p = s.cache.take(size);
  if (p == nullptr) {
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
  s.cache.give(p, it->second);
  s.stats.allocated_bytes -= static_cast<std::int64_t>(it->second);
}

StreamOps& stream_ops() {
  static CudaStreamOps ops;
  return ops;
}

void record_stream(void* p, void* stream) {
  if (p == nullptr) return;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  // The block holding p (p may point inside it: a view of a flat buffer).
  auto it = s.sizes.upper_bound(p);
  if (it == s.sizes.begin()) return;
  --it;
  if (static_cast<char*>(p) >= static_cast<char*>(it->first) + it->second) return;  // not ours
  s.cache.note_use(it->first, stream);
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

MemoryInfo memory_info() {
  if (state().device < 0) detail::fail_error("memory_info() is asked before cuda::init()");
  std::size_t free_bytes = 0, total_bytes = 0;
  check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  return {.free_bytes = static_cast<std::int64_t>(free_bytes), .total_bytes = static_cast<std::int64_t>(total_bytes)};
}

void* alloc_pinned(std::size_t bytes) {
  if (state().device < 0) detail::fail_error("pinned host memory is allocated before cuda::init()");
  void* p = nullptr;
  const cudaError_t e = cudaMallocHost(&p, std::max<std::size_t>(bytes, 1));
  if (e != cudaSuccess) {
    cudaGetLastError();
    detail::fail_error("cannot pin " + mib(static_cast<double>(bytes)) + " of host memory (cudaMallocHost: " +
                       cudaGetErrorString(e) + "); free host memory or ask for less");
  }
  return p;
}

void free_pinned(void* p) noexcept {
  if (p != nullptr) cudaFreeHost(p);
}

void* copy_stream() {
  State& s = state();
  if (s.device < 0) detail::fail_error("the copy stream is used before cuda::init()");
  std::lock_guard<std::mutex> lock(s.mutex);
  static cudaStream_t copies = nullptr;
  if (copies == nullptr) check(cudaStreamCreateWithFlags(&copies, cudaStreamNonBlocking), "cudaStreamCreate");
  return copies;
}

void copy_async(void* dst, const void* src, std::size_t bytes, void* stream) {
  if (bytes == 0) return;
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)),
        "cudaMemcpyAsync (offload)");
}

void wait_event(void* event) { check(cudaEventSynchronize(static_cast<cudaEvent_t>(event)), "a copy before an event"); }

}  // namespace ndmesh::cuda
