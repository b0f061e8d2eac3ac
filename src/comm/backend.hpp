// The backend seam: what a communication engine implements. One folder per backend
// under src/backends/<name>/ provides a CommImpl for the world; the Communicator handle,
// timeouts, avg, argument checks and messages live in src/comm and are shared by all.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ndmesh/comm/communicator.hpp"
#include "ndmesh/core/dtype.hpp"
#include "ndmesh/launch/store.hpp"

namespace ndmesh::comm::detail {

/// Why a communicator was ended by Communicator::abort() (or, on a group whose failures
/// stay inside it, by its timeout): the first call wins. Shared with the tasks a backend
/// runs on other threads, which may outlive the communicator.
class AbortState {
 public:
  /// Records the reason; false when one was recorded before (nothing changes).
  bool record(std::string_view component, const std::string& why, bool timed_out);
  bool set() const { return set_.load(std::memory_order_acquire); }
  /// Throws the recorded reason (TimeoutError when timed out, else Aborted); nothing when unset.
  void throw_if_set() const;
  /// The recorded component and whether it was a timeout (empty and false when unset).
  std::string component() const;
  bool timed_out() const;

 private:
  std::atomic<bool> set_{false};
  mutable std::mutex mutex_;
  std::string component_, why_;
  bool timed_out_ = false;
};

/// One operation in flight on a backend.
class WorkImpl {
 public:
  virtual ~WorkImpl() = default;
  /// Polls without blocking: true once complete. Throws Error on a backend failure.
  virtual bool test() = 0;
};

/// A backend communicator. Operations start nonblocking work; the caller polls it
/// against the deadline. Reductions never see ReduceOp::kAvg (the caller sums, then
/// divides).
class CommImpl {
 public:
  virtual ~CommImpl() = default;
  virtual std::string_view backend() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// World ranks of the members in group-rank order.
  const std::vector<std::int64_t>& members() const { return members_; }
  /// The node (host name) of a world rank; empty when the backend does not know it.
  virtual std::string_view host_of(std::int64_t /*world_rank*/) const { return {}; }
  /// The most elements one call may carry (counts above it are chunked or refused).
  virtual std::size_t max_count() const = 0;

  /// Blocking split; nullptr for a member without color.
  virtual std::shared_ptr<CommImpl> split(std::optional<std::int64_t> color, std::int64_t key) = 0;
  /// A communicator of this process alone; local, no communication.
  virtual std::shared_ptr<CommImpl> self() = 0;
  /// Blocking split into the members that share memory (one node).
  virtual std::shared_ptr<CommImpl> split_node() = 0;
  /// Blocking duplicate: the same members, a separate message space. The default is a
  /// split with one color, which every backend's split makes.
  virtual std::shared_ptr<CommImpl> dup() { return split(0, rank()); }
  /// True when `data` is device memory that this backend reduces, scatters and gathers
  /// itself (the device communicators: nccl, staged). For such buffers the Communicator
  /// passes ReduceOp::kAvg through, touches no element on the host, and an in-place
  /// reduce_scatter's output is this rank's block of the input.
  virtual bool handles_device(const void* /*data*/) const { return false; }
  /// Sets up the point-to-point connections with `peers` (both directions) before the first
  /// message: Communicator::connect_peers. Nothing on backends that connect on demand.
  virtual std::unique_ptr<WorkImpl> connect_peers(std::span<const int> /*peers*/, bool /*blocking*/) {
    return nullptr;
  }
  /// Empty when any thread may call any operation at any time; otherwise why not.
  virtual std::string thread_limit() const { return {}; }
  /// A Work waiting on this backend calls this between polls: a backend whose operations
  /// complete without being polled (in-process ranks) sleeps until one of this job's
  /// operations completed since the calling thread's last poll, or `at_most`, and returns
  /// true. Engines that progress only inside their calls (MPI) return false at once.
  virtual bool wait_for_progress(std::chrono::microseconds at_most) {
    (void)at_most;
    return false;
  }

  // Each operation either completes before returning (blocking: returns nullptr; the
  // caller guards it with the watchdog) or starts nonblocking work that the caller polls.
  virtual std::unique_ptr<WorkImpl> barrier(bool blocking) = 0;
  virtual std::unique_ptr<WorkImpl> broadcast(ElementSpan data, int root, bool blocking) = 0;
  virtual std::unique_ptr<WorkImpl> all_reduce(ElementSpan data, ReduceOp op, bool blocking) = 0;
  virtual std::unique_ptr<WorkImpl> reduce_scatter(ElementSpan in, ElementSpan out, ReduceOp op,
                                                   bool blocking) = 0;
  virtual std::unique_ptr<WorkImpl> all_gather(ElementSpan in, ElementSpan out, bool blocking) = 0;
  virtual std::unique_ptr<WorkImpl> all_to_all(ElementSpan in, ElementSpan out, bool blocking) = 0;
  /// Counts per member (validated by the caller: size() of them, summing to in/out.count);
  /// a backend copies what it keeps past the call. The default refuses, naming the backend.
  virtual std::unique_ptr<WorkImpl> all_to_all_v(ElementSpan in, std::span<const std::int64_t> send_counts,
                                                 ElementSpan out, std::span<const std::int64_t> recv_counts,
                                                 bool blocking);
  virtual std::unique_ptr<WorkImpl> send(ElementSpan data, int peer, int tag, bool blocking) = 0;
  virtual std::unique_ptr<WorkImpl> recv(ElementSpan data, int peer, int tag, bool blocking) = 0;

  /// Ends every process of the job with `code`; never returns. Callable from any
  /// thread (the watchdog's) while another thread is inside a blocking call.
  [[noreturn]] virtual void abort_job(int code) = 0;
  /// A backend whose ranks are threads of this process (inproc) ends the job without
  /// ending the process: it makes every operation of every rank in flight or started
  /// later throw (TimeoutError("[component] message") when `timed_out`, else
  /// JobAborted) and returns true; the caller then throws the same on its own thread.
  /// Callable from any thread (the watchdog's). Other backends return false and the
  /// caller prints the message and calls abort_job().
  virtual bool interrupt(std::string_view component, const std::string& message, bool timed_out) {
    (void)component, (void)message, (void)timed_out;
    return false;
  }

  /// Communicator::abort(): records why, then end_in_flight() ends what the backend can end
  /// now. Callable from any thread, more than once (the first reason stays).
  void abort(std::string_view component, const std::string& why, bool timed_out) {
    if (abort_->record(component, why, timed_out)) end_in_flight(why);
  }
  const AbortState& abort_state() const { return *abort_; }
  /// The bound of operations called without Options::timeout_s; 0: default_timeout_s().
  virtual double default_timeout_s() const { return 0; }

 protected:
  /// What abort() ends at once beyond refusing later operations (which the Communicator
  /// does for every backend): the operations in flight, on this rank and, where the
  /// transport lets a peer notice, on the members waiting for this one. Nothing by default
  /// (MPI and NCCL here cannot cancel an operation in flight).
  virtual void end_in_flight(const std::string& why) { (void)why; }

  std::vector<std::int64_t> members_;
  std::shared_ptr<AbortState> abort_ = std::make_shared<AbortState>();
};

/// What the Communicator call now starting on this thread is (set around a backend's
/// start of an operation), for backends that watch their operations themselves after
/// the call returned (the device communicators).
struct CallSite {
  const char* op = "";
  const std::string* group = nullptr;
  double timeout_s = 0;
};
const CallSite& current_call();

/// Runs `poll` on the watchdog's thread at every tick (about 10 ms) for the rest of the
/// process; it may end the job (a device backend's stuck or failed operations).
void add_watchdog_poll(std::function<void()> poll);

/// The backend communicator behind a handle (nullptr for the empty handle): what a
/// device communicator wraps.
std::shared_ptr<CommImpl> impl_of(const Communicator& c);

/// The job's TCP store under a launch without MPI (torchrun), once Communicator::world()
/// has run the rendezvous; nullptr under MPI launchers. Backends bootstrap through it
/// (NCCL: store.share("nccl/<group>/id", rank == 0, id)).
const launch::Store* job_store();

/// The elements per call a backend with limit `backend_limit` may use now (the limit,
/// or the smaller cap set by testing::set_max_count_per_call).
std::size_t count_limit(std::size_t backend_limit);

/// InternalError naming `op` when a block collective's per-rank `count` exceeds
/// count_limit(backend_limit) (the block collectives are not chunked).
void check_block_count(std::string_view op, std::size_t count, std::size_t backend_limit);

/// The Gloo reduce-scatter algorithm set by testing::set_gloo_reduce_scatter (kAuto unless set).
testing::GlooReduceScatter gloo_reduce_scatter();

/// Overrides default_timeout_s() on the calling thread (the ranks of an in-process job);
/// 0 restores NDMESH_TIMEOUT_S.
void set_thread_default_timeout(double seconds);

}  // namespace ndmesh::comm::detail
