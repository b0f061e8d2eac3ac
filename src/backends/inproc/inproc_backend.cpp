// The in-process backend (see ndmesh/comm/inproc.hpp for what callers see). One Job holds
// every rank of a run; one mutex guards all of its state, which is small: per communicator
// (Context) the collectives not yet complete, by position, and the unmatched sends and
// posted receives, by destination. Whoever completes an operation (the last member of a
// collective, the second side of a message) does its copies and reductions under the lock
// and wakes the ranks taking part (each rank has a condition variable and a count of the
// operations of its that completed: waking all ranks at every completion costs O(ranks^2)
// wake-ups per ring step); a blocking call waits on its rank's condition variable, a Work
// polls. Buffers of the other members are touched only while their owners wait for the
// operation, which is the contract of every Communicator call; the mutex orders those
// accesses for ThreadSanitizer too.
//
// Ending a job: the first failure (a timeout that the watchdog or a Work's deadline
// reports through interrupt(), abort_job(), or an exception out of a rank's body) marks
// the job failed and wakes everyone; from then on every wait and every new operation of
// the job throws. run() rethrows the exception of the rank that ended the job.
#include "ndmesh/comm/inproc.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backends/inproc/inproc_backend.hpp"
#include "comm/backend.hpp"
#include "ndmesh/core/error.hpp"
#include "ndmesh/core/log.hpp"

namespace ndmesh::comm::inproc {

// memcpy for a block that may be empty: an empty block's pointer may be null, which memcpy
// does not allow even for 0 bytes.
inline void copy_bytes(void* dst, const void* src, std::size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
}

namespace {

using detail::CommImpl;
using detail::WorkImpl;

enum class Kind { kBarrier, kBroadcast, kAllReduce, kReduceScatter, kAllGather, kAllToAll, kAllToAllV, kSplit };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kBarrier:
      return "barrier";
    case Kind::kBroadcast:
      return "broadcast";
    case Kind::kAllReduce:
      return "all_reduce";
    case Kind::kReduceScatter:
      return "reduce_scatter";
    case Kind::kAllGather:
      return "all_gather";
    case Kind::kAllToAll:
      return "all_to_all";
    case Kind::kAllToAllV:
      return "all_to_all_v";
    case Kind::kSplit:
      return "split";
  }
  return "?";
}

// What one member brings to a collective.
struct Part {
  bool arrived = false;
  Kind kind = Kind::kBarrier;
  ElementSpan in, out;
  int root = -1;
  ReduceOp op = ReduceOp::kSum;
  std::optional<std::int64_t> color;  // split
  std::int64_t key = 0;
  std::vector<std::int64_t> send_counts, recv_counts;  // all_to_all_v, by group rank
};

// "all_reduce of 8 float32 (sum)": one member's call, for mismatch messages.
std::string describe(const Part& p) {
  switch (p.kind) {
    case Kind::kBarrier:
    case Kind::kSplit:
      return kind_name(p.kind);
    case Kind::kBroadcast:
      return fmt::format("broadcast of {} {} from root {}", p.out.count, dtype_name(p.out.dtype), p.root);
    case Kind::kAllReduce:
      return fmt::format("all_reduce of {} {} ({})", p.out.count, dtype_name(p.out.dtype),
                         reduce_op_name(p.op));
    case Kind::kReduceScatter:
      return fmt::format("reduce_scatter of {} {} into {} ({})", p.in.count, dtype_name(p.in.dtype),
                         p.out.count, reduce_op_name(p.op));
    case Kind::kAllGather:
      return fmt::format("all_gather of {} {} into {}", p.in.count, dtype_name(p.in.dtype), p.out.count);
    case Kind::kAllToAll:
      return fmt::format("all_to_all of {} {}", p.in.count, dtype_name(p.in.dtype));
    case Kind::kAllToAllV:
      return fmt::format("all_to_all_v of {} {} (counts {}) into {} (counts {})", p.in.count,
                         dtype_name(p.in.dtype), fmt::join(p.send_counts, ","), p.out.count,
                         fmt::join(p.recv_counts, ","));
  }
  return "?";
}

bool same_call(const Part& a, const Part& b) {
  if (a.kind != b.kind) return false;
  if (a.kind == Kind::kBarrier || a.kind == Kind::kSplit) return true;
  if (a.kind == Kind::kAllToAllV) return a.in.dtype == b.in.dtype;  // counts: checked pairwise
  return a.in.count == b.in.count && a.out.count == b.out.count && a.in.dtype == b.in.dtype &&
         a.out.dtype == b.out.dtype && a.root == b.root && a.op == b.op;
}

// One collective on one communicator.
struct Slot {
  std::uint64_t index = 0;  // its position on the communicator
  std::vector<Part> parts;  // by group rank
  int arrived = 0;
  bool done = false;
  std::string error;
  std::vector<std::shared_ptr<CommImpl>> children;  // split: each member's new communicator
};

// One posted send or receive.
struct Message {
  bool send = false;
  int src = 0, dst = 0, tag = 0;  // group ranks
  ElementSpan data;
  bool done = false;
  std::string error;
};

// The shared state of one communicator.
struct Context {
  explicit Context(std::vector<std::int64_t> m)
      : members(std::move(m)), next_slot(members.size(), 0), sends(members.size()), recvs(members.size()) {}
  std::vector<std::int64_t> members;                     // world ranks, by group rank
  std::vector<std::uint64_t> next_slot;                  // per member: the position of its next collective
  std::map<std::uint64_t, std::shared_ptr<Slot>> slots;  // collectives some member has not joined yet
  std::vector<std::deque<std::shared_ptr<Message>>> sends, recvs;  // unmatched, by destination
  // Communicator::abort() by any member ends the group for all (as closed connections do).
  std::shared_ptr<detail::AbortState> aborted = std::make_shared<detail::AbortState>();
  // The ranks its members show (Communicator::members()): the world ranks, but 0..size-1 in
  // a group of connect_group() and the groups split from it, as in a job of their own.
  std::vector<std::int64_t> shown;
  // A group of connect_group(): its failures abort it instead of ending the job.
  bool contained = false;
  double timeout_s = 0;  // its operations' default (0: the job's)
};

// Where the members of a connect_group() group meet.
struct Meeting {
  std::vector<std::int64_t> world_ranks;  // by group rank; -1 until arrived
  int arrived = 0;
  std::shared_ptr<Context> ctx;  // made by the last to arrive
};

struct Job {
  Job(int n, std::int64_t rpn)
      : size(n),
        ranks_per_node(rpn),
        finished(static_cast<std::size_t>(n), false),
        signals(static_cast<std::size_t>(n)) {}
  const int size;
  const std::int64_t ranks_per_node;
  bool tagless = false;  // JobOptions::tagless (set before the ranks start)
  // make_self_world(): the process's own world of one, named "self"; abort_job ends the
  // process, as MPI_Abort ends a job.
  bool process = false;
  std::mutex mutex;
  // The failure that ended the job (guarded by mutex).
  bool failed = false, timed_out = false;
  int failed_rank = -1;
  std::string component, message;  // a timeout's (TimeoutError(component, message))
  std::string what;                // the full message, for JobAborted
  std::vector<bool> finished;      // rank bodies that returned normally
  // Per world rank: woken when an operation it takes part in completes, with the count of them.
  struct Signal {
    std::condition_variable cv;
    std::uint64_t completions = 0;
  };
  std::vector<Signal> signals;
  std::map<std::string, std::shared_ptr<Meeting>> meetings;  // connect_group(), by key

  // Lock held.
  void wake(std::int64_t world_rank) {
    Signal& s = signals[static_cast<std::size_t>(world_rank)];
    ++s.completions;
    s.cv.notify_all();
  }
  // Lock held: a failure, or a rank that returned (its peers' waits may end).
  void wake_all() {
    for (Signal& s : signals) s.cv.notify_all();
  }

  // Lock held.
  void fail(int rank, std::string_view comp, const std::string& msg, bool timeout) {
    if (failed) return;
    failed = true;
    timed_out = timeout;
    failed_rank = rank;
    component = comp;
    message = msg;
    what = comp.empty() ? msg : fmt::format("[{}] {}", comp, msg);
    wake_all();
  }
  // Lock held.
  [[noreturn]] void throw_failure() const {
    if (timed_out) throw TimeoutError(component, message);
    throw JobAborted("comm", fmt::format("the in-process job was ended by rank {}: {}", failed_rank, what));
  }
};

// The completion count of the calling thread's rank at its last poll (wait_for_progress).
thread_local std::uint64_t t_seen_completions = 0;

// An operation in flight, as seen by one member.
struct Pending {
  std::shared_ptr<Context> ctx;
  int rank = 0;
  std::shared_ptr<Slot> slot;    // collectives
  std::shared_ptr<Message> msg;  // send / recv
};

// Lock held. True when the operation is complete; throws when it failed, when the job
// ended, or when the member it waits for has returned from its body (which ends the job:
// nothing can complete the operation any more, as in a deadlock).
bool settle(Job& job, const Pending& p) {
  const auto& m = p.ctx->members;
  t_seen_completions = job.signals[static_cast<std::size_t>(m[static_cast<std::size_t>(p.rank)])].completions;
  p.ctx->aborted->throw_if_set();
  if (p.slot) {
    if (p.slot->done) {
      if (!p.slot->error.empty()) throw Error("comm", p.slot->error);
      return true;
    }
  } else if (p.msg->done) {
    if (!p.msg->error.empty()) throw Error("comm", p.msg->error);
    return true;
  }
  if (job.failed) job.throw_failure();
  std::string gone;
  if (p.slot) {
    for (std::size_t i = 0; i < p.slot->parts.size() && gone.empty(); ++i)
      if (!p.slot->parts[i].arrived && job.finished[static_cast<std::size_t>(m[i])])
        gone = fmt::format(
            "rank {} of the group (world rank {}, group of ranks {}) returned from its body without joining "
            "collective #{} ({}); every member must make the same collective calls in the same order",
            i, m[i], fmt::join(m, ","), p.slot->index,
            describe(p.slot->parts[static_cast<std::size_t>(p.rank)]));
  } else {
    const int peer = p.msg->send ? p.msg->dst : p.msg->src;
    if (job.finished[static_cast<std::size_t>(m[static_cast<std::size_t>(peer)])])
      gone = fmt::format(
          "{} rank {} (world {}) with tag {}: that rank returned from its body without the matching {}",
          p.msg->send ? "send to" : "recv from", peer, m[static_cast<std::size_t>(peer)], p.msg->tag,
          p.msg->send ? "recv" : "send");
  }
  if (gone.empty()) return false;
  if (p.ctx->contained) {  // the group ends, not the job
    if (p.ctx->aborted->record("comm", gone, false))
      for (std::int64_t r : m) job.wake(r);
    throw Error("comm", gone);
  }
  job.fail(static_cast<int>(m[static_cast<std::size_t>(p.rank)]), "comm", gone, false);
  throw Error("comm", gone);
}

template <typename T>
T combine(T a, T b, ReduceOp op) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    return BFloat16(combine(static_cast<float>(a), static_cast<float>(b), op));
  } else {
    switch (op) {
      case ReduceOp::kMax:
        return std::max(a, b);
      case ReduceOp::kMin:
        return std::min(a, b);
      default:
        return static_cast<T>(a + b);
    }
  }
}

// Element j of block `block` (of `n` elements) of member i's span.
template <typename T>
const T* block_of(const ElementSpan& s, std::size_t block, std::size_t n) {
  return static_cast<const T*>(s.data) + block * n;
}

template <typename T>
void compute(Slot& slot) {
  auto& parts = slot.parts;
  const std::size_t p = parts.size();
  // Every result is computed before any output is written: outputs may alias inputs.
  switch (parts[0].kind) {
    case Kind::kBroadcast: {
      const Part& root = parts[static_cast<std::size_t>(parts[0].root)];
      for (const Part& q : parts)
        if (q.out.data != root.out.data) copy_bytes(q.out.data, root.out.data, root.out.bytes());
      break;
    }
    case Kind::kAllReduce: {
      const std::size_t n = parts[0].out.count;
      std::vector<T> acc(static_cast<const T*>(parts[0].out.data),
                         static_cast<const T*>(parts[0].out.data) + n);
      for (std::size_t i = 1; i < p; ++i) {
        const T* x = static_cast<const T*>(parts[i].out.data);
        for (std::size_t j = 0; j < n; ++j) acc[j] = combine(acc[j], x[j], parts[0].op);
      }
      for (const Part& q : parts) copy_bytes(q.out.data, acc.data(), n * sizeof(T));
      break;
    }
    case Kind::kReduceScatter: {
      const std::size_t n = parts[0].out.count;
      std::vector<T> acc(p * n);
      for (std::size_t r = 0; r < p; ++r) {
        T* a = acc.data() + r * n;
        std::copy_n(block_of<T>(parts[0].in, r, n), n, a);
        for (std::size_t i = 1; i < p; ++i) {
          const T* x = block_of<T>(parts[i].in, r, n);
          for (std::size_t j = 0; j < n; ++j) a[j] = combine(a[j], x[j], parts[0].op);
        }
      }
      for (std::size_t r = 0; r < p; ++r) copy_bytes(parts[r].out.data, acc.data() + r * n, n * sizeof(T));
      break;
    }
    case Kind::kAllGather: {
      const std::size_t n = parts[0].in.count;
      std::vector<T> all(p * n);
      for (std::size_t i = 0; i < p; ++i)
        std::copy_n(static_cast<const T*>(parts[i].in.data), n, all.data() + i * n);
      for (const Part& q : parts) copy_bytes(q.out.data, all.data(), p * n * sizeof(T));
      break;
    }
    case Kind::kAllToAll: {
      const std::size_t n = parts[0].in.count / p;
      std::vector<T> all(p * p * n);  // member j's output, block i = member i's input block j
      for (std::size_t j = 0; j < p; ++j)
        for (std::size_t i = 0; i < p; ++i)
          std::copy_n(block_of<T>(parts[i].in, j, n), n, all.data() + (j * p + i) * n);
      for (std::size_t j = 0; j < p; ++j)
        copy_bytes(parts[j].out.data, all.data() + j * p * n, p * n * sizeof(T));
      break;
    }
    case Kind::kAllToAllV: {
      // Every member's input is read in full before any output is written.
      std::vector<std::vector<T>> results(p);
      for (std::size_t j = 0; j < p; ++j) {
        std::size_t total = 0;
        for (std::int64_t c : parts[j].recv_counts) total += static_cast<std::size_t>(c);
        results[j].resize(total);
        std::size_t at = 0;
        for (std::size_t i = 0; i < p; ++i) {
          std::size_t offset = 0;
          for (std::size_t k = 0; k < j; ++k) offset += static_cast<std::size_t>(parts[i].send_counts[k]);
          const auto n = static_cast<std::size_t>(parts[i].send_counts[j]);
          std::copy_n(static_cast<const T*>(parts[i].in.data) + offset, n, results[j].data() + at);
          at += n;
        }
      }
      for (std::size_t j = 0; j < p; ++j)
        copy_bytes(parts[j].out.data, results[j].data(), results[j].size() * sizeof(T));
      break;
    }
    case Kind::kBarrier:
    case Kind::kSplit:
      break;
  }
}

class InprocComm final : public CommImpl {
 public:
  InprocComm(std::shared_ptr<Job> job, std::shared_ptr<Context> ctx, int rank)
      : job_(std::move(job)),
        ctx_(std::move(ctx)),
        rank_(rank),
        size_(static_cast<int>(ctx_->members.size())) {
    members_ = ctx_->shown.empty() ? ctx_->members : ctx_->shown;
    abort_ = ctx_->aborted;
  }

  std::string_view backend() const override { return job_->process ? "self" : "inproc"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::size_t max_count() const override { return std::numeric_limits<std::size_t>::max(); }

  std::shared_ptr<CommImpl> split(std::optional<std::int64_t> color, std::int64_t key) override {
    Part part{.kind = Kind::kSplit, .color = color, .key = key};
    std::unique_lock lock(job_->mutex);
    Pending p = arrive(part);
    signal().cv.wait(lock, [&] { return settle(*job_, p); });
    return p.slot->children[static_cast<std::size_t>(rank_)];
  }

  std::shared_ptr<CommImpl> self() override {
    auto ctx = std::make_shared<Context>(std::vector<std::int64_t>{world_rank()});
    if (!ctx_->shown.empty()) ctx->shown = {ctx_->shown[static_cast<std::size_t>(rank_)]};
    return std::make_shared<InprocComm>(job_, std::move(ctx), 0);
  }

  std::shared_ptr<CommImpl> split_node() override {
    const std::int64_t rpn = job_->ranks_per_node;
    return split(rpn > 0 ? world_rank() / rpn : 0, rank_);
  }

  std::unique_ptr<WorkImpl> barrier(bool blocking) override {
    return collective({.kind = Kind::kBarrier}, blocking);
  }
  std::unique_ptr<WorkImpl> broadcast(ElementSpan data, int root, bool blocking) override {
    return collective({.kind = Kind::kBroadcast, .in = data, .out = data, .root = root}, blocking);
  }
  std::unique_ptr<WorkImpl> all_reduce(ElementSpan data, ReduceOp op, bool blocking) override {
    return collective({.kind = Kind::kAllReduce, .in = data, .out = data, .op = op}, blocking);
  }
  std::unique_ptr<WorkImpl> reduce_scatter(ElementSpan in, ElementSpan out, ReduceOp op,
                                           bool blocking) override {
    return collective({.kind = Kind::kReduceScatter, .in = in, .out = out, .op = op}, blocking);
  }
  std::unique_ptr<WorkImpl> all_gather(ElementSpan in, ElementSpan out, bool blocking) override {
    return collective({.kind = Kind::kAllGather, .in = in, .out = out}, blocking);
  }
  std::unique_ptr<WorkImpl> all_to_all(ElementSpan in, ElementSpan out, bool blocking) override {
    return collective({.kind = Kind::kAllToAll, .in = in, .out = out}, blocking);
  }

  std::unique_ptr<WorkImpl> all_to_all_v(ElementSpan in, std::span<const std::int64_t> send_counts, ElementSpan out,
                                         std::span<const std::int64_t> recv_counts, bool blocking) override {
    Part part{.kind = Kind::kAllToAllV, .in = in, .out = out};
    part.send_counts.assign(send_counts.begin(), send_counts.end());
    part.recv_counts.assign(recv_counts.begin(), recv_counts.end());
    return collective(std::move(part), blocking);
  }

  std::unique_ptr<WorkImpl> send(ElementSpan data, int peer, int tag, bool blocking) override {
    auto m =
        std::make_shared<Message>(Message{.send = true, .src = rank_, .dst = peer, .tag = tag, .data = data});
    std::unique_lock lock(job_->mutex);
    if (job_->failed) job_->throw_failure();
    ctx_->aborted->throw_if_set();
    auto& posted = ctx_->recvs[static_cast<std::size_t>(peer)];
    auto it = std::find_if(posted.begin(), posted.end(),
                           [&](const auto& r) { return r->src == rank_ && (job_->tagless || r->tag == tag); });
    if (it != posted.end()) {
      match(*m, **it);
      posted.erase(it);
    } else {
      ctx_->sends[static_cast<std::size_t>(peer)].push_back(m);
    }
    return finish(lock, Pending{.ctx = ctx_, .rank = rank_, .msg = std::move(m)}, blocking);
  }

  std::unique_ptr<WorkImpl> recv(ElementSpan data, int peer, int tag, bool blocking) override {
    auto m = std::make_shared<Message>(
        Message{.send = false, .src = peer, .dst = rank_, .tag = tag, .data = data});
    std::unique_lock lock(job_->mutex);
    if (job_->failed) job_->throw_failure();
    ctx_->aborted->throw_if_set();
    auto& unmatched = ctx_->sends[static_cast<std::size_t>(rank_)];
    auto it = std::find_if(unmatched.begin(), unmatched.end(),
                           [&](const auto& s) { return s->src == peer && (job_->tagless || s->tag == tag); });
    if (it != unmatched.end()) {
      match(**it, *m);
      unmatched.erase(it);
    } else {
      ctx_->recvs[static_cast<std::size_t>(rank_)].push_back(m);
    }
    return finish(lock, Pending{.ctx = ctx_, .rank = rank_, .msg = std::move(m)}, blocking);
  }

  [[noreturn]] void abort_job(int code) override {
    if (job_->process) {
      std::fflush(nullptr);
      std::_Exit(code);
    }
    const std::string message = fmt::format("rank {} ended the job with exit status {}", world_rank(), code);
    {
      std::lock_guard lock(job_->mutex);
      job_->fail(static_cast<int>(world_rank()), "comm", message, false);
    }
    throw JobAborted("comm", message);
  }

  bool wait_for_progress(std::chrono::microseconds at_most) override {
    std::unique_lock lock(job_->mutex);
    Job::Signal& s = signal();
    s.cv.wait_for(lock, at_most, [&] { return s.completions != t_seen_completions || job_->failed; });
    return true;
  }

  double default_timeout_s() const override { return ctx_->timeout_s; }

  bool interrupt(std::string_view component, const std::string& message, bool timed_out) override {
    if (ctx_->contained) {  // the group ends, not the job: its members' waits throw
      abort(component, message, timed_out);
      return true;
    }
    std::lock_guard lock(job_->mutex);
    job_->fail(static_cast<int>(world_rank()), component, message, timed_out);
    return true;
  }

 protected:
  // The group is ended for every member (they share the abort state): wake them all.
  void end_in_flight(const std::string& /*why*/) override {
    std::lock_guard lock(job_->mutex);
    for (std::int64_t r : ctx_->members) job_->wake(r);
  }

 private:
  class Work final : public WorkImpl {
   public:
    Work(std::shared_ptr<Job> job, Pending p) : job_(std::move(job)), p_(std::move(p)) {}
    bool test() override {
      std::lock_guard lock(job_->mutex);
      return settle(*job_, p_);
    }

   private:
    std::shared_ptr<Job> job_;
    Pending p_;
  };

  std::int64_t world_rank() const { return ctx_->members[static_cast<std::size_t>(rank_)]; }

 public:
  // connect_group(): waits under the job's lock until `size` members arrived under `key`.
  std::shared_ptr<CommImpl> meet(const std::string& key, int rank, int size, double timeout_s) {
    std::unique_lock lock(job_->mutex);
    std::shared_ptr<Meeting>& slot = job_->meetings[key];
    if (!slot) {
      slot = std::make_shared<Meeting>();
      slot->world_ranks.assign(static_cast<std::size_t>(size), -1);
    }
    const std::shared_ptr<Meeting> meeting = slot;
    NDMESH_CHECK(static_cast<int>(meeting->world_ranks.size()) == size &&
                     meeting->world_ranks[static_cast<std::size_t>(rank)] == -1,
                 "comm", "connect_group '{}': rank {} of {} arrived twice or with another size", key, rank, size);
    meeting->world_ranks[static_cast<std::size_t>(rank)] = world_rank();
    if (++meeting->arrived == size) {
      meeting->ctx = std::make_shared<Context>(meeting->world_ranks);
      meeting->ctx->contained = true;
      for (int r = 0; r < size; ++r) meeting->ctx->shown.push_back(r);
      meeting->ctx->timeout_s = timeout_s;
      job_->meetings.erase(key);
      for (std::int64_t r : meeting->world_ranks) job_->wake(r);
    }
    const double wait_s = timeout_s > 0 ? timeout_s : comm::default_timeout_s();
    const bool met = signal().cv.wait_for(lock, std::chrono::duration<double>(wait_s),
                                          [&] { return meeting->ctx != nullptr || job_->failed; });
    if (job_->failed) job_->throw_failure();
    if (!met)
      throw TimeoutError("comm", fmt::format("connect_group '{}': {} of {} members arrived within {:g} s", key,
                                             meeting->arrived, size, wait_s));
    return std::make_shared<InprocComm>(job_, meeting->ctx, rank);
  }

 private:
  Job::Signal& signal() const { return job_->signals[static_cast<std::size_t>(world_rank())]; }

  std::unique_ptr<WorkImpl> finish(std::unique_lock<std::mutex>& lock, Pending p, bool blocking) {
    if (!blocking) return std::make_unique<Work>(job_, std::move(p));
    signal().cv.wait(lock, [&] { return settle(*job_, p); });
    return nullptr;
  }

  std::unique_ptr<WorkImpl> collective(Part part, bool blocking) {
    std::unique_lock lock(job_->mutex);
    return finish(lock, arrive(part), blocking);
  }

  // Lock held: joins this member's next collective; the last member completes it.
  Pending arrive(Part part) {
    if (job_->failed) job_->throw_failure();
    ctx_->aborted->throw_if_set();
    const std::uint64_t index = ctx_->next_slot[static_cast<std::size_t>(rank_)]++;
    std::shared_ptr<Slot>& slot = ctx_->slots[index];
    if (!slot) {
      slot = std::make_shared<Slot>();
      slot->index = index;
      slot->parts.resize(ctx_->members.size());
    }
    part.arrived = true;
    slot->parts[static_cast<std::size_t>(rank_)] = part;
    Pending p{.ctx = ctx_, .rank = rank_, .slot = slot};
    if (++slot->arrived == size()) {
      complete(*slot);
      ctx_->slots.erase(index);
      for (std::int64_t r : ctx_->members) job_->wake(r);
    }
    return p;
  }

  // Lock held: every member has arrived.
  void complete(Slot& slot) {
    slot.done = true;
    const auto& parts = slot.parts;
    for (std::size_t i = 1; i < parts.size(); ++i)
      if (!same_call(parts[0], parts[i])) {
        slot.error = fmt::format(
            "collective #{} of the group of ranks {}: rank 0 calls {} but rank {} calls {}; every member "
            "must make "
            "the same collective calls in the same order",
            slot.index, fmt::join(ctx_->members, ","), describe(parts[0]), i, describe(parts[i]));
        return;
      }
    if (parts[0].kind == Kind::kSplit) {
      make_children(slot);
      return;
    }
    if (parts[0].kind == Kind::kBarrier) return;
    if (parts[0].kind == Kind::kAllToAllV)
      for (std::size_t i = 0; i < parts.size(); ++i)
        for (std::size_t j = 0; j < parts.size(); ++j)
          if (parts[i].send_counts[j] != parts[j].recv_counts[i]) {
            slot.error = fmt::format(
                "all_to_all_v #{} of the group of ranks {}: rank {} sends {} elements to rank {}, which expects {}; "
                "send_counts[j] of rank i must equal recv_counts[i] of rank j",
                slot.index, fmt::join(ctx_->members, ","), i, parts[i].send_counts[j], j, parts[j].recv_counts[i]);
            return;
          }
    const DType t = parts[0].kind == Kind::kBroadcast || parts[0].kind == Kind::kAllReduce
                        ? parts[0].out.dtype
                        : parts[0].in.dtype;
    visit_dtype(t, [&]<typename T>(T) { compute<T>(slot); });
  }

  // Lock held: one new context per color, members ordered by (key, rank).
  void make_children(Slot& slot) {
    const auto& parts = slot.parts;
    slot.children.assign(parts.size(), nullptr);
    std::map<std::int64_t, std::vector<int>> by_color;
    for (std::size_t i = 0; i < parts.size(); ++i)
      if (parts[i].color) by_color[*parts[i].color].push_back(static_cast<int>(i));
    for (auto& [color, ranks] : by_color) {
      std::stable_sort(ranks.begin(), ranks.end(), [&](int a, int b) {
        return parts[static_cast<std::size_t>(a)].key < parts[static_cast<std::size_t>(b)].key;
      });
      std::vector<std::int64_t> members;
      for (int r : ranks) members.push_back(ctx_->members[static_cast<std::size_t>(r)]);
      auto child = std::make_shared<Context>(std::move(members));
      if (!ctx_->shown.empty())
        for (int r : ranks) child->shown.push_back(ctx_->shown[static_cast<std::size_t>(r)]);
      for (std::size_t k = 0; k < ranks.size(); ++k)
        slot.children[static_cast<std::size_t>(ranks[k])] =
            std::make_shared<InprocComm>(job_, child, static_cast<int>(k));
    }
  }

  // Lock held: the receive takes the send's data; both complete.
  void match(Message& s, Message& r) {
    if (s.data.dtype != r.data.dtype || s.data.count != r.data.count)
      r.error = fmt::format(
          "recv from group rank {} expected {} {} elements but the message held {} {}; send and recv counts "
          "must "
          "match",
          r.src, r.data.count, dtype_name(r.data.dtype), s.data.count, dtype_name(s.data.dtype));
    else if (s.data.count > 0)
      copy_bytes(r.data.data, s.data.data, s.data.bytes());
    s.done = r.done = true;
    job_->wake(ctx_->members[static_cast<std::size_t>(s.src)]);
    if (s.dst != s.src) job_->wake(ctx_->members[static_cast<std::size_t>(s.dst)]);
  }

  std::shared_ptr<Job> job_;
  std::shared_ptr<Context> ctx_;
  int rank_, size_;
};

}  // namespace

Communicator connect_group(const Communicator& member, const std::string& key, int rank, int size,
                           const std::string& name, double timeout_s) {
  auto* any = dynamic_cast<InprocComm*>(detail::impl_of(member).get());
  NDMESH_CHECK(any != nullptr, "comm", "connect_group needs a communicator of an in-process job, got backend {}",
               member.backend());
  NDMESH_CHECK(size >= 1 && rank >= 0 && rank < size, "comm", "connect_group: rank {} of {} members", rank, size);
  return detail::make_communicator(any->meet(key, rank, size, timeout_s), name);
}

void run(int ranks, const std::function<void(const Communicator& world)>& body, const JobOptions& options) {
  NDMESH_CHECK(ranks >= 1, "comm", "an in-process job needs at least one rank, got {}", ranks);
  NDMESH_CHECK(options.ranks_per_node >= 0, "comm", "ranks_per_node={} must be >= 0", options.ranks_per_node);
  auto job = std::make_shared<Job>(ranks, options.ranks_per_node);
  job->tagless = options.tagless;
  std::vector<std::int64_t> members(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) members[static_cast<std::size_t>(r)] = r;
  auto world = std::make_shared<Context>(std::move(members));
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(ranks));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      log::set_thread_rank(r);
      detail::set_thread_default_timeout(options.timeout_s);
      try {
        body(detail::make_communicator(std::make_shared<InprocComm>(job, world, r), "world"));
        std::lock_guard lock(job->mutex);
        job->finished[static_cast<std::size_t>(r)] = true;
        job->wake_all();
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
        std::string what = "an exception that is not a std::exception";
        try {
          throw;
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        std::lock_guard lock(job->mutex);
        job->fail(r, "", fmt::format("{}", what), false);
      }
    });
  for (auto& t : threads) t.join();
  const int origin = job->failed_rank;
  if (origin >= 0 && errors[static_cast<std::size_t>(origin)])
    std::rethrow_exception(errors[static_cast<std::size_t>(origin)]);
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
  // Ended although every body returned: the failure was thrown inside a destructor (an
  // unwaited Work whose peer never came), which could only report it.
  std::lock_guard lock(job->mutex);
  if (job->failed) job->throw_failure();
}

std::shared_ptr<detail::CommImpl> make_self_world() {
  auto job = std::make_shared<Job>(1, 0);
  job->process = true;
  return std::make_shared<InprocComm>(job, std::make_shared<Context>(std::vector<std::int64_t>{0}), 0);
}

}  // namespace ndmesh::comm::inproc
