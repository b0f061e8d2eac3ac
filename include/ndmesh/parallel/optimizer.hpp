// The optimizer of a rank's model chunks: AdamW with global-norm clipping over the elements
// the rank updates (its ZeRO shard of each chunk's flat buffer, or all of it), then, under
// ZeRO, the updated parameters all-gathered over the gradient group bucket by bucket.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ndmesh/nn/adamw.hpp"
#include "ndmesh/parallel/grad_sync.hpp"
#include "ndmesh/parallel/parallelize.hpp"
#include "ndmesh/parallel/train_options.hpp"

namespace ndmesh::parallel {

/// One AdamW per local chunk over the segments its reducer says this rank updates.
class Optimizer {
 public:
  /// With `offload` set (--offload optimizer), the moments live in files
  /// `<dir>/rank<world_rank>-chunk<c>.adamw`; ConfigError naming them, and the command that
  /// clears them, when files of this rank are there already (a run that was killed). On a GPU
  /// (the model's chunks on CUDA) they live in pinned host memory (AdamW::offload_to_host).
  Optimizer(RankModel& model, GradSync& sync, const nn::AdamWOptions& options,
            const OffloadOptions& offload = {}, int world_rank = 0);
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// Clips with `grad_norm` (the global norm: a number, or its square on the device, which
  /// the CUDA update reads itself), updates, and under ZeRO gathers the parameters
  /// (collective over the gradient group).
  void step(double lr, nn::GradNorm grad_norm);
  /// The AdamW of local chunk c (its moments hold the chunk's owned segments in order).
  nn::AdamW<float>& adam(std::size_t c) { return *adams_[c]; }
  const nn::AdamW<float>& adam(std::size_t c) const { return *adams_[c]; }
  std::size_t chunks() const { return adams_.size(); }
  /// Updates done so far (the same for every chunk).
  std::int64_t steps() const { return adams_.front()->steps(); }
  void set_steps(std::int64_t steps);
  /// Moment elements this rank holds (two per updated element), in memory or offloaded.
  std::int64_t state_elements() const;
  /// Whether the moments are offloaded: in files, or on a GPU in pinned host memory.
  bool offloaded() const { return adams_.front()->offload() != nullptr || pinned(); }
  /// Whether they are in pinned host memory (--offload optimizer with --device cuda).
  bool pinned() const { return adams_.front()->pinned() != nullptr; }
  /// Bytes of the offload files' I/O windows (0 in memory and in pinned host memory).
  std::int64_t offload_window_bytes() const;
  /// Pinned host bytes (nn::PinnedOffload::host_bytes, every chunk; 0 otherwise).
  std::int64_t pinned_host_bytes() const;
  /// Pinned: bytes copied device-to-host (gradients; the master's first read) and
  /// host-to-device (updated parameters) so far.
  std::int64_t pinned_bytes_to_host() const;
  std::int64_t pinned_bytes_to_device() const;
  /// Bytes read and written by the offload files so far, and the seconds their I/O took.
  std::int64_t offload_bytes_read() const;
  std::int64_t offload_bytes_written() const;
  double offload_io_seconds() const;
  /// --offload optimizer+params: the parameter elements this rank keeps in files (its shard).
  std::int64_t offloaded_param_elements() const;

 private:
  std::vector<model::Model*> chunks_;
  GradSync& sync_;
  std::vector<std::unique_ptr<nn::AdamW<float>>> adams_;
  std::vector<std::unique_ptr<nn::OffloadArray>> params_files_;  // optimizer+params, one per chunk
};

}  // namespace ndmesh::parallel
