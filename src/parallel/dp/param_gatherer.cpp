#include "ndmesh/parallel/dp/param_gatherer.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <numeric>

#include "ndmesh/core/error.hpp"
#include "ndmesh/tensor/device.hpp"
#include "ndmesh/tensor/ops.hpp"

namespace ndmesh::parallel {

void release_memory(float* data, std::int64_t count, float fill) {
  if (count <= 0) return;
  static const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<std::uintptr_t>(data);
  const auto end = reinterpret_cast<std::uintptr_t>(data + count);
  const std::uintptr_t lo = (begin + page - 1) / page * page, hi = end / page * page;
  if (lo >= hi) {
    std::fill(data, data + count, fill);
    return;
  }
  float* inner_lo = reinterpret_cast<float*>(lo);
  float* inner_hi = reinterpret_cast<float*>(hi);
  std::fill(data, inner_lo, fill);
  std::fill(inner_hi, data + count, fill);
  // Private anonymous memory (the heap and malloc's mappings) reads as zeros after this.
  if (madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED) != 0) std::fill(inner_lo, inner_hi, fill);
}

void release_memory(float* data, std::int64_t count, float fill, Device device) {
  if (device == Device::kCpu)
    release_memory(data, count, fill);
  else
    ops::fill(data, fill, count, device);
}

ParamGatherer::ParamGatherer(comm::Communicator group, float* params, std::vector<nn::Segment> ranges,
                             std::vector<model::ParamUnit> units, std::vector<int> backward_order,
                             GatherOptions options, Device device)
    : group_(std::move(group)),
      params_(params),
      device_(device),
      options_(options),
      units_(std::move(units)),
      backward_order_(std::move(backward_order)) {
  const std::int64_t p = group_.size(), r = group_.rank();
  for (const nn::Segment& s : ranges) {
    NDMESH_CHECK(s.count % p == 0, "dp", "ZeRO-3 unit range [{}, {}) is not a multiple of the group size {}",
                 s.offset, s.offset + s.count, p);
    ranges_.push_back({.lo = s.offset, .hi = s.offset + s.count});
    const std::int64_t block = s.count / p;
    own_at_.push_back(shard_.empty() ? 0 : own_at_.back() + shard_.back().count);
    shard_.push_back({s.offset + r * block, block});
  }
  forward_order_.resize(units_.size());
  std::iota(forward_order_.begin(), forward_order_.end(), 0);
  if (device_ != Device::kCpu) {  // the own blocks stay backed for good
    pages_ =
        std::make_unique<DevicePages>(params_, static_cast<std::size_t>(ranges_.back().hi) * sizeof(float));
    for (const nn::Segment& own : shard_)
      pages_->hold(params_ + own.offset, static_cast<std::size_t>(own.count) * sizeof(float));
  }
  for (Range& range : ranges_) release(range);
  gathered_ = 0;
  if (pages_) {  // the freed chunks go now, before the optimizer allocates its state
    pages_->drop_unheld();
    pages_->flush();
  }
}

ParamGatherer::~ParamGatherer() = default;

// Frees [lo, lo + count) of the buffer: NaN where a page (a chunk on CUDA) is shared with
// what stays, the rest given back (on CUDA by DevicePages, when the range is dropped).
void ParamGatherer::free_elements(std::int64_t lo, std::int64_t count) {
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  if (count <= 0) return;
  if (device_ == Device::kCpu) return release_memory(params_ + lo, count, kNaN, device_);
  const auto chunk = static_cast<std::int64_t>(DevicePages::chunk_bytes() / sizeof(float));
  // The buffer starts on a chunk: element offsets align as addresses do. A chunk that is
  // not backed holds nothing to hide (the model was placed with only its kept ranges backed).
  auto fill = [&](std::int64_t from, std::int64_t n) {
    if (n > 0 && pages_->backed(params_ + from)) ops::fill(params_ + from, kNaN, n, device_);
  };
  const std::int64_t a = (lo + chunk - 1) / chunk * chunk, b = (lo + count) / chunk * chunk;
  if (a >= b) {  // no whole chunk inside: the parts of at most two chunks
    const std::int64_t split = std::min(a, lo + count);
    fill(lo, split - lo);
    fill(split, lo + count - split);
    return;
  }
  fill(lo, a - lo);
  fill(b, lo + count - b);
}

void ParamGatherer::offload_to(nn::OffloadArray* file) {
  for (const Range& r : ranges_)
    NDMESH_CHECK(r.users == 0 && r.state == State::kFree, "dp", "ZeRO-3 parameters offloaded while in use");
  file_ = file;
  release_own(true);
}

void ParamGatherer::fetch_own() {
  if (file_ == nullptr) return;
  for (std::size_t k = 0; k < shard_.size(); ++k)
    if (ranges_[k].state == State::kFree) file_->read(own_at_[k], shard_[k].count, params_ + shard_[k].offset);
}

void ParamGatherer::release_own(bool changed) {
  if (file_ == nullptr) return;
  for (std::size_t k = 0; k < shard_.size(); ++k) {
    if (ranges_[k].state != State::kFree) continue;
    if (changed) file_->write(own_at_[k], shard_[k].count, params_ + shard_[k].offset);
    release_memory(params_ + shard_[k].offset, shard_[k].count, std::numeric_limits<float>::quiet_NaN());
  }
}

void ParamGatherer::start(Range& r) {
  // On CUDA the range's chunks are backed (again) before the gather writes them.
  if (pages_) pages_->hold(params_ + r.lo, static_cast<std::size_t>(r.hi - r.lo) * sizeof(float));
  if (file_ != nullptr) {  // the own block comes back from the file first
    const auto k = static_cast<std::size_t>(&r - ranges_.data());
    file_->read(own_at_[k], shard_[k].count, params_ + shard_[k].offset);
    gathered_ += shard_[k].count;
  }
  r.work = group_.all_gather_in_place_async(
      std::span<float>(params_ + r.lo, static_cast<std::size_t>(r.hi - r.lo)));
  r.state = State::kInFlight;
  ++gathers_;
  const std::int64_t p = group_.size();
  gathered_ += (r.hi - r.lo) / p * (p - 1);
  peak_gathered_ = std::max(peak_gathered_, gathered_);
}

void ParamGatherer::release(Range& r) {
  const std::int64_t block = (r.hi - r.lo) / group_.size();
  const std::int64_t own = r.lo + group_.rank() * block;
  // Every element but the own block; NaN where a page is shared with it.
  free_elements(r.lo, own - r.lo);
  free_elements(own + block, r.hi - own - block);
  if (r.state != State::kFree) {  // it was gathered: what it held goes
    if (pages_) pages_->drop(params_ + r.lo, static_cast<std::size_t>(r.hi - r.lo) * sizeof(float));
    gathered_ -= block * (group_.size() - 1);
    if (file_ != nullptr) {  // the file holds the own block: it goes too
      release_memory(params_ + own, block, std::numeric_limits<float>::quiet_NaN());
      gathered_ -= block;
    }
  }
  r.state = State::kFree;
}

void ParamGatherer::acquire(int unit) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int id : units_.at(static_cast<std::size_t>(unit)).ranges) {
    Range& r = ranges_[static_cast<std::size_t>(id)];
    if (r.state == State::kFree) start(r);
    if (r.state == State::kInFlight) {
      r.work.wait();
      r.state = State::kGathered;
    }
    ++r.users;
  }
  exposed_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void ParamGatherer::prefetch_after(const std::vector<int>& order, int unit) {
  auto it = std::find(order.begin(), order.end(), unit);
  if (it == order.end()) return;
  // The next unit that reads any of these ranges (the experts' gatherer: the next MoE block).
  do {
    if (++it == order.end()) return;
  } while (units_[static_cast<std::size_t>(*it)].ranges.empty());
  for (int id : units_[static_cast<std::size_t>(*it)].ranges)
    if (Range& r = ranges_[static_cast<std::size_t>(id)]; r.state == State::kFree) start(r);
}

void ParamGatherer::on_unit(model::UnitEvent event, int unit) {
  using model::UnitEvent;
  if (pages_) pages_->poll();
  const bool forward = event == UnitEvent::kForwardBegin || event == UnitEvent::kForwardEnd;
  // A backward that reads no parameter (the embedding's) needs nothing gathered.
  if (!forward && std::find(backward_order_.begin(), backward_order_.end(), unit) == backward_order_.end())
    return;
  if (event == UnitEvent::kForwardBegin || event == UnitEvent::kBackwardBegin) {
    acquire(unit);
    if (options_.prefetch) prefetch_after(forward ? forward_order_ : backward_order_, unit);
    return;
  }
  for (int id : units_.at(static_cast<std::size_t>(unit)).ranges) {
    Range& r = ranges_[static_cast<std::size_t>(id)];
    NDMESH_CHECK(r.users > 0, "dp", "ZeRO-3 unit {} ended without beginning",
                 units_[static_cast<std::size_t>(unit)].name);
    if (--r.users == 0 && (!forward || options_.reshard_after_forward)) release(r);
  }
}

void ParamGatherer::poll() {
  if (pages_) pages_->poll();
  for (Range& r : ranges_)
    if (r.state == State::kInFlight && r.work.test()) r.state = State::kGathered;
}

void ParamGatherer::free_all() {
  for (Range& r : ranges_) {
    NDMESH_CHECK(r.users == 0, "dp", "ZeRO-3 range [{}, {}) freed while a unit uses it", r.lo, r.hi);
    if (r.state == State::kInFlight) r.work.wait();
    if (r.state != State::kFree) release(r);
  }
}

}  // namespace ndmesh::parallel
