// The staged device communicator (staged_backend.hpp). An operation on device buffers
// copies them to pinned host buffers on the compute stream and waits for it, runs the CPU
// backend's operation on the host copies (nonblocking when asked: the Work polls it), and
// once that is complete divides an average, copies the result back on the compute stream and
// waits for the copy, so that the pinned buffer may serve the next operation at once.
#include "backends/staged/staged_backend.hpp"

#include <cuda_runtime.h>

#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/tensor/device.hpp"

namespace ndmesh::comm::staging {

bool is_device_pointer(const void* p) {
  if (p == nullptr) return false;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // no driver, or a pointer CUDA does not know: host memory
    return false;
  }
  return a.type == cudaMemoryTypeDevice;
}

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail<>("comm", "staging a device buffer: {} failed: {}", what, cudaGetErrorString(e));
}

// Copies on the compute stream and waits for it (host, device or pinned memory on either side).
void copy_now(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  auto s = static_cast<cudaStream_t>(cuda::stream());
  check(cudaSetDevice(cuda::current_device()), "cudaSetDevice");  // on any thread: this process's GPU
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s), "cudaMemcpyAsync");
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

// Pinned host buffers, kept for reuse by size (the sizes of a training step repeat).
class PinnedPool {
 public:
  static PinnedPool& get() {
    static auto* pool = new PinnedPool;  // never destroyed: buffers live as long as the process
    return *pool;
  }
  std::shared_ptr<char> take(std::size_t bytes) {
    void* p = nullptr;
    {
      std::lock_guard lock(mutex_);
      auto& free = free_[bytes];
      if (!free.empty()) {
        p = free.back();
        free.pop_back();
      }
    }
    if (p == nullptr) check(cudaMallocHost(&p, std::max<std::size_t>(bytes, 1)), "cudaMallocHost");
    return std::shared_ptr<char>(static_cast<char*>(p), [this, bytes](char* q) {
      std::lock_guard lock(mutex_);
      free_[bytes].push_back(q);
    });
  }

 private:
  std::mutex mutex_;
  std::map<std::size_t, std::vector<void*>> free_;
};

// CUDA's memory for the staged communicator: device pointers by cudaPointerGetAttributes,
// copies on the compute stream, pinned host buffers.
class CudaStagingMemory final : public StagingMemory {
 public:
  bool is_device(const void* p) const override { return is_device_pointer(p); }
  void copy(void* dst, const void* src, std::size_t bytes) override { copy_now(dst, src, bytes); }
  std::shared_ptr<char> host_buffer(std::size_t bytes) override { return PinnedPool::get().take(bytes); }
};

}  // namespace

std::shared_ptr<StagingMemory> cuda_memory() {
  static auto memory = std::make_shared<CudaStagingMemory>();
  return memory;
}

}  // namespace ndmesh::comm::staging
