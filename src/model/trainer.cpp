#include "ndmesh/model/trainer.hpp"

#include <cmath>
#include <numbers>

#include <fmt/format.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/model/checkpoint.hpp"

namespace ndmesh::model {

Trainer::Trainer(TrainOptions options, std::unique_ptr<DataSource> data)
    : options_(std::move(options)), data_(std::move(data)) {
  NDMESH_CHECK(data_ != nullptr, "train", "no data source");
  NDMESH_CHECK_CONFIG(options_.batch > 0, "train", "batch={} must be positive; e.g. --batch 8",
                      options_.batch);
  NDMESH_CHECK_CONFIG(options_.steps >= 0, "train", "steps={} must be >= 0", options_.steps);
  NDMESH_CHECK_CONFIG(options_.lr > 0 && std::isfinite(options_.lr), "train",
                      "lr={} must be positive; e.g. --lr 3e-3", options_.lr);
  NDMESH_CHECK_CONFIG(options_.warmup >= 0, "train", "warmup={} must be >= 0", options_.warmup);
  NDMESH_CHECK_CONFIG(options_.model.vocab == data_->vocab(), "train",
                      "vocab={} but the data ({}) has {} tokens; use --vocab {}", options_.model.vocab,
                      data_->describe(), data_->vocab(), data_->vocab());
  model_ = std::make_unique<Gpt>(options_.model, GptOptions{.seed = options_.seed, .batch = options_.batch});
  adam_ = std::make_unique<nn::AdamW<float>>(model_->params(), options_.adamw);
  tokens_.resize(static_cast<std::size_t>(tokens_per_step()));
  targets_.resize(tokens_.size());
}

double Trainer::lr_at(std::int64_t step) const {
  if (step < options_.warmup)
    return options_.lr * static_cast<double>(step + 1) / static_cast<double>(options_.warmup);
  const double span = static_cast<double>(std::max<std::int64_t>(1, options_.steps - options_.warmup));
  const double progress = std::min(1.0, static_cast<double>(step - options_.warmup) / span);
  const double floor = options_.lr * options_.min_lr_ratio;
  return floor + (options_.lr - floor) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

StepStats Trainer::step() {
  const std::int64_t seq = options_.model.seq;
  data_->next_batch(options_.batch, seq, tokens_.data(), targets_.data());
  auto& params = model_->params();
  params.zero_grad();
  StepStats s;
  s.loss = model_->forward(tokens_.data(), targets_.data());
  model_->backward();
  s.lr = lr_at(step_);
  s.grad_norm = adam_->step(params, s.lr);
  s.step = ++step_;
  return s;
}

double Trainer::evaluate(std::int64_t batches, std::uint64_t stream) {
  const std::uint64_t saved = data_->position();
  data_->set_position(stream);
  double total = 0;
  for (std::int64_t i = 0; i < batches; ++i) {
    data_->next_batch(options_.batch, options_.model.seq, tokens_.data(), targets_.data());
    total += model_->forward(tokens_.data(), targets_.data());
  }
  data_->set_position(saved);
  return batches > 0 ? total / static_cast<double>(batches) : 0.0;
}

void Trainer::save(const std::string& path) const {
  Checkpoint c;
  c.spec = options_.model;
  c.step = step_;
  c.data = data_->describe();
  c.data_position = data_->position();
  c.adam_steps = adam_->steps();
  const auto& params = model_->params().params();
  c.params.assign(params.begin(), params.end());
  c.adam_m.assign(adam_->m().begin(), adam_->m().end());
  c.adam_v.assign(adam_->v().begin(), adam_->v().end());
  save_checkpoint(path, c);
}

void Trainer::load(const std::string& path) {
  Checkpoint c = load_checkpoint(path);
  auto diffs = spec_differences(c.spec, options_.model);
  if (c.data != data_->describe())
    diffs.push_back(fmt::format("data: checkpoint has '{}', the run has '{}'", c.data, data_->describe()));
  if (!diffs.empty())
    fail<ConfigError>("checkpoint", "'{}' does not match this run ({}); pass the flags it was saved with",
                      path, fmt::join(diffs, "; "));
  auto params = model_->params().params();
  NDMESH_CHECK(c.params.size() == params.size(), "checkpoint",
               "'{}' holds {} parameters but the model has {}", path, c.params.size(), params.size());
  std::copy(c.params.begin(), c.params.end(), params.begin());
  std::copy(c.adam_m.begin(), c.adam_m.end(), adam_->m().begin());
  std::copy(c.adam_v.begin(), c.adam_v.end(), adam_->v().begin());
  adam_->set_steps(c.adam_steps);
  step_ = c.step;
  data_->set_position(c.data_position);
}

}  // namespace ndmesh::model
