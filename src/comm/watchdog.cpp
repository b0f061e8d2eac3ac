// The watchdog thread and the per-thread slots it watches. Slots are written only by
// their thread (plain atomic stores, the generation last, with release order) and read
// by the watchdog (generation first with acquire order, then the fields, then the
// generation again: a changed generation means the operation finished meanwhile).
// Slots live for the whole process: a thread's slot is reused by nobody else, and the
// few bytes of threads that exit are not reclaimed. On an in-process job the watchdog
// interrupts the job instead of aborting the process (the blocked thread then throws),
// once per armed operation.
#include "comm/watchdog.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "ndmesh/core/log.hpp"
#include "ndmesh/launch/notify.hpp"

namespace ndmesh::comm::detail {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kTick = std::chrono::milliseconds(10);
constexpr std::size_t kNameBytes = 48;

struct Slot {
  std::atomic<std::uint64_t> gen{0};  // odd while an operation is armed
  std::atomic<const char*> op{nullptr};
  std::atomic<CommImpl*> comm{nullptr};
  std::array<std::atomic<char>, kNameBytes> group{};
  std::atomic<double> timeout_s{0};
  std::atomic<int> peer{-1};
  // The watchdog's own notes.
  std::uint64_t seen_gen = 0;
  std::uint64_t fired_gen = 0;  // the operation already interrupted
  Clock::time_point seen_since{};
};

struct Registry {
  std::mutex mutex;
  std::vector<Slot*> slots;
};

Registry& registry() {
  static auto* r = new Registry;  // never destroyed: the watchdog may run during exit
  return *r;
}

// The nodes the members of `comm` sit on, in member order; empty when the backend does
// not know a member's node.
std::vector<std::string_view> member_nodes(const CommImpl& comm) {
  std::vector<std::string_view> nodes;
  for (std::int64_t r : comm.members()) {
    std::string_view h = comm.host_of(r);
    if (h.empty()) return {};
    if (std::find(nodes.begin(), nodes.end(), h) == nodes.end()) nodes.push_back(h);
  }
  return nodes;
}

[[noreturn]] void abort_for_timeout(const std::string& message, CommImpl& comm) {
  log::error("[comm] {}", message);
  std::fflush(stderr);
  // Under ndmesh launch the supervisor prints the line again (mpirun drops the ranks' output
  // when it kills them) and ends the job.
  notify_launcher_of(comm, "comm", message);
  comm.abort_job(kTimeoutExitCode);
  std::abort();  // not reached: abort_job ends the process
}

struct Polls {
  std::mutex mutex;
  std::vector<std::function<void()>> polls;
};

Polls& polls() {
  static auto* p = new Polls;  // never destroyed: the watchdog may run during exit
  return *p;
}

void watch_loop() {
  Registry& reg = registry();
  for (;;) {
    std::this_thread::sleep_for(kTick);
    {
      std::lock_guard<std::mutex> lock(polls().mutex);
      for (const auto& poll : polls().polls) poll();
    }
    auto now = Clock::now();
    std::lock_guard<std::mutex> lock(reg.mutex);
    for (Slot* s : reg.slots) {
      std::uint64_t g = s->gen.load(std::memory_order_acquire);
      if ((g & 1u) == 0) continue;
      if (g == s->fired_gen) continue;
      if (g != s->seen_gen) {
        s->seen_gen = g;
        s->seen_since = now;
        continue;
      }
      double timeout = s->timeout_s.load(std::memory_order_relaxed);
      if (std::chrono::duration<double>(now - s->seen_since).count() < timeout) continue;
      const char* op = s->op.load(std::memory_order_relaxed);
      CommImpl* comm = s->comm.load(std::memory_order_relaxed);
      std::string group;
      for (const auto& c : s->group) {
        char ch = c.load(std::memory_order_relaxed);
        if (ch == '\0') break;
        group.push_back(ch);
      }
      int peer = s->peer.load(std::memory_order_relaxed);
      if (s->gen.load(std::memory_order_acquire) != g) continue;  // finished meanwhile
      const std::string message = timeout_message(op, peer_detail(op, *comm, peer), group, *comm, timeout);
      if (comm->interrupt("comm", message, true)) {
        s->fired_gen = g;  // the blocked thread throws; nothing else to do here
        continue;
      }
      abort_for_timeout(message, *comm);
    }
  }
}

void start_watchdog() {
  static std::once_flag started;
  std::call_once(started, [] { std::thread(watch_loop).detach(); });
}

Slot& my_slot() {
  thread_local Slot* slot = [] {
    start_watchdog();
    auto* s = new Slot;
    std::lock_guard<std::mutex> lock(registry().mutex);
    registry().slots.push_back(s);
    return s;
  }();
  return *slot;
}

}  // namespace

void add_watchdog_poll(std::function<void()> poll) {
  {
    std::lock_guard<std::mutex> lock(polls().mutex);
    polls().polls.push_back(std::move(poll));
  }
  start_watchdog();
}

WatchScope::WatchScope(const char* op, const CommImpl& comm, const std::string& group, double timeout_s,
                       int peer)
    : slot_(&my_slot()) {
  Slot& s = *static_cast<Slot*>(slot_);
  s.op.store(op, std::memory_order_relaxed);
  s.comm.store(const_cast<CommImpl*>(&comm), std::memory_order_relaxed);
  std::size_t n = std::min(group.size(), kNameBytes - 1);
  for (std::size_t i = 0; i < n; ++i) s.group[i].store(group[i], std::memory_order_relaxed);
  s.group[n].store('\0', std::memory_order_relaxed);
  s.timeout_s.store(timeout_s, std::memory_order_relaxed);
  s.peer.store(peer, std::memory_order_relaxed);
  s.gen.store(s.gen.load(std::memory_order_relaxed) + 1, std::memory_order_release);
}

WatchScope::~WatchScope() {
  Slot& s = *static_cast<Slot*>(slot_);
  s.gen.store(s.gen.load(std::memory_order_relaxed) + 1, std::memory_order_release);
}

void notify_launcher_of(const CommImpl& comm, std::string_view component, std::string_view message) {
  notify_launcher(
      fmt::format("[rank {}] [{}] {}", comm.members()[static_cast<std::size_t>(comm.rank())], component, message));
}

std::string members_string(const std::vector<std::int64_t>& m) {
  if (m.size() <= 16) return fmt::format("ranks {}", fmt::join(m, ","));
  return fmt::format("ranks {},{},{},...,{} ({} ranks)", m[0], m[1], m[2], m.back(), m.size());
}

std::string timeout_message(std::string_view op, std::string_view detail, std::string_view group,
                            const CommImpl& comm, double timeout_s) {
  std::string spans;
  const std::vector<std::string_view> nodes = member_nodes(comm);
  if (nodes.size() > 1)
    spans = nodes.size() <= 8 ? fmt::format("{}nodes {}", kSpansNodes, fmt::join(nodes, ","))
                              : fmt::format("{}{} nodes ({},{},...,{})", kSpansNodes, nodes.size(), nodes[0],
                                            nodes[1], nodes.back());
  return fmt::format("{}{} on group {} ({}) timed out after {:g} s{}", op, detail, group,
                     members_string(comm.members()), timeout_s, spans);
}

std::string peer_detail(std::string_view op, const CommImpl& comm, int peer) {
  if (peer < 0 || peer >= comm.size()) return "";
  std::string_view dir = op == "send" ? "to" : "from";
  const std::int64_t world = comm.members()[static_cast<std::size_t>(peer)];
  // Across nodes the peer's node says where to look.
  if (member_nodes(comm).size() > 1)
    return fmt::format(" {} rank {} (world {}, node {})", dir, peer, world, comm.host_of(world));
  return fmt::format(" {} rank {} (world {})", dir, peer, world);
}

void expire(std::string_view op, std::string_view detail, std::string_view group, CommImpl& comm,
            double timeout_s) {
  const std::string message = timeout_message(op, detail, group, comm, timeout_s);
  if (comm.interrupt("comm", message, true)) throw TimeoutError("comm", message);
  abort_for_timeout(message, comm);
}

}  // namespace ndmesh::comm::detail
