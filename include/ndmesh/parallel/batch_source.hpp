// The batch source: which tokens this rank trains on, in one place.
//
// A step's global batch is a pure function of (data seed, step, sequence index), the same
// for every layout (docs/internals/runtime.md). Data parallelism gives dp rank r
// the contiguous sequences [r * batch / dp, (r + 1) * batch / dp); --micro-batch cuts them
// into micro-batches (gradient accumulation); context parallelism keeps, of every sequence,
// the positions of this cp rank (zigzag or contiguous chunks, cp/ring_attention.hpp). The
// model then runs [micro_batch, local_seq] tokens per micro-batch. The serial run is the
// layout with dp = cp = 1 and one micro-batch.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ndmesh/comm/communicator.hpp"
#include "ndmesh/model/data.hpp"
#include "ndmesh/parallel/train_options.hpp"

namespace ndmesh::parallel {

/// What one rank reads of each step.
struct BatchLayout {
  std::int64_t global_batch = 1;  ///< sequences per step over all ranks
  std::int64_t seq = 1;           ///< tokens per (whole) sequence
  std::int64_t dp_rank = 0, dp_size = 1;
  std::int64_t local_batch = 1;   ///< sequences of this dp rank per step
  std::int64_t micro_batch = 1;   ///< sequences per micro-batch
  std::int64_t microbatches = 1;  ///< local_batch / micro_batch
  std::int64_t cp_size = 1;
  std::vector<std::int64_t> positions;  ///< this cp rank's positions of each sequence, ascending

  /// Tokens of each sequence this rank holds (seq / cp).
  std::int64_t local_seq() const { return static_cast<std::int64_t>(positions.size()); }
  /// Tokens of one micro-batch on this rank.
  std::int64_t micro_tokens() const { return micro_batch * local_seq(); }
};

/// The batch layout of `options` (which pass train_option_problems()) over the data-parallel
/// group `dp` and the context-parallel group `cp` (groups of one: the serial layout).
/// ConfigError naming the flag, the value and the fix when --batch, --micro-batch or --seq
/// do not divide as the layout needs.
BatchLayout make_batch_layout(const TrainOptions& options, const comm::Communicator& dp,
                              const comm::Communicator& cp);

/// Elastic data parallelism: the micro-batches [first, first + count) of a step's global
/// batch that one replica computes.
struct ReplicaShare {
  std::int64_t first = 0, count = 0;
};

/// The share of replica `position` (0-based) of `replicas` live ones in a global batch of
/// `microbatches` micro-batches: an even split in replica order, the first
/// microbatches % replicas replicas one more, so the shares cover the batch once whatever
/// the membership. In units of `granule` micro-batches (a multiple of it each: the
/// interleaved pipeline schedule runs a multiple of pp; `microbatches` is one). ConfigError
/// when there are fewer units than replicas.
ReplicaShare replica_share(std::int64_t microbatches, std::int64_t position, std::int64_t replicas,
                           std::int64_t granule = 1);

/// This rank's micro-batches of any step, from a DataSource.
class BatchSource {
 public:
  /// ConfigError when the data cannot give sequences of layout.seq tokens.
  BatchSource(BatchLayout layout, std::unique_ptr<model::DataSource> data);

  /// Micro-batch `mb` of step `step` of `stream` (DataSource::kTrainStream or kEvalStream):
  /// tokens and targets [micro_batch, local_seq] each.
  void fill(std::uint64_t stream, std::int64_t step, int mb, std::int32_t* tokens, std::int32_t* targets) {
    fill(*data_, stream, step, mb, tokens, targets);
  }
  /// The same from another source (held-out data), sliced by this rank's layout.
  void fill(const model::DataSource& data, std::uint64_t stream, std::int64_t step, int mb, std::int32_t* tokens,
            std::int32_t* targets);

  const BatchLayout& layout() const { return layout_; }
  const model::DataSource& data() const { return *data_; }
  /// Elastic data parallelism: from now on this rank reads its dp rank's part of the share of
  /// replica `position` of `replicas`. The global batch is split over the replicas in units
  /// of dp micro-batches (one per dp rank of a replica: replica_share(microbatches of a dp
  /// rank, ...)); replica i's units are sequences [first, first + count) * dp * micro-batch,
  /// of which dp rank d reads the d-th contiguous part, count micro-batches. Returns the
  /// share in those units. (0, 1): the whole batch, the layout of a run without replicas.
  /// `granule`: each share a multiple of that many units (replica_share).
  ReplicaShare set_replica(std::int64_t position, std::int64_t replicas, std::int64_t granule = 1);

 private:
  BatchLayout layout_;
  std::unique_ptr<model::DataSource> data_;
  ReplicaShare share_;  // in micro-batches of a dp rank; {0, layout.microbatches}: the whole batch
  std::vector<std::int32_t> full_tokens_, full_targets_;  // whole sequences, before the cp slice
};

}  // namespace ndmesh::parallel
