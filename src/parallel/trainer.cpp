#include "ndmesh/parallel/trainer.hpp"

#include <chrono>
#include <cmath>
#include <algorithm>
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
  for (auto [dim, what] : {Pending{"pp", "pipeline parallelism"}, Pending{"ep", "expert parallelism"}})
    if (mesh.size_of(dim) > 1)
      out.push_back(fmt::format("--{}={}: {} is not implemented in ndmesh train yet; use --{} 1 (data parallelism: "
                                "--dp N, context parallelism: --cp N, tensor parallelism: --tp N)",
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

  // Tensor parallelism: the model is split over the tp group (of one in a serial run).
  tp_ = groups_.tp();
  NDMESH_CHECK_CONFIG(!o.sequence_parallel || tp_.size() > 1, "train",
                      "--sequence-parallel needs --tp > 1 (it splits the tokens of the norms over tp); add --tp 2 "
                      "or leave it out");
  if (auto problems = model::gpt_tp_problems(o.model, tp_.size(), o.sequence_parallel, micro * local_seq);
      !problems.empty())
    fail<ConfigError>("train", "{}", fmt::join(problems, "; "));
  tp_double_ = std::make_unique<CommunicatorTpComm<double>>(tp_, tp_stats_);

  const std::int64_t pad = o.dp.zero > 0 ? grad_size_ : 1;
  model_ = std::make_unique<model::Gpt>(
      o.model, model::GptOptions{.seed = o.seed, .batch = micro, .seq = local_seq, .pad_to = pad},
      make_tp_context<float>(tp_, o.sequence_parallel, tp_stats_));
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
  tp_stats_->reset();
  double loss_sum = 0;  // summed over this rank's tokens
  for (std::int64_t mb = 0; mb < microbatches_; ++mb) {
    model_->set_tp_grad_sync(mb + 1 == microbatches_);
    const std::int64_t first = dp_rank_ * local_batch_ + mb * micro;
    load_batch(model::DataSource::kTrainStream, step_, first, micro);
    loss_sum += model_->forward(tokens_.data(), targets_.data()) * static_cast<double>(micro * seq);
    reducer_->begin_backward(params.grads().data(), mb + 1 == microbatches_);
    model_->backward();
    reducer_->finish_backward();
  }
  std::array<double, 2> sums = {loss_sum, owned_grad_square_sum()};
  if (reducer_->zero() > 0)
    sum_over_dp(sums);
  else
    sum_over_dp(std::span<double>(sums.data(), 1));  // the reduced gradients are the same everywhere
  tp_double_->all_reduce_sum(&sums[1], 1);          // the loss is the same on every tp rank
  StepStats s;
  s.loss = sums[0] / static_cast<double>(tokens_per_step());
  s.grad_norm = std::sqrt(sums[1]);
  s.lr = lr_at(step_);
  adam_->update(params, s.lr, s.grad_norm, reducer_->shard_grads());
  reducer_->gather_params(params.params().data());
  s.step = ++step_;
  s.comm_seconds = reducer_->comm_seconds();
  s.exposed_comm_seconds = reducer_->exposed_seconds();
  s.tp_comm = *tp_stats_;
  s.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return s;
}

double Trainer::owned_grad_square_sum() const {
  const auto& params = model_->params();
  const float* shard_grads = reducer_->shard_grads();
  const bool tp_lead = tp_.rank() == 0;
  double sum = 0;
  std::int64_t at = 0;
  for (const nn::Segment& seg : reducer_->shard()) {
    const float* g = shard_grads != nullptr ? shard_grads + at : params.grads().data() + seg.offset;
    for (const ParamView& v : params.views()) {
      if (!v.shard.sharded() && !tp_lead) continue;  // replicated over tp: counted once
      const std::int64_t lo = std::max(v.offset, seg.offset), hi = std::min(v.offset + v.numel, seg.offset + seg.count);
      for (std::int64_t i = lo; i < hi; ++i) {
        const double x = g[i - seg.offset];
        sum += x * x;
      }
    }
    at += seg.count;
  }
  return sum;
}

std::vector<float> Trainer::to_logical(std::span<const float> local) {
  const auto& store = model_->params();
  std::int64_t total = 0;
  const std::vector<std::int64_t> offsets = store.logical_offsets(&total);
  std::vector<float> out(static_cast<std::size_t>(total), 0.0f), gathered;
  for (std::size_t i = 0; i < store.views().size(); ++i) {
    const ParamView& v = store.views()[i];
    const float* src = local.data() + v.offset;
    float* dst = out.data() + offsets[i];
    if (!v.shard.sharded()) {
      std::copy_n(src, v.numel, dst);
      continue;
    }
    gathered.resize(static_cast<std::size_t>(v.numel * tp_.size()));
    tp_.all_gather(std::span<const float>(src, static_cast<std::size_t>(v.numel)), std::span<float>(gathered));
    for (int r = 0; r < tp_.size(); ++r)
      copy_shard(v.shard, v.shape, gathered.data() + r * v.numel, dst, true, r);
  }
  return out;
}

void Trainer::from_logical(const std::vector<float>& logical, std::span<float> local) const {
  const auto& store = model_->params();
  const std::vector<std::int64_t> offsets = store.logical_offsets();
  std::fill(local.begin(), local.end(), 0.0f);
  for (std::size_t i = 0; i < store.views().size(); ++i) {
    const ParamView& v = store.views()[i];
    copy_shard(v.shard, v.shape, local.data() + v.offset, const_cast<float*>(logical.data()) + offsets[i], false);
  }
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
  // The logical model: tp shards are gathered into the serial layout.
  std::vector<float> logical_params = to_logical(params);
  std::vector<float> logical_m = to_logical(m), logical_v = to_logical(v);
  if (groups_.rank() == 0) {
    model::Checkpoint c;
    c.spec = options_.model;
    c.step = step_;
    c.data = data_->describe();
    c.adam_steps = adam_->steps();
    c.params = std::move(logical_params);
    c.adam_m = std::move(logical_m);
    c.adam_v = std::move(logical_v);
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
  // The checkpoint holds the logical (serial) layout, perhaps padded (ZeRO pads to the dp
  // size): the logical parameters are the same up to the padding; each rank takes its
  // tp slices.
  std::int64_t logical = 0;
  model_->params().logical_offsets(&logical);
  const auto need = static_cast<std::size_t>(logical);
  NDMESH_CHECK(c.params.size() >= need && c.adam_m.size() >= need && c.adam_v.size() >= need, "checkpoint",
               "'{}' holds {} parameters but the model has {}", path, c.params.size(), need);
  for (std::size_t i = need; i < c.params.size(); ++i)
    NDMESH_CHECK(c.params[i] == 0.0f, "checkpoint", "'{}' holds {} parameters but the model has {}", path,
                 c.params.size(), need);
  from_logical(c.params, params);
  std::vector<float> m(params.size()), v(params.size());
  from_logical(c.adam_m, m);
  from_logical(c.adam_v, v);
  std::int64_t at = 0;
  for (const nn::Segment& seg : adam_->segments()) {
    std::copy_n(m.begin() + seg.offset, seg.count, adam_->m().begin() + at);
    std::copy_n(v.begin() + seg.offset, seg.count, adam_->v().begin() + at);
    at += seg.count;
  }
  adam_->set_steps(c.adam_steps);
  step_ = c.step;
}

}  // namespace ndmesh::parallel
