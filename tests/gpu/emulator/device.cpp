// tensor/device.hpp for the CUDA emulator (cuda_runtime.h beside this): "device" memory is
// host memory, the stream is a token, copies are memcpy, and device work waits in one queue
// until the host waits for it (device_op, below). Linked into the emulated test
// binaries in place of src/tensor/cuda/device.cu, so that the GPU tests run unchanged.
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <vector>

#include "account_hooks.hpp"
#include "cuda_runtime.h"
#include "memory.hpp"  // emulator/memory.hpp

#include "ndmesh/core/streams.hpp"
#include "ndmesh/tensor/device.hpp"
#include "tensor/cuda/errors.hpp"
#include "ndmesh/tensor/kernel_times.hpp"

// The guard (emu::guard_device_memory): one arena of reserved address space, page-granular
// blocks, all inaccessible (PROT_NONE) while no thread does device work.
namespace emu {
namespace {
struct Guard {
  std::mutex mutex;
  bool on = false;
  char* arena = nullptr;
  std::size_t capacity = 0, top = 0;                // bytes reserved, bytes handed out so far
  std::multimap<std::size_t, char*> free_blocks;   // by size
  int active = 0;                                   // threads inside device work
  std::map<char*, std::size_t> given_back;          // chunks of mappable memory unmapped: no access ever
};
Guard& guard() {
  static Guard g;
  return g;
}
constexpr std::size_t kPage = 4096;

void protect_locked(Guard& g, int prot) {
  if (g.top > 0 && mprotect(g.arena, g.top, prot) != 0) {
    std::perror("emulator: mprotect");
    std::abort();
  }
  // Chunks given back (unmap_pages) stay inaccessible inside device work too, as on a GPU.
  if (prot != PROT_NONE)
    for (auto [p, bytes] : g.given_back) mprotect(p, bytes, PROT_NONE);
}

void on_fault(int, siginfo_t* info, void*) {
  const Guard& g = guard();
  const char* a = static_cast<const char*>(info->si_addr);
  bool given_back = false;
  for (auto [p, bytes] : g.given_back) given_back = given_back || (a >= p && a < p + bytes);
  const char* msg = given_back ? "emulator: device memory given back (cuda::unmap_pages) was read or written "
                                 "before cuda::map_pages backed it again (on a GPU: an illegal address)\n"
                    : a >= g.arena && a < g.arena + g.capacity
                        ? "emulator: host code read or wrote device memory outside a kernel or a copy "
                          "(on a GPU this is a crash or garbage); run under gdb for the stack\n"
                        : "emulator: segmentation fault outside device memory\n";
  (void)!write(2, msg, std::strlen(msg));
  signal(SIGSEGV, SIG_DFL);
  raise(SIGSEGV);
}
}  // namespace

DeviceWork::DeviceWork() {
  Guard& g = guard();
  if (!g.on) return;
  std::lock_guard<std::mutex> lock(g.mutex);
  if (g.active++ == 0) protect_locked(g, PROT_READ | PROT_WRITE);
}
DeviceWork::~DeviceWork() {
  Guard& g = guard();
  if (!g.on) return;
  std::lock_guard<std::mutex> lock(g.mutex);
  if (--g.active == 0) protect_locked(g, PROT_NONE);
}

void guard_device_memory() {
  Guard& g = guard();
  std::lock_guard<std::mutex> lock(g.mutex);
  if (g.on) return;
  g.capacity = std::size_t{8} << 30;  // address space only
  void* p = mmap(nullptr, g.capacity, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("emulator: mmap");
    std::abort();
  }
  g.arena = static_cast<char*>(p);
  struct sigaction sa {};
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO;
  sigaction(SIGSEGV, &sa, nullptr);
  g.on = true;
}

// Device work in stream order (cuda_runtime.h's device_op): a queue per stream, run by
// whichever host thread waits (one at a time), each queue in the order its ops were queued;
// an op after a stream's wait for an event first runs the other stream's work up to it.
namespace {
struct Op {
  std::function<void()> run;  // empty: a wait for `after` only
  Mark after{};               // work of another stream that must have run first (seq 0: none)
};
struct StreamQueue {
  std::deque<Op> ops;
  std::uint64_t enqueued = 0;  // ops queued so far: an op's number is its place, from 1
  std::uint64_t done = 0;      // ops run so far
};
struct Queues {
  std::mutex mutex;    // the queues' contents and counters
  std::mutex running;  // one thread runs device work at a time
  std::map<const void*, StreamQueue> streams;
  std::atomic<bool> at_once{false};
};
Queues& queues() {  // never destroyed: ops still queued at exit (a deferred free) stay reachable
  static auto* q = new Queues;
  return *q;
}
const void* which(const void* stream) { return stream != nullptr ? stream : &compute_stream_token; }

// Runs stream `stream`'s ops up to number `upto`, and first what each waits for (the caller
// holds `running`, not `mutex`).
void run_until(const void* stream, std::uint64_t upto, int depth = 0) {
  Queues& q = queues();
  if (depth > 64) {
    std::fputs("emulator: streams wait for each other in a cycle (on a GPU: a hang)\n", stderr);
    std::abort();
  }
  for (;;) {
    Op op;
    {
      std::lock_guard<std::mutex> lock(q.mutex);
      StreamQueue& s = q.streams[stream];
      if (s.ops.empty() || s.done >= upto) return;
      op = std::move(s.ops.front());
      s.ops.pop_front();
    }
    if (op.after.seq > 0) run_until(op.after.stream, op.after.seq, depth + 1);
    if (op.run) op.run();
    std::lock_guard<std::mutex> lock(q.mutex);
    ++q.streams[stream].done;
  }
}

void enqueue(const void* stream, Op op) {
  Queues& q = queues();
  std::lock_guard<std::mutex> lock(q.mutex);
  StreamQueue& s = q.streams[stream];
  s.ops.push_back(std::move(op));
  ++s.enqueued;
}
}  // namespace

int compute_stream_token = 0;

Mark device_work_mark(const void* stream) {
  Queues& q = queues();
  std::lock_guard<std::mutex> lock(q.mutex);
  return {which(stream), q.streams[which(stream)].enqueued};
}

bool device_work_done(Mark mark) {
  Queues& q = queues();
  std::lock_guard<std::mutex> lock(q.mutex);
  return mark.seq == 0 || q.streams[mark.stream].done >= mark.seq;
}

void drain_device_work(Mark mark) {
  if (mark.seq == 0) return;
  std::lock_guard<std::mutex> run(queues().running);
  run_until(mark.stream, mark.seq);
}

void drain_device_work(const void* stream) { drain_device_work(device_work_mark(stream)); }

void drain_all_device_work() {
  Queues& q = queues();
  std::vector<Mark> marks;
  {
    std::lock_guard<std::mutex> lock(q.mutex);
    for (auto& [stream, s] : q.streams) marks.push_back({stream, s.enqueued});
  }
  for (const Mark& m : marks) drain_device_work(m);
}

void device_wait(const void* stream, Mark mark) {
  if (mark.seq == 0 || queues().at_once.load()) return;
  enqueue(which(stream), Op{.after = mark});
}

void device_op(std::function<void()> op, const void* stream) {
  if (queues().at_once.load()) {
    drain_all_device_work();
    op();
    return;
  }
  enqueue(which(stream), Op{.run = std::move(op)});
}

void run_device_work_at_once(bool at_once) {
  drain_all_device_work();
  queues().at_once.store(at_once);
}

namespace {
// A block of the arena (the guard on), accessible when device work is in progress.
// `fill` false: the pages stay untouched (mappable memory made without backing).
void* guarded_alloc(std::size_t bytes, bool fill = true) {
  Guard& g = guard();
  std::lock_guard<std::mutex> lock(g.mutex);
  const std::size_t size = std::max<std::size_t>((bytes + kPage - 1) / kPage * kPage, kPage);
  char* p = nullptr;
  if (auto it = g.free_blocks.find(size); it != g.free_blocks.end()) {
    p = it->second;
    g.free_blocks.erase(it);
  } else {
    if (g.top + size > g.capacity) {
      std::fputs("emulator: the guarded device arena is full\n", stderr);
      std::abort();
    }
    p = g.arena + g.top;
    g.top += size;
  }
  mprotect(p, size, PROT_READ | PROT_WRITE);
  if (fill) std::memset(p, 0xA5, size);  // not zero: device memory starts as garbage
  if (g.active == 0) mprotect(p, size, PROT_NONE);
  return p;
}
// Marks a chunk of mappable memory given back (no access until taken again) or taken again.
void give_back(char* p, std::size_t bytes) {
  Guard& g = guard();
  if (!g.on || p < g.arena || p >= g.arena + g.capacity) return;
  std::lock_guard<std::mutex> lock(g.mutex);
  g.given_back[p] = bytes;
  mprotect(p, bytes, PROT_NONE);
}
void take_again(char* p, std::size_t bytes) {
  Guard& g = guard();
  if (!g.on || p < g.arena || p >= g.arena + g.capacity) return;
  std::lock_guard<std::mutex> lock(g.mutex);
  g.given_back.erase(p);
  mprotect(p, bytes, g.active > 0 ? PROT_READ | PROT_WRITE : PROT_NONE);
}
// True when p was a guarded block (returned to the arena's free list).
bool guarded_free(void* p, std::size_t size) {
  Guard& g = guard();
  if (!g.on) return false;
  char* c = static_cast<char*>(p);
  if (c < g.arena || c >= g.arena + g.capacity) return false;
  std::lock_guard<std::mutex> lock(g.mutex);
  g.free_blocks.emplace(std::max<std::size_t>((size + kPage - 1) / kPage * kPage, kPage), c);
  return true;
}
}  // namespace
}  // namespace emu

namespace ndmesh::cuda {

namespace {
// A call that waits for the stream on a GPU (the emulator has nothing to wait for): counted
// in the kernel times as the GPU's host waits are.
void host_wait();

struct State {
  std::mutex mutex;
  std::map<void*, std::size_t> sizes;
  AllocatorStats stats;
};
State& state() {
  static State s;
  return s;
}
}  // namespace

bool built() { return true; }
int device_count() { return 1; }
std::string unavailable_reason() { return ""; }
void init(int) {}
int current_device() { return 0; }
void* stream() { return &emu::compute_stream_token; }
void synchronize() {  // the compute stream, and what it waits for
  emu::drain_device_work(stream());
  host_wait();
}

void* alloc(std::size_t bytes) {
  const std::size_t size = (bytes + 255) / 256 * 256;
  void* p = nullptr;
  if (emu::account_on()) {
    p = emu::account_alloc(bytes);  // the account's arena (and its record of driver allocations)
  } else if (emu::guard().on) {
    p = emu::guarded_alloc(size);
  } else {
    p = std::aligned_alloc(256, size == 0 ? 256 : size);
    std::memset(p, 0xA5, size);  // not zero: device memory starts as garbage
  }
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
  std::size_t size = 0;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    auto it = s.sizes.find(p);
    if (it == s.sizes.end()) return;
    s.stats.allocated_bytes -= static_cast<std::int64_t>(it->second);
    s.stats.reserved_bytes = s.stats.allocated_bytes;
    size = it->second;
    s.sizes.erase(it);
  }
  if (emu::account_on()) emu::account_cache_free(size);
  // Work queued before the free may still use the block (a caching allocator hands it out
  // again in stream order): it goes back once that work has run.
  emu::device_op([p, size] {
    if (!emu::account_arena_free(p, size) && !emu::guarded_free(p, size)) std::free(p);
  });
}

// Mappable memory (ZeRO-3): host pages in chunks of one page; a chunk given back is
// madvise(MADV_DONTNEED)'d and, with the guard on, inaccessible even to kernels and copies
// until map_pages backs it again (as on a GPU, where it is unmapped), which fills it with
// garbage, as new device memory holds. The statistics count the backed chunks.
namespace {
constexpr std::size_t kChunk = 4096;
struct Mappable {
  std::size_t bytes = 0;
  std::vector<bool> backed;
};
std::map<char*, Mappable>& mappables() {  // under state().mutex
  static std::map<char*, Mappable> m;
  return m;
}
void count_chunks(std::int64_t chunks) {  // caller holds state().mutex
  State& s = state();
  s.stats.allocated_bytes += chunks * static_cast<std::int64_t>(kChunk);
  s.stats.reserved_bytes = s.stats.allocated_bytes;
  s.stats.peak_allocated_bytes = std::max(s.stats.peak_allocated_bytes, s.stats.allocated_bytes);
}
// The block holding [p, p + bytes) and the chunks wholly inside the range (caller holds the mutex).
std::pair<std::map<char*, Mappable>::iterator, std::pair<std::size_t, std::size_t>> chunks_inside(
    void* p, std::size_t bytes) {
  char* c = static_cast<char*>(p);
  auto it = mappables().upper_bound(c);
  if (it == mappables().begin() || (--it, c + bytes > it->first + it->second.bytes)) {
    std::fputs("emulator: map_pages / unmap_pages of a range outside every mappable block\n", stderr);
    std::abort();
  }
  const auto lo = static_cast<std::size_t>(c - it->first), hi = lo + bytes;
  return {it, {(lo + kChunk - 1) / kChunk, hi / kChunk}};
}
}  // namespace

std::size_t map_granularity() { return kChunk; }

void* alloc_mappable(std::size_t bytes, bool backed) {
  const std::size_t n = std::max<std::size_t>((bytes + kChunk - 1) / kChunk, 1);
  char* p = nullptr;
  if (emu::guard().on) {
    p = static_cast<char*>(emu::guarded_alloc(n * kChunk, backed));
  } else {
    p = static_cast<char*>(std::aligned_alloc(kChunk, n * kChunk));
    if (backed) std::memset(p, 0xA5, n * kChunk);
  }
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  mappables()[p] = Mappable{.bytes = n * kChunk, .backed = std::vector<bool>(n, backed)};
  if (backed) {
    count_chunks(static_cast<std::int64_t>(n));
  } else {  // addresses only: untouched host pages, inaccessible until map_pages
    madvise(p, n * kChunk, MADV_DONTNEED);
    for (std::size_t i = 0; i < n; ++i) emu::give_back(p + i * kChunk, kChunk);
  }
  return p;
}

std::vector<bool> backed_chunks(const void* p, std::size_t bytes) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  auto [it, range] = chunks_inside(const_cast<void*>(p), (bytes + kChunk - 1) / kChunk * kChunk);
  return {it->second.backed.begin() + static_cast<std::ptrdiff_t>(range.first),
          it->second.backed.begin() + static_cast<std::ptrdiff_t>(range.second)};
}

void free_mappable(void* p) noexcept {
  if (p == nullptr) return;
  emu::drain_all_device_work();  // as device.cu's synchronize(): nothing queued may touch it
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  auto it = mappables().find(static_cast<char*>(p));
  if (it == mappables().end()) return;
  count_chunks(
      -static_cast<std::int64_t>(std::count(it->second.backed.begin(), it->second.backed.end(), true)));
  for (std::size_t i = 0; i < it->second.backed.size(); ++i)
    if (!it->second.backed[i]) emu::take_again(it->first + i * kChunk, kChunk);
  const std::size_t bytes = it->second.bytes;
  mappables().erase(it);
  if (!emu::guarded_free(p, bytes)) std::free(p);
}

void unmap_pages(void* p, std::size_t bytes) {
  if (bytes == 0) return;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  auto [it, range] = chunks_inside(p, bytes);
  for (std::size_t i = range.first; i < range.second; ++i) {
    if (!it->second.backed[i]) continue;
    madvise(it->first + i * kChunk, kChunk, MADV_DONTNEED);
    emu::give_back(it->first + i * kChunk, kChunk);  // with the guard on: any access faults
    it->second.backed[i] = false;
    count_chunks(-1);
  }
}

void map_pages(void* p, std::size_t bytes) {
  if (bytes == 0) return;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  auto [it, range] = chunks_inside(p, bytes);
  for (std::size_t i = range.first; i < range.second; ++i) {
    if (it->second.backed[i]) continue;
    emu::take_again(it->first + i * kChunk, kChunk);
    const emu::DeviceWork work;                         // writes device memory
    std::memset(it->first + i * kChunk, 0xA5, kChunk);  // new device memory holds garbage
    it->second.backed[i] = true;
    count_chunks(1);
  }
}

namespace emulator {
bool is_device(const void* p) {
  if (p == nullptr) return false;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  const auto* c = static_cast<const char*>(p);
  if (auto m = mappables().upper_bound(const_cast<char*>(c));
      m != mappables().begin() && c < std::prev(m)->first + std::prev(m)->second.bytes)
    return true;
  auto it = s.sizes.upper_bound(const_cast<void*>(p));  // the first block above p
  if (it == s.sizes.begin()) return false;
  --it;
  return c < static_cast<const char*>(it->first) + it->second;
}
void run_device_work_at_once(bool at_once) { emu::run_device_work_at_once(at_once); }
}  // namespace emulator

// Events over the streams' queues (cuda_runtime.h's device_op): an event marks how many ops
// its stream had queued when it was recorded, and has passed once they have run; a stream's
// wait for it holds that stream's later work until then. A query of an event that has not
// passed answers no and runs the work up to it, so the next query answers yes: the code that
// polls meets "not yet" at least once, as on a GPU.
namespace {
emu::Mark& event_mark(void* event) { return *static_cast<emu::Mark*>(event); }
class EmulatedStreamOps final : public StreamOps {
 public:
  void* create_event() override { return new emu::Mark{}; }
  void destroy_event(void* event) noexcept override { delete static_cast<emu::Mark*>(event); }
  void record(void* event, void* stream) override { event_mark(event) = emu::device_work_mark(stream); }
  void wait(void* stream, void* event) override { emu::device_wait(stream, event_mark(event)); }
  bool query(void* event) override {
    if (emu::device_work_done(event_mark(event))) return true;
    emu::drain_device_work(event_mark(event));
    return false;
  }
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

// As device.cu's: cudaMemcpyAsync from pageable memory reads the source before it returns
// and writes the device in stream order; to the host it waits for the stream; the copies on
// the device and the memsets are stream work.
void copy_to_device(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  const bool skip = emu::account_count_only() && bytes > emu::kCountOnlyCopyLimit;
  emu::account_copy("copy host to device", bytes, !skip);
  if (skip) return detail::timed("copy host to device");
  auto data = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                  static_cast<const char*>(src) + bytes);
  emu::device_op([dst, data] {
    const emu::DeviceWork work;
    std::memcpy(dst, data->data(), data->size());
  });
  detail::timed("copy host to device");
}
void copy_to_host(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  emu::account_copy("copy device to host", bytes, true);
  emu::drain_device_work(stream());
  {
    const emu::DeviceWork work;
    std::memcpy(dst, src, bytes);
  }
  detail::timed("copy device to host");
  host_wait();
}
void copy_device(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  const bool skip = emu::account_count_only() && bytes > emu::kCountOnlyCopyLimit;
  emu::account_copy("copy on the device", bytes, !skip);
  if (skip) return detail::timed("copy on the device");
  emu::device_op([dst, src, bytes] {
    const emu::DeviceWork work;
    std::memmove(dst, src, bytes);
  });
  detail::timed("copy on the device");
}
void memset_zero(void* dst, std::size_t bytes) {
  if (bytes == 0) return;
  const bool skip = emu::account_count_only() && bytes > emu::kCountOnlyCopyLimit;
  emu::account_copy("memset", bytes, !skip);
  if (skip) return detail::timed("memset");
  emu::device_op([dst, bytes] {
    const emu::DeviceWork work;
    std::memset(dst, 0, bytes);
  });
  detail::timed("memset");
}

// Pinned memory is host memory; the copy stream has its own queue (device_op).
namespace {
int copy_stream_token = 0;
}  // namespace
void* alloc_pinned(std::size_t bytes) { return std::malloc(std::max<std::size_t>(bytes, 1)); }
void free_pinned(void* p) noexcept {
  emu::drain_all_device_work();  // cudaFreeHost waits for the device
  std::free(p);
}
void* copy_stream() { return &copy_stream_token; }
// Stream work: the source is read when the copy runs (pinned memory written after the call
// and before the copy ran is what the copy moves, as on a GPU).
void copy_async(void* dst, const void* src, std::size_t bytes, void* stream) {
  if (bytes == 0) return;
  const bool device_dst = emulator::is_device(dst), device_src = emulator::is_device(src);
  const char* what = device_dst && device_src ? "copy on the device"
                     : device_dst             ? "copy host to device"
                                              : "copy device to host";
  const bool skip = emu::account_count_only() && bytes > emu::kCountOnlyCopyLimit;
  emu::account_copy(what, bytes, !skip);
  if (skip) return;
  emu::device_op(
      [dst, src, bytes] {
        const emu::DeviceWork work;
        std::memmove(dst, src, bytes);
      },
      stream);
}
void wait_event(void* event) {
  emu::drain_device_work(event_mark(event));
  host_wait();
}

// Kernel times: every launch has ended when it returns, so the host's clock from one mark to
// the next is the operation's time (with the host's own work between the two, which a GPU
// would overlap). The calls that wait on a GPU are counted as host waits of no time.
namespace {
struct Timing {
  std::atomic<bool> on{false};
  std::mutex mutex;
  std::chrono::steady_clock::time_point last;
  detail::KernelTimeTable table;
};
Timing& timing_state() {
  static Timing t;
  return t;
}

void host_wait() {
  emu::account_host_wait();
  Timing& t = timing_state();
  if (!t.on.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(t.mutex);
  t.table.host_wait(0);
}
}  // namespace

namespace detail {
bool timing() { return timing_state().on.load(std::memory_order_relaxed); }
void timed(const char* what) {
  emu::account_name(what);  // a launch's record gets check_launch's name
  Timing& t = timing_state();
  if (!t.on.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(t.mutex);
  const auto now = std::chrono::steady_clock::now();
  t.table.add(what, std::chrono::duration<double>(now - t.last).count());
  t.last = now;
}
}  // namespace detail

void kernel_times_start() {
  Timing& t = timing_state();
  std::lock_guard<std::mutex> lock(t.mutex);
  t.table = {};
  t.last = std::chrono::steady_clock::now();
  t.on.store(true, std::memory_order_relaxed);
}

KernelTimes kernel_times_stop() {
  Timing& t = timing_state();
  std::lock_guard<std::mutex> lock(t.mutex);
  if (!t.on.load(std::memory_order_relaxed)) return {};
  t.on.store(false, std::memory_order_relaxed);
  return t.table.result();
}

}  // namespace ndmesh::cuda
