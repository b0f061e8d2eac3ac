// A fake of StreamOps (core/streams.hpp) for the CPU tests of stream-ordered code: streams
// are queues of records, waits and "kernels" (host functions) that run only when the test
// says so (run()), so a test decides which stream is slow and sees what the order allows.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <stdexcept>
#include <vector>

#include "ndmesh/core/streams.hpp"

namespace ndmesh::testing {

class FakeStreams final : public StreamOps {
 public:
  struct EventState {
    long recorded = 0;  // records enqueued
    long passed = 0;    // records run
    bool live = true;
  };

  /// A new stream.
  void* stream() {
    streams_.push_back(std::make_unique<Queue>());
    return streams_.back().get();
  }
  /// Enqueues a kernel on `s`.
  void launch(void* s, std::function<void()> fn) {
    q(s).push_back({Item::kKernel, nullptr, 0, std::move(fn)});
  }
  /// Runs `s` until it is empty or waits for an event that has not passed; the items run.
  int run(void* s) {
    int n = 0;
    Queue& queue = q(s);
    while (!queue.empty()) {
      Item& it = queue.front();
      if (it.kind == Item::kWait && it.event->passed < it.gen) break;
      if (it.kind == Item::kRecord) it.event->passed = it.gen;
      if (it.kind == Item::kKernel) it.fn();
      queue.pop_front();
      ++n;
    }
    return n;
  }
  /// Runs every stream until none can go on.
  void run_all() {
    for (bool more = true; more;) {
      more = false;
      for (auto& s : streams_) more = run(s.get()) > 0 || more;
    }
  }
  std::size_t queued(void* s) { return q(s).size(); }
  int live_events() const {
    int n = 0;
    for (const auto& e : events_) n += e->live ? 1 : 0;
    return n;
  }

  void* create_event() override {
    events_.push_back(std::make_unique<EventState>());
    return events_.back().get();
  }
  void destroy_event(void* e) noexcept override { static_cast<EventState*>(e)->live = false; }
  void record(void* e, void* s) override {
    auto* ev = live(e);
    q(s).push_back({Item::kRecord, ev, ++ev->recorded, {}});
  }
  void wait(void* s, void* e) override {
    auto* ev = live(e);
    q(s).push_back({Item::kWait, ev, ev->recorded, {}});  // the record enqueued last, as CUDA
  }
  bool query(void* e) override {
    auto* ev = live(e);
    return ev->passed == ev->recorded;
  }

 private:
  struct Item {
    enum Kind { kRecord, kWait, kKernel } kind;
    EventState* event;
    long gen;
    std::function<void()> fn;
  };
  using Queue = std::deque<Item>;
  Queue& q(void* s) { return *static_cast<Queue*>(s); }
  EventState* live(void* e) {
    auto* ev = static_cast<EventState*>(e);
    if (!ev->live) throw std::logic_error("an event used after destroy_event");
    return ev;
  }
  std::vector<std::unique_ptr<Queue>> streams_;
  std::vector<std::unique_ptr<EventState>> events_;
};

}  // namespace ndmesh::testing
