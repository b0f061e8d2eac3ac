// Devices: where a tensor's elements live (docs/gpu.md).
//
// The CPU is the reference every device is checked against. CUDA is built only where nvcc
// is found (NDMESH_CUDA); this header needs no CUDA header, so code that merely names a
// device compiles everywhere, and asking for CUDA on a build or a machine without it is a
// ConfigError that says why (cuda::unavailable_reason()).
//
// On CUDA each process uses one GPU (its local rank modulo the GPUs it sees) and one
// compute stream; every operation of ndmesh::cuda is ordered on that stream, and only the
// calls that hand data to the host (copy_to_host, the reductions that return a number)
// wait for it. Device memory comes from a caching allocator: a freed block is kept for the
// next allocation of its size class, so a training step allocates nothing after the first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ndmesh/core/streams.hpp"

namespace ndmesh {

/// Where elements live.
enum class Device : std::uint8_t { kCpu, kCuda };

/// "cpu", "cuda".
std::string_view device_name(Device d);
/// Parses a device name; std::nullopt when it is not one.
std::optional<Device> parse_device(std::string_view name);

namespace cuda {

/// True when this ndmesh was built with CUDA (NDMESH_CUDA found nvcc).
bool built();
/// GPUs the CUDA driver reports: 0 without CUDA, a driver or a GPU.
int device_count();
/// Why CUDA cannot run in this process, in one line with the fix; empty when it can.
std::string unavailable_reason();

/// Selects this process's GPU (`local_rank` modulo device_count()) and creates its compute
/// stream. ConfigError with unavailable_reason() when CUDA cannot run. Idempotent.
void init(int local_rank = 0);
/// The GPU init() selected (-1 before init()).
int current_device();
/// The compute stream (a cudaStream_t) of this process; init() first.
void* stream();
/// Waits until everything enqueued on the compute stream has run; Error naming the CUDA
/// error if any kernel failed.
void synchronize();

/// `bytes` of device memory from the caching allocator (never nullptr; Error when the GPU
/// is full, naming the request and what is held). Ordered on the compute stream.
void* alloc(std::size_t bytes);
/// Gives a block back to the allocator's cache (nullptr is ignored).
void free(void* p) noexcept;

/// Work enqueued now on `stream`, a stream other than the compute stream (a communication
/// stream), uses the device memory at `p` (anywhere inside a block): the block is not handed
/// out again after its free before that stream has passed this point
/// (tensor/block_cache.hpp). Without CUDA, does nothing.
void record_stream(void* p, void* stream);
/// CUDA's events and streams behind StreamOps (core/streams.hpp).
StreamOps& stream_ops();

/// Device memory whose pages can be given back and taken again at the same addresses
/// (ZeRO-3's parameters, ZeRO 2/3's gradient work space: DevicePages), outside the
/// caching allocator: `bytes` of
/// addresses reserved once, backed in chunks of map_granularity() bytes, all of them at
/// first, or none with `backed` false (map_pages backs what is used: a ZeRO-3 model that
/// only fits sharded never holds the whole buffer) (CUDA's virtual memory management:
/// cuMemAddressReserve, cuMemCreate, cuMemMap; in the emulator, host pages). The
/// allocator's statistics count the backed chunks.
void* alloc_mappable(std::size_t bytes, bool backed = true);
/// Per chunk of the mappable block that holds [p, p + bytes) (p on a chunk), from p's
/// chunk on: whether it is backed now.
std::vector<bool> backed_chunks(const void* p, std::size_t bytes);
void free_mappable(void* p) noexcept;
/// The chunk size of alloc_mappable's memory (2 MiB on current GPUs).
std::size_t map_granularity();
/// Gives back the chunks that lie wholly inside [p, p + bytes) of a mappable block: their
/// addresses stay reserved, reading them is an error on a GPU (zeros in the emulator). At
/// once: the caller makes sure that no queued work still touches them (an event passed).
void unmap_pages(void* p, std::size_t bytes);
/// Backs again every chunk inside [p, p + bytes) that unmap_pages gave back (their contents
/// undefined); the rest of the range is untouched.
void map_pages(void* p, std::size_t bytes);

/// What the allocator holds and has handed out.
struct AllocatorStats {
  std::int64_t allocated_bytes = 0;       ///< in blocks handed out now
  std::int64_t peak_allocated_bytes = 0;  ///< the most handed out at once
  std::int64_t reserved_bytes = 0;        ///< obtained from the driver (handed out or cached)
  std::int64_t driver_allocations = 0;    ///< cudaMalloc calls so far
};
AllocatorStats allocator_stats();

/// One operation's share of the GPU's time while kernel times were on.
struct KernelTime {
  std::string name;         ///< the kernel's name; a product's with its type, shape and epilogue
  std::int64_t calls = 0;
  double seconds = 0;
};
/// Where the compute stream's time went between kernel_times_start() and kernel_times_stop()
/// (ndmesh train --kernel-times). An event is recorded after every kernel, matrix product,
/// attention call and copy on the compute stream, and the GPU time from one event to the next
/// is the operation's. On one stream that is its run time when the GPU had work queued; a
/// GPU left idle by a slow host shows in the operation after the gap, except right after a
/// host wait, whose idle estimate (the host's time until its next launch) has its own row.
/// Timing adds an event per operation (about a microsecond of host time each).
struct KernelTimes {
  std::vector<KernelTime> rows;      ///< the longest total first
  double seconds = 0;                ///< GPU time from the start to the last operation (the rows' sum)
  std::int64_t host_waits = 0;       ///< times the host waited for the compute stream
  double host_wait_seconds = 0;      ///< how long it waited, in all
};
/// Starts (or restarts, forgetting what was timed) kernel timing; init() first.
void kernel_times_start();
/// Waits for the compute stream, stops timing and returns what it measured (empty when it
/// was not on).
KernelTimes kernel_times_stop();

/// Copies between host and device memory, ordered on the compute stream. copy_to_host
/// waits for the stream (the data is on the host when it returns).
void copy_to_device(void* device_dst, const void* host_src, std::size_t bytes);
void copy_to_host(void* host_dst, const void* device_src, std::size_t bytes);
void copy_device(void* device_dst, const void* device_src, std::size_t bytes);
/// copy_to_device for the small uploads of a step (tokens, targets, tables of pointers):
/// through a ring of pinned host slots, so that the host never waits for the stream (a copy
/// from pageable memory may synchronise with it first: a hidden host wait in mid-step). The
/// bytes are copied into a slot, the slot's transfer is enqueued on the compute stream, and
/// the slot is written again only once an event recorded after that transfer has passed.
/// `host_src` may be reused at once. A copy larger than a slot is copy_to_device.
void upload(void* device_dst, const void* host_src, std::size_t bytes);
/// Sets `bytes` of device memory to zero.
void memset_zero(void* device_dst, std::size_t bytes);

/// The memory of this process's GPU as the driver reports it (cudaMemGetInfo); init() first.
struct MemoryInfo {
  std::int64_t free_bytes = 0;   ///< not held by any process (nor by this one's allocator)
  std::int64_t total_bytes = 0;  ///< the GPU's memory
};
MemoryInfo memory_info();
/// Pinned (page-locked) host memory of `bytes` (cudaMallocHost; Error when it cannot be had,
/// naming the request): the host reads and writes it like any memory, and copies between it
/// and the device run asynchronously at the link's full rate. free_pinned gives it back
/// (nullptr is ignored).
void* alloc_pinned(std::size_t bytes);
void free_pinned(void* p) noexcept;
/// A stream of its own for host-device copies beside the compute stream (--offload optimizer:
/// nn::PinnedOffload); created on first use, it lives as long as the process.
void* copy_stream();
/// Enqueues a copy of `bytes` on `stream`, in whichever direction the two pointers say
/// (cudaMemcpyDefault); returns at once. Order it against other streams with stream_ops().
void copy_async(void* dst, const void* src, std::size_t bytes, void* stream);
/// Blocks the host until `event` (stream_ops()) has passed; Error naming the CUDA error if
/// the work before it failed.
void wait_event(void* event);

}  // namespace cuda

/// Device memory of `bytes` from cuda::alloc, freed when it goes away. Move-only; the
/// empty buffer holds nothing.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes) : data_(bytes > 0 ? cuda::alloc(bytes) : nullptr), bytes_(bytes) {}
  /// `bytes` of cuda::alloc_mappable memory instead (its pages can be given back in place),
  /// all of it backed or, with `backed` false, none.
  static DeviceBuffer mappable(std::size_t bytes, bool backed = true) {
    DeviceBuffer b;
    b.data_ = bytes > 0 ? cuda::alloc_mappable(bytes, backed) : nullptr;
    b.bytes_ = bytes;
    b.mappable_ = true;
    return b;
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : data_(o.data_), bytes_(o.bytes_), mappable_(o.mappable_) {
    o.data_ = nullptr, o.bytes_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = o.data_, bytes_ = o.bytes_, mappable_ = o.mappable_;
      o.data_ = nullptr, o.bytes_ = 0;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { release(); }

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }

 private:
  void release() noexcept {
    if (mappable_)
      cuda::free_mappable(data_);
    else
      cuda::free(data_);
  }
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  bool mappable_ = false;
};

}  // namespace ndmesh
