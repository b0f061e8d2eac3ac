// Fully sharded parameters (ZeRO-3): the prefetching gatherer of one model chunk.
//
// Under ZeRO-3 a parameter is still a view of the logical parameter (FSDP2's per-parameter
// sharding): the flat buffer keeps its layout and addresses, and each unit's range (a
// block, the embedding, the head; model::ParamUnit) is cut into one equal block per member
// of the gradient group, like the ZeRO-1/2 buckets. A rank keeps only its own block of
// every range resident (the optimizer updates it in place); the rest of the range is
// "freed": its pages go back to the system (madvise(MADV_DONTNEED): the addresses stay
// valid and read as zero) and the few elements on pages shared with the own block are
// set to NaN, so that any read of a freed parameter shows in the loss.
//
// The model reports each unit's use (model::UnitEvent) and this class answers: before a
// unit's forward or backward its ranges are all-gathered in place (waiting for a gather
// already in flight), after it they are freed, except after a forward with
// reshard_after_forward = false (FSDP2's option: the parameters stay until the backward).
// With prefetch, the gather of the next unit in the same direction (forward: the buffer's
// order; backward: model::ModelT::backward_units()) that holds ranges here starts when a unit
// begins, so it moves while the unit computes. A unit may hold none (the expert partition's
// gatherer over edp: a dense block has no experts; it sees every unit's events). A range
// shared by two units (a tied head reads the embedding's table) counts its users and is
// freed when the last one ends.
//
// Buffers: a range whose gather is in flight belongs to the all-gather until it is waited
// for (on the unit's Begin event, in poll() once complete, or in free_all()); the model
// reads a range only between the Begin and End events of a unit holding it.
//
// On CUDA the flat buffer is mappable device memory (cuda::alloc_mappable: the model is
// built so, ModelPlan::mappable_params) whose chunks DevicePages keeps: the own blocks are
// held for good and a gathered range while it is gathered. Freeing fills the freed elements
// on chunks shared with the rest of the buffer with NaN and drops the range: its chunks that
// nothing else holds go once the compute stream has passed the unit's last kernel (checked
// in poll() and at every unit event); a gather holds the range first (backing its chunks
// again, or cancelling their give-back), then all-gathers into it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ndmesh/comm/communicator.hpp"
#include "ndmesh/model/model.hpp"
#include "ndmesh/nn/adamw.hpp"
#include "ndmesh/nn/offload.hpp"
#include "ndmesh/tensor/device_pages.hpp"

namespace ndmesh::parallel {

/// How the ZeRO-3 gatherer runs (`ndmesh train --zero3-reshard-after-forward`, `--zero3-prefetch`).
struct GatherOptions {
  bool reshard_after_forward = true;  ///< free after the forward and gather again for the backward
  bool prefetch = true;               ///< start the next unit's gather when a unit begins
};

/// Sets [data, data + count) to `fill` while returning the whole pages inside it to the
/// system (they read as zero afterwards; with fill = 0 the range reads as zeros throughout).
void release_memory(float* data, std::int64_t count, float fill);
/// The same where `device` says: on the CPU as above; on a GPU every element is set to `fill`
/// and the memory stays (cudaMalloc's has no pages to give back; ZeRO-3's parameters, in
/// mappable memory, go through ParamGatherer).
void release_memory(float* data, std::int64_t count, float fill, Device device);

/// Gathers and frees the units of one model chunk over the gradient group.
class ParamGatherer {
 public:
  /// `params`: the chunk's flat parameter buffer (host memory, or mappable device memory on
  /// `device` CUDA); `ranges`, `units`: the
  /// chunk's (model::ModelT::unit_ranges(), units()); every range's length must be a
  /// multiple of the group size. Frees every range (collective over nothing).
  ParamGatherer(comm::Communicator group, float* params, std::vector<nn::Segment> ranges,
                std::vector<model::ParamUnit> units, std::vector<int> backward_order, GatherOptions options,
                Device device = Device::kCpu);
  ~ParamGatherer();
  ParamGatherer(const ParamGatherer&) = delete;
  ParamGatherer& operator=(const ParamGatherer&) = delete;

  /// The model's unit hook.
  void on_unit(model::UnitEvent event, int unit);
  /// Polls the gathers in flight (the model's progress hook).
  void poll();
  /// Waits for the gathers in flight and frees every range: after the optimizer updated
  /// the own blocks, or a checkpoint load wrote them (the gathered copies are stale).
  void free_all();

  /// --offload optimizer+params: the own blocks move into `file` (this rank's shard, the
  /// blocks one after another: the optimizer's state order) and leave memory; from now on a
  /// gather first reads the own block back, and a release drops it too. No range may be in
  /// use. The file must outlive this object's use of it.
  void offload_to(nn::OffloadArray* file);
  bool offloaded() const { return file_ != nullptr; }
  /// With offload: reads every own block back into the buffer (for a checkpoint save) ...
  void fetch_own();
  /// ... and drops them again, after writing them to the file when `changed` (a load).
  void release_own(bool changed);

  /// This rank's own block of every range (what it keeps and updates).
  const std::vector<nn::Segment>& shard() const { return shard_; }
  /// The most elements outside the own blocks that were resident at once (gathered ranges;
  /// with offload the own blocks of the gathered ranges count too).
  std::int64_t peak_gathered_elements() const { return peak_gathered_; }
  /// All-gathers started since construction.
  std::int64_t gathers() const { return gathers_; }
  /// Seconds the model waited for gathers (on Begin events), since the last reset.
  double exposed_seconds() const { return exposed_seconds_; }
  void reset_timers() { exposed_seconds_ = 0; }

 private:
  enum class State { kFree, kInFlight, kGathered };
  struct Range {
    std::int64_t lo = 0, hi = 0;  // [lo, hi) of the flat buffer
    State state = State::kFree;
    int users = 0;
    comm::Work work;
  };
  void start(Range& r);
  void release(Range& r);
  void free_elements(std::int64_t lo, std::int64_t count);
  void acquire(int unit);
  void prefetch_after(const std::vector<int>& order, int unit);

  comm::Communicator group_;
  float* params_;
  Device device_;
  std::unique_ptr<DevicePages> pages_;  // CUDA: the buffer's chunks (own blocks and gathered ranges held)
  GatherOptions options_;
  std::vector<Range> ranges_;
  std::vector<model::ParamUnit> units_;
  std::vector<int> forward_order_, backward_order_;
  std::vector<nn::Segment> shard_;
  std::vector<std::int64_t> own_at_;  // each range's own block in the shard (the file's order)
  nn::OffloadArray* file_ = nullptr;
  std::int64_t gathered_ = 0, peak_gathered_ = 0, gathers_ = 0;
  double exposed_seconds_ = 0;
};

}  // namespace ndmesh::parallel
