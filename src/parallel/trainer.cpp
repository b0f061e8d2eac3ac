#include "ndmesh/parallel/trainer.hpp"

#include <chrono>
#include <cmath>
#include <numbers>

#include <fmt/format.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/model/checkpoint.hpp"

namespace ndmesh::parallel {

std::vector<std::string> unsupported_layout(const Mesh& mesh) {
  std::vector<std::string> out;
  struct Pending {
    const char* dim;
    const char* what;
  };
  for (auto [dim, what] : {Pending{"tp", "tensor parallelism"}, Pending{"pp", "pipeline parallelism"},
                           Pending{"ep", "expert parallelism"}})
    if (mesh.size_of(dim) > 1)
      out.push_back(fmt::format("--{}={}: {} is not implemented in ndmesh train yet; use --{} 1 (data parallelism: --dp N, context parallelism: --cp N)",
                                dim, mesh.size_of(dim), what, dim));
  for (const Dim& d : mesh.dims())
    if (d.size > 1 && d.name != "dp" && d.name != "tp" && d.name != "pp" && d.name != "cp" && d.name != "ep")
      out.push_back(fmt::format("dim {}={}: ndmesh train knows the dims dp, pp, cp, tp; rename it or give it size 1",
                                d.name, d.size));
  return out;
}

Trainer::Trainer(TrainOptions options, std::unique_ptr<model::DataSource> data, ProcessGroups& groups)
    : options_(std::move(options)), data_(std::move(data)), groups_(groups) {
  NDMESH_CHECK(data_ != nullptr, "train", "no data source");
  if (auto problems = unsupported_layout(groups_.mesh()); !problems.empty())
    fail<ConfigError>("train", "{}", fmt::join(problems, "; "));
  const TrainOptions& o = options_;
  NDMESH_CHECK_CONFIG(o.batch > 0, "train", "--batch={} must be positive; e.g. --batch 8", o.batch);
  NDMESH_CHECK_CONFIG(o.steps >= 0, "train", "--steps={} must be >= 0", o.steps);
  NDMESH_CHECK_CONFIG(o.lr > 0 && std::isfinite(o.lr), "train", "--lr={} must be positive; e.g. --lr 3e-3", o.lr);
  NDMESH_CHECK_CONFIG(o.warmup >= 0, "train", "--warmup={} must be >= 0", o.warmup);
  NDMESH_CHECK_CONFIG(o.model.vocab == data_->vocab(), "train", "vocab={} but the data ({}) has {} tokens; use --vocab {}",
                      o.model.vocab, data_->describe(), data_->vocab(), data_->vocab());
  data_->check_seq(o.model.seq);

  dp_ = groups_.dp();
  dp_rank_ = dp_.rank();
  dp_size_ = dp_.size();
  NDMESH_CHECK_CONFIG(o.batch % dp_size_ == 0, "train",
                      "--batch={} is not divisible by --dp={}; use --batch {} (each dp rank trains batch / dp sequences)",
                      o.batch, dp_size_, std::max<std::int64_t>(dp_size_, o.batch / dp_size_ * dp_size_));
  local_batch_ = o.batch / dp_size_;
  const std::int64_t micro = o.micro_batch > 0 ? o.micro_batch : local_batch_;
  NDMESH_CHECK_CONFIG(o.micro_batch >= 0, "train", "--micro-batch={} must be >= 0 (0: the whole local batch)",
                      o.micro_batch);
  NDMESH_CHECK_CONFIG(local_batch_ % micro == 0, "train",
                      "--micro-batch={} does not divide the local batch {} (--batch {} / --dp {}); use a divisor of {}",
                      micro, local_batch_, o.batch, dp_size_, local_batch_);
  microbatches_ = local_batch_ / micro;

  // Context parallelism: each cp rank holds some positions of every sequence; attention
  // runs around the cp ring, everything else on the local tokens.
  const comm::Communicator& cp = groups_.cp();
  cp_size_ = cp.size();
  if (auto problems = cp_problems(o.model.seq, cp_size_, o.cp_layout); !problems.empty())
    fail<ConfigError>("train", "{}", fmt::join(problems, "; "));
  positions_ = cp_positions(o.model.seq, cp_size_, cp.rank(), o.cp_layout);
  const auto local_seq = static_cast<std::int64_t>(positions_.size());
  // Parameters are replicated over dp and cp: gradients are summed over both.
  grad_ = cp_size_ > 1 ? groups_.cp_dp() : dp_;
  grad_size_ = grad_.size();

  const std::int64_t pad = o.dp.zero > 0 ? grad_size_ : 1;
  model_ = std::make_unique<model::Gpt>(
      o.model, model::GptOptions{.seed = o.seed, .batch = micro, .seq = local_seq, .pad_to = pad});
  model_->set_loss_weight(1.0 / static_cast<double>(o.batch * o.model.seq));
  if (cp_size_ > 1) {
    model_->set_positions(positions_);
    ring_ = std::make_shared<RingAttention<float>>(cp);
    model_->set_attention_core(ring_);
  }
  reducer_ = std::make_unique<GradReducer>(grad_, model_->params().size(), o.dp);
  model_->set_grads_final_hook([r = reducer_.get()](std::int64_t from) { r->grads_final(from); });
  model_->set_progress_hook([r = reducer_.get()] { r->progress(); });
  adam_ = std::make_unique<nn::AdamW<float>>(model_->params(), o.adamw, reducer_->shard());
  tokens_.resize(static_cast<std::size_t>(micro * local_seq));
  targets_.resize(tokens_.size());
  full_tokens_.resize(static_cast<std::size_t>(micro * o.model.seq));
  full_targets_.resize(full_tokens_.size());
}

void Trainer::load_batch(std::uint64_t stream, std::int64_t index, std::int64_t first, std::int64_t count) {
  const std::int64_t seq = options_.model.seq;
  if (cp_size_ == 1) {
    data_->batch(stream, index, first, count, seq, tokens_.data(), targets_.data());
    return;
  }
  data_->batch(stream, index, first, count, seq, full_tokens_.data(), full_targets_.data());
  const auto local = static_cast<std::int64_t>(positions_.size());
  for (std::int64_t b = 0; b < count; ++b)
    for (std::int64_t t = 0; t < local; ++t) {
      tokens_[static_cast<std::size_t>(b * local + t)] = full_tokens_[static_cast<std::size_t>(b * seq + positions_[t])];
      targets_[static_cast<std::size_t>(b * local + t)] =
          full_targets_[static_cast<std::size_t>(b * seq + positions_[t])];
    }
}

double Trainer::lr_at(std::int64_t step) const {
  const TrainOptions& o = options_;
  if (step < o.warmup) return o.lr * static_cast<double>(step + 1) / static_cast<double>(o.warmup);
  const double span = static_cast<double>(std::max<std::int64_t>(1, o.steps - o.warmup));
  const double progress = std::min(1.0, static_cast<double>(step - o.warmup) / span);
  const double floor = o.lr * o.min_lr_ratio;
  return floor + (o.lr - floor) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

void Trainer::sum_over_dp(std::span<double> values) {
  if (grad_size_ > 1) grad_.all_reduce(values);
}

StepStats Trainer::step() {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  const std::int64_t seq = model_->seq(), micro = model_->batch();
  auto& params = model_->params();
  params.zero_grad();
  reducer_->zero_shard_grads();
  reducer_->reset_timers();
  double loss_sum = 0;  // summed over this rank's tokens
  for (std::int64_t mb = 0; mb < microbatches_; ++mb) {
    const std::int64_t first = dp_rank_ * local_batch_ + mb * micro;
    load_batch(model::DataSource::kTrainStream, step_, first, micro);
    loss_sum += model_->forward(tokens_.data(), targets_.data()) * static_cast<double>(micro * seq);
    reducer_->begin_backward(params.grads().data(), mb + 1 == microbatches_);
    model_->backward();
    reducer_->finish_backward();
  }
  std::array<double, 2> sums = {loss_sum, reducer_->owned_grad_square_sum(params.grads().data())};
  if (reducer_->zero() > 0)
    sum_over_dp(sums);
  else
    sum_over_dp(std::span<double>(sums.data(), 1));  // the reduced gradients are the same everywhere
  StepStats s;
  s.loss = sums[0] / static_cast<double>(tokens_per_step());
  s.grad_norm = std::sqrt(sums[1]);
  s.lr = lr_at(step_);
  adam_->update(params, s.lr, s.grad_norm, reducer_->shard_grads());
  reducer_->gather_params(params.params().data());
  s.step = ++step_;
  s.comm_seconds = reducer_->comm_seconds();
  s.exposed_comm_seconds = reducer_->exposed_seconds();
  s.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return s;
}

double Trainer::evaluate(std::int64_t batches) {
  const std::int64_t seq = model_->seq(), micro = model_->batch();
  double sum = 0;
  for (std::int64_t b = 0; b < batches; ++b) {
    for (std::int64_t mb = 0; mb < microbatches_; ++mb) {
      const std::int64_t first = dp_rank_ * local_batch_ + mb * micro;
      load_batch(model::DataSource::kEvalStream, b, first, micro);
      sum += model_->forward(tokens_.data(), targets_.data()) * static_cast<double>(micro * seq);
    }
  }
  sum_over_dp(std::span<double>(&sum, 1));
  return batches > 0 ? sum / static_cast<double>(batches * tokens_per_step()) : 0.0;
}

MemoryBytes Trainer::memory() const {
  const double elements = static_cast<double>(model_->params().size());
  const double shard = reducer_->zero() > 0 ? elements / static_cast<double>(grad_size_) : elements;
  MemoryBytes m;
  m.params = elements * sizeof(float);
  m.grads = (reducer_->zero() == 2 ? shard : elements) * sizeof(float);
  m.optimizer = 2 * shard * sizeof(float);
  m.grad_workspace = reducer_->zero() == 2 ? elements * sizeof(float) : 0.0;
  // Activations the forward keeps for one micro-batch: everything the whole-model
  // estimate counts beyond parameters and gradients.
  const double all = model::gpt_memory_elements(options_.model, model_->batch(), model_->seq());
  m.activations = std::max(0.0, all - 2 * elements) * sizeof(float);
  return m;
}

void Trainer::save(const std::string& path) {
  // The logical model: parameters are replicated over dp; ZeRO moments are gathered.
  const auto params = model_->params().params();
  std::vector<float> m(params.size(), 0.0f), v(params.size(), 0.0f);
  std::int64_t at = 0;
  for (const nn::Segment& seg : adam_->segments()) {
    std::copy_n(adam_->m().begin() + at, seg.count, m.begin() + seg.offset);
    std::copy_n(adam_->v().begin() + at, seg.count, v.begin() + seg.offset);
    at += seg.count;
  }
  if (reducer_->zero() > 0) {  // every element is owned by exactly one rank: a sum gathers them
    grad_.all_reduce(std::span<float>(m));
    grad_.all_reduce(std::span<float>(v));
  }
  if (groups_.rank() == 0) {
    model::Checkpoint c;
    c.spec = options_.model;
    c.step = step_;
    c.data = data_->describe();
    c.adam_steps = adam_->steps();
    c.params.assign(params.begin(), params.end());
    c.adam_m = std::move(m);
    c.adam_v = std::move(v);
    save_checkpoint(path, c);
  }
  groups_.world().barrier();
}

void Trainer::load(const std::string& path) {
  model::Checkpoint c = model::load_checkpoint(path);
  auto diffs = model::spec_differences(c.spec, options_.model);
  if (c.data != data_->describe())
    diffs.push_back(fmt::format("data: checkpoint has '{}', the run has '{}'", c.data, data_->describe()));
  if (!diffs.empty())
    fail<ConfigError>("checkpoint", "'{}' does not match this run ({}); pass the flags it was saved with", path,
                      fmt::join(diffs, "; "));
  auto params = model_->params().params();
  // The flat buffer may be padded differently (ZeRO pads to the dp size): the logical
  // parameters are the same up to the padding.
  const std::size_t common = std::min(c.params.size(), params.size());
  for (std::size_t i = common; i < c.params.size(); ++i)
    NDMESH_CHECK(c.params[i] == 0.0f, "checkpoint", "'{}' holds {} parameters but the model has {}", path,
                 c.params.size(), params.size());
  std::fill(params.begin(), params.end(), 0.0f);
  std::copy_n(c.params.begin(), common, params.begin());
  std::int64_t at = 0;
  for (const nn::Segment& seg : adam_->segments()) {
    for (std::int64_t i = 0; i < seg.count; ++i) {
      const auto src = static_cast<std::size_t>(seg.offset + i);
      adam_->m()[static_cast<std::size_t>(at + i)] = src < c.adam_m.size() ? c.adam_m[src] : 0.0f;
      adam_->v()[static_cast<std::size_t>(at + i)] = src < c.adam_v.size() ? c.adam_v[src] : 0.0f;
    }
    at += seg.count;
  }
  adam_->set_steps(c.adam_steps);
  step_ = c.step;
}

}  // namespace ndmesh::parallel
