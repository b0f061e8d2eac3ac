// Data parallelism: bucketed, overlapped gradient reduction over the data-parallel group
// (dp together with cp, the group that sees different data for replicated parameters).
//
// The flat gradient buffer is cut into buckets of about `bucket_mb` MiB from its end,
// because the backward pass finalises gradients from the end of the buffer (the head,
// then the last block, ..., the embedding at offset 0). The model's grads-final hook says
// from which offset every gradient is final; each bucket entirely above it starts its
// reduction at once (asynchronous) while the backward of earlier blocks goes on, and every
// call of the hook also polls the reductions in flight, which is what makes Open MPI move
// their data during the backward. Only the last micro-batch of a step reduces (no-sync);
// the earlier ones accumulate locally. With overlap off every bucket starts after the
// backward, the baseline the overlap is measured against.
//
// ZeRO over the group: stage 1 reduce-scatters each bucket in place instead of
// all-reducing it (this rank's block of every bucket is its shard; the optimizer updates
// only the shard, then the parameters are all-gathered bucket by bucket); stage 2 also
// keeps only the shard of the gradients between micro-batches: every micro-batch's
// backward reduce-scatters its buckets and adds this rank's blocks to a shard
// accumulator (DeepSpeed's stage 2: one reduce-scatter per micro-batch, the price of not
// keeping the full gradients between them). The layers still write into the model's
// full-size flat buffer as their work space; with the model's units given (ModelPlan::
// pad_units) stage 2 reduces and retires per unit as stage 3 does below, so the work space
// holds about two units, not the model; without them its buckets are bucket_mb ones, zeroed
// after each micro-batch, and the whole work space stays resident.
// Stage 3 reduces like stage 2, with one bucket per unit of the model (model::ParamUnit:
// the embedding, each block, the head), so that each unit's gradients are reduce-scattered
// as soon as the backward has produced them; the parameters are sharded on the same blocks
// (ParamGatherer), so gather_params() has nothing to do. A unit whose reduce-scatter has
// completed is retired at the next hook (grads_final() or progress()): this rank's block is
// added to the shard accumulator and the unit's full-size range of the work space is
// handed back (own_workspace(): the pages to the system on the CPU; on a GPU the chunks of
// mappable memory, backed again when a unit's backward begins), so that during the backward the work space
// holds about the unit being written and those in flight, not the whole model's gradients
// (with bf16 reduction the fp32 range goes back as soon as it is rounded into the bucket).
// As FSDP does, a unit's reduce-scatter starts only once the previous unit's completed
// (waited for at the grads-final hook, counted as exposed time), so that the backward
// holds at most two units' full gradients even where a peer lags behind. The work
// space's resident bytes are measured (mincore; on a GPU the backed chunks) at every grads-final hook, before
// that wait, where the most are resident: peak_workspace_bytes().
//
// Progress: Open MPI moves the data of a nonblocking operation only inside MPI calls. With
// `progress_thread` (the default with overlap) a helper thread polls the started buckets
// every few tens of microseconds while the backward computes, so transfers advance between
// the model's own polls; without it the model's hooks (per block and between sub-layers)
// are the only polls. A bucket handed to the thread is touched by it alone until
// finish_backward() has seen every bucket complete (mutex + condition variable). If the
// thread sees no completion for the whole timeout while it has buckets (its clock starts
// when it is handed new ones, so an idle gap of evaluation, checkpointing or many
// micro-batches does not count) it stops, and finish_backward() waits on the remaining
// buckets itself, which ends the job with the usual timeout message. The thread needs a
// communicator that several threads may use at once (MPI_THREAD_MULTIPLE): below that the
// reducer runs without it and says so once per process.
//
// Buffers: between begin_backward() and finish_backward() a started bucket's range of
// the gradient buffer belongs to the reduction; the model writes only below the
// watermark it reported, so the two never touch the same elements.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ndmesh/comm/allreduce.hpp"
#include "ndmesh/comm/communicator.hpp"
#include "ndmesh/nn/adamw.hpp"
#include "ndmesh/tensor/device_pages.hpp"
#include "ndmesh/parallel/dp/param_gatherer.hpp"
#include "ndmesh/tensor/tensor.hpp"

namespace ndmesh::parallel {

/// How gradients are reduced.
struct DataParallelOptions {
  double bucket_mb = 25;  ///< bucket size in MiB
  bool overlap = true;    ///< start buckets during the backward
  int zero = 0;           ///< 0: all-reduce; 1: shard optimizer state; 2: also gradients; 3: also parameters
  comm::AllReduceAlgorithm algorithm = comm::AllReduceAlgorithm::kMpi;
  std::int64_t ranks_per_node = 0;  ///< hierarchical: simulated ranks per node (0: real nodes)
  bool progress_thread = true;      ///< with overlap: a thread polls the buckets in flight
  /// Reduce the gradients in bfloat16 (--grad-dtype bf16): each bucket is rounded to bf16,
  /// reduced in bf16 (sums in fp32, rounded per step) and widened back into the fp32
  /// buffer; the master weights and AdamW state stay fp32. The rounded copy lives where the
  /// gradients do (ops::cast on CUDA), so the collective runs on device buffers there.
  bool bf16 = false;
  GatherOptions zero3;  ///< ZeRO-3: how the parameters are gathered (ParamGatherer)
};

/// Every problem with `options`, one line each naming the flag, the value and the fix.
std::vector<std::string> data_parallel_option_problems(const DataParallelOptions& options);

/// Reduces the gradients of one flat buffer over the data-parallel group.
class GradReducer {
 public:
  /// `flat_size` must be a multiple of the group size when zero > 0. ConfigError listing
  /// data_parallel_option_problems(options). Collective over `group` (the hierarchical
  /// algorithm builds node sub-groups). Under ZeRO-3, and under ZeRO-2 when given, `units`
  /// are the buckets (ascending, covering the buffer, each a multiple of the group size;
  /// model::ModelT::unit_ranges()): see per_unit().
  /// `device` is where the gradient buffer lives (ZeRO-2's shard is kept there too).
  GradReducer(comm::Communicator group, std::int64_t flat_size, DataParallelOptions options,
              const std::vector<nn::Segment>& units = {}, Device device = Device::kCpu);
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  /// Called before each micro-batch's backward with the gradient buffer it accumulates
  /// into; `last` marks the last micro-batch of the step.
  void begin_backward(float* grads, bool last);
  /// The model's grads-final hook: gradients at offsets >= from are final.
  void grads_final(std::int64_t from);
  /// Polls the reductions in flight (the model's progress hook, between sub-layers).
  void progress();
  /// After each backward: starts what has not started and waits for every reduction.
  void finish_backward();

  /// This rank's segments of the flat buffer (ZeRO), or the whole buffer.
  const std::vector<nn::Segment>& shard() const { return shard_; }
  /// ZeRO-2: the reduced gradients of the shard, one segment after another; nullptr
  /// otherwise (the reduced gradients are in the flat buffer).
  const float* shard_grads() const { return zero_ >= 2 ? shard_grads_.data() : nullptr; }
  float* shard_grads() { return zero_ >= 2 ? shard_grads_.data() : nullptr; }
  /// Calls f(gradients, n, at) for each run of the flat range [offset, offset + count)
  /// whose reduced gradients this rank updates (all of it without ZeRO, its shard's part
  /// with ZeRO): `at` is the run's distance from `offset`; the gradients are in `grads`
  /// (the flat buffer), or in the shard buffer under ZeRO-2.
  template <typename F>
  void for_each_owned(float* grads, std::int64_t offset, std::int64_t count, F&& f) {
    for_each_in(shard_, grads, offset, count, f);
  }
  /// The same for the elements this rank counts in the global gradient norm: each element
  /// is counted by exactly one member of the group (its shard under ZeRO; without ZeRO,
  /// where every member holds all of them, an even split of the buffer by group rank).
  template <typename F>
  void for_each_counted(float* grads, std::int64_t offset, std::int64_t count, F&& f) {
    for_each_in(counted_, grads, offset, count, f);
  }
  /// Whether a progress thread polls the buckets (options and the group's thread level).
  bool progress_thread() const { return options_.overlap && options_.progress_thread; }
  /// Buckets whose completion the progress thread saw, since construction.
  std::int64_t thread_completions() const { return thread_completions_.load(); }
  /// ZeRO 1/2: all-gathers the updated parameters bucket by bucket (collective); nothing
  /// under ZeRO-3 (the parameters stay sharded).
  void gather_params(float* params);
  /// Whether gather_params writes the parameters (ZeRO 1/2 over 2 or more ranks).
  bool gathers_params() const { return (zero_ == 1 || zero_ == 2) && group_.size() > 1; }
  /// Sets the ZeRO-2 shard accumulator to zero (start of a step).
  void zero_shard_grads();

  /// Per unit (per_unit()): the full-size work space `grads` (the buffer every backward
  /// writes into) is this reducer's to give back from now on, and goes now. On the CPU its
  /// pages go back (madvise: they read as zeros when touched again); in `mappable` device
  /// memory (cuda::alloc_mappable; ModelPlan::mappable_grads) its chunks go (DevicePages), so
  /// a unit's range is backed only from the begin of the unit's backward
  /// (begin_unit_backward) until its reduction retires; other device memory is set to zero.
  void own_workspace(float* grads, bool mappable);
  /// Per unit, at the start of a step: the work space reads as zeros again, none of it kept.
  void release_workspace();
  /// Per unit, the model's unit hook at a unit's BackwardBegin: its backward is about to write
  /// the gradients of `ranges` (indices of the units given at construction). In mappable
  /// device memory the ranges not yet backed are backed and set to zero; nothing otherwise.
  void begin_unit_backward(const std::vector<int>& ranges);
  /// The same for the unit whose range holds flat offset `at` (the model's grads-write hook:
  /// the weight half of a split backward writes outside the unit events).
  void writes_at(std::int64_t at);
  /// Per unit (per_unit()): the most bytes of the full-size gradient work space that were
  /// resident at once (measured at the grads-final hooks, since construction: with mincore on
  /// the CPU, the backed chunks in mappable device memory, the whole buffer in other device
  /// memory); 0 otherwise.
  std::int64_t peak_workspace_bytes() const { return peak_workspace_bytes_; }

  /// Seconds from the first bucket's start to the last bucket's completion, summed over
  /// the backwards since the last reset, and the part of it the step waited for (in
  /// finish_backward). Without overlap the two are equal: that is the cost the overlap
  /// hides, and bench/bench_dp.sh compares the exposed time of both modes.
  double comm_seconds() const { return comm_seconds_; }
  double exposed_seconds() const { return exposed_seconds_; }
  void reset_timers() {
    comm_seconds_ = exposed_seconds_ = 0;
    reduced_bytes_ = 0;
  }
  /// Number of buckets.
  std::size_t buckets() const { return buckets_.size(); }
  /// Bytes of the gradient buffers handed to the reductions since the last reset (the
  /// reduced elements times the element size: 4 in fp32, 2 in bf16).
  std::int64_t reduced_bytes() const { return reduced_bytes_; }
  int zero() const { return zero_; }
  /// Whether each unit is reduce-scattered and retired on its own (ZeRO-3; ZeRO-2 built with
  /// the model's units): the full-size work space holds about two units, peak_workspace_bytes().
  bool per_unit() const { return per_unit_; }
  const comm::Communicator& group() const { return group_; }

 private:
  struct Bucket {
    std::int64_t lo = 0, hi = 0;  // [lo, hi) of the flat buffer
    bool started = false;
    double start_time = 0;
    comm::PendingAllReduce reduce;  // without ZeRO
    comm::Work scatter;             // with ZeRO
    Tensor<BFloat16> low;           // --grad-dtype bf16: the bucket as reduced, on device_
    std::int64_t shard_at = 0;      // ZeRO 2/3: where this rank's block goes in shard_grads_
    bool retired = false;           // per unit: added to the shard, its work space released
    bool held = false;              // per unit, mappable: its range held in pages_
  };
  // for_each_owned / for_each_counted over `segments` (a subset of shard_'s elements).
  template <typename F>
  void for_each_in(const std::vector<nn::Segment>& segments, float* grads, std::int64_t offset, std::int64_t count,
                   F&& f) {
    float* shard = shard_grads();  // ZeRO-2: the shard's segments one after another
    std::int64_t at = 0;           // where `seg` starts in the shard buffer
    for (const nn::Segment& seg : segments) {
      const std::int64_t lo = std::max(offset, seg.offset), hi = std::min(offset + count, seg.offset + seg.count);
      if (lo < hi) f((shard != nullptr ? shard + at - seg.offset : grads) + lo, hi - lo, lo - offset);
      at += seg.count;
    }
  }
  void start(Bucket& b);
  bool poll(Bucket& b);
  void retire(Bucket& b);   // per unit: b's reduction is complete
  void give_back(Bucket& b);  // per unit: b's range of the work space reads as zeros or is dropped
  void back(Bucket& b);       // per unit, mappable: b's range backed and zeroed unless held
  void retire_done();       // per unit: retires every started bucket whose reduction completed
  void wait_in_flight();    // per unit: waits for the started buckets and retires them
  void sample_workspace();  // per unit: measures the work space's resident bytes
  void expire_if_stuck();  // after the thread timed out: end the job unless every bucket completes
  void progress_loop();

  comm::Communicator group_;
  comm::AllReducer reducer_;
  DataParallelOptions options_;
  int zero_ = 0;
  bool per_unit_ = false;  // see per_unit()
  std::vector<Bucket> buckets_;  // from the end of the buffer to its start
  std::vector<nn::Segment> shard_;
  std::vector<nn::Segment> counted_;  // see for_each_counted (shard_ under ZeRO)
  Tensor<float> shard_grads_;  // on device_
  Device device_ = Device::kCpu;
  float* grads_ = nullptr;
  std::int64_t flat_size_ = 0;
  std::unique_ptr<DevicePages> pages_;   // per unit in mappable device memory
  std::vector<unsigned char> resident_;  // sample_workspace()'s mincore vector
  std::int64_t peak_workspace_bytes_ = 0;
  bool reduce_now_ = false;
  std::size_t next_ = 0;  // the next bucket to start
  double comm_seconds_ = 0, exposed_seconds_ = 0;
  std::int64_t reduced_bytes_ = 0;
  // The progress thread and what it polls (guarded by mutex_).
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable work_cv_, done_cv_;
  std::vector<Bucket*> active_;
  std::uint64_t handed_ = 0;  // buckets ever handed to the thread
  bool stop_ = false, thread_gave_up_ = false;
  bool thread_timed_out_ = false;  // gave up after timeout_s_ without a bucket completing
  std::exception_ptr thread_error_;  // what the thread's polls threw; finish_backward rethrows
  std::atomic<std::int64_t> thread_completions_{0};
  double timeout_s_ = 0;  // the thread's give-up time (NDMESH_TIMEOUT_S of the constructing thread)
};

}  // namespace ndmesh::parallel
