// The account of device work (account.hpp): the records, the sampled runs of a launch's blocks,
// the access hooks of the instrumented kernels and the unbacked device arena.
//
// The hooks: the account's copy of the translated .cu files is compiled with -fsanitize=thread
// (tests/gpu/CMakeLists.txt: ndmesh_cuda_emulated_account),
// which makes GCC call __tsan_readN / __tsan_writeN (N = 1, 2, 4, 8, 16) before every load and
// store, __tsan_read_range / __tsan_write_range for block copies, and a few more entry points
// (atomics of the host code in those files, vtable updates, the module's init). ThreadSanitizer's
// run-time is not linked: they are defined here. Outside an accounted block they return at once
// (one thread-local load); atomics do what they stand for. (The uninstrumented copy the kernel
// tests link never calls them: its launches are recorded without their bytes.)
#include "account.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>

#include "cuda_runtime.h"
#include "ndmesh/core/error.hpp"

namespace emu {
namespace {

using ndmesh::cuda::emulator::Account;
using ndmesh::cuda::emulator::AccountMode;
using ndmesh::cuda::emulator::AllocationRecord;
using ndmesh::cuda::emulator::CopyRecord;
using ndmesh::cuda::emulator::CudnnRecord;
using ndmesh::cuda::emulator::kWidths;
using ndmesh::cuda::emulator::LaunchRecord;
using ndmesh::cuda::emulator::ProductRecord;

constexpr int kSamples = 5;  // blocks run per launch in count-only mode

// The distinct bytes of one 32-byte sector a launch read and wrote, and which sampled blocks
// touched it.
struct Sector {
  std::uint32_t read = 0, written = 0;
  std::uint8_t blocks = 0;
};

// The accesses of the launch running on this thread.
struct Tracker {
  std::uintptr_t lo = 0, hi = 0;  // device memory: the arena
  std::unordered_map<std::uintptr_t, Sector> sectors;
  std::array<double, kWidths> widths{};
  std::uint8_t block_bit = 1;
  void touch(std::uintptr_t a, std::size_t bytes, bool write) {
    if (a < lo || a >= hi) return;
    const int w = bytes >= 16 ? 4 : std::bit_width(bytes) - 1;
    widths[static_cast<std::size_t>(w)] += static_cast<double>(bytes);
    while (bytes > 0) {
      const std::uintptr_t s = a >> 5;
      const std::size_t first = a & 31, n = std::min<std::size_t>(bytes, 32 - first);
      const std::uint32_t mask = (n == 32 ? ~0u : ((1u << n) - 1)) << first;
      Sector& sec = sectors[s];
      (write ? sec.written : sec.read) |= mask;
      sec.blocks |= block_bit;
      a += n, bytes -= n;
    }
  }
};
thread_local Tracker* tracker = nullptr;

struct State {
  std::mutex mutex;
  AccountMode mode = AccountMode::kOff;
  Account account;
  std::string last_op;  // the last device operation recorded (what an allocation follows)
  // The caching allocator's free blocks per size class (device.cu's policy), for allocations.
  std::map<std::size_t, std::int64_t> cached;
  // The arena: device memory while the account is on (its pages backed only when touched).
  char* arena = nullptr;
  std::size_t capacity = 0, top = 0;
  std::multimap<std::size_t, char*> free_blocks;
};
State& state() {  // never destroyed: a deferred free may run at exit
  static auto* s = new State;
  return *s;
}
// Read without the lock on every launch (set once, before any device work).
std::atomic<AccountMode> mode_now{AccountMode::kOff};
thread_local long pending_name = -1;  // this thread's last launch record not yet named

std::size_t size_class(std::size_t bytes) {
  constexpr std::size_t kSmall = 512, kLarge = std::size_t{2} << 20, kSplit = std::size_t{1} << 20;
  const std::size_t unit = bytes < kSplit ? kSmall : kLarge;
  return (bytes + unit - 1) / unit * unit;
}

void remember(State& s, Account::Kind kind, std::size_t index, const std::string& name) {
  s.account.order.push_back({kind, index});
  s.last_op = name;
}

}  // namespace

bool account_on() { return mode_now.load(std::memory_order_relaxed) != AccountMode::kOff; }
bool account_count_only() { return mode_now.load(std::memory_order_relaxed) == AccountMode::kCountOnly; }

long account_launch(dim3 grid, dim3 threads, std::size_t shared_bytes) {
  if (!account_on()) return -1;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  LaunchRecord r;
  r.grid = {grid.x, grid.y, grid.z};
  r.block = {threads.x, threads.y, threads.z};
  r.shared_bytes = shared_bytes;
  s.account.launches.push_back(std::move(r));
  const std::size_t index = s.account.launches.size() - 1;
  remember(s, Account::Kind::kLaunch, index, "(a launch)");
  pending_name = static_cast<long>(index);
  return static_cast<long>(index);
}

void account_name(const char* name) {
  if (!account_on() || pending_name < 0) return;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  // The records of an earlier take() are gone: only a record of this take is named.
  if (static_cast<std::size_t>(pending_name) < s.account.launches.size()) {
    s.account.launches[static_cast<std::size_t>(pending_name)].name = name;
    s.last_op = name;
  }
  pending_name = -1;
}

void run_grid(dim3 grid, dim3 threads, std::size_t shared_bytes, const std::function<void()>& body, long record) {
  const std::int64_t total = std::int64_t{grid.x} * grid.y * grid.z;
  auto run = [&](std::int64_t b) {
    const auto i = static_cast<std::uint64_t>(b);
    run_block(grid, threads,
              dim3(static_cast<unsigned>(i % grid.x), static_cast<unsigned>(i / grid.x % grid.y),
                   static_cast<unsigned>(i / (std::uint64_t{grid.x} * grid.y))),
              shared_bytes, body);
  };
  if (record < 0) {
    for (std::int64_t b = 0; b < total; ++b) run(b);
    return;
  }
  State& s = state();
  Tracker t;
  t.lo = reinterpret_cast<std::uintptr_t>(s.arena);
  t.hi = t.lo + s.capacity;
  const bool sample = account_count_only() && total > kSamples;
  std::vector<std::int64_t> blocks;
  // Evenly spread, the middle of each fifth: a grid's last block is often a partial tail.
  if (sample)
    for (int i = 0; i < kSamples; ++i) blocks.push_back((2 * i + 1) * total / (2 * kSamples));
  tracker = &t;
  if (sample) {
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      t.block_bit = static_cast<std::uint8_t>(1u << i);
      run(blocks[i]);
    }
  } else {
    for (std::int64_t b = 0; b < total; ++b) run(b);
  }
  tracker = nullptr;
  // A sector of one sampled block is that block's own (each block has as many); one of several
  // is shared (counted once).
  std::int64_t own_read = 0, own_written = 0, shared_read = 0, shared_written = 0;
  for (const auto& [key, sec] : t.sectors) {
    const bool own = sample && std::popcount(sec.blocks) == 1;
    (own ? own_read : shared_read) += std::popcount(sec.read);
    (own ? own_written : shared_written) += std::popcount(sec.written);
  }
  const auto extrapolated = [&](std::int64_t own, std::int64_t shared) {
    return static_cast<double>(shared) + static_cast<double>(own) * static_cast<double>(total) / kSamples;
  };
  const double read = extrapolated(own_read, shared_read), written = extrapolated(own_written, shared_written);
  std::lock_guard<std::mutex> lock(s.mutex);
  if (static_cast<std::size_t>(record) >= s.account.launches.size()) return;  // taken meanwhile
  LaunchRecord& r = s.account.launches[static_cast<std::size_t>(record)];
  r.bytes_read = read;
  r.bytes_written = written;
  for (int w = 0; w < kWidths; ++w)
    r.access_bytes[static_cast<std::size_t>(w)] = t.widths[static_cast<std::size_t>(w)] * static_cast<double>(total) /
                                                  (sample ? kSamples : static_cast<double>(total));
  r.sampled_blocks = static_cast<int>(sample ? kSamples : total);
}

void account_product(ProductRecord r) {
  if (!account_on()) return;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  const std::string name = r.name;
  s.account.products.push_back(std::move(r));
  remember(s, Account::Kind::kProduct, s.account.products.size() - 1, name);
}

void account_cudnn(CudnnRecord r) {
  if (!account_on()) return;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  const std::string name = r.name;
  s.account.cudnn.push_back(std::move(r));
  remember(s, Account::Kind::kCudnn, s.account.cudnn.size() - 1, name);
}

void account_copy(const char* name, std::size_t bytes, bool ran) {
  if (!account_on()) return;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.account.copies.push_back({name, bytes, ran});
  remember(s, Account::Kind::kCopy, s.account.copies.size() - 1, name);
}

void account_host_wait() {
  if (!account_on()) return;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  ++s.account.host_waits;
}

void* account_alloc(std::size_t bytes) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  // What device.cu's caching allocator does: a cached block of the class, else the driver.
  const std::size_t cls = size_class(bytes);
  if (std::int64_t& free = s.cached[cls]; free > 0)
    --free;
  else
    s.account.allocations.push_back({cls, s.last_op});
  const std::size_t size = std::max<std::size_t>((bytes + 255) / 256 * 256, 256);
  char* p = nullptr;
  if (auto it = s.free_blocks.find(size); it != s.free_blocks.end()) {
    p = it->second;
    s.free_blocks.erase(it);
  } else {
    if (s.top + size > s.capacity) {
      std::fputs("emulator: the account's device arena is full\n", stderr);
      std::abort();
    }
    p = s.arena + s.top;
    s.top += size;
  }
  if (s.mode == AccountMode::kArithmetic) std::memset(p, 0xA5, size);  // new device memory holds garbage
  return p;
}

void account_cache_free(std::size_t bytes) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  ++s.cached[size_class(bytes)];
}

bool account_arena_free(void* p, std::size_t bytes) {
  State& s = state();
  char* c = static_cast<char*>(p);
  if (s.arena == nullptr || c < s.arena || c >= s.arena + s.capacity) return false;
  std::lock_guard<std::mutex> lock(s.mutex);
  const std::size_t size = std::max<std::size_t>((bytes + 255) / 256 * 256, 256);
  // Count-only: give the pages back (a sampled kernel or a small copy may have backed them).
  if (s.mode == AccountMode::kCountOnly && size >= (std::size_t{1} << 20)) madvise(c, size, MADV_DONTNEED);
  s.free_blocks.emplace(size, c);
  return true;
}

}  // namespace emu

namespace ndmesh::cuda::emulator {

double LaunchRecord::narrow_share() const {
  double all = 0, narrow = 0;
  for (int w = 0; w < kWidths; ++w) {
    all += access_bytes[static_cast<std::size_t>(w)];
    if (w < kWidths - 1) narrow += access_bytes[static_cast<std::size_t>(w)];
  }
  return all > 0 ? narrow / all : 0.0;
}

double ProductRecord::bytes() const {
  const auto d = [](std::int64_t v) { return static_cast<double>(v); };
  double b = d(m) * d(k) * ab_bytes + d(k) * d(n) * ab_bytes + d(m) * d(n) * c_bytes * (beta_reads_c ? 2 : 1);
  if (epilogue.find("gelu") != std::string::npos) b += d(m) * d(n) * c_bytes;  // the aux
  if (epilogue == "bias grad") b += d(m) * c_bytes;                            // the bias gradient of op(A)
  else if (epilogue != "" && epilogue != "dgelu") b += d(n) * c_bytes;         // the bias or its gradient
  return b;
}

std::string ProductRecord::misalignment() const {
  std::string out;
  auto add = [&](const std::string& what) { out += (out.empty() ? "" : ", ") + what; };
  // Each operand's row stride, else the length of its rows (row-major: A is [m, k], [k, m]
  // transposed; B [k, n], [n, k] transposed; C [m, n]).
  struct Rows {
    const char *ld, *name;
    std::int64_t stride, length;
  };
  const Rows rows[] = {{"lda", "A", lda * ab_bytes, (trans_a ? m : k) * ab_bytes},
                       {"ldb", "B", ldb * ab_bytes, (trans_b ? k : n) * ab_bytes},
                       {"ldc", "C", ldc * c_bytes, n * c_bytes}};
  for (const Rows& r : rows) {
    if (r.stride % 16 != 0)
      add(std::string(r.ld) + " " + std::to_string(r.stride) + " B");
    else if (r.length % 16 != 0)
      add(std::string(r.name) + " rows of " + std::to_string(r.length) + " B");
  }
  const std::pair<const char*, unsigned> ptrs[] = {
      {"A", align_a}, {"B", align_b}, {"C", align_c}, {"bias", align_bias}, {"aux", align_aux}};
  for (const auto& [what, align] : ptrs)
    if (align < 16) add(std::string(what) + " aligned to " + std::to_string(align) + " B");
  return out;
}

double CudnnRecord::flops() const {
  const double f = static_cast<double>(batch) * static_cast<double>(seq) * static_cast<double>(seq) *
                   static_cast<double>(heads) * static_cast<double>(head_dim);
  return (backward ? 5.0 : 2.0) * f;
}

double CudnnRecord::bytes() const {
  const double rows = static_cast<double>(batch) * static_cast<double>(seq);
  const double q = rows * static_cast<double>(heads * head_dim), kv = rows * static_cast<double>(kv_heads * head_dim);
  const double stats = rows * static_cast<double>(heads) * 4;
  const double tensors = backward ? 2 * (q + 2 * kv) + 2 * q : q + 2 * kv + q;  // (q k v, dq dk dv, o, do) : (q k v, o)
  return tensors * element_bytes + stats;
}

void account_start(AccountMode mode) {
  emu::State& s = emu::state();
  emu::drain_all_device_work();  // what was queued runs in the mode it was queued in
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.arena == nullptr && mode != AccountMode::kOff) {
    // Address space only: count-only touches a few pages of it; the arithmetic mode backs what
    // it uses.
    s.capacity = std::size_t{256} << 30;
    void* p = mmap(nullptr, s.capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) fail<Error>("cuda emulator", "cannot reserve {} GiB of address space for the account", 256);
    s.arena = static_cast<char*>(p);
  }
  s.mode = mode;
  emu::mode_now.store(mode);
}

AccountMode account_mode() { return emu::mode_now.load(); }

Account account_take() {
  emu::drain_all_device_work();
  emu::State& s = emu::state();
  std::lock_guard<std::mutex> lock(s.mutex);
  Account out = std::move(s.account);
  s.account = Account{};
  return out;
}

}  // namespace ndmesh::cuda::emulator

// ThreadSanitizer's entry points, for the instrumented kernels (see the top of this file).
extern "C" {
#define NDMESH_ACCESS(N)                                                                             \
  void __tsan_read##N(void* p) {                                                                    \
    if (emu::Tracker* t = emu::tracker) t->touch(reinterpret_cast<std::uintptr_t>(p), N, false);    \
  }                                                                                                 \
  void __tsan_write##N(void* p) {                                                                   \
    if (emu::Tracker* t = emu::tracker) t->touch(reinterpret_cast<std::uintptr_t>(p), N, true);     \
  }                                                                                                 \
  void __tsan_unaligned_read##N(void* p) { __tsan_read##N(p); }                                     \
  void __tsan_unaligned_write##N(void* p) { __tsan_write##N(p); }
NDMESH_ACCESS(1)
NDMESH_ACCESS(2)
NDMESH_ACCESS(4)
NDMESH_ACCESS(8)
NDMESH_ACCESS(16)
#undef NDMESH_ACCESS
void __tsan_read_range(void* p, unsigned long bytes) {
  if (emu::Tracker* t = emu::tracker) t->touch(reinterpret_cast<std::uintptr_t>(p), bytes, false);
}
void __tsan_write_range(void* p, unsigned long bytes) {
  if (emu::Tracker* t = emu::tracker) t->touch(reinterpret_cast<std::uintptr_t>(p), bytes, true);
}
void __tsan_init() {}
void __tsan_func_entry(void*) {}
void __tsan_func_exit() {}
void __tsan_vptr_update(void**, void*) {}
void __tsan_vptr_read(void**) {}
// Atomics of the host code in the translated files (shared_ptr's counts): done, sequentially
// consistent whatever order was asked for (never weaker than asked).
#define NDMESH_ATOMIC(N, T)                                                                              \
  T __tsan_atomic##N##_load(const volatile T* a, int) { return __atomic_load_n(a, __ATOMIC_SEQ_CST); } \
  void __tsan_atomic##N##_store(volatile T* a, T v, int) { __atomic_store_n(a, v, __ATOMIC_SEQ_CST); } \
  T __tsan_atomic##N##_exchange(volatile T* a, T v, int) { return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST); } \
  T __tsan_atomic##N##_fetch_add(volatile T* a, T v, int) { return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST); } \
  T __tsan_atomic##N##_fetch_sub(volatile T* a, T v, int) { return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST); } \
  T __tsan_atomic##N##_fetch_and(volatile T* a, T v, int) { return __atomic_fetch_and(a, v, __ATOMIC_SEQ_CST); } \
  T __tsan_atomic##N##_fetch_or(volatile T* a, T v, int) { return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST); }   \
  T __tsan_atomic##N##_fetch_xor(volatile T* a, T v, int) { return __atomic_fetch_xor(a, v, __ATOMIC_SEQ_CST); } \
  int __tsan_atomic##N##_compare_exchange_strong(volatile T* a, T* c, T v, int, int) {                  \
    return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);              \
  }                                                                                                      \
  int __tsan_atomic##N##_compare_exchange_weak(volatile T* a, T* c, T v, int, int) {                    \
    return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);              \
  }                                                                                                      \
  T __tsan_atomic##N##_compare_exchange_val(volatile T* a, T c, T v, int, int) {                        \
    __atomic_compare_exchange_n(a, &c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                    \
    return c;                                                                                            \
  }
NDMESH_ATOMIC(8, unsigned char)
NDMESH_ATOMIC(16, unsigned short)
NDMESH_ATOMIC(32, int)
NDMESH_ATOMIC(64, long)
#undef NDMESH_ATOMIC
void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
void __tsan_atomic_signal_fence(int) { __atomic_signal_fence(__ATOMIC_SEQ_CST); }
}
