// The free lists of the device caching allocator (tensor/device.hpp) and its cross-stream
// rule, apart from CUDA (StreamOps) so that the rule is tested on the CPU with a fake stream.
//
// Blocks are used on the allocator's home stream (the compute stream), where reuse is
// ordered after every earlier use by the stream itself. A block that work on another stream
// (a communication stream) used is different: when it is given back, an event is recorded
// on each such stream, and the block is handed out again only once every one of those events
// has passed (PyTorch's recordStream rule), so a kernel on the compute stream never writes a
// buffer that a collective may still be reading.
//
// Not thread-safe: the allocator calls it under its lock.
#pragma once

#include <algorithm>
#include <cstddef>
#include <map>
#include <utility>
#include <vector>

#include "ndmesh/core/streams.hpp"

namespace ndmesh {

class BlockCache {
 public:
  /// `ops` may be null while no other stream exists (then note_use is never called).
  BlockCache(StreamOps* ops, void* home_stream) : ops_(ops), home_(home_stream) {}
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;
  ~BlockCache() {
    for (Pending& p : pending_)
      for (void* e : p.events) ops_->destroy_event(e);
  }

  void set_streams(StreamOps* ops, void* home_stream) { ops_ = ops, home_ = home_stream; }

  /// A cached block of exactly `size` bytes that the home stream may use now, or nullptr.
  void* take(std::size_t size) {
    sweep();
    auto it = free_.find(size);
    if (it == free_.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    return p;
  }

  /// Work enqueued now on `stream` uses block `p` (the block's base). Ignored for the home
  /// stream.
  void note_use(void* p, void* stream) {
    if (stream == home_ || stream == nullptr) return;
    std::vector<void*>& s = uses_[p];
    if (std::find(s.begin(), s.end(), stream) == s.end()) s.push_back(stream);
  }

  /// Gives back block `p` of `size` bytes.
  void give(void* p, std::size_t size) {
    auto it = uses_.find(p);
    if (it == uses_.end()) {
      free_[size].push_back(p);
      return;
    }
    Pending pend{p, size, {}};
    for (void* stream : it->second) {
      void* e = ops_->create_event();
      ops_->record(e, stream);
      pend.events.push_back(e);
    }
    uses_.erase(it);
    pending_.push_back(std::move(pend));
  }

  /// Removes and returns every block the home stream may use now (for a release of the
  /// cache); blocks still waiting for another stream stay.
  std::vector<std::pair<void*, std::size_t>> drain() {
    sweep();
    std::vector<std::pair<void*, std::size_t>> out;
    for (auto& [size, blocks] : free_)
      for (void* p : blocks) out.emplace_back(p, size);
    free_.clear();
    return out;
  }

  /// Blocks given back that still wait for another stream.
  std::size_t pending() const { return pending_.size(); }

 private:
  struct Pending {
    void* block;
    std::size_t size;
    std::vector<void*> events;
  };

  // Moves the pending blocks whose events have all passed to the free lists.
  void sweep() {
    for (auto it = pending_.begin(); it != pending_.end();) {
      bool passed = true;
      for (void* e : it->events) passed = passed && ops_->query(e);
      if (!passed) {
        ++it;
        continue;
      }
      for (void* e : it->events) ops_->destroy_event(e);
      free_[it->size].push_back(it->block);
      it = pending_.erase(it);
    }
  }

  StreamOps* ops_;
  void* home_;
  std::map<std::size_t, std::vector<void*>> free_;  // by size class
  std::map<void*, std::vector<void*>> uses_;        // block -> other streams that used it
  std::vector<Pending> pending_;
};

}  // namespace ndmesh
