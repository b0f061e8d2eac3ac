// The stream-ordering state machine of device communicators (comm/stream_order.hpp).
#include "ndmesh/comm/stream_order.hpp"

#include "ndmesh/core/error.hpp"

namespace ndmesh::comm {

Event make_event(StreamOps& ops) {
  return Event(ops.create_event(), [o = &ops](void* e) { o->destroy_event(e); });
}

void StreamOrder::begin() {
  NDMESH_CHECK(state_ == State::kNew, "comm", "a stream-ordered operation began twice");
  Event ready = make_event(*ops_);
  ops_->record(ready.get(), compute_);
  ops_->wait(comm_, ready.get());
  state_ = State::kOrdered;
}

void StreamOrder::end() {
  NDMESH_CHECK(state_ == State::kOrdered, "comm", "a stream-ordered operation ended before it began");
  done_ = make_event(*ops_);
  ops_->record(done_.get(), comm_);
  state_ = State::kEnqueued;
}

void StreamOrder::join() {
  if (state_ == State::kJoined) return;
  NDMESH_CHECK(state_ == State::kEnqueued, "comm",
               "a stream-ordered operation joined before it was enqueued");
  ops_->wait(compute_, done_.get());
  state_ = State::kJoined;
}

bool StreamOrder::passed() const { return done_ != nullptr && ops_->query(done_.get()); }

void PendingOps::add(Op op) {
  std::lock_guard lock(mutex_);
  ops_list_.push_back(std::move(op));
}

std::optional<PendingOps::Op> PendingOps::expired(Clock::time_point now) {
  std::lock_guard lock(mutex_);
  while (!ops_list_.empty() && ops_->query(ops_list_.front().done.get())) ops_list_.pop_front();
  for (const Op& o : ops_list_)
    if (now - o.start >= std::chrono::duration<double>(o.timeout_s)) return o;
  return std::nullopt;
}

std::size_t PendingOps::size() const {
  std::lock_guard lock(mutex_);
  return ops_list_.size();
}

}  // namespace ndmesh::comm
