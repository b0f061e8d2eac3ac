// The CUDA side of tensor/device.hpp: GPU selection, the compute stream and the caching
// allocator. Blocks are rounded up to a size class (512 B below 1 MiB, 2 MiB above) and a
// freed block waits in its class's free list for the next request of that class. With one
// compute stream per process, reusing a block is ordered after every earlier use of it, so
// no event is needed, except for blocks that work on another stream used (record_stream: the
// communication streams of NCCL): those wait for an event of that stream before they are
// handed out again (tensor/block_cache.hpp). When the driver refuses a request the cache is
// released and the request retried once.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <map>
#include <mutex>
#include <vector>

#include "ndmesh/tensor/block_cache.hpp"
#include "ndmesh/tensor/device.hpp"
#include "tensor/cuda/errors.hpp"
#include "ndmesh/tensor/kernel_times.hpp"

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

// Kernel times (device.hpp): an event after every operation on the compute stream, resolved
// front to back as they pass, so timing adds no host wait of its own.
using Clock = std::chrono::steady_clock;
struct Timing {
  std::atomic<bool> on{false};
  std::mutex mutex;
  struct Mark {
    std::string what;
    cudaEvent_t event;
    double idle;  // the host's time from its last wait to this launch (the first after a wait)
  };
  std::deque<Mark> pending;
  std::vector<cudaEvent_t> spare;
  cudaEvent_t last = nullptr;  // the latest passed event: where the next interval starts
  detail::KernelTimeTable table;
  bool after_wait = false;
  Clock::time_point wait_end;
};
Timing& timing_state() {
  static Timing t;
  return t;
}

cudaEvent_t timing_event(Timing& t) {
  if (!t.spare.empty()) {
    cudaEvent_t e = t.spare.back();
    t.spare.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  check(cudaEventCreate(&e), "cudaEventCreate (kernel times)");
  return e;
}

// Books the passed events at the front (all of them when `all`: the stream has been waited
// for). Caller holds t.mutex.
void resolve(Timing& t, bool all) {
  while (!t.pending.empty()) {
    Timing::Mark& m = t.pending.front();
    if (!all) {
      const cudaError_t r = cudaEventQuery(m.event);
      if (r == cudaErrorNotReady) return;
      check(r, "a kernel before a kernel-times event");
    }
    float ms = 0;
    check(cudaEventElapsedTime(&ms, t.last, m.event), "cudaEventElapsedTime (kernel times)");
    t.table.add(m.what, 1e-3 * ms, m.idle);
    t.spare.push_back(t.last);
    t.last = m.event;
    t.pending.pop_front();
  }
}

// Around every host wait for the compute stream.
class HostWait {
 public:
  HostWait() : on_(timing_state().on.load(std::memory_order_relaxed)), start_(Clock::now()) {}
  ~HostWait() {
    if (!on_) return;
    Timing& t = timing_state();
    std::lock_guard<std::mutex> lock(t.mutex);
    t.wait_end = Clock::now();
    t.table.host_wait(std::chrono::duration<double>(t.wait_end - start_).count());
    t.after_wait = true;
  }
  HostWait(const HostWait&) = delete;
  HostWait& operator=(const HostWait&) = delete;

 private:
  bool on_;
  Clock::time_point start_;
};

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
  HostWait wait;
  check(cudaStreamSynchronize(s.stream), "a kernel on the compute stream");
}

namespace detail {
bool timing() { return timing_state().on.load(std::memory_order_relaxed); }

void timed(const char* what) {
  Timing& t = timing_state();
  if (!t.on.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(t.mutex);
  double idle = 0;
  if (t.after_wait) {
    idle = std::chrono::duration<double>(Clock::now() - t.wait_end).count();
    t.after_wait = false;
  }
  cudaEvent_t e = timing_event(t);
  check(cudaEventRecord(e, state().stream), "cudaEventRecord (kernel times)");
  t.pending.push_back({what, e, idle});
  resolve(t, false);
}
}  // namespace detail

void kernel_times_start() {
  State& s = state();
  if (s.device < 0) detail::fail_error("kernel times are started before cuda::init()");
  Timing& t = timing_state();
  std::lock_guard<std::mutex> lock(t.mutex);
  for (Timing::Mark& m : t.pending) t.spare.push_back(m.event);
  t.pending.clear();
  t.table = {};
  t.after_wait = false;
  if (t.last == nullptr) t.last = timing_event(t);
  check(cudaEventRecord(t.last, s.stream), "cudaEventRecord (kernel times)");
  t.on.store(true, std::memory_order_relaxed);
}

KernelTimes kernel_times_stop() {
  Timing& t = timing_state();
  if (!t.on.load(std::memory_order_relaxed)) return {};
  check(cudaStreamSynchronize(state().stream), "a kernel on the compute stream");
  std::lock_guard<std::mutex> lock(t.mutex);
  t.on.store(false, std::memory_order_relaxed);
  resolve(t, true);
  return t.table.result();
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
  detail::timed("copy host to device");
}

void copy_to_host(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(stream())),
        "cudaMemcpyAsync (to the host)");
  detail::timed("copy device to host");
  synchronize();
}

void copy_device(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream())),
        "cudaMemcpyAsync (on the device)");
  detail::timed("copy on the device");
}

void memset_zero(void* dst, std::size_t bytes) {
  if (bytes == 0) return;
  check(cudaMemsetAsync(dst, 0, bytes, static_cast<cudaStream_t>(stream())), "cudaMemsetAsync");
  detail::timed("memset");
}

// ---- mappable memory (ZeRO-3): CUDA's virtual memory management ---------------------------
//
// The driver's entry points are looked up through the runtime (cudaGetDriverEntryPointByVersion),
// so nothing links libcuda. A block is one address reservation of whole chunks; each chunk is
// mapped on its own (cuMemUnmap takes a whole mapping, never part of one), and a run of chunks
// backed together is made accessible in one cuMemSetAccess. A chunk given back
// keeps its physical memory in a pool that the next chunk backed takes (cuMemMap and
// cuMemSetAccess again, no cuMemCreate): ZeRO gives back and backs the same number of chunks
// every step, and the caching allocator, which never returns memory to the driver either,
// could not have used it in between. Pooled chunks count as reserved, not allocated; freeing
// a block releases its chunks and the pool.
namespace {
struct Vmm {
  CUresult (*address_reserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long) = nullptr;
  CUresult (*address_free)(CUdeviceptr, size_t) = nullptr;
  CUresult (*create)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,
                     unsigned long long) = nullptr;
  CUresult (*release)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long) = nullptr;
  CUresult (*unmap)(CUdeviceptr, size_t) = nullptr;
  CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) = nullptr;
  CUresult (*granularity)(size_t*, const CUmemAllocationProp*, CUmemAllocationGranularity_flags) = nullptr;
  CUmemAllocationProp prop{};
  CUmemAccessDesc access{};
  std::size_t chunk = 0;
};

struct Mappable {
  std::size_t bytes = 0;     // reserved: a whole number of chunks
  std::vector<bool> backed;  // per chunk
  std::vector<CUmemGenericAllocationHandle> handles;  // per backed chunk: its physical memory
};

struct MappableState {
  std::mutex mutex;
  std::map<char*, Mappable> blocks;
  std::vector<CUmemGenericAllocationHandle> pool;  // physical chunks given back, to map again
};
MappableState& mappables() {
  static MappableState m;
  return m;
}

void check_cu(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS)
    detail::fail_error(std::string("CUDA virtual memory (") + what + ") failed with CUresult " +
                       std::to_string(r) + " (ZeRO's mappable memory on the GPU)");
}

template <typename F>
void entry(F& fn, const char* name) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found{};
  check(cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &found), name);
  if (found != cudaDriverEntryPointSuccess || p == nullptr)
    detail::fail_error(std::string("the CUDA driver has no ") + name +
                       " (ZeRO-3 on the GPU needs CUDA 12 or later)");
  fn = reinterpret_cast<F>(p);
}

const Vmm& vmm() {
  static const Vmm v = [] {
    Vmm x;
    entry(x.address_reserve, "cuMemAddressReserve");
    entry(x.address_free, "cuMemAddressFree");
    entry(x.create, "cuMemCreate");
    entry(x.release, "cuMemRelease");
    entry(x.map, "cuMemMap");
    entry(x.unmap, "cuMemUnmap");
    entry(x.set_access, "cuMemSetAccess");
    entry(x.granularity, "cuMemGetAllocationGranularity");
    x.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    x.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    x.prop.location.id = state().device;
    x.access.location = x.prop.location;
    x.access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    check_cu(x.granularity(&x.chunk, &x.prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
             "cuMemGetAllocationGranularity");
    return x;
  }();
  return v;
}

// Backs chunk `i` of the block at `base`, not yet accessible: set_access() follows over the
// run of chunks backed (caller holds mappables().mutex).
void back_chunk(char* base, Mappable& m, std::size_t i) {
  const Vmm& v = vmm();
  auto& pool = mappables().pool;
  CUmemGenericAllocationHandle h{};
  const bool pooled = !pool.empty();
  if (pooled) {
    h = pool.back();
    pool.pop_back();
  } else {
    const CUresult r = v.create(&h, v.chunk, &v.prop, 0);
    if (r == CUDA_ERROR_OUT_OF_MEMORY)
      detail::fail_error(
          "out of GPU memory: a " + mib(static_cast<double>(v.chunk)) +
          " chunk of ZeRO's sharded parameters or gradients could not be backed; lower --micro-batch or use "
          "more ranks");
    check_cu(r, "cuMemCreate");
  }
  const auto at = reinterpret_cast<CUdeviceptr>(base + i * v.chunk);
  if (const CUresult r = v.map(at, v.chunk, 0, h, 0); r != CUDA_SUCCESS) {
    pool.push_back(h);  // still ours: released with the pool
    if (!pooled) {
      std::lock_guard<std::mutex> lock(state().mutex);
      state().stats.reserved_bytes += static_cast<std::int64_t>(v.chunk);
    }
    check_cu(r, "cuMemMap");
  }
  m.handles[i] = h;
  m.backed[i] = true;
  {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    s.stats.allocated_bytes += static_cast<std::int64_t>(v.chunk);
    if (!pooled) s.stats.reserved_bytes += static_cast<std::int64_t>(v.chunk);
    s.stats.peak_allocated_bytes = std::max(s.stats.peak_allocated_bytes, s.stats.allocated_bytes);
  }
}

// Makes chunks [first, last) of the block at `base`, just backed, readable and writable by
// the device: one call over the run (the driver takes a range over several mappings).
void set_access(char* base, std::size_t first, std::size_t last) {
  const Vmm& v = vmm();
  check_cu(v.set_access(reinterpret_cast<CUdeviceptr>(base + first * v.chunk), (last - first) * v.chunk,
                        &v.access, 1),
           "cuMemSetAccess");
}

// Gives chunk `i` back: its physical memory into the pool, or to the driver when `release`.
void unback_chunk(char* base, Mappable& m, std::size_t i, bool release) {
  const Vmm& v = vmm();
  check_cu(v.unmap(reinterpret_cast<CUdeviceptr>(base + i * v.chunk), v.chunk), "cuMemUnmap");
  m.backed[i] = false;
  State& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.stats.allocated_bytes -= static_cast<std::int64_t>(v.chunk);
  }
  if (!release) {
    mappables().pool.push_back(m.handles[i]);
    return;
  }
  check_cu(v.release(m.handles[i]), "cuMemRelease");
  std::lock_guard<std::mutex> lock(s.mutex);
  s.stats.reserved_bytes -= static_cast<std::int64_t>(v.chunk);
}

// The block holding [p, p + bytes) and its chunk range [first, last) wholly inside it.
std::pair<std::map<char*, Mappable>::iterator, std::pair<std::size_t, std::size_t>> chunks_inside(
    void* p, std::size_t bytes) {
  auto& blocks = mappables().blocks;
  char* c = static_cast<char*>(p);
  auto it = blocks.upper_bound(c);
  if (it == blocks.begin() || (--it, c + bytes > it->first + it->second.bytes))
    detail::fail_error("map_pages / unmap_pages of a range outside every mappable block");
  const std::size_t chunk = vmm().chunk;
  const auto lo = static_cast<std::size_t>(c - it->first), hi = lo + bytes;
  return {it, {(lo + chunk - 1) / chunk, hi / chunk}};
}
}  // namespace

std::size_t map_granularity() {
  if (state().device < 0) detail::fail_error("mappable memory is asked for before cuda::init()");
  return vmm().chunk;
}

void* alloc_mappable(std::size_t bytes, bool backed) {
  const std::size_t chunk = map_granularity();
  const std::size_t n = std::max<std::size_t>((bytes + chunk - 1) / chunk, 1);
  CUdeviceptr base = 0;
  check_cu(vmm().address_reserve(&base, n * chunk, chunk, 0, 0), "cuMemAddressReserve");
  auto* p = reinterpret_cast<char*>(base);
  std::lock_guard<std::mutex> lock(mappables().mutex);
  Mappable& m = mappables().blocks[p];
  m.bytes = n * chunk;
  m.backed.assign(n, false);
  m.handles.assign(n, CUmemGenericAllocationHandle{});
  if (!backed) return p;  // addresses only: map_pages backs what is used
  for (std::size_t i = 0; i < n; ++i) back_chunk(p, m, i);
  set_access(p, 0, n);
  return p;
}

std::vector<bool> backed_chunks(const void* p, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mappables().mutex);
  const std::size_t chunk = vmm().chunk;
  auto [it, range] = chunks_inside(const_cast<void*>(p), (bytes + chunk - 1) / chunk * chunk);
  return {it->second.backed.begin() + static_cast<std::ptrdiff_t>(range.first),
          it->second.backed.begin() + static_cast<std::ptrdiff_t>(range.second)};
}

void free_mappable(void* p) noexcept {
  if (p == nullptr) return;
  try {
    synchronize();  // nothing queued may touch it
    std::lock_guard<std::mutex> lock(mappables().mutex);
    auto it = mappables().blocks.find(static_cast<char*>(p));
    if (it == mappables().blocks.end()) return;
    for (std::size_t i = 0; i < it->second.backed.size(); ++i)
      if (it->second.backed[i]) unback_chunk(it->first, it->second, i, true);
    vmm().address_free(reinterpret_cast<CUdeviceptr>(p), it->second.bytes);
    mappables().blocks.erase(it);
    // A block freed ends its training: the pool goes back to the driver too.
    for (CUmemGenericAllocationHandle h : mappables().pool) {
      vmm().release(h);
      std::lock_guard<std::mutex> stats(state().mutex);
      state().stats.reserved_bytes -= static_cast<std::int64_t>(vmm().chunk);
    }
    mappables().pool.clear();
  } catch (...) {  // at exit, after a failure: the driver reclaims it with the process
  }
}

void unmap_pages(void* p, std::size_t bytes) {
  if (bytes == 0) return;
  std::lock_guard<std::mutex> lock(mappables().mutex);
  auto [it, range] = chunks_inside(p, bytes);
  for (std::size_t i = range.first; i < range.second; ++i)
    if (it->second.backed[i]) unback_chunk(it->first, it->second, i, false);
}

void map_pages(void* p, std::size_t bytes) {
  if (bytes == 0) return;
  std::lock_guard<std::mutex> lock(mappables().mutex);
  auto [it, range] = chunks_inside(p, bytes);
  for (std::size_t i = range.first; i < range.second;) {
    if (it->second.backed[i]) {
      ++i;
      continue;
    }
    std::size_t j = i;  // a run of chunks given back: backed one by one, then made accessible at once
    for (; j < range.second && !it->second.backed[j]; ++j) back_chunk(it->first, it->second, j);
    set_access(it->first, i, j);
    i = j;
  }
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
        "cudaMemcpyAsync (copy_async: offload, upload)");
}

void wait_event(void* event) {
  HostWait wait;
  check(cudaEventSynchronize(static_cast<cudaEvent_t>(event)), "a copy before an event");
}

}  // namespace ndmesh::cuda
