#include "ndmesh/tensor/device_pages.hpp"

#include <algorithm>

#include "ndmesh/core/error.hpp"
#include "ndmesh/tensor/device.hpp"

namespace ndmesh {

std::size_t DevicePages::chunk_bytes() { return cuda::map_granularity(); }

DevicePages::DevicePages(void* data, std::size_t bytes) : base_(static_cast<char*>(data)), chunk_(chunk_bytes()) {
  NDMESH_CHECK(reinterpret_cast<std::uintptr_t>(data) % chunk_ == 0, "tensor",
               "mappable device memory at {} does not start on a chunk of {} bytes", data, chunk_);
  const std::size_t n = (bytes + chunk_ - 1) / chunk_;
  holders_.assign(n, 0);
  backed_chunks_ = cuda::backed_chunks(data, n * chunk_);  // as the owner left them
  pending_.assign(n, nullptr);
  backed_ = peak_backed_ = std::count(backed_chunks_.begin(), backed_chunks_.end(), true);
}

DevicePages::~DevicePages() {
  // The buffer's owner gives its memory back as a whole (cuda::free_mappable): only the events go.
  for (auto [event, refs] : event_refs_) cuda::stream_ops().destroy_event(event);
  for (void* e : spare_events_) cuda::stream_ops().destroy_event(e);
}

std::pair<std::size_t, std::size_t> DevicePages::chunks_of(const void* p, std::size_t bytes) const {
  const auto lo = static_cast<std::size_t>(static_cast<const char*>(p) - base_);
  const std::pair<std::size_t, std::size_t> r{lo / chunk_, (lo + bytes + chunk_ - 1) / chunk_};
  NDMESH_CHECK(static_cast<const char*>(p) >= base_ && r.second <= holders_.size(), "tensor",
               "bytes [{}, {}) lie outside the mappable buffer of {} chunks", lo, lo + bytes,
               holders_.size());
  return bytes == 0 ? std::pair<std::size_t, std::size_t>{0, 0} : r;
}

void DevicePages::hold(const void* p, std::size_t bytes) {
  const auto [first, last] = chunks_of(p, bytes);
  for (std::size_t i = first; i < last;) {
    if (holders_[i]++ > 0 || backed_chunks_[i]) {
      if (pending_[i] != nullptr) {  // still backed: the give-back is cancelled
        unref(pending_[i]);
        pending_[i] = nullptr;
        --queued_;
      }
      ++i;
      continue;
    }
    std::size_t j = i + 1;  // a run of chunks given back: backed again in one call
    while (j < last && holders_[j] == 0 && !backed_chunks_[j]) ++holders_[j++];
    cuda::map_pages(base_ + i * chunk_, (j - i) * chunk_);
    for (std::size_t k = i; k < j; ++k) backed_chunks_[k] = true;
    backed_ += static_cast<std::int64_t>(j - i);
    peak_backed_ = std::max(peak_backed_, backed_);
    i = j;
  }
}

void DevicePages::queue(std::size_t chunk, void*& event) {
  if (event == nullptr) {  // one event for every chunk one call queues
    if (spare_events_.empty()) {
      event = cuda::stream_ops().create_event();
    } else {
      event = spare_events_.back();
      spare_events_.pop_back();
    }
    cuda::stream_ops().record(event, cuda::stream());
  }
  ++event_refs_[event];
  pending_[chunk] = event;
  ++queued_;
}

void DevicePages::unref(void* event) {
  auto it = event_refs_.find(event);
  if (--it->second > 0) return;
  event_refs_.erase(it);
  spare_events_.push_back(event);
}

void DevicePages::drop(const void* p, std::size_t bytes) {
  const auto [first, last] = chunks_of(p, bytes);
  void* event = nullptr;
  for (std::size_t i = first; i < last; ++i) {
    NDMESH_CHECK(holders_[i] > 0, "tensor", "chunk {} of mappable device memory dropped more often than held", i);
    if (--holders_[i] == 0 && backed_chunks_[i]) queue(i, event);
  }
}

bool DevicePages::backed(const void* p) const {
  return backed_chunks_[chunks_of(p, 1).first];
}

void DevicePages::drop_unheld() {
  void* event = nullptr;
  for (std::size_t i = 0; i < holders_.size(); ++i)
    if (holders_[i] == 0 && backed_chunks_[i] && pending_[i] == nullptr) queue(i, event);
}

void DevicePages::poll() {
  if (queued_ == 0) return;
  std::unordered_map<void*, bool> passed;  // each event asked once
  for (std::size_t i = 0; i < pending_.size(); ++i) {
    void* event = pending_[i];
    if (event == nullptr) continue;
    auto it = passed.find(event);
    if (it == passed.end()) it = passed.emplace(event, cuda::stream_ops().query(event)).first;
    if (!it->second) continue;
    cuda::unmap_pages(base_ + i * chunk_, chunk_);
    backed_chunks_[i] = false;
    --backed_;
    pending_[i] = nullptr;
    --queued_;
    unref(event);
  }
}

void DevicePages::flush() {
  if (queued_ == 0) return;
  cuda::synchronize();
  poll();
}

}  // namespace ndmesh
