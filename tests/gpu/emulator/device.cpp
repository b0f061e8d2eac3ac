// tensor/device.hpp for the CUDA emulator (cuda_runtime.h beside this): "device" memory is
// host memory, the stream is a token, copies are memcpy. Linked into the emulated test
// binaries in place of src/tensor/cuda/device.cu, so that the GPU tests run unchanged.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "memory.hpp"  // emulator/memory.hpp
#include "ndmesh/core/streams.hpp"
#include "ndmesh/tensor/device.hpp"

namespace ndmesh::cuda {

namespace {
struct State {
  std::mutex mutex;
  std::map<void*, std::size_t> sizes;
  AllocatorStats stats;
};
State& state() {
  static State s;
  return s;
}
int stream_token = 0;
}  // namespace

bool built() { return true; }
int device_count() { return 1; }
std::string unavailable_reason() { return ""; }
void init(int) {}
int current_device() { return 0; }
void* stream() { return &stream_token; }
void synchronize() {}

void* alloc(std::size_t bytes) {
  const std::size_t size = (bytes + 255) / 256 * 256;
  void* p = std::aligned_alloc(256, size == 0 ? 256 : size);
  std::memset(p, 0xA5, size);  // not zero: device memory starts as garbage
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.sizes[p] = size;
  s.stats.allocated_bytes += static_cast<std::int64_t>(size);
  s.stats.peak_allocated_bytes = std::max(s.stats.peak_allocated_bytes, s.stats.allocated_bytes);
  s.stats.reserved_bytes = s.stats.allocated_bytes;
  ++s.stats.driver_allocations;
  return p;
}

void free(void* p) noexcept {
  if (p == nullptr) return;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  auto it = s.sizes.find(p);
  if (it == s.sizes.end()) return;
  s.stats.allocated_bytes -= static_cast<std::int64_t>(it->second);
  s.stats.reserved_bytes = s.stats.allocated_bytes;
  s.sizes.erase(it);
  std::free(p);
}

namespace emulator {
bool is_device(const void* p) {
  if (p == nullptr) return false;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  auto it = s.sizes.upper_bound(const_cast<void*>(p));  // the first block above p
  if (it == s.sizes.begin()) return false;
  --it;
  return static_cast<const char*>(p) < static_cast<const char*>(it->first) + it->second;
}
}  // namespace emulator

// One stream, and every kernel has ended when its launch returns: an event has passed as soon
// as it is recorded, waits have nothing to wait for, and a block is never in use on another stream.
namespace {
class EmulatedStreamOps final : public StreamOps {
 public:
  void* create_event() override { return new int(0); }
  void destroy_event(void* event) noexcept override { delete static_cast<int*>(event); }
  void record(void*, void*) override {}
  void wait(void*, void*) override {}
  bool query(void*) override { return true; }
};
}  // namespace

StreamOps& stream_ops() {
  static EmulatedStreamOps ops;
  return ops;
}

void record_stream(void*, void*) {}

AllocatorStats allocator_stats() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.stats;
}

void copy_to_device(void* dst, const void* src, std::size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}
void copy_to_host(void* dst, const void* src, std::size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}
void copy_device(void* dst, const void* src, std::size_t bytes) {
  if (bytes) std::memmove(dst, src, bytes);
}
void memset_zero(void* dst, std::size_t bytes) {
  if (bytes) std::memset(dst, 0, bytes);
}

// Pinned memory is host memory; the copy stream is the one stream (copies end when enqueued).
namespace {
int copy_stream_token = 0;
}  // namespace
void* alloc_pinned(std::size_t bytes) { return std::malloc(std::max<std::size_t>(bytes, 1)); }
void free_pinned(void* p) noexcept { std::free(p); }
void* copy_stream() { return &copy_stream_token; }
void copy_async(void* dst, const void* src, std::size_t bytes, void*) {
  if (bytes) std::memmove(dst, src, bytes);
}
void wait_event(void*) {}

}  // namespace ndmesh::cuda
