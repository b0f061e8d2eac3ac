// Device names, and the CUDA entry points of a build without CUDA (every one says why).
#include "ndmesh/tensor/device.hpp"

#include <array>
#include <cstring>
#include <mutex>

#include "ndmesh/core/error.hpp"
#include "ndmesh/core/streams.hpp"
#include "ndmesh/core/log.hpp"
#include "tensor/cuda/errors.hpp"

namespace ndmesh {

namespace cuda::detail {
void fail_error(const std::string& message) { throw Error("cuda", message); }
void fail_config(const std::string& message) { throw ConfigError("cuda", message); }
void note(const std::string& message) { log::info("[cuda] {}", message); }
}  // namespace cuda::detail

std::string_view device_name(Device d) { return d == Device::kCuda ? "cuda" : "cpu"; }

std::optional<Device> parse_device(std::string_view name) {
  if (name == "cpu") return Device::kCpu;
  if (name == "cuda") return Device::kCuda;
  return std::nullopt;
}

#if NDMESH_WITH_CUDA
namespace cuda {
namespace {
// The pinned slots of upload(): kSlots of kSlotBytes, used in turn, each with the event that
// passes after its last transfer. Made on the first upload; they live as long as the process.
constexpr std::size_t kSlots = 8, kSlotBytes = std::size_t{1} << 20;
struct Uploads {
  std::mutex mutex;
  char* pinned = nullptr;
  std::array<void*, kSlots> events{};
  std::size_t next = 0;
};
Uploads& uploads() {
  static Uploads u;
  return u;
}
}  // namespace

void upload(void* device_dst, const void* host_src, std::size_t bytes) {
  if (bytes == 0) return;
  if (bytes > kSlotBytes) return copy_to_device(device_dst, host_src, bytes);
  Uploads& u = uploads();
  std::lock_guard<std::mutex> lock(u.mutex);
  if (u.pinned == nullptr) {
    u.pinned = static_cast<char*>(alloc_pinned(kSlots * kSlotBytes));
    for (void*& e : u.events) e = stream_ops().create_event();
  }
  const std::size_t slot = u.next;
  u.next = (u.next + 1) % kSlots;
  void* event = u.events[slot];
  if (!stream_ops().query(event)) wait_event(event);  // its last transfer is still queued
  char* staging = u.pinned + slot * kSlotBytes;
  std::memcpy(staging, host_src, bytes);
  copy_async(device_dst, staging, bytes, stream());
  stream_ops().record(event, stream());
  if (detail::timing()) detail::timed("copy host to device");
}
}  // namespace cuda
#else
namespace cuda {
namespace {
[[noreturn]] void unavailable() { fail<ConfigError>("cuda", "{}", unavailable_reason()); }
}  // namespace

bool built() { return false; }
int device_count() { return 0; }
std::string unavailable_reason() {
  return "this ndmesh was built without CUDA (no nvcc was found, or NDMESH_CUDA=OFF); rebuild where the CUDA "
         "toolkit is installed (cmake -DNDMESH_CUDA=ON) or use --device cpu";
}
void init(int) { unavailable(); }
int current_device() { return -1; }
void* stream() { unavailable(); }
void synchronize() {}
void* alloc(std::size_t) { unavailable(); }
void free(void*) noexcept {}
void record_stream(void*, void*) {}
StreamOps& stream_ops() { unavailable(); }
AllocatorStats allocator_stats() { return {}; }
void copy_to_device(void*, const void*, std::size_t) { unavailable(); }
void copy_to_host(void*, const void*, std::size_t) { unavailable(); }
void copy_device(void*, const void*, std::size_t) { unavailable(); }
void upload(void*, const void*, std::size_t) { unavailable(); }
void memset_zero(void*, std::size_t) { unavailable(); }
MemoryInfo memory_info() { unavailable(); }
void* alloc_pinned(std::size_t) { unavailable(); }
void free_pinned(void*) noexcept {}
void* copy_stream() { unavailable(); }
void copy_async(void*, const void*, std::size_t, void*) { unavailable(); }
void wait_event(void*) { unavailable(); }
void* alloc_mappable(std::size_t, bool) { unavailable(); }
std::vector<bool> backed_chunks(const void*, std::size_t) { unavailable(); }
void free_mappable(void*) noexcept {}
std::size_t map_granularity() { unavailable(); }
void unmap_pages(void*, std::size_t) { unavailable(); }
void map_pages(void*, std::size_t) { unavailable(); }
void kernel_times_start() { unavailable(); }
KernelTimes kernel_times_stop() { return {}; }
}  // namespace cuda
#endif

}  // namespace ndmesh
