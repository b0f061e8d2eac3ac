// Trainer: the serial training loop (the baseline every parallel run is compared with).
//
// One step: draw a batch from the data source, forward, backward, AdamW with global-norm
// clipping, at the learning rate of a linear-warmup + cosine schedule. With the same
// options, seed and BLAS thread count the losses are bit-identical run to run, and
// save() + load() continues exactly where an uninterrupted run would be.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ndmesh/config/config.hpp"
#include "ndmesh/model/data.hpp"
#include "ndmesh/model/gpt.hpp"
#include "ndmesh/nn/adamw.hpp"

namespace ndmesh::model {

/// Options of a training run.
struct TrainOptions {
  ModelSpec model;
  std::int64_t batch = 8;     ///< sequences per step
  std::int64_t steps = 100;   ///< total steps of the run (the schedule's length)
  double lr = 3e-3;           ///< peak learning rate
  std::int64_t warmup = 0;    ///< linear warmup steps
  double min_lr_ratio = 0.1;  ///< the cosine decays to lr * min_lr_ratio at `steps`
  nn::AdamWOptions adamw;
  std::uint64_t seed = 1;  ///< model initialisation seed
};

/// What one step did.
struct StepStats {
  std::int64_t step = 0;  ///< 1-based index of the step just done
  double loss = 0;        ///< mean loss of its batch, before the update
  double grad_norm = 0;   ///< before clipping
  double lr = 0;
};

/// The model, optimizer and data of one serial run.
class Trainer {
 public:
  /// ConfigError when the options are not usable (bad model spec, vocab mismatch...).
  Trainer(TrainOptions options, std::unique_ptr<DataSource> data);

  /// One optimizer step.
  StepStats step();
  /// Steps done so far.
  std::int64_t steps_done() const { return step_; }
  /// The learning rate of step `step` (0-based).
  double lr_at(std::int64_t step) const;
  /// Mean loss over `batches` batches drawn from a stream independent of training (the
  /// training position is unchanged), without updating.
  double evaluate(std::int64_t batches, std::uint64_t stream = 0x65766131);

  /// Atomic checkpoint of the whole state.
  void save(const std::string& path) const;
  /// Restores a checkpoint; ConfigError naming every difference when it was written
  /// by a run with another model or data source.
  void load(const std::string& path);

  Gpt& model() { return *model_; }
  DataSource& data() { return *data_; }
  const TrainOptions& options() const { return options_; }
  /// Tokens per step (batch * seq).
  std::int64_t tokens_per_step() const { return options_.batch * options_.model.seq; }

 private:
  TrainOptions options_;
  std::unique_ptr<DataSource> data_;
  std::unique_ptr<Gpt> model_;
  std::unique_ptr<nn::AdamW<float>> adam_;
  std::vector<std::int32_t> tokens_, targets_;
  std::int64_t step_ = 0;
};

}  // namespace ndmesh::model
