// Gloo backend. Gloo's operations are blocking calls, so the Communicator's async Work
// maps onto threads:
//   - collectives of one communicator run in issue order on its lane: an async one is
//     queued to the lane's thread, a blocking one runs on the caller once the queue is
//     empty (every rank issues a group's collectives in the same order, so one tag per
//     communicator suffices, as MPI's in-order matching does);
//   - point-to-point operations are posted at once (Gloo's unbound-buffer send and recv
//     do not block) on slots made of the tag, and an async one is waited for by a thread
//     of a small growing pool, so that any completion order works (the ring and the
//     pipeline post several and wait in their own order).
// Gloo's own timeouts are set far beyond NDMESH_TIMEOUT_S: the Communicator's deadline
// (its watchdog for blocking calls, Work polling for async ones) ends the job first, with
// the line naming the group. A peer that exits closes its TCP pairs, which makes the
// pending operations of its partners fail at once with an Error naming the members.
//
// Collectives of zero elements return at once without calling Gloo (whose algorithms
// divide by the element count), as they move nothing.
// Gloo 0.5 (Debian's) has no reduce-scatter in its options API. reduce_scatter runs one
// of three algorithms (testing::GlooReduceScatter), on a duplicate of the group of its own
// (its own TCP pairs, made at the first reduce_scatter) for the two that are not an
// all-reduce: an all-reduce of the whole input and a copy of this rank's block (2(p-1)/p
// of the input sent per rank), the ring reduce-scatter of comm/allreduce.hpp ((p-1)/p),
// or Gloo's ReduceScatterHalvingDoubling. By default (kAuto) the ring, as
// bench/bench_reduce_scatter.sh measured (see reduce_scatter below). Reductions other than
// a sum (max, min) take the all-reduce.
//
// ReduceScatterHalvingDoubling is made per call here, but it is
// written to live across calls (Gloo's benchmarks make it once): (1) run() returns
// without waiting for its data sends, which its notifications make safe only for the next
// run() of the same object, so destroying it leaves sends queued in the pairs that point
// at freed buffers (tcp::Buffer's destructor only unregisters it); (2) it uses the older
// pair API, whose receiving side stops reading a pair, spinning, when data arrives for a
// slot not registered yet, and a new object takes new slots (Context::nextSlot), so
// whatever follows on that pair (the unbound-buffer messages of point-to-point and of
// the options-API collectives) waits until the peer reaches the same call: a rank that
// posts a point-to-point receive before its own reduce_scatter then never gets the message
// queued behind the peer's. (store.collectives_np3 once hung in the sends after it; with
// the arrangement of then, made per call on the group's own context, that did not recur in
// five runs here, so which of the two it was is not shown.) Here every send is waited for
// before the object goes (HalvingDoubling below), and it runs on the duplicate, where
// nothing else travels.
#include "backends/gloo/gloo_backend.hpp"

#include <unistd.h>

#include <csignal>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "ndmesh/comm/allreduce.hpp"
#include "ndmesh/comm/communicator.hpp"
#include "ndmesh/core/env.hpp"
#include "ndmesh/core/error.hpp"
#include "ndmesh/core/log.hpp"
#include "ndmesh/launch/route.hpp"

namespace ndmesh::comm::gloo {
namespace {

// Far beyond any NDMESH_TIMEOUT_S: the Communicator's deadline ends a stuck operation.
constexpr std::chrono::milliseconds kGlooTimeout = std::chrono::hours(24 * 30);
// Point-to-point slots: a prefix byte Gloo's collectives do not use, then the tag.
constexpr std::uint64_t kP2pSlot = std::uint64_t{0x80} << 56;

std::uint64_t p2p_slot(int tag) { return kP2pSlot | static_cast<std::uint32_t>(tag); }
// The collectives of a group over a store (made of this backend's own transfers, see
// GlooComm::contained_collective): one slot, as they run one at a time in issue order.
constexpr std::uint64_t kStoreGroupSlot = std::uint64_t{0x81} << 56;

using Clock = std::chrono::steady_clock;

// Gloo's rendezvous store over the job's store (a view under the group's prefix). With a
// deadline (the world's creation), no wait outlasts it.
class StoreAdapter final : public ::gloo::rendezvous::Store {
 public:
  explicit StoreAdapter(launch::Store store, Clock::time_point deadline = Clock::time_point::max())
      : store_(std::move(store)), deadline_(deadline) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    std::string v = store_.get(key);
    return {v.begin(), v.end()};
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, kGlooTimeout); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    double s = timeout.count() > 0 ? timeout.count() / 1000.0 : 0;
    if (deadline_ != Clock::time_point::max())  // never 0: that would mean the store's default
      s = std::clamp(std::chrono::duration<double>(deadline_ - Clock::now()).count(), 1e-3, s > 0 ? s : 1e9);
    store_.wait(keys, s);
  }

 private:
  launch::Store store_;
  Clock::time_point deadline_;
};

// The transfers of a communicator that are posted and not yet waited for, so that abort()
// can end their waits (Gloo's abortWaitRecv / abortWaitSend). Shared with the tasks that
// wait for them, which may outlive the communicator.
class Inflight {
 public:
  // Registers `b` until the returned guard goes; when the communicator is already aborted,
  // ends its waits at once.
  auto track(::gloo::transport::UnboundBuffer* b, const detail::AbortState& aborted) {
    {
      std::lock_guard lock(mutex_);
      buffers_.insert(b);
    }
    if (aborted.set()) end(b);
    struct Guard {
      Inflight* self;
      ::gloo::transport::UnboundBuffer* b;
      ~Guard() {
        std::lock_guard lock(self->mutex_);
        self->buffers_.erase(b);
      }
    };
    return Guard{this, b};
  }
  void end_all() {
    std::lock_guard lock(mutex_);
    for (auto* b : buffers_) end(b);
  }

 private:
  static void end(::gloo::transport::UnboundBuffer* b) {
    b->abortWaitRecv();
    b->abortWaitSend();
  }
  std::mutex mutex_;
  std::set<::gloo::transport::UnboundBuffer*> buffers_;
};

// Waits for a posted transfer of `b`; an Error (the abort's, when it was aborted) when the
// wait was ended.
void wait_transfer(::gloo::transport::UnboundBuffer& b, bool is_send, const detail::AbortState& aborted) {
  const bool ok = is_send ? b.waitSend(kGlooTimeout) : b.waitRecv(kGlooTimeout);
  if (ok) return;
  aborted.throw_if_set();
  fail<>("comm", "a gloo {} was ended before it completed", is_send ? "send" : "recv");
}

// A unit of work run on another thread; its Work polls `done`.
struct Task {
  std::function<void()> fn;
  std::atomic<bool> done{false};
  std::exception_ptr error;
  void run() {
    try {
      fn();
    } catch (...) {
      error = std::current_exception();
    }
    fn = nullptr;
    done.store(true, std::memory_order_release);
  }
};

class TaskWork final : public detail::WorkImpl {
 public:
  explicit TaskWork(std::shared_ptr<Task> task) : task_(std::move(task)) {}
  bool test() override {
    if (!task_->done.load(std::memory_order_acquire)) return false;
    if (task_->error) std::rethrow_exception(task_->error);
    return true;
  }

 private:
  std::shared_ptr<Task> task_;
};

// Threads that wait for posted point-to-point transfers, one per waiting transfer (grown
// on demand, kept idle afterwards), so that completions are seen in any order.
class WaiterPool {
 public:
  static WaiterPool& get() {
    static auto* pool = new WaiterPool;  // never destroyed: waiters may run during exit
    return *pool;
  }
  void submit(std::shared_ptr<Task> task) {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(task));
    // Every queued transfer needs a thread of its own: an idle thread that was notified
    // but has not woken yet still counts as idle, so compare with the queue, not with 0
    // (one thread serving two transfers would see them complete only in order).
    if (queue_.size() > static_cast<std::size_t>(idle_)) {
      std::thread([this] { loop(); }).detach();
    } else {
      cv_.notify_one();
    }
  }

 private:
  void loop() {
    std::unique_lock lock(mutex_);
    for (;;) {
      ++idle_;
      cv_.wait(lock, [&] { return !queue_.empty(); });
      --idle_;
      auto task = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      task->run();
      task.reset();
      lock.lock();
    }
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Task>> queue_;
  int idle_ = 0;
};

// Runs one communicator's collectives in issue order (see the file comment).
class Lane {
 public:
  ~Lane() {
    {
      std::unique_lock lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  std::shared_ptr<Task> submit(std::function<void()> fn) {
    auto task = std::make_shared<Task>();
    task->fn = std::move(fn);
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(task);
      if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    }
    cv_.notify_all();
    return task;
  }

  // Runs fn on the caller after every queued collective has run.
  void run_now(const std::function<void()>& fn) {
    {
      std::unique_lock lock(mutex_);
      idle_cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
      busy_ = true;
    }
    struct Release {
      Lane* lane;
      ~Release() {
        {
          std::lock_guard lock(lane->mutex_);
          lane->busy_ = false;
        }
        lane->cv_.notify_all();
        lane->idle_cv_.notify_all();
      }
    } release{this};
    fn();
  }

 private:
  void loop() {
    std::unique_lock lock(mutex_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || (!queue_.empty() && !busy_); });
      if (queue_.empty()) return;  // stop_ with nothing left
      auto task = queue_.front();
      busy_ = true;
      lock.unlock();
      task->run();
      lock.lock();
      queue_.pop_front();
      busy_ = false;
      idle_cv_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::shared_ptr<Task>> queue_;
  bool busy_ = false, stop_ = false;
  std::thread thread_;
};

// Runs f, turning Gloo's exceptions into an Error naming the operation and the members,
// or, once the communicator was aborted (its pairs closed), into the abort's error.
template <typename F>
auto wrap(const char* op, const std::vector<std::int64_t>& members, const detail::AbortState& aborted, F&& f) {
  aborted.throw_if_set();
  try {
    return f();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    aborted.throw_if_set();
    fail<>("comm", "gloo {} among world ranks {} failed: {} (a peer exited or lost its connection)", op,
           fmt::join(members, ","), e.what());
  }
}

template <typename T>
void bf16_reduce(void* c, const void* a, const void* b, std::size_t n) {
  auto* out = static_cast<BFloat16*>(c);
  auto* x = static_cast<const BFloat16*>(a);
  auto* y = static_cast<const BFloat16*>(b);
  for (std::size_t i = 0; i < n; ++i)
    out[i] = BFloat16(T{}(static_cast<float>(x[i]), static_cast<float>(y[i])));
}
struct Add {
  float operator()(float x, float y) const { return x + y; }
};
struct Max {
  float operator()(float x, float y) const { return std::max(x, y); }
};
struct Min {
  float operator()(float x, float y) const { return std::min(x, y); }
};

template <typename T>
::gloo::AllreduceOptions::Func reduce_fn(ReduceOp op) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    switch (op) {
      case ReduceOp::kMax:
        return &bf16_reduce<Max>;
      case ReduceOp::kMin:
        return &bf16_reduce<Min>;
      default:
        return &bf16_reduce<Add>;
    }
  } else {
    void (*fn)(void*, const void*, const void*, std::size_t) = &::gloo::sum<T>;
    if (op == ReduceOp::kMax) fn = &::gloo::max<T>;
    if (op == ReduceOp::kMin) fn = &::gloo::min<T>;
    return fn;
  }
}

// The element-wise reduction of ReduceScatterHalvingDoubling (x = x op y), typed.
template <typename T>
typename ::gloo::ReductionFunction<T>::Function* reduction(ReduceOp op) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    switch (op) {
      case ReduceOp::kMax:
        return [](T* x, const T* y, std::size_t n) { bf16_reduce<Max>(x, x, y, n); };
      case ReduceOp::kMin:
        return [](T* x, const T* y, std::size_t n) { bf16_reduce<Min>(x, x, y, n); };
      default:
        return [](T* x, const T* y, std::size_t n) { bf16_reduce<Add>(x, x, y, n); };
    }
  } else {
    switch (op) {
      case ReduceOp::kMax:
        return [](T* x, const T* y, std::size_t n) { ::gloo::max<T>(x, x, y, n); };
      case ReduceOp::kMin:
        return [](T* x, const T* y, std::size_t n) { ::gloo::min<T>(x, x, y, n); };
      default:
        return [](T* x, const T* y, std::size_t n) { ::gloo::sum<T>(x, x, y, n); };
    }
  }
}

// Gloo's ReduceScatterHalvingDoubling, made for one call: run() then waits for every send
// it made, so that nothing queued in a pair outlives the object (the file comment says
// why). Which sends run() made is read from the same members and conditions it uses.
template <typename T>
class HalvingDoubling final : public ::gloo::ReduceScatterHalvingDoubling<T> {
 public:
  using ::gloo::ReduceScatterHalvingDoubling<T>::ReduceScatterHalvingDoubling;

  void run_and_drain() {
    this->run();
    if (this->contextSize_ == 1) return;
    for (std::size_t i = 0; i < this->stepsWithinBlock_; ++i)
      if (this->sendOffsets_[i] < static_cast<std::size_t>(this->count_)) this->sendDataBufs_[i]->waitSend();
    const std::size_t to_larger = this->stepsWithinBlock_ > 0 ? this->recvCounts_[this->stepsWithinBlock_ - 1]
                                                              : static_cast<std::size_t>(this->count_);
    if (this->nextLargerBlockSize_ != 0 && to_larger != 0)
      for (std::size_t i = 0; i < this->largerBlockSendDataBufs_.size(); ++i)
        if (this->sendCountToLargerBlock_ * i < to_larger) this->largerBlockSendDataBufs_[i]->waitSend();
    for (auto& buf : this->distSendDataBufs_) buf->waitSend();
    for (auto& buf : this->sendNotificationBufs_) buf->waitSend();
  }
};

// A byte that gives empty buffers an address.
char g_empty_byte = 0;
void* addr(void* p) { return p != nullptr ? p : &g_empty_byte; }

std::shared_ptr<::gloo::transport::Device>& device_slot() {
  static std::shared_ptr<::gloo::transport::Device> device;
  return device;
}

class GlooComm final : public detail::CommImpl {
 public:
  GlooComm(std::shared_ptr<::gloo::rendezvous::Context> ctx, launch::Store store, std::string node_id,
           std::vector<std::int64_t> members)
      : ctx_(std::move(ctx)), store_(std::move(store)), node_id_(std::move(node_id)) {
    members_ = std::move(members);
  }

  template <typename F>
  auto wrap(const char* op, F&& f) const {
    return gloo::wrap(op, members_, *abort_, std::forward<F>(f));
  }

  // Connects a group of `size` ranks (this one `rank`) under `store`'s prefix; no store
  // wait outlasts `deadline`, and with one, Gloo's own waits (its pairs' connections, the
  // barrier) are bounded by what is left of it. Each member then sets "connected/<rank>"
  // there (which the world's start-up guard reads). `device`: the world's by default.
  static std::shared_ptr<::gloo::rendezvous::Context> connect(
      const launch::Store& store, int rank, int size, Clock::time_point deadline = Clock::time_point::max(),
      std::shared_ptr<::gloo::transport::Device> device = nullptr) {
    auto left = [&] {
      if (deadline == Clock::time_point::max()) return kGlooTimeout;
      return std::max(std::chrono::milliseconds(1),
                      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
    };
    auto ctx = std::make_shared<::gloo::rendezvous::Context>(rank, size);
    ctx->setTimeout(left());
    StoreAdapter adapter(store, deadline);
    ctx->connectFullMesh(adapter, device ? device : device_slot());
    if (deadline != Clock::time_point::max()) store.set(fmt::format("connected/{}", rank), "1");
    // connectFullMesh returns once this rank's pairs are connected, which may be before a
    // peer's side has finished its handshake; a rank that then dropped the group (a
    // temporary node group) would close a pair the peer is still connecting. A barrier
    // makes the group's creation complete on every member before any uses or drops it.
    ::gloo::BarrierOptions barrier(ctx);
    barrier.setTimeout(left());
    ::gloo::barrier(barrier);
    ctx->setTimeout(kGlooTimeout);
    return ctx;
  }

  // A group of connect_store_group: its timeouts abort it and throw on the caller (see
  // interrupt), and `timeout_s` bounds the operations called without a timeout.
  void contain(double timeout_s) {
    contained_ = true;
    default_timeout_s_ = timeout_s;
  }
  double default_timeout_s() const override { return default_timeout_s_; }

  bool interrupt(std::string_view component, const std::string& message, bool timed_out) override {
    if (!contained_) return false;
    abort(component, message, timed_out);
    return true;
  }

  std::string_view backend() const override { return "gloo"; }
  int rank() const override { return ctx_->rank; }
  int size() const override { return ctx_->size; }
  std::size_t max_count() const override { return std::size_t{1} << 60; }

  std::shared_ptr<detail::CommImpl> split(std::optional<std::int64_t> color, std::int64_t key) override {
    refuse_if_contained("split");
    NDMESH_CHECK(!color || *color >= 0, "comm", "split color {} is negative (colors are non-negative)",
                 *color);
    const int seq = splits_++;
    // Every member learns every (color, key); -1: no color.
    std::vector<std::int64_t> mine = {color ? *color : -1, key}, all(2 * static_cast<std::size_t>(size()));
    lane_.run_now([&] { gather(mine.data(), all.data(), 2); });
    if (!color) return nullptr;
    std::vector<std::pair<std::int64_t, int>> group;  // (key, parent rank)
    for (int r = 0; r < size(); ++r)
      if (all[2 * static_cast<std::size_t>(r)] == *color)
        group.emplace_back(all[2 * static_cast<std::size_t>(r) + 1], r);
    std::sort(group.begin(), group.end());
    std::vector<std::int64_t> world;
    int new_rank = 0;
    for (std::size_t i = 0; i < group.size(); ++i) {
      if (group[i].second == rank()) new_rank = static_cast<int>(i);
      world.push_back(members_[static_cast<std::size_t>(group[i].second)]);
    }
    launch::Store sub = store_.prefixed(fmt::format("s{}/c{}/", seq, *color));
    auto ctx = wrap("split", [&] {
      return connect(sub, new_rank, static_cast<int>(group.size()), Clock::time_point::max(), ctx_->getDevice());
    });
    auto child = std::make_shared<GlooComm>(std::move(ctx), sub, node_id_, std::move(world));
    if (contained_) child->contain(default_timeout_s_);
    return child;
  }

  std::shared_ptr<detail::CommImpl> self() override {
    refuse_if_contained("self");
    const int seq = selves_++;
    launch::Store sub = store_.prefixed(fmt::format("self{}/r{}/", seq, rank()));
    auto ctx = wrap("self", [&] { return connect(sub, 0, 1, Clock::time_point::max(), ctx_->getDevice()); });
    return std::make_shared<GlooComm>(std::move(ctx), sub, node_id_,
                                      std::vector<std::int64_t>{members_[static_cast<std::size_t>(rank())]});
  }

  std::shared_ptr<detail::CommImpl> split_node() override {
    refuse_if_contained("split_node");
    // Members with the same node identity (host name and the launcher's node rank) form
    // a node; its color is the lowest member rank.
    std::vector<std::int64_t> ids(static_cast<std::size_t>(size()));
    std::int64_t id = static_cast<std::int64_t>(std::hash<std::string>{}(node_id_) >> 1);
    lane_.run_now([&] { gather(&id, ids.data(), 1); });
    std::int64_t color = 0;
    while (ids[static_cast<std::size_t>(color)] != id) ++color;
    return split(color, rank());
  }

  std::unique_ptr<detail::WorkImpl> barrier(bool blocking) override {
    if (contained_) {
      return contained_collective("barrier", blocking, [](const Transfer& xfer, int rank, int size) {
        char byte = 0;
        if (rank == 0) {
          for (int r = 1; r < size; ++r) xfer(false, &byte, 1, r);
          for (int r = 1; r < size; ++r) xfer(true, &byte, 1, r);
        } else {
          xfer(true, &byte, 1, 0);
          xfer(false, &byte, 1, 0);
        }
      });
    }
    return collective("barrier", blocking, [ctx = ctx_] {
      ::gloo::BarrierOptions o(ctx);
      o.setTimeout(kGlooTimeout);
      ::gloo::barrier(o);
    });
  }

  std::unique_ptr<detail::WorkImpl> broadcast(ElementSpan data, int root, bool blocking) override {
    if (data.count == 0) return nullptr;
    if (contained_) {
      return contained_collective("broadcast", blocking, [data, root](const Transfer& xfer, int rank, int size) {
        if (rank != root) return xfer(false, data.data, data.bytes(), root);
        for (int r = 0; r < size; ++r)
          if (r != root) xfer(true, data.data, data.bytes(), r);
      });
    }
    return collective("broadcast", blocking, [ctx = ctx_, data, root] {
      visit_dtype(data.dtype, [&]<typename T>(T) {
        ::gloo::BroadcastOptions o(ctx);
        o.setOutput(static_cast<T*>(addr(data.data)), data.count);
        o.setRoot(root);
        o.setTimeout(kGlooTimeout);
        ::gloo::broadcast(o);
      });
    });
  }

  std::unique_ptr<detail::WorkImpl> all_reduce(ElementSpan data, ReduceOp op, bool blocking) override {
    if (data.count == 0) return nullptr;
    if (contained_) {
      // Member 0 reduces in member order and sends the result back: every member gets the
      // same bits; 2(p-1) messages of the whole buffer, for the few members such groups have.
      return contained_collective("all_reduce", blocking, [data, op](const Transfer& xfer, int rank, int size) {
        if (rank != 0) {
          xfer(true, data.data, data.bytes(), 0);
          return xfer(false, data.data, data.bytes(), 0);
        }
        std::vector<char> in(data.bytes());
        visit_dtype(data.dtype, [&]<typename T>(T) {
          const auto reduce = reduce_fn<T>(op);
          for (int r = 1; r < size; ++r) {
            xfer(false, in.data(), in.size(), r);
            reduce(data.data, data.data, in.data(), data.count);
          }
        });
        for (int r = 1; r < size; ++r) xfer(true, data.data, data.bytes(), r);
      });
    }
    return collective("all_reduce", blocking, [ctx = ctx_, data, op] { reduce_in_place(ctx, data, op); });
  }

  std::unique_ptr<detail::WorkImpl> reduce_scatter(ElementSpan in, ElementSpan out, ReduceOp op,
                                                   bool blocking) override {
    refuse_if_contained("reduce_scatter");
    check_block("reduce_scatter", out.count);
    if (out.count == 0) return nullptr;
    using Algorithm = testing::GlooReduceScatter;
    Algorithm algorithm = detail::gloo_reduce_scatter();
    // kAuto: the ring at every size (bench/bench_reduce_scatter.sh, docs/launch.md: it beat the
    // all-reduce and a copy at most sizes from 64 KiB to 64 MiB on 2-4 ranks, and Gloo's
    // halving-doubling lost to both from 1 MiB on).
    if (algorithm == Algorithm::kAuto) algorithm = Algorithm::kRing;
    if (op != ReduceOp::kSum && algorithm == Algorithm::kRing) algorithm = Algorithm::kAllReduce;
    if (algorithm == Algorithm::kHalvingDoubling && in.count > static_cast<std::size_t>(INT32_MAX))
      algorithm = Algorithm::kAllReduce;  // its counts are int
    if (size() == 1) algorithm = Algorithm::kAllReduce;  // a copy
    if (algorithm != Algorithm::kAllReduce && !reducer_) {
      // Collective: every member reaches its first such reduce_scatter in the same order.
      auto reducer = std::static_pointer_cast<GlooComm>(dup());
      std::lock_guard lock(reducer_mutex_);
      reducer_ = std::move(reducer);
      reducer_handle_ = detail::make_communicator(reducer_, "reduce_scatter");
      if (abort_->set()) reducer_->abort("comm", "the group was aborted", false);
    }
    std::function<void()> fn;
    switch (algorithm) {
      case Algorithm::kRing:
        fn = [group = reducer_handle_, in, out] {
          std::vector<char> work(static_cast<const char*>(in.data), static_cast<const char*>(in.data) + in.bytes());
          ring_reduce_scatter(group, ElementSpan{work.data(), in.count, in.dtype});
          std::memcpy(out.data, work.data() + static_cast<std::size_t>(group.rank()) * out.bytes(), out.bytes());
        };
        break;
      case Algorithm::kHalvingDoubling:
        fn = [ctx = reducer_->ctx_, in, out, op] {
          // It reduces in place; the result is this rank's block, at the start of the buffer.
          std::vector<char> work(static_cast<const char*>(in.data), static_cast<const char*>(in.data) + in.bytes());
          visit_dtype(in.dtype, [&]<typename T>(T) {
            const ::gloo::ReductionFunction<T> reduce(op == ReduceOp::kMax   ? ::gloo::MAX
                                                      : op == ReduceOp::kMin ? ::gloo::MIN
                                                                             : ::gloo::SUM,
                                                      reduction<T>(op));
            const std::vector<int> blocks(static_cast<std::size_t>(ctx->size), static_cast<int>(out.count));
            HalvingDoubling<T> rshd(ctx, {reinterpret_cast<T*>(work.data())}, static_cast<int>(in.count), blocks,
                                    &reduce);
            rshd.run_and_drain();
          });
          std::memcpy(out.data, work.data(), out.bytes());
        };
        break;
      default:
        fn = [ctx = ctx_, in, out, op] {
          std::vector<char> work(static_cast<const char*>(in.data), static_cast<const char*>(in.data) + in.bytes());
          reduce_in_place(ctx, ElementSpan{work.data(), in.count, in.dtype}, op);
          std::memcpy(out.data, work.data() + static_cast<std::size_t>(ctx->rank) * out.bytes(), out.bytes());
        };
    }
    return collective("reduce_scatter", blocking, std::move(fn));
  }

  std::unique_ptr<detail::WorkImpl> all_gather(ElementSpan in, ElementSpan out, bool blocking) override {
    refuse_if_contained("all_gather");
    check_block("all_gather", in.count);
    if (in.count == 0) return nullptr;
    const bool in_place =
        in.data == static_cast<char*>(out.data) + static_cast<std::size_t>(rank()) * in.bytes();
    return collective("all_gather", blocking, [ctx = ctx_, in, out, in_place] {
      visit_dtype(in.dtype, [&]<typename T>(T) {
        ::gloo::AllgatherOptions o(ctx);
        if (!in_place) o.setInput(static_cast<T*>(addr(in.data)), in.count);
        o.setOutput(static_cast<T*>(addr(out.data)), out.count);
        o.setTimeout(kGlooTimeout);
        ::gloo::allgather(o);
      });
    });
  }

  std::unique_ptr<detail::WorkImpl> all_to_all(ElementSpan in, ElementSpan out, bool blocking) override {
    refuse_if_contained("all_to_all");
    check_block("all_to_all", in.count / static_cast<std::size_t>(size()));
    if (in.count == 0) return nullptr;
    return collective("all_to_all", blocking, [ctx = ctx_, in, out] {
      visit_dtype(in.dtype, [&]<typename T>(T) {
        ::gloo::AlltoallOptions o(ctx);
        o.setInput(static_cast<T*>(addr(in.data)), in.count);
        o.setOutput(static_cast<T*>(addr(out.data)), out.count);
        o.setTimeout(kGlooTimeout);
        ::gloo::alltoall(o);
      });
    });
  }

  std::unique_ptr<detail::WorkImpl> all_to_all_v(ElementSpan in, std::span<const std::int64_t> send_counts,
                                                 ElementSpan out, std::span<const std::int64_t> recv_counts,
                                                 bool blocking) override {
    refuse_if_contained("all_to_all_v");
    check_block("all_to_all_v", in.count);
    check_block("all_to_all_v", out.count);
    std::vector<std::int64_t> sc(send_counts.begin(), send_counts.end()), rc(recv_counts.begin(), recv_counts.end());
    return collective("all_to_all_v", blocking, [ctx = ctx_, in, out, sc = std::move(sc), rc = std::move(rc)] {
      visit_dtype(in.dtype, [&]<typename T>(T) {
        ::gloo::AlltoallvOptions o(ctx);
        o.setInput(static_cast<T*>(addr(in.data)), sc);
        o.setOutput(static_cast<T*>(addr(out.data)), rc);
        o.setTimeout(kGlooTimeout);
        ::gloo::alltoallv(o);
      });
    });
  }

  std::unique_ptr<detail::WorkImpl> send(ElementSpan data, int peer, int tag, bool blocking) override {
    return point_to_point("send", data, peer, tag, blocking);
  }
  std::unique_ptr<detail::WorkImpl> recv(ElementSpan data, int peer, int tag, bool blocking) override {
    return point_to_point("recv", data, peer, tag, blocking);
  }

  // Ends the waits of this rank's transfers in flight (point-to-point, and every collective
  // of a group over a store, which is made of them) and closes its connections of the
  // group: later operations fail, and so do the peers' operations with this rank. A
  // collective of Gloo's own (a job group's) cannot be reached: it ends at its peers, and
  // here at its timeout.
  void end_in_flight(const std::string& why) override {
    inflight_->end_all();
    for (int i = 0; i < ctx_->size; ++i)
      if (i != ctx_->rank && ctx_->getPair(i)) ctx_->getPair(i)->close();
    {
      std::lock_guard lock(self_mutex_);  // a receive from this rank itself waits no more
      for (auto& [tag, waiting] : self_recvs_)
        for (auto& r : waiting) {
          r.task->error = std::make_exception_ptr(Error("comm", why));
          r.task->done.store(true, std::memory_order_release);
        }
      self_recvs_.clear();
    }
    std::lock_guard lock(reducer_mutex_);
    if (reducer_) reducer_->abort("comm", why, false);
  }

  [[noreturn]] void abort_job(int code) override {
    // No job-wide abort in Gloo: exiting closes this rank's pairs, so every peer's pending
    // operation with it fails at once, and the launcher ends the job.
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(code);
  }

 private:
  static void reduce_in_place(const std::shared_ptr<::gloo::rendezvous::Context>& ctx, ElementSpan data,
                              ReduceOp op) {
    visit_dtype(data.dtype, [&]<typename T>(T) {
      ::gloo::AllreduceOptions o(ctx);
      o.setOutput(static_cast<T*>(addr(data.data)), data.count);
      o.setReduceFunction(reduce_fn<T>(op));
      o.setTimeout(kGlooTimeout);
      ::gloo::allreduce(o);
    });
  }

  // The block collectives refuse a per-rank block above the per-call limit (tests lower it
  // with testing::set_max_count_per_call), as the MPI backend does.
  void check_block(std::string_view op, std::size_t count) const {
    detail::check_block_count(op, count, max_count());
  }

  // An all_gather of `n` int64 per rank, on the calling thread (inside run_now).
  void gather(std::int64_t* in, std::int64_t* out, std::size_t n) {
    wrap("split", [&] {
      ::gloo::AllgatherOptions o(ctx_);
      o.setInput(in, n);
      o.setOutput(out, n * static_cast<std::size_t>(size()));
      o.setTimeout(kGlooTimeout);
      ::gloo::allgather(o);
      return 0;
    });
  }

  // One blocking transfer of a contained collective: (is_send, data, bytes, peer).
  using Transfer = std::function<void(bool, void*, std::size_t, int)>;

  // A collective of a group over a store, written over this group's own transfers (which
  // abort() can end, unlike Gloo's collectives), run in issue order like the others.
  std::unique_ptr<detail::WorkImpl> contained_collective(const char* op, bool blocking,
                                                         std::function<void(const Transfer&, int, int)> body) {
    return collective(op, blocking, [ctx = ctx_, aborted = abort_, inflight = inflight_, body = std::move(body)] {
      const Transfer xfer = [&](bool is_send, void* data, std::size_t bytes, int peer) {
        std::shared_ptr<::gloo::transport::UnboundBuffer> b = ctx->createUnboundBuffer(addr(data), bytes);
        auto tracked = inflight->track(b.get(), *aborted);
        if (is_send)
          b->send(peer, kStoreGroupSlot, 0, bytes);
        else
          b->recv(peer, kStoreGroupSlot, 0, bytes);
        wait_transfer(*b, is_send, *aborted);
      };
      body(xfer, ctx->rank, ctx->size);
    });
  }

  void refuse_if_contained(std::string_view op) const {
    if (contained_)
      fail<>("comm",
             "{} is not available on a group over a store (connect_store_group): it has all_reduce, broadcast, "
             "barrier, send and recv",
             op);
  }

  std::unique_ptr<detail::WorkImpl> collective(const char* op, bool blocking, std::function<void()> fn) {
    // Tasks hold the context and the member list, never this communicator, so that the
    // last handle is never released on the lane's own thread.
    auto guarded = [members = members_, aborted = abort_, op, fn = std::move(fn)] {
      gloo::wrap(op, members, *aborted, [&] {
        fn();
        return 0;
      });
    };
    if (blocking) {
      lane_.run_now(guarded);
      return nullptr;
    }
    return std::make_unique<TaskWork>(lane_.submit(guarded));
  }

  // Messages to this rank itself: Gloo has no pair to self, so they meet here. A send is
  // copied at once; a receive takes the oldest message of its tag, or waits for one.
  struct SelfRecv {
    ElementSpan data;
    std::shared_ptr<Task> task;
  };
  static void deliver(const std::string& bytes, const SelfRecv& r) {
    if (bytes.size() != r.data.bytes())
      r.task->error = std::make_exception_ptr(Error(
          "comm",
          fmt::format("recv from this rank itself expected {} bytes but the message held {}; send and recv "
                      "counts must match",
                      r.data.bytes(), bytes.size())));
    else if (!bytes.empty())
      std::memcpy(r.data.data, bytes.data(), bytes.size());
    r.task->done.store(true, std::memory_order_release);
  }

  std::unique_ptr<detail::WorkImpl> to_self(bool is_send, ElementSpan data, int tag, bool blocking) {
    auto recv = std::make_shared<Task>();
    {
      std::lock_guard lock(self_mutex_);
      if (is_send) {
        std::string bytes(static_cast<const char*>(addr(data.data)), data.bytes());
        auto& waiting = self_recvs_[tag];
        if (waiting.empty()) {
          self_sends_[tag].push_back(std::move(bytes));
        } else {
          deliver(bytes, waiting.front());
          waiting.pop_front();
        }
        return nullptr;
      }
      auto& queued = self_sends_[tag];
      if (queued.empty()) {
        self_recvs_[tag].push_back({data, recv});
      } else {
        deliver(queued.front(), {data, recv});
        queued.pop_front();
      }
    }
    auto work = std::make_unique<TaskWork>(recv);
    if (!blocking) return work;
    while (!work->test()) std::this_thread::sleep_for(std::chrono::microseconds(50));  // under the watchdog
    return nullptr;
  }

  std::unique_ptr<detail::WorkImpl> point_to_point(const char* op, ElementSpan data, int peer, int tag,
                                                   bool blocking) {
    const bool is_send = op[0] == 's';
    if (peer == rank()) return to_self(is_send, data, tag, blocking);
    std::shared_ptr<::gloo::transport::UnboundBuffer> buf = wrap(op, [&] {
      std::shared_ptr<::gloo::transport::UnboundBuffer> b =
          ctx_->createUnboundBuffer(addr(data.data), data.bytes());
      if (is_send) {
        b->send(peer, p2p_slot(tag), 0, data.bytes());
      } else {
        b->recv(peer, p2p_slot(tag), 0, data.bytes());
      }
      return b;
    });
    auto finish = [ctx = ctx_, members = members_, aborted = abort_, inflight = inflight_, op, is_send, buf] {
      auto tracked = inflight->track(buf.get(), *aborted);
      gloo::wrap(op, members, *aborted, [&] {
        wait_transfer(*buf, is_send, *aborted);
        return 0;
      });
    };
    if (blocking) {
      finish();
      return nullptr;
    }
    auto task = std::make_shared<Task>();
    task->fn = std::move(finish);
    WaiterPool::get().submit(task);
    return std::make_unique<TaskWork>(std::move(task));
  }

  std::shared_ptr<::gloo::rendezvous::Context> ctx_;
  launch::Store store_;  // this group's prefix
  std::string node_id_;
  int splits_ = 0, selves_ = 0;
  // The reduce-scatter's own duplicate of this group (see the file comment), and a handle
  // over it for ring_reduce_scatter; made at the first reduce_scatter that needs it.
  std::shared_ptr<GlooComm> reducer_;
  Communicator reducer_handle_;
  std::mutex reducer_mutex_;  // reducer_ is read by end_in_flight on any thread
  std::shared_ptr<Inflight> inflight_ = std::make_shared<Inflight>();
  bool contained_ = false;    // a group of connect_store_group
  double default_timeout_s_ = 0;
  std::mutex self_mutex_;
  std::map<int, std::deque<std::string>> self_sends_;
  std::map<int, std::deque<SelfRecv>> self_recvs_;
  Lane lane_;  // last: its thread uses the members above
};

std::string rank_list(const std::vector<std::int64_t>& ranks) {
  if (ranks.size() <= 16) return fmt::format("{}", fmt::join(ranks, ","));
  return fmt::format("{},{},{},...,{} ({} ranks)", ranks[0], ranks[1], ranks[2], ranks.back(), ranks.size());
}

// The bound of the world's creation: Gloo waits for the store and its pairs with its own
// (30-day) timeout and has no deadline of the Communicator yet. Past the deadline this
// names, from the store, the ranks that did not publish their address (Gloo's key: the
// rank) or did not connect ("connected/<rank>"), and ends the process with
// kTimeoutExitCode, as the rendezvous does. The store's calls are serialized: its check
// waits for a store wait of the creating thread, which the deadline also bounds.
class WorldGuard {
 public:
  WorldGuard(launch::Store store, const LaunchEnv& env, Clock::time_point deadline, double timeout_s)
      : thread_([this, store = std::move(store), &env, deadline, timeout_s] {
          {
            std::unique_lock lock(mutex_);
            if (cv_.wait_until(lock, deadline, [this] { return done_; })) return;
          }
          std::string line;
          try {
            std::vector<std::int64_t> unpublished, unconnected;
            for (std::int64_t r = 0; r < env.world_size; ++r) {
              if (!store.check({std::to_string(r)}))
                unpublished.push_back(r);
              else if (!store.check({fmt::format("connected/{}", r)}))
                unconnected.push_back(r);
            }
            auto ranks = [&](const std::vector<std::int64_t>& v) {
              return fmt::format("rank{} {} of WORLD_SIZE={}", v.size() == 1 ? "" : "s", rank_list(v),
                                 env.world_size);
            };
            if (!unpublished.empty())
              line = fmt::format("{} arrived but did not publish {} Gloo address", ranks(unpublished),
                                 unpublished.size() == 1 ? "its" : "their");
            else if (!unconnected.empty())
              line = fmt::format("{} published {} Gloo address but did not connect to the others",
                                 ranks(unconnected), unconnected.size() == 1 ? "its" : "their");
            else
              line = "the Gloo world's last barrier did not complete";
          } catch (const std::exception& e) {
            line = fmt::format("the store is gone ({}): rank 0, which serves it, has exited", e.what());
          }
          log::error(
              "[comm] rank {}: {} within {:g} s of the start (NDMESH_INIT_TIMEOUT_S): a rank exited or hangs "
              "while joining the Gloo world; its own output says why",
              env.rank, line, timeout_s);
          std::fflush(stdout);
          std::fflush(stderr);
          std::_Exit(kTimeoutExitCode);
        }) {}
  ~WorldGuard() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  WorldGuard(const WorldGuard&) = delete;
  WorldGuard& operator=(const WorldGuard&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;  // last: started after the members it uses
};

std::string node_id_of(std::optional<std::int64_t> node_rank) {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return fmt::format("{}/{}", host, node_rank ? *node_rank : -1);
}

}  // namespace

std::shared_ptr<detail::CommImpl> make_store_group(const launch::Store& store, int rank, int size,
                                                   const std::string& toward, double timeout_s) {
  // Members of such a group vanish (killed, or gone on without this one): a write to their
  // closed connections must fail the operation, not end this process with SIGPIPE.
  ::signal(SIGPIPE, SIG_IGN);
  std::shared_ptr<::gloo::transport::Device> device;
  {
    // One device (listening address) per host the groups are reached through.
    static std::mutex mutex;
    static std::map<std::string, std::shared_ptr<::gloo::transport::Device>> devices;
    std::lock_guard lock(mutex);
    auto& d = devices[toward];
    if (!d) {
      ::gloo::transport::tcp::attr attr;
      attr.hostname = launch::local_address_toward(toward, "comm", fmt::format("the store's host {}", toward),
                                                   "pass the address of the store's host");
      d = ::gloo::transport::tcp::CreateDevice(attr);
    }
    device = d;
  }
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  std::shared_ptr<::gloo::rendezvous::Context> ctx;
  try {
    ctx = GlooComm::connect(store, rank, size, deadline, device);
  } catch (const std::exception& e) {
    fail<>("comm", "the {} members of a group over the store (prefix of {}) did not all connect within {:g} s: {}", size,
           store.address(), timeout_s, e.what());
  }
  std::vector<std::int64_t> members(static_cast<std::size_t>(size));
  for (std::size_t i = 0; i < members.size(); ++i) members[i] = static_cast<std::int64_t>(i);
  auto comm = std::make_shared<GlooComm>(std::move(ctx), store, node_id_of(std::nullopt), std::move(members));
  comm->contain(timeout_s);
  return comm;
}

std::shared_ptr<detail::CommImpl> make_world(const launch::JobStore& job, const LaunchEnv& env,
                                             Clock::time_point deadline, double timeout_s) {
  ::gloo::transport::tcp::attr attr;
  attr.hostname = launch::local_address_toward(*env.master_addr, "comm", fmt::format("MASTER_ADDR={}", *env.master_addr),
                                               "set it to the host of rank 0");
  device_slot() = ::gloo::transport::tcp::CreateDevice(attr);
  std::string node_id = node_id_of(env.node_rank);
  launch::Store store = job.store.prefixed("gloo/world/");
  // A test hook: this rank exits after arriving, before publishing its address.
  if (env::integer("NDMESH_TEST_EXIT_BEFORE_GLOO", 0, 0, 1) == 1) std::_Exit(3);
  std::shared_ptr<::gloo::rendezvous::Context> ctx;
  {
    WorldGuard guard(store, env, deadline, timeout_s);
    try {
      ctx = GlooComm::connect(store, static_cast<int>(env.rank), static_cast<int>(env.world_size), deadline);
    } catch (const std::exception& e) {
      // A store wait cut at the deadline: the guard names the ranks and ends the process.
      if (Clock::now() + std::chrono::milliseconds(100) >= deadline)
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
      if (dynamic_cast<const Error*>(&e) != nullptr) throw;
      fail<>("comm", "gloo could not connect the world of {} ranks: {}", env.world_size, e.what());
    }
  }
  std::vector<std::int64_t> members(static_cast<std::size_t>(env.world_size));
  for (std::size_t i = 0; i < members.size(); ++i) members[i] = static_cast<std::int64_t>(i);
  log::debug("[comm] gloo world of {} ranks over TCP at {}", env.world_size, attr.hostname);
  return std::make_shared<GlooComm>(std::move(ctx), store, node_id, std::move(members));
}

}  // namespace ndmesh::comm::gloo
