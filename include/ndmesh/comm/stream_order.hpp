// Stream-ordered communication (docs/comm.md, "On GPUs"): the state machine of one
// operation of a device communicator, and the list of operations the watchdog watches.
// Written against StreamOps (core/streams.hpp) so that it is tested on the CPU with a fake
// stream; the NCCL backend runs it on cudaStream_t and cudaEvent_t.
//
// An operation goes kNew -> begin() -> kOrdered -> end() -> kEnqueued -> join() -> kJoined:
//   begin(): an event recorded on the compute stream, and the communication stream waits
//            for it (the operation sees every kernel enqueued before it);
//   (the backend enqueues the operation on the communication stream)
//   end():   an event recorded on the communication stream after the operation;
//   join():  the compute stream waits for that event: what is enqueued there later sees the
//            result. No step blocks the host; the host polls the event with passed().
// A Work of a device communicator is complete once joined: its result is ordered before
// everything the rank does next on the device, and a host read of it goes through the
// compute stream (copy_to_host), which waits for the event.
#pragma once

#include <chrono>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "ndmesh/core/streams.hpp"

namespace ndmesh::comm {

/// An event, destroyed with its last handle.
using Event = std::shared_ptr<void>;
Event make_event(StreamOps& ops);

class StreamOrder {
 public:
  enum class State { kNew, kOrdered, kEnqueued, kJoined };
  StreamOrder(StreamOps& ops, void* compute_stream, void* comm_stream)
      : ops_(&ops), compute_(compute_stream), comm_(comm_stream) {}
  /// The communication stream waits for what the compute stream holds now.
  void begin();
  /// The operation is enqueued: records the event that passes after it.
  void end();
  /// The compute stream waits for the operation (no host wait); idempotent.
  void join();
  /// Polls the end event (false before end()).
  bool passed() const;
  State state() const { return state_; }
  /// The event recorded by end() (empty before).
  const Event& done() const { return done_; }

 private:
  StreamOps* ops_;
  void* compute_;
  void* comm_;
  State state_ = State::kNew;
  Event done_;
};

/// The operations of one communicator whose end event the host has not seen pass yet,
/// oldest first. Thread-safe: the rank's threads add, the watchdog polls.
class PendingOps {
 public:
  using Clock = std::chrono::steady_clock;
  struct Op {
    Event done;
    std::string op;     ///< "all_reduce"
    std::string group;  ///< "tp"
    Clock::time_point start;
    double timeout_s = 0;
  };
  explicit PendingOps(StreamOps& ops) : ops_(&ops) {}
  void add(Op op);
  /// Drops the operations whose event has passed (in order: a stream runs in order) and
  /// returns the oldest one still pending past its own timeout at `now`, if any.
  std::optional<Op> expired(Clock::time_point now);
  std::size_t size() const;

 private:
  StreamOps* ops_;
  mutable std::mutex mutex_;
  std::deque<Op> ops_list_;
};

}  // namespace ndmesh::comm
