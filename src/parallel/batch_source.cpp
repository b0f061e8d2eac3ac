#include "ndmesh/parallel/batch_source.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ndmesh/core/error.hpp"

namespace ndmesh::parallel {

BatchLayout make_batch_layout(const TrainOptions& o, const comm::Communicator& dp, const comm::Communicator& cp) {
  BatchLayout l;
  l.global_batch = o.batch;
  l.seq = o.model.seq;
  l.dp_rank = dp.rank();
  l.dp_size = dp.size();
  // The batch and cp rules are training_problems()'s (config/training.hpp), checked once by
  // parallelize(); here they are invariants.
  NDMESH_CHECK(o.batch > 0 && o.micro_batch >= 0 && o.batch % l.dp_size == 0, "train",
               "batch {} / micro-batch {} on dp {}: check the run with training_problems() first", o.batch,
               o.micro_batch, l.dp_size);
  l.local_batch = o.batch / l.dp_size;
  l.micro_batch = o.micro_batch > 0 ? o.micro_batch : l.local_batch;
  NDMESH_CHECK(l.local_batch % l.micro_batch == 0, "train", "micro-batch {} does not divide the local batch {}",
               l.micro_batch, l.local_batch);
  l.microbatches = l.local_batch / l.micro_batch;
  l.cp_size = cp.size();
  NDMESH_CHECK(cp_problems(o.model.seq, l.cp_size, o.cp_layout).empty(), "train",
               "seq {} does not split into the chunks of cp {}", o.model.seq, l.cp_size);
  l.positions = cp_positions(o.model.seq, l.cp_size, cp.rank(), o.cp_layout);
  return l;
}

BatchSource::BatchSource(BatchLayout layout, std::unique_ptr<model::DataSource> data)
    : layout_(std::move(layout)), data_(std::move(data)), share_{.first = 0, .count = layout_.microbatches} {
  NDMESH_CHECK(data_ != nullptr, "train", "no data source");
  data_->check_seq(layout_.seq);
  if (layout_.cp_size > 1) {
    full_tokens_.resize(static_cast<std::size_t>(layout_.micro_batch * layout_.seq));
    full_targets_.resize(full_tokens_.size());
  }
}

ReplicaShare replica_share(std::int64_t microbatches, std::int64_t position, std::int64_t replicas,
                           std::int64_t granule) {
  NDMESH_CHECK(replicas >= 1 && position >= 0 && position < replicas, "batch",
               "replica position {} of {} replicas", position, replicas);
  NDMESH_CHECK(granule >= 1 && microbatches % granule == 0, "batch",
               "{} micro-batches are not a multiple of the replicas' unit of {}", microbatches, granule);
  const std::int64_t units = microbatches / granule;
  if (units < replicas) {
    if (granule == 1)
      fail<ConfigError>("elastic",
                        "the global batch has {} micro-batches per data-parallel rank (--batch / --micro-batch / "
                        "--dp), fewer than the {} live replicas; raise --batch or lower --micro-batch",
                        microbatches, replicas);
    fail<ConfigError>("elastic",
                      "the global batch has {} micro-batches per data-parallel rank (--batch / --micro-batch / "
                      "--dp) and the interleaved schedule runs a multiple of pp={} on each replica: fewer than "
                      "the {} live replicas need ({}); raise --batch or lower --micro-batch",
                      microbatches, granule, replicas, replicas * granule);
  }
  const std::int64_t base = units / replicas, extra = units % replicas;
  return {.first = (position * base + std::min(position, extra)) * granule,
          .count = (base + (position < extra ? 1 : 0)) * granule};
}

ReplicaShare BatchSource::set_replica(std::int64_t position, std::int64_t replicas, std::int64_t granule) {
  share_ = replica_share(layout_.microbatches, position, replicas, granule);
  return share_;
}

void BatchSource::fill(const model::DataSource& data, std::uint64_t stream, std::int64_t step, int mb,
                       std::int32_t* tokens, std::int32_t* targets) {
  const BatchLayout& l = layout_;
  // The replica's units before this one, this dp rank's part of the replica's, then mb
  // (without replicas: dp_rank * local_batch + mb * micro_batch).
  const std::int64_t first = (share_.first * l.dp_size + l.dp_rank * share_.count + mb) * l.micro_batch;
  if (l.cp_size == 1) {
    data.batch(stream, step, first, l.micro_batch, l.seq, tokens, targets);
    return;
  }
  data.batch(stream, step, first, l.micro_batch, l.seq, full_tokens_.data(), full_targets_.data());
  const std::int64_t local = l.local_seq();
  for (std::int64_t b = 0; b < l.micro_batch; ++b)
    for (std::int64_t t = 0; t < local; ++t) {
      const auto from = static_cast<std::size_t>(b * l.seq + l.positions[static_cast<std::size_t>(t)]);
      tokens[b * local + t] = full_tokens_[from];
      targets[b * local + t] = full_targets_[from];
    }
}

}  // namespace ndmesh::parallel
