// A CPU emulator of the CUDA execution model, so that the kernels of src/**/cuda/*.cu run
// (and their tests pass or fail) on a machine without a GPU. Found before the toolkit's
// header by the emulated builds only (tests/gpu/CMakeLists.txt); never part of the library.
//
// What it does: translate.py rewrites each .cu file's launches (k<<<grid, block, smem,
// stream>>>(args) -> ::emu::launch(k, grid, block, smem, stream, args)) and its dynamic
// shared memory; this header supplies what the host compiler lacks (the qualifiers, the
// builtin variables, __syncthreads, __syncthreads_or, __shfl_xor_sync, the _rn intrinsics,
// float4). A launch is queued on its stream, as every copy, memset and product on the device
// is, and runs when the host waits for it (device_op below: a queue per stream in the order
// of the calls, run by the thread that synchronises, copies to the host, or waits for or
// queries an event; a query that finds its event not passed answers no once; a stream's
// wait for an event holds its later work). A launch runs its blocks one
// after another; a block runs its threads as fibers
// on the calling thread (emulator.cpp), each until it reaches a barrier, in a pseudo-random
// order that changes every pass, so that a missing barrier shows up as a wrong result
// more often than not. __shared__ variables are function statics (one block at a time per
// host thread: in-process ranks may launch concurrently; the scheduler state is per thread too),
// shuffles exchange through a slot per lane at a warp barrier, and a barrier that some
// threads never reach stops the program with a message (a divergent __syncthreads or
// shuffle). Device memory is host memory (tests/gpu/emulator/device.cpp).
//
// What it cannot show: speed, the GPU's float functions (expf and tanhf here are glibc's),
// races within a warp between barriers, anything of cuBLASLt (test_blas runs on a GPU
// only), and NCCL (not built here).
#pragma once

#include <setjmp.h>
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static thread_local

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(8) float2 {
  float x, y;
};

enum cudaError_t { cudaSuccess = 0 };
using cudaStream_t = struct CUstream_st*;
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
inline const char* cudaGetErrorString(cudaError_t) { return "no error"; }
inline const char* cudaGetErrorName(cudaError_t) { return "cudaSuccess"; }
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
template <typename T>
cudaError_t cudaFuncSetAttribute(T*, cudaFuncAttribute, int) {
  return cudaSuccess;
}

namespace emu {

struct Barrier {
  int expected = 0, arrived = 0;
  std::uint64_t generation = 0;
};

struct Fiber {
  jmp_buf resume;      // where it continues after a yield
  ucontext_t context;  // its first entry
  dim3 index;
  int linear = 0;
  bool started = false, done = false;
  const Barrier* waiting_on = nullptr;  // the barrier it waits at, and that barrier's generation then
  std::uint64_t waiting_generation = 0;
  int or_calls = 0;       // __syncthreads_or calls so far
  int shuffle_calls = 0;  // __shfl_xor_sync calls so far
};

struct Block {
  dim3 grid, block, index;
  std::vector<Fiber> fibers;
  Barrier all;
  std::vector<Barrier> warps;
  std::vector<std::uint64_t> lanes[2];  // shuffle slots, one per thread, alternating by call
  int or_flags[2] = {0, 0};
  std::vector<unsigned char> shared;  // dynamic shared memory
  jmp_buf scheduler;
  ucontext_t scheduler_context;
  int current = -1;
  const std::function<void()>* body = nullptr;
  std::uint64_t rng = 0x9E3779B97F4A7C15ull;
};

/// The block running now (one at a time).
Block& block();
inline Fiber& self() { return block().fibers[static_cast<std::size_t>(block().current)]; }

/// Waits until every live thread of the barrier's group has arrived.
void wait(Barrier& b);

/// The scope of device work (a kernel, a copy, a memset): while any thread is inside one,
/// device memory may be read and written. Outside, with the guard on (guard_device_memory()),
/// it is inaccessible and the host code that touches it stops with a message, as a GPU's
/// host would crash on a device pointer.
struct DeviceWork {
  DeviceWork();
  ~DeviceWork();
  DeviceWork(const DeviceWork&) = delete;
  DeviceWork& operator=(const DeviceWork&) = delete;
};
/// From now on, "device" memory comes from one arena that is inaccessible outside device
/// work (mprotect): host code that reads or writes it through a device pointer faults, and
/// the fault is reported as such. Call before the allocations to check; opt-in (the
/// in-process tests that exchange device buffers through host memcpy cannot use it).
void guard_device_memory();

/// Runs `body` as every thread of one block.
void run_block(dim3 grid, dim3 threads, dim3 index, std::size_t shared_bytes,
               const std::function<void()>& body);

/// Device work in stream order. A GPU runs a launch, an asynchronous copy or memset, and a
/// product later than the call that enqueues it; so does the emulator: `op` is queued on its
/// stream (nullptr: the compute stream), each stream's queue in the order of the calls, and
/// runs when the host waits for it (a synchronisation, a copy to the host, an event waited
/// for or queried; device.cpp); a stream's wait for an event holds its later ops until the
/// other stream's work up to the event has run. Host code that reads what it did not wait
/// for, writes a buffer a queued copy still reads, gives memory back before the work on it
/// ran, or a stream that reads what another has not yet written (no wait between them), sees
/// what it would see on a GPU. run_device_work_at_once(true) runs each op in its call instead.
void device_op(std::function<void()> op, const void* stream = nullptr);
void run_device_work_at_once(bool at_once);
/// What an event records: a stream and how many ops it had queued (seq 0: nothing to wait for).
struct Mark {
  const void* stream = nullptr;
  std::uint64_t seq = 0;
};
Mark device_work_mark(const void* stream);
bool device_work_done(Mark mark);
/// Runs a stream's ops up to the mark (and what they wait for); every op queued on `stream`
/// so far (a synchronisation of it); every stream's.
void drain_device_work(Mark mark);
void drain_device_work(const void* stream = nullptr);
void drain_all_device_work();
/// `stream`'s later work waits for the work up to `mark` (cudaStreamWaitEvent).
void device_wait(const void* stream, Mark mark);
/// The compute stream (cuda::stream()).
extern int compute_stream_token;

/// The account of device work (account.hpp; account.cpp): a record for a launch of this
/// shape, its index (-1 while the account is off); run_grid runs the launch's blocks (every
/// one, or in count-only mode a sample) and fills the record with what they accessed.
long account_launch(dim3 grid, dim3 threads, std::size_t shared_bytes);
void run_grid(dim3 grid, dim3 threads, std::size_t shared_bytes, const std::function<void()>& body, long record);

/// Runs kernel(args...) over the grid, block by block (in stream order: device_op); the
/// arguments are converted to the kernel's parameter types first, as a launch copies them.
template <typename... P, typename... A>
void launch(void (*kernel)(P...), dim3 grid, dim3 threads, std::size_t shared_bytes, cudaStream_t stream,
            A&&... args) {
  auto params = std::make_shared<std::tuple<std::decay_t<P>...>>(
      static_cast<std::decay_t<P>>(std::forward<A>(args))...);
  const long record = account_launch(grid, threads, shared_bytes);
  device_op(
      [kernel, grid, threads, shared_bytes, params, record] {
        const DeviceWork work;  // device memory is readable while the kernel runs (device.cpp's guard)
        const std::function<void()> body = [&] { std::apply(kernel, *params); };
        run_grid(grid, threads, shared_bytes, body, record);
      },
      stream);
}

/// The block's dynamic shared memory (what `extern __shared__ T name[]` names).
template <typename T>
T* dynamic_shared() {
  return reinterpret_cast<T*>(block().shared.data());
}

}  // namespace emu

#define threadIdx (::emu::self().index)
#define blockIdx (::emu::block().index)
#define blockDim (::emu::block().block)
#define gridDim (::emu::block().grid)

inline void __syncthreads() { emu::wait(emu::block().all); }

inline int __syncthreads_or(int predicate) {
  // Slot calls % 2 collects this call's votes; the other slot is cleared for the next call
  // (everyone has read it: they are past this call's first barrier).
  emu::Block& b = emu::block();
  emu::Fiber& f = emu::self();
  const int slot = f.or_calls % 2;
  emu::wait(b.all);
  if (predicate) b.or_flags[slot] = 1;
  emu::wait(b.all);
  const int result = b.or_flags[slot];
  b.or_flags[1 - slot] = 0;
  ++f.or_calls;
  return result;
}

template <typename T>
T __shfl_xor_sync(unsigned, T value, int lane_mask, int = 32) {
  // One warp barrier per exchange: the slots alternate between calls, and a lane can only
  // overwrite a slot of call k at call k + 2, after every lane has passed call k + 1 (and
  // so has read what call k wrote).
  static_assert(sizeof(T) <= sizeof(std::uint64_t));
  emu::Block& b = emu::block();
  emu::Fiber& f = emu::self();
  const int me = f.linear, warp = me / 32;
  std::vector<std::uint64_t>& slots = b.lanes[f.shuffle_calls++ % 2];
  std::memcpy(&slots[static_cast<std::size_t>(me)], &value, sizeof value);
  emu::wait(b.warps[static_cast<std::size_t>(warp)]);
  T result;
  std::memcpy(&result, &slots[static_cast<std::size_t>(warp * 32 + ((me % 32) ^ lane_mask))], sizeof result);
  return result;
}

inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline double __dsqrt_rn(double a) { return std::sqrt(a); }
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
