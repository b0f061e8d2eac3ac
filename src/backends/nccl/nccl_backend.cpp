// The NCCL device communicator (nccl_backend.hpp).
//
// Each communicator has its NCCL communicator (non-blocking: config.blocking = 0, so that
// the watchdog can abort it) and a communication stream, both made when the communicator is
// (wrap; a one-rank group on its first device operation): rank 0 takes a unique id and shares
// it over the job's store ("nccl/<members>/<n>/id", n its number among the communicators of
// those members) or, under MPI, by a broadcast over the bootstrap group.
// Every device operation is stream-ordered (comm/stream_order.hpp): the communication
// stream waits for an event of the compute stream, NCCL runs there, and the Work is
// complete once the compute stream waits for the operation's end event; nothing waits on
// the host. The buffers are recorded on the communication stream for the allocator's
// cross-stream rule.
//
// NCCL has no tags, and stream-ordered send/recv pairs deadlock unless grouped: send and
// recv are batched and issued as one ncclGroupStart/End when one of their Works is tested
// or waited, before the next collective or operation on host buffers, or at once when
// blocking. Messages of one
// communicator match in issue order per peer (the tag is not sent; subsystems use their own
// duplicate, as on every backend).
//
// The watchdog polls every communicator: an asynchronous NCCL error, or an operation whose
// end event has not passed within its timeout, prints the line naming the group, aborts
// every NCCL communicator of the process (ncclCommAbort) and ends the job.
#include "backends/nccl/nccl_backend.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "backends/staged/staged_backend.hpp"
#include "comm/watchdog.hpp"
#include "ndmesh/comm/stream_order.hpp"
#include "ndmesh/core/error.hpp"
#include "ndmesh/core/log.hpp"
#include "ndmesh/launch/store.hpp"
#include "ndmesh/tensor/device.hpp"

namespace ndmesh::comm::nccl {
namespace {

using Clock = std::chrono::steady_clock;
using staging::is_device_pointer;

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kFloat64:
      return ncclFloat64;
    case DType::kInt32:
      return ncclInt32;
    case DType::kInt64:
      return ncclInt64;
    case DType::kBFloat16:
      return ncclBfloat16;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  return ncclSum;
}

// The shared state of one NCCL communicator: what its Works and the watchdog hold.
struct State {
  std::mutex mutex;  // the NCCL calls of this communicator
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  PendingOps pending{cuda::stream_ops()};
  std::shared_ptr<detail::CommImpl> cpu;  // for the timeout line and abort_job
  std::string group;                      // the name of the group of its latest operation
  bool aborted = false;
};

// Every NCCL communicator of the process, for the watchdog and for abort.
struct Registry {
  std::mutex mutex;
  std::vector<std::weak_ptr<State>> states;
};
Registry& registry() {
  static auto* r = new Registry;  // never destroyed: the watchdog may run during exit
  return *r;
}

void abort_all() {
  std::vector<std::shared_ptr<State>> live;
  {
    std::lock_guard lock(registry().mutex);
    for (auto& w : registry().states)
      if (auto s = w.lock()) live.push_back(std::move(s));
  }
  for (auto& s : live)
    if (s->comm != nullptr && !s->aborted) {
      s->aborted = true;
      ncclCommAbort(s->comm);
    }
}

[[noreturn]] void end_job(State& s, int code, const std::string& message) {
  log::error("[comm] {}", message);
  std::fflush(stderr);
  detail::notify_launcher_of(*s.cpu, "comm", message);
  abort_all();
  s.cpu->abort_job(code);
  std::abort();  // not reached: abort_job ends the process
}

// The watchdog's poll: an asynchronous error or an operation past its timeout ends the job.
void watch() {
  std::vector<std::shared_ptr<State>> live;
  {
    std::lock_guard lock(registry().mutex);
    auto& v = registry().states;
    v.erase(std::remove_if(v.begin(), v.end(), [](const std::weak_ptr<State>& w) { return w.expired(); }),
            v.end());
    for (auto& w : v)
      if (auto s = w.lock()) live.push_back(std::move(s));
  }
  const auto now = Clock::now();
  for (auto& s : live) {
    // An operation holds the lock only while it enqueues (bounded by its own timeout).
    std::unique_lock lock(s->mutex, std::try_to_lock);
    if (!lock.owns_lock() || s->comm == nullptr || s->aborted) continue;
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(s->comm, &async);
    if (async != ncclSuccess && async != ncclInProgress)
      end_job(*s, 1,
              fmt::format("NCCL failed on group {} ({}): {} ({}); a peer exited or lost its connection",
                          s->group, detail::members_string(s->cpu->members()), ncclGetErrorString(async),
                          ncclGetLastError(s->comm)));
    std::optional<PendingOps::Op> late;
    try {
      late = s->pending.expired(now);
    } catch (const std::exception& e) {
      end_job(*s, 1, fmt::format("a kernel failed before NCCL on group {}: {}", s->group, e.what()));
    }
    if (late)
      end_job(*s, kTimeoutExitCode,
              detail::timeout_message(late->op, "", late->group, *s->cpu, late->timeout_s));
  }
}

void check_nccl(ncclResult_t r, const char* what, const State& s) {
  if (r == ncclSuccess || r == ncclInProgress) return;
  fail<>("comm", "{} on NCCL group {} ({}) failed: {} ({})", what, s.group,
         detail::members_string(s.cpu->members()), ncclGetErrorString(r),
         s.comm ? ncclGetLastError(s.comm) : "no communicator yet");
}

// A non-blocking communicator's call may return before its work is enqueued: wait until
// it is (bounded by the call's timeout; past it the job ends with the group's line).
void settle(State& s, const char* op, double timeout_s) {
  const auto start = Clock::now();
  for (;;) {
    ncclResult_t r = ncclSuccess;
    ncclCommGetAsyncError(s.comm, &r);
    if (r == ncclSuccess) return;
    check_nccl(r, op, s);
    if (Clock::now() - start > std::chrono::duration<double>(timeout_s))
      end_job(s, kTimeoutExitCode, detail::timeout_message(op, "", s.group, *s.cpu, timeout_s));
    std::this_thread::yield();
  }
}

// The number of the next NCCL communicator of these members in this process. Taken when the
// communicator is made (wrap): every member makes its communicators of one member list in
// the same order (splits and duplicates are collective), so the numbers agree across ranks.
int next_id_seq(const std::string& members) {
  static std::mutex mutex;
  static std::map<std::string, int> made;  // NCCL communicators made per member list
  std::lock_guard lock(mutex);
  return made[members]++;
}

// The unique id of NCCL communicator `seq` of these members, from rank 0.
ncclUniqueId share_id(detail::CommImpl& cpu, const std::string& members, int seq) {
  ncclUniqueId id{};
  if (cpu.rank() == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) fail<>("comm", "ncclGetUniqueId failed: {}", ncclGetErrorString(r));
  }
  if (const launch::Store* store = detail::job_store()) {
    std::string bytes(reinterpret_cast<const char*>(&id), sizeof id);
    bytes = store->share(fmt::format("nccl/{}/{}/id", members, seq), cpu.rank() == 0, bytes);
    NDMESH_CHECK(bytes.size() == sizeof id, "comm", "the NCCL unique id from the store has {} bytes, not {}",
                 bytes.size(), sizeof id);
    std::memcpy(&id, bytes.data(), sizeof id);
  } else {
    // Under MPI: a broadcast over the bootstrap group (the id is 128 bytes).
    static_assert(sizeof(ncclUniqueId) % sizeof(std::int64_t) == 0);
    cpu.broadcast(ElementSpan{&id, sizeof id / sizeof(std::int64_t), DType::kInt64}, 0, true);
  }
  return id;
}

// The Work of a device operation: complete once the compute stream waits for it. Batched
// point-to-point operations are issued first (flush).
class NcclWork final : public detail::WorkImpl {
 public:
  NcclWork(std::shared_ptr<StreamOrder> order, std::function<void()> flush)
      : order_(std::move(order)), flush_(std::move(flush)) {}
  bool test() override {
    if (order_->state() == StreamOrder::State::kNew && flush_) flush_();
    order_->join();
    return true;
  }

 private:
  std::shared_ptr<StreamOrder> order_;
  std::function<void()> flush_;
};

class NcclComm final : public detail::CommImpl, public std::enable_shared_from_this<NcclComm> {
 public:
  explicit NcclComm(std::shared_ptr<detail::CommImpl> cpu) : state_(std::make_shared<State>()) {
    state_->cpu = std::move(cpu);
    members_ = state_->cpu->members();
    id_members_ = fmt::format("{}", fmt::join(members_, ","));
    id_seq_ = next_id_seq(id_members_);
    state_->group = fmt::format("of ranks {}", id_members_);  // until an operation names it
  }

  // Makes the NCCL communicator now, while every member makes this communicator (wrap).
  // NCCL's creation is collective: made on first use instead, two ranks whose first device
  // operations fall on different groups would each wait in a creation the other never
  // reaches. One rank has no peer to wait for: its communicator is made on first use.
  void start() {
    if (size() <= 1) return;
    use_device();
    State& s = *state_;
    std::lock_guard lock(s.mutex);
    ensure(s, default_timeout_s());
  }
  ~NcclComm() override {
    State& s = *state_;
    try {
      flush_batch();
    } catch (const std::exception& e) {
      log::error("{} (sends and receives never waited for on group {})", e.what(), s.group);
    }
    std::lock_guard lock(s.mutex);  // the watchdog skips it meanwhile
    if (s.comm != nullptr && !s.aborted) {
      // Finalize flushes this rank's operations; bounded, so that a gone peer cannot hold
      // the exit (then abort).
      ncclResult_t r = ncclCommFinalize(s.comm);
      const auto until = Clock::now() + std::chrono::seconds(10);
      while (r == ncclInProgress && Clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        if (ncclCommGetAsyncError(s.comm, &r) != ncclSuccess) break;
      }
      if (r == ncclSuccess) {
        ncclCommDestroy(s.comm);
      } else {
        s.aborted = true;
        ncclCommAbort(s.comm);
      }
      s.comm = nullptr;
    }
    if (s.stream != nullptr) cudaStreamDestroy(s.stream);
    s.stream = nullptr;
  }

  std::string_view backend() const override { return "nccl"; }
  int rank() const override { return cpu().rank(); }
  int size() const override { return cpu().size(); }
  std::string_view host_of(std::int64_t r) const override { return cpu().host_of(r); }
  std::size_t max_count() const override { return cpu().max_count(); }
  std::shared_ptr<detail::CommImpl> split(std::optional<std::int64_t> color, std::int64_t key) override {
    auto c = host().split(color, key);
    return c ? wrap(std::move(c)) : nullptr;
  }
  std::shared_ptr<detail::CommImpl> self() override { return wrap(cpu().self()); }
  std::shared_ptr<detail::CommImpl> split_node() override { return wrap(cpu().split_node()); }
  std::shared_ptr<detail::CommImpl> dup() override { return wrap(host().dup()); }
  std::string thread_limit() const override { return cpu().thread_limit(); }
  bool wait_for_progress(std::chrono::microseconds at_most) override {
    return cpu().wait_for_progress(at_most);
  }
  bool handles_device(const void* data) const override { return is_device_pointer(data); }

  std::unique_ptr<detail::WorkImpl> barrier(bool blocking) override { return host().barrier(blocking); }

  // One byte each way with every peer in one group (its contents unused): NCCL makes the
  // connections of both directions with each peer in one exchange, which mirrors the peer's
  // (it names this rank too), when the group is enqueued.
  std::unique_ptr<detail::WorkImpl> connect_peers(std::span<const int> peers, bool blocking) override {
    if (peers.empty()) return nullptr;
    const DeviceBuffer bytes(2 * peers.size());
    auto* b = static_cast<unsigned char*>(bytes.data());
    return collective(blocking, {b}, [&](State& s) {
      ncclResult_t r = ncclGroupStart();
      for (std::size_t i = 0; i < peers.size() && (r == ncclSuccess || r == ncclInProgress); ++i) {
        r = ncclSend(b + 2 * i, 1, ncclUint8, peers[i], s.comm, s.stream);
        if (r == ncclSuccess || r == ncclInProgress) r = ncclRecv(b + 2 * i + 1, 1, ncclUint8, peers[i], s.comm, s.stream);
      }
      const ncclResult_t end = ncclGroupEnd();
      return r == ncclSuccess || r == ncclInProgress ? end : r;
    });
  }

  std::unique_ptr<detail::WorkImpl> broadcast(ElementSpan data, int root, bool blocking) override {
    if (!is_device_pointer(data.data)) return host().broadcast(data, root, blocking);
    return collective(blocking, {data.data}, [&](State& s) {
      return ncclBroadcast(data.data, data.data, data.count, nccl_type(data.dtype), root, s.comm, s.stream);
    });
  }

  std::unique_ptr<detail::WorkImpl> all_reduce(ElementSpan data, ReduceOp op, bool blocking) override {
    if (!is_device_pointer(data.data)) return host().all_reduce(data, op, blocking);
    return collective(blocking, {data.data}, [&](State& s) {
      return ncclAllReduce(data.data, data.data, data.count, nccl_type(data.dtype), nccl_op(op), s.comm,
                           s.stream);
    });
  }

  std::unique_ptr<detail::WorkImpl> reduce_scatter(ElementSpan in, ElementSpan out, ReduceOp op,
                                                   bool blocking) override {
    if (!is_device_pointer(in.data)) return host().reduce_scatter(in, out, op, blocking);
    return collective(blocking, {in.data, out.data}, [&](State& s) {
      return ncclReduceScatter(in.data, out.data, out.count, nccl_type(in.dtype), nccl_op(op), s.comm,
                               s.stream);
    });
  }

  std::unique_ptr<detail::WorkImpl> all_gather(ElementSpan in, ElementSpan out, bool blocking) override {
    if (!is_device_pointer(out.data)) return host().all_gather(in, out, blocking);
    return collective(blocking, {in.data, out.data}, [&](State& s) {
      return ncclAllGather(in.data, out.data, in.count, nccl_type(in.dtype), s.comm, s.stream);
    });
  }

  std::unique_ptr<detail::WorkImpl> all_to_all(ElementSpan in, ElementSpan out, bool blocking) override {
    if (!is_device_pointer(in.data)) return host().all_to_all(in, out, blocking);
    const std::size_t n = in.count / static_cast<std::size_t>(size());
    const std::size_t bytes = n * dtype_size(in.dtype);
    return collective(blocking, {in.data, out.data}, [&](State& s) {
      ncclResult_t r = ncclGroupStart();
      for (int p = 0; p < size() && r == ncclSuccess; ++p) {
        r = ncclSend(static_cast<const char*>(in.data) + static_cast<std::size_t>(p) * bytes, n,
                     nccl_type(in.dtype), p, s.comm, s.stream);
        if (r == ncclSuccess || r == ncclInProgress)
          r = ncclRecv(static_cast<char*>(out.data) + static_cast<std::size_t>(p) * bytes, n,
                       nccl_type(in.dtype), p, s.comm, s.stream);
      }
      const ncclResult_t end = ncclGroupEnd();
      return r == ncclSuccess || r == ncclInProgress ? end : r;
    });
  }

  // NCCL has no all-to-all-v: one group of a send and a receive per peer (zero counts skipped).
  std::unique_ptr<detail::WorkImpl> all_to_all_v(ElementSpan in, std::span<const std::int64_t> send_counts,
                                                 ElementSpan out, std::span<const std::int64_t> recv_counts,
                                                 bool blocking) override {
    if (!is_device_pointer(in.data) && !is_device_pointer(out.data))
      return host().all_to_all_v(in, send_counts, out, recv_counts, blocking);
    const std::size_t width = dtype_size(in.dtype);
    return collective(blocking, {in.data, out.data}, [&](State& s) {
      ncclResult_t r = ncclGroupStart();
      std::size_t s_at = 0, r_at = 0;
      for (int p = 0; p < size() && (r == ncclSuccess || r == ncclInProgress); ++p) {
        const auto sn = static_cast<std::size_t>(send_counts[static_cast<std::size_t>(p)]);
        const auto rn = static_cast<std::size_t>(recv_counts[static_cast<std::size_t>(p)]);
        if (sn > 0)
          r = ncclSend(static_cast<const char*>(in.data) + s_at * width, sn, nccl_type(in.dtype), p, s.comm,
                       s.stream);
        if (rn > 0 && (r == ncclSuccess || r == ncclInProgress))
          r = ncclRecv(static_cast<char*>(out.data) + r_at * width, rn, nccl_type(in.dtype), p, s.comm, s.stream);
        s_at += sn;
        r_at += rn;
      }
      const ncclResult_t end = ncclGroupEnd();
      return r == ncclSuccess || r == ncclInProgress ? end : r;
    });
  }

  std::unique_ptr<detail::WorkImpl> send(ElementSpan data, int peer, int tag, bool blocking) override {
    if (!is_device_pointer(data.data)) return host().send(data, peer, tag, blocking);
    return point_to_point(true, data, peer, blocking);
  }
  std::unique_ptr<detail::WorkImpl> recv(ElementSpan data, int peer, int tag, bool blocking) override {
    if (!is_device_pointer(data.data)) return host().recv(data, peer, tag, blocking);
    return point_to_point(false, data, peer, blocking);
  }

  [[noreturn]] void abort_job(int code) override {
    abort_all();
    cpu().abort_job(code);
    std::abort();  // not reached: abort_job ends the process
  }
  bool interrupt(std::string_view component, const std::string& message, bool timed_out) override {
    return cpu().interrupt(component, message, timed_out);
  }

 private:
  struct P2p {
    bool is_send;
    ElementSpan data;
    int peer;
  };

  detail::CommImpl& cpu() const { return *state_->cpu; }
  // The CPU backend for an operation on host buffers: the sends and receives batched so far
  // go out first, so that a peer never waits on the host for a message still held here.
  detail::CommImpl& host() {
    flush_batch();
    return cpu();
  }

  // Makes the NCCL communicator and the communication stream (start, or a one-rank group's
  // first device operation).
  void ensure(State& s, double timeout_s) {
    if (s.comm != nullptr) return;
    check_cuda(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking), "cudaStreamCreate");
    const ncclUniqueId id = share_id(cpu(), id_members_, id_seq_);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    check_nccl(ncclCommInitRankConfig(&s.comm, size(), id, rank(), &config), "ncclCommInitRankConfig", s);
    settle(s, "NCCL communicator creation", timeout_s);
    {
      std::lock_guard lock(registry().mutex);
      registry().states.push_back(state_);
    }
    static std::once_flag watched;
    std::call_once(watched, [] { detail::add_watchdog_poll(watch); });
    log::debug("[comm] NCCL communicator of {} ranks for group {}", size(), s.group);
  }

  // The calling thread (the data-parallel progress thread, say) works on this process's GPU:
  // events and streams belong to the device current when they are made.
  static void use_device() { check_cuda(cudaSetDevice(cuda::current_device()), "cudaSetDevice"); }

  static void check_cuda(cudaError_t e, const char* what) {
    if (e != cudaSuccess) fail<>("comm", "{} failed: {}", what, cudaGetErrorString(e));
  }

  // Enqueues one stream-ordered NCCL operation (the caller holds no lock).
  template <typename Enqueue>
  std::unique_ptr<detail::WorkImpl> collective(bool blocking, std::initializer_list<const void*> buffers,
                                               const Enqueue& enqueue) {
    use_device();
    flush_batch();
    const detail::CallSite& site = detail::current_call();
    State& s = *state_;
    std::lock_guard lock(s.mutex);
    if (site.group != nullptr) s.group = *site.group;
    const double timeout = site.timeout_s > 0 ? site.timeout_s : default_timeout_s();
    ensure(s, timeout);
    auto order = std::make_shared<StreamOrder>(cuda::stream_ops(), cuda::stream(), s.stream);
    order->begin();
    check_nccl(enqueue(s), site.op, s);
    settle(s, site.op, timeout);
    order->end();
    for (const void* b : buffers) cuda::record_stream(const_cast<void*>(b), s.stream);
    s.pending.add({.done = order->done(),
                   .op = site.op,
                   .group = s.group,
                   .start = Clock::now(),
                   .timeout_s = timeout});
    if (blocking) {
      order->join();
      return nullptr;
    }
    return std::make_unique<NcclWork>(std::move(order), nullptr);
  }

  std::unique_ptr<detail::WorkImpl> point_to_point(bool is_send, ElementSpan data, int peer, bool blocking) {
    const detail::CallSite& site = detail::current_call();
    std::shared_ptr<StreamOrder> order;
    {
      std::lock_guard lock(batch_mutex_);
      if (site.group != nullptr) batch_group_ = *site.group;
      batch_timeout_ = site.timeout_s > 0 ? site.timeout_s : default_timeout_s();
      batch_.push_back({is_send, data, peer});
      if (!batch_order_)
        batch_order_ = std::make_shared<StreamOrder>(cuda::stream_ops(), cuda::stream(), nullptr);
      order = batch_order_;
    }
    if (blocking) {
      flush_batch();
      order->join();
      return nullptr;
    }
    std::weak_ptr<NcclComm> self = weak_from_this();
    return std::make_unique<NcclWork>(order, [self] {
      if (auto c = self.lock()) c->flush_batch();
    });
  }

  // Issues the batched sends and receives as one NCCL group.
  void flush_batch() {
    std::vector<P2p> batch;
    std::shared_ptr<StreamOrder> order;
    std::string group;
    double timeout = 0;
    {
      std::lock_guard lock(batch_mutex_);
      if (batch_.empty()) return;
      batch.swap(batch_);
      order = std::move(batch_order_);
      batch_order_.reset();
      group = batch_group_;
      timeout = batch_timeout_;
    }
    use_device();
    State& s = *state_;
    std::lock_guard lock(s.mutex);
    s.group = group;
    ensure(s, timeout);
    // The order was made before the stream existed: it is rebuilt on it, then handed over.
    *order = StreamOrder(cuda::stream_ops(), cuda::stream(), s.stream);
    order->begin();
    ncclResult_t r = ncclGroupStart();
    for (const P2p& p : batch) {
      if (r != ncclSuccess && r != ncclInProgress) break;
      r = p.is_send ? ncclSend(p.data.data, p.data.count, nccl_type(p.data.dtype), p.peer, s.comm, s.stream)
                    : ncclRecv(p.data.data, p.data.count, nccl_type(p.data.dtype), p.peer, s.comm, s.stream);
    }
    const ncclResult_t end = ncclGroupEnd();
    check_nccl(r == ncclSuccess || r == ncclInProgress ? end : r, batch.front().is_send ? "send" : "recv", s);
    settle(s, "send/recv", timeout);
    order->end();
    for (const P2p& p : batch) cuda::record_stream(p.data.data, s.stream);
    s.pending.add({.done = order->done(),
                   .op = batch.size() == 1 ? (batch.front().is_send ? "send" : "recv") : "send/recv",
                   .group = group,
                   .start = Clock::now(),
                   .timeout_s = timeout});
  }

  std::shared_ptr<State> state_;
  std::string id_members_;  // the store key of the unique id: members and number (share_id)
  int id_seq_ = 0;
  std::mutex batch_mutex_;
  std::vector<P2p> batch_;
  std::shared_ptr<StreamOrder> batch_order_;
  std::string batch_group_;
  double batch_timeout_ = 0;
};

}  // namespace

std::shared_ptr<detail::CommImpl> wrap(std::shared_ptr<detail::CommImpl> cpu) {
  NDMESH_CHECK(cpu != nullptr, "comm", "an NCCL communicator needs a bootstrap communicator");
  auto c = std::make_shared<NcclComm>(std::move(cpu));
  c->start();
  return c;
}

std::string version() {
  int v = 0;
  ncclGetVersion(&v);
  return fmt::format("{}.{}.{}", v / 10000, v / 100 % 100, v % 100);
}

}  // namespace ndmesh::comm::nccl
