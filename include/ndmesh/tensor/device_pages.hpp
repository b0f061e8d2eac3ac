// The chunks of one mappable device buffer that the ranges in use need (ZeRO on a GPU).
//
// ZeRO-3's parameters and the per-unit gradient work space of ZeRO-2/3 live in mappable
// device memory (cuda::alloc_mappable): addresses reserved once, backed in chunks of
// cuda::map_granularity() bytes. Their users hold and drop ranges of elements (a gathered
// unit, the own blocks, a unit's gradients while its backward writes them); a chunk is
// backed while some held range touches it and given back once none does, but only after
// the compute stream has passed what was queued when its last holder dropped it (kernels
// still queued may touch it; unmapping under them is an illegal address). Holding a range
// again before that cancels the pending give-back; a chunk given back is backed again with
// undefined contents.
//
// One thread (the step's) uses an object; the host never waits for the stream except in
// flush().
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace ndmesh {

class DevicePages {
 public:
  /// `data`: a block of cuda::alloc_mappable (chunk-aligned), `bytes` of it used. Every chunk
  /// starts held by nothing, backed or not as the owner left it (cuda::backed_chunks;
  /// drop_unheld() queues the backed ones).
  DevicePages(void* data, std::size_t bytes);
  ~DevicePages();
  DevicePages(const DevicePages&) = delete;
  DevicePages& operator=(const DevicePages&) = delete;

  /// One more hold of [p, p + bytes): every chunk it touches is backed when this returns.
  void hold(const void* p, std::size_t bytes);
  /// Ends one hold of [p, p + bytes): the chunks it touches that nothing holds any more are
  /// queued to go once the compute stream passes what is queued now.
  void drop(const void* p, std::size_t bytes);
  /// True when the chunk holding `p` is backed now (queued ones included).
  bool backed(const void* p) const;
  /// Queues every backed chunk that nothing holds (after construction).
  void drop_unheld();
  /// Gives back the queued chunks whose work the stream has passed (never waits).
  void poll();
  /// Waits for the device, then gives back every queued chunk.
  void flush();

  /// The size of the chunks of mappable device memory (cuda::map_granularity()).
  static std::size_t chunk_bytes();

  /// Bytes backed now (queued chunks included) and the most since construction.
  std::int64_t backed_bytes() const { return backed_ * static_cast<std::int64_t>(chunk_); }
  std::int64_t peak_backed_bytes() const { return peak_backed_ * static_cast<std::int64_t>(chunk_); }

 private:
  std::pair<std::size_t, std::size_t> chunks_of(const void* p, std::size_t bytes) const;
  void queue(std::size_t chunk, void*& event);
  void unref(void* event);

  char* base_;
  std::size_t chunk_;
  std::vector<int> holders_;
  std::vector<bool> backed_chunks_;
  std::vector<void*> pending_;  // per chunk: the event its give-back waits for, or nullptr
  std::size_t queued_ = 0;      // chunks with a pending give-back
  std::unordered_map<void*, int> event_refs_;
  std::vector<void*> spare_events_;
  std::int64_t backed_ = 0, peak_backed_ = 0;
};

}  // namespace ndmesh
