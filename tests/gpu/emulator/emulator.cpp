// The scheduler of the CUDA emulator (cuda_runtime.h): a block's threads are fibers on the
// calling thread. A fiber is entered once through its ucontext and from then on switched
// with _setjmp/_longjmp (no system call per switch, unlike swapcontext, which sets the
// signal mask each time: a hundred times slower here). Built without _FORTIFY_SOURCE,
// whose longjmp check rejects jumps between stacks.
#include <setjmp.h>
#include <ucontext.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "cuda_runtime.h"

namespace emu {

namespace {

// Per host thread: in-process ranks (threads) may run kernels at the same time.
thread_local Block* running = nullptr;
constexpr std::size_t kStackBytes = 256 * 1024;

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "[cuda emulator] %s (block %u,%u,%u)\n", what, running->index.x, running->index.y,
               running->index.z);
  std::abort();
}

// Fiber stacks, reused by every block (not zeroed: a fresh 256 KiB per thread and block
// was most of the emulator's time, in page faults).
unsigned char* stack(std::size_t t) {
  thread_local std::vector<std::unique_ptr<unsigned char[]>> pool;
  while (pool.size() <= t) pool.emplace_back(new unsigned char[kStackBytes]);
  return pool[t].get();
}

// Back to the scheduler; returns when the scheduler resumes this fiber. The jumps stay in
// these two small functions, whose locals do not change between _setjmp and _longjmp.
__attribute__((noinline)) void yield(Fiber& f) {
  if (_setjmp(f.resume) == 0) _longjmp(running->scheduler, 1);
}

// A thread that returned from the kernel leaves its barriers' groups.
void drop(Barrier& b) {
  --b.expected;
  if (b.arrived > 0 && b.arrived == b.expected) {
    b.arrived = 0;
    ++b.generation;
  }
}

void fiber_main() {
  Block& b = *running;
  Fiber& f = self();
  (*b.body)();
  f.done = true;
  drop(b.all);
  drop(b.warps[static_cast<std::size_t>(f.linear / 32)]);
  _longjmp(b.scheduler, 1);  // never returns: the next block reuses its stack
}

// The first entry of fiber f: fiber_main on `stack` (getcontext "returns twice" for the
// compiler, like _setjmp: kept apart in its own function).
__attribute__((noinline)) void prepare(Fiber& f, unsigned char* stack) {
  getcontext(&f.context);
  f.context.uc_stack.ss_sp = stack;
  f.context.uc_stack.ss_size = kStackBytes;
  f.context.uc_link = nullptr;
  makecontext(&f.context, fiber_main, 0);
}

// Runs fiber f until it yields or finishes.
__attribute__((noinline)) void resume(Block& b, Fiber& f) {
  if (_setjmp(b.scheduler) != 0) return;
  if (f.started) _longjmp(f.resume, 1);
  f.started = true;
  swapcontext(&b.scheduler_context, &f.context);
}

}  // namespace

Block& block() { return *running; }

void wait(Barrier& b) {
  const std::uint64_t generation = b.generation;
  if (++b.arrived == b.expected) {
    b.arrived = 0;
    ++b.generation;
    return;
  }
  Fiber& f = self();
  f.waiting_on = &b;
  f.waiting_generation = generation;
  while (b.generation == generation) yield(f);
  f.waiting_on = nullptr;
}

void run_block(dim3 grid, dim3 threads, dim3 index, std::size_t shared_bytes,
               const std::function<void()>& body) {
  Block b;
  b.grid = grid, b.block = threads, b.index = index, b.body = &body;
  const int n = static_cast<int>(threads.x * threads.y * threads.z);
  b.fibers.resize(static_cast<std::size_t>(n));
  b.lanes[0].resize(static_cast<std::size_t>(n));
  b.lanes[1].resize(static_cast<std::size_t>(n));
  b.shared.assign(shared_bytes + 16, 0xA5);  // not zero: shared memory starts as garbage
  b.all.expected = n;
  b.warps.resize(static_cast<std::size_t>((n + 31) / 32));
  for (std::size_t w = 0; w < b.warps.size(); ++w)
    b.warps[w].expected = std::min(32, n - static_cast<int>(w) * 32);
  running = &b;
  for (int t = 0; t < n; ++t) {
    Fiber& f = b.fibers[static_cast<std::size_t>(t)];
    f.linear = t;
    f.index = dim3(static_cast<unsigned>(t) % threads.x, static_cast<unsigned>(t) / threads.x % threads.y,
                   static_cast<unsigned>(t) / (threads.x * threads.y));
    prepare(f, stack(static_cast<std::size_t>(t)));
  }
  std::vector<int> order(static_cast<std::size_t>(n));
  for (int t = 0; t < n; ++t) order[static_cast<std::size_t>(t)] = t;
  for (int live = n; live > 0;) {
    // A fresh order every pass (xorshift Fisher-Yates): no thread always runs first.
    for (int i = n - 1; i > 0; --i) {
      b.rng ^= b.rng << 13, b.rng ^= b.rng >> 7, b.rng ^= b.rng << 17;
      std::swap(order[static_cast<std::size_t>(i)], order[static_cast<std::size_t>(b.rng % (i + 1))]);
    }
    bool progress = false;
    for (int t : order) {
      Fiber& f = b.fibers[static_cast<std::size_t>(t)];
      if (f.done || (f.waiting_on && f.waiting_on->generation == f.waiting_generation)) continue;
      progress = true;
      b.current = t;
      resume(b, f);
      if (f.done) --live;
    }
    if (!progress && live > 0) die("deadlock: a barrier or shuffle that some threads never reach");
  }
  running = nullptr;
}

}  // namespace emu
