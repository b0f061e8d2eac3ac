#include "ndmesh/parallel/trainer.hpp"

#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <thread>
#include <cmath>
#include <algorithm>
#include <numbers>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ndmesh/core/env.hpp"
#include "ndmesh/core/error.hpp"
#include "ndmesh/config/partition.hpp"
#include "ndmesh/config/training.hpp"
#include "ndmesh/model/checkpoint.hpp"
#include "ndmesh/model/checkpoint_dir.hpp"

namespace ndmesh::parallel {

std::vector<std::string> unsupported_layout(const Mesh& mesh) {
  std::vector<std::string> out;
  struct Pending {
    const char* dim;
    const char* what;
  };
  for (auto [dim, what] : {Pending{"ep", "expert parallelism"}})
    if (mesh.size_of(dim) > 1)
      out.push_back(fmt::format("--{}={}: {} is not implemented in ndmesh train yet; use --{} 1 (data parallelism: "
                                "--dp N, tensor parallelism: --tp N, pipeline parallelism: --pp N, context "
                                "parallelism: --cp N)",
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
  NDMESH_CHECK_CONFIG(o.steps >= 0, "train", "--steps={} must be >= 0", o.steps);
  NDMESH_CHECK_CONFIG(o.lr > 0 && std::isfinite(o.lr), "train", "--lr={} must be positive; e.g. --lr 3e-3", o.lr);
  NDMESH_CHECK_CONFIG(o.warmup >= 0, "train", "--warmup={} must be >= 0", o.warmup);
  NDMESH_CHECK_CONFIG(o.model.vocab == data_->vocab(), "train", "vocab={} but the data ({}) has {} tokens; use --vocab {}",
                      o.model.vocab, data_->describe(), data_->vocab(), data_->vocab());
  data_->check_seq(o.model.seq);

  // The rules of running this model on this layout (config/training.hpp): batch, cp chunks,
  // tp splits, sequence parallelism, schedule and virtual stages, one call.
  const TrainingRun run{.dp = groups_.dp().size(),
                        .cp = groups_.cp().size(),
                        .tp = groups_.tp().size(),
                        .pp = groups_.pp().size(),
                        .vpp = o.pp.virtual_stages,
                        .schedule = o.pp.schedule,
                        .global_batch = o.batch,
                        .micro_batch = o.micro_batch,
                        .sequence_parallel = o.sequence_parallel,
                        .recompute = o.recompute != nn::Recompute::kNone,
                        .cp_contiguous = o.cp_layout == CpLayout::kContiguous,
                        .pp_layers_entries = o.pp.layers.empty()
                                                 ? 0
                                                 : static_cast<std::int64_t>(
                                                       std::count(o.pp.layers.begin(), o.pp.layers.end(), ',') + 1)};
  if (auto problems = training_problems(run, &o.model); !problems.empty())
    fail<ConfigError>("train", "{}", fmt::join(problems, "; "));

  dp_ = groups_.dp();
  dp_rank_ = dp_.rank();
  dp_size_ = dp_.size();
  local_batch_ = o.batch / dp_size_;
  const std::int64_t micro = o.micro_batch > 0 ? o.micro_batch : local_batch_;
  microbatches_ = local_batch_ / micro;

  // Context parallelism: each cp rank holds some positions of every sequence; attention
  // runs around the cp ring, everything else on the local tokens.
  const comm::Communicator& cp = groups_.cp();
  cp_size_ = cp.size();
  positions_ = cp_positions(o.model.seq, cp_size_, cp.rank(), o.cp_layout);
  const auto local_seq = static_cast<std::int64_t>(positions_.size());
  // Parameters are replicated over dp and cp: gradients are summed over both.
  grad_ = cp_size_ > 1 ? groups_.cp_dp() : dp_;
  grad_size_ = grad_.size();

  // Tensor parallelism: the model is split over the tp group (of one in a serial run).
  tp_ = groups_.tp();
  tp_double_ = std::make_unique<CommunicatorTpComm<double>>(tp_, tp_stats_);
  if (cp_size_ > 1) ring_ = std::make_shared<RingAttention<float>>(cp);
  full_tokens_.resize(static_cast<std::size_t>(micro * o.model.seq));
  full_targets_.resize(full_tokens_.size());
  build_pipeline(micro, local_seq);
}

void Trainer::build_pipeline(std::int64_t micro, std::int64_t local_seq) {
  const TrainOptions& o = options_;
  pp_ = groups_.pp();
  stage_ = pp_.rank();
  stages_ = pp_.size();
  const std::int64_t v = o.pp.virtual_stages;
  try {
    partition_ = o.pp.layers.empty() ? balanced_partition(o.model.layers, stages_, v)
                                     : parse_partition(o.pp.layers, o.model.layers, stages_, v, "--pp-layers");
  } catch (const ConfigError& e) {
    fail<ConfigError>("train", "--layers={} over --pp={} x --vpp={}: {}", o.model.layers, stages_, v, e.what());
  }
  pp::PipelineSchedule schedule = pp::make_schedule({.schedule = o.pp.schedule,
                                                     .stages = stages_,
                                                     .microbatches = static_cast<int>(microbatches_),
                                                     .chunks = static_cast<int>(v)});

  // Local chunk c is virtual stage c * pp + stage: blocks after those of the chunks before it.
  const std::int64_t pad = o.dp.zero > 0 ? grad_size_ : 1;
  std::vector<model::Gpt*> raw;
  for (int c = 0; c < v; ++c) {
    const int vs = schedule.virtual_stage(stage_, c);
    std::int64_t first = 0;
    for (int k = 0; k < vs; ++k) first += partition_[static_cast<std::size_t>(k)];
    chunks_.push_back(std::make_unique<model::Gpt>(
        o.model,
        model::GptOptions{.seed = o.seed,
                          .batch = micro,
                          .seq = local_seq,
                          .first_block = first,
                          .last_block = first + partition_[static_cast<std::size_t>(vs)],
                          .pad_to = pad,
                          .recompute = o.recompute,
                          .split_backward = o.pp.schedule == Schedule::kZbH1},
        make_tp_context<float>(tp_, o.sequence_parallel, tp_stats_)));
    model::Gpt& g = *chunks_.back();
    // The chunks of a rank run one backward at a time: one recompute workspace for all.
    if (c > 0) g.share_recompute_workspace(*chunks_.front());
    g.set_loss_weight(1.0 / static_cast<double>(o.batch * o.model.seq));
    if (cp_size_ > 1) {
      g.set_positions(positions_);
      g.set_attention_core(ring_);
    }
    reducers_.push_back(std::make_unique<GradReducer>(grad_, g.params().size(), o.dp));
    GradReducer* r = reducers_.back().get();
    g.set_grads_final_hook([r](std::int64_t from) { r->grads_final(from); });
    g.set_progress_hook([r, this] {
      r->progress();
      if (executor_) executor_->poll();
    });
    adams_.push_back(std::make_unique<nn::AdamW<float>>(g.params(), o.adamw, r->shard()));
    raw.push_back(&g);
    if (stages_ > 1 && o.model.tied_embeddings) {
      if (g.has_head() && !g.has_embedding()) tied_copy_chunk_ = c;
      if (g.has_embedding() && !g.has_head()) tied_main_chunk_ = c;
    }
  }
  embedding_ = groups_.embedding();
  executor_ = std::make_unique<pp::Executor>(std::move(schedule), pp_, std::move(raw),
                                             pp::ExecutorOptions{.timeout_s = o.pp.timeout_s});
  if (!o.pp.drop_action.empty()) {
    int st = -1, index = -1;
    NDMESH_CHECK_CONFIG(std::sscanf(o.pp.drop_action.c_str(), "%d:%d", &st, &index) == 2, "train",
                        "--pp-drop-action={} is not STAGE:INDEX; e.g. --pp-drop-action 0:1", o.pp.drop_action);
    if (st == stage_) executor_->drop_action(index);
  }
  tokens_.resize(static_cast<std::size_t>(micro * local_seq));
  targets_.resize(tokens_.size());
  groups_.world().barrier();
  executor_->set_origin(std::chrono::steady_clock::now());
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

namespace {
// The gradient of the token table inside a chunk's flat buffer.
std::span<float> token_table_grads(model::Gpt& g) {
  const int id = g.params().find("embed.tokens");
  NDMESH_CHECK(id >= 0, "train", "a chunk with a tied head has no embed.tokens");
  return std::span<float>(g.params().grad(id), static_cast<std::size_t>(g.params().view(id).numel));
}
}  // namespace

StepStats Trainer::step() {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  const std::int64_t micro = model().batch();
  for (std::size_t c = 0; c < chunks_.size(); ++c) {
    chunks_[c]->params().zero_grad();
    reducers_[c]->zero_shard_grads();
    reducers_[c]->reset_timers();
  }
  tp_stats_->reset();
  pp::StageHooks hooks;
  hooks.data = [&](int mb, std::int32_t* tokens, std::int32_t* targets) {
    load_batch(model::DataSource::kTrainStream, step_, dp_rank_ * local_batch_ + mb * micro, micro);
    std::copy(tokens_.begin(), tokens_.end(), tokens);
    std::copy(targets_.begin(), targets_.end(), targets);
  };
  hooks.before_model_backward = [&](int c, bool last) {
    // tp-summed gradients (norms and biases under sequence parallelism): once, at the last
    // micro-batch; ZeRO-2 reduce-scatters and clears the gradients of every micro-batch, so
    // there they are summed every time.
    const auto i = static_cast<std::size_t>(c);
    chunks_[i]->set_tp_grad_sync(last || reducers_[i]->zero() == 2);
  };
  hooks.before_backward = [&](int c, bool last) {
    reducers_[static_cast<std::size_t>(c)]->begin_backward(chunks_[static_cast<std::size_t>(c)]->params().grads().data(),
                                                           last);
  };
  hooks.after_backward = [&](int c) { reducers_[static_cast<std::size_t>(c)]->finish_backward(); };
  pp::WalkResult walk = executor_->train_step(hooks);
  // Pipelines are numbered by their pp group's color (one per dp x cp x tp coordinate).
  const Mesh& mesh = groups_.mesh();
  const double pipeline = static_cast<double>(mesh.color(groups_.rank(), mesh.dims_present("pp")));
  for (const pp::ActionTiming& t : walk.timings)
    trace_.insert(trace_.end(), {pipeline, static_cast<double>(stage_), static_cast<double>(step_),
                                 static_cast<double>(t.action.kind), static_cast<double>(t.action.microbatch),
                                 static_cast<double>(t.action.chunk), t.start, t.end});

  // A tied head on the last stage and the embedding on the first hold two copies of the
  // token table: both get the sum of their gradients (Megatron's embedding group).
  if (tied_copy_chunk_ >= 0) sum_tied_table(static_cast<std::size_t>(tied_copy_chunk_));
  if (tied_main_chunk_ >= 0) sum_tied_table(static_cast<std::size_t>(tied_main_chunk_));

  double square_sum = 0;
  for (std::size_t c = 0; c < chunks_.size(); ++c) square_sum += owned_grad_square_sum(c);
  if (tied_copy_chunk_ >= 0)  // the copy counts once in the norm, on the first stage (its tp shard)
    for_each_owned_table_grad(static_cast<std::size_t>(tied_copy_chunk_), [&](float* g, std::int64_t n, std::int64_t) {
      for (std::int64_t i = 0; i < n; ++i) square_sum -= static_cast<double>(g[i]) * static_cast<double>(g[i]);
    });
  std::array<double, 2> sums = {walk.loss_sum, square_sum};
  if (reducers_.front()->zero() > 0)
    sum_over_dp(sums);
  else
    sum_over_dp(std::span<double>(sums.data(), 1));  // the reduced gradients are the same everywhere
  tp_double_->all_reduce_sum(&sums[1], 1);          // the loss is the same on every tp rank
  if (stages_ > 1) pp_.all_reduce(std::span<double>(sums));
  StepStats s;
  s.loss = sums[0] / static_cast<double>(tokens_per_step());
  s.grad_norm = std::sqrt(std::max(0.0, sums[1]));
  s.lr = lr_at(step_);
  for (std::size_t c = 0; c < chunks_.size(); ++c) {
    adams_[c]->update(chunks_[c]->params(), s.lr, s.grad_norm, reducers_[c]->shard_grads());
    reducers_[c]->gather_params(chunks_[c]->params().params().data());
    s.comm_seconds += reducers_[c]->comm_seconds();
    s.exposed_comm_seconds += reducers_[c]->exposed_seconds();
    s.grad_comm_bytes += reducers_[c]->reduced_bytes();
  }
  s.step = ++step_;
  s.tp_comm = *tp_stats_;
  s.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return s;
}

void Trainer::for_each_owned_table_grad(std::size_t c,
                                        const std::function<void(float*, std::int64_t, std::int64_t)>& f) {
  model::Gpt& g = *chunks_[c];
  const ParamView& view = g.params().view(g.params().find("embed.tokens"));
  reducers_[c]->for_each_owned(g.params().grads().data(), view.offset, view.numel, f);
}

void Trainer::sum_tied_table(std::size_t c) {
  if (reducers_[c]->zero() == 0) {
    embedding_.all_reduce(token_table_grads(*chunks_[c]));
    return;
  }
  // ZeRO: the reduced gradient of the table is spread over the shards of the gradient
  // group, cut where the flat buffer is cut (differently on the two stages): gather it
  // whole (each element is owned by one rank, so a sum gathers), sum it over the
  // embedding group, keep the owned part.
  const model::Gpt& g = *chunks_[c];
  std::vector<float> table(static_cast<std::size_t>(g.params().view(g.params().find("embed.tokens")).numel), 0.0f);
  for_each_owned_table_grad(c, [&](float* p, std::int64_t n, std::int64_t at) { std::copy_n(p, n, table.begin() + at); });
  grad_.all_reduce(std::span<float>(table));
  embedding_.all_reduce(std::span<float>(table));
  for_each_owned_table_grad(c, [&](float* p, std::int64_t n, std::int64_t at) { std::copy_n(table.begin() + at, n, p); });
}

double Trainer::owned_grad_square_sum(std::size_t chunk) const {
  model::Gpt& g = *chunks_[chunk];
  const bool tp_lead = tp_.rank() == 0;
  double sum = 0;
  for (const ParamView& v : g.params().views()) {
    if (!v.shard.sharded() && !tp_lead) continue;  // replicated over tp: counted once
    reducers_[chunk]->for_each_owned(g.params().grads().data(), v.offset, v.numel,
                                     [&](const float* x, std::int64_t n, std::int64_t) {
                                       for (std::int64_t i = 0; i < n; ++i)
                                         sum += static_cast<double>(x[i]) * static_cast<double>(x[i]);
                                     });
  }
  return sum;
}

void Trainer::from_logical(const std::vector<float>& logical, std::span<float> local) const {
  const auto& store = chunks_.front()->params();
  const std::vector<std::int64_t> offsets = store.logical_offsets();
  std::fill(local.begin(), local.end(), 0.0f);
  for (std::size_t i = 0; i < store.views().size(); ++i) {
    const ParamView& v = store.views()[i];
    copy_shard(v.shard, v.shape, local.data() + v.offset, const_cast<float*>(logical.data()) + offsets[i], false);
  }
}

double Trainer::evaluate(std::int64_t batches) {
  const std::int64_t micro = model().batch();
  double sum = 0;
  for (std::int64_t b = 0; b < batches; ++b) {
    pp::StageHooks hooks;
    hooks.data = [&](int mb, std::int32_t* tokens, std::int32_t* targets) {
      load_batch(model::DataSource::kEvalStream, b, dp_rank_ * local_batch_ + mb * micro, micro);
      std::copy(tokens_.begin(), tokens_.end(), tokens);
      std::copy(targets_.begin(), targets_.end(), targets);
    };
    sum += executor_->evaluate(hooks).loss_sum;
  }
  sum_over_dp(std::span<double>(&sum, 1));
  if (stages_ > 1) pp_.all_reduce(std::span<double>(&sum, 1));
  return batches > 0 ? sum / static_cast<double>(batches * tokens_per_step()) : 0.0;
}

MemoryBytes Trainer::memory() const {
  double elements = 0, shard = 0;
  for (std::size_t c = 0; c < chunks_.size(); ++c) {
    const double n = static_cast<double>(chunks_[c]->params().size());
    elements += n;
    shard += reducers_[c]->zero() > 0 ? n / static_cast<double>(grad_size_) : n;
  }
  const int zero = reducers_.front()->zero();
  MemoryBytes m;
  m.params = elements * sizeof(float);
  m.grads = (zero == 2 ? shard : elements) * sizeof(float);
  m.optimizer = 2 * shard * sizeof(float);
  m.grad_workspace = zero == 2 ? elements * sizeof(float) : 0.0;
  // Activations: measured, not estimated. The micro-batch activations the executor held at
  // once at its peak, plus the recompute workspace the chunks share.
  m.activations = static_cast<double>(executor_->peak_live_activation_bytes() +
                                      chunks_.front()->recompute_workspace_bytes());
  m.activation_buffers = static_cast<double>(chunks_.front()->workspace_buffer_bytes());
  for (const auto& c : chunks_) m.activation_buffers += static_cast<double>(c->own_buffer_bytes());
  return m;
}

namespace {
// A string carried in int64 words (the communicator moves numbers), and back.
std::vector<std::int64_t> to_words(const std::string& text) {
  std::vector<std::int64_t> words((text.size() + 7) / 8 + 1, 0);
  words[0] = static_cast<std::int64_t>(text.size());
  std::memcpy(words.data() + 1, text.data(), text.size());
  return words;
}
std::string from_words(const std::vector<std::int64_t>& words) {
  return std::string(reinterpret_cast<const char*>(words.data() + 1), static_cast<std::size_t>(words[0]));
}
}  // namespace

void Trainer::agree(const std::exception_ptr& error, const std::string& what) {
  std::int64_t failed = error ? 1 : 0;
  groups_.world().all_reduce(std::span<std::int64_t>(&failed, 1));
  if (error) std::rethrow_exception(error);
  if (failed > 0)
    fail<IoError>("checkpoint", "{}: {} other rank(s) failed (their errors above say why)", what, failed);
}

void Trainer::full_moments(std::size_t c, std::vector<float>& m, std::vector<float>& v) {
  // The optimizer keeps the moments of its segments (ZeRO: this rank's shard); every
  // element is owned by exactly one rank of the gradient group, so a sum gathers them.
  const auto size = chunks_[c]->params().params().size();
  m.assign(size, 0.0f);
  v.assign(size, 0.0f);
  std::int64_t at = 0;
  for (const nn::Segment& seg : adams_[c]->segments()) {
    std::copy_n(adams_[c]->m().begin() + at, seg.count, m.begin() + seg.offset);
    std::copy_n(adams_[c]->v().begin() + at, seg.count, v.begin() + seg.offset);
    at += seg.count;
  }
  if (reducers_[c]->zero() > 0) {
    grad_.all_reduce(std::span<float>(m));
    grad_.all_reduce(std::span<float>(v));
  }
}

void Trainer::set_moments(std::size_t c, const std::vector<float>& m, const std::vector<float>& v) {
  std::int64_t at = 0;
  for (const nn::Segment& seg : adams_[c]->segments()) {
    std::copy_n(m.begin() + seg.offset, seg.count, adams_[c]->m().begin() + at);
    std::copy_n(v.begin() + seg.offset, seg.count, adams_[c]->v().begin() + at);
    at += seg.count;
  }
}

model::CheckpointLayout Trainer::checkpoint_layout() const {
  model::CheckpointLayout l;
  l.mesh = groups_.mesh().to_string();
  l.world = groups_.world().size();
  l.zero = reducers_.front()->zero();
  l.virtual_stages = options_.pp.virtual_stages;
  l.partition = partition_;
  l.sequence_parallel = options_.sequence_parallel;
  l.cp_layout = cp_size_ > 1 ? std::string(to_string(options_.cp_layout)) : "";
  return l;
}

void Trainer::save(const std::string& dir) {
  const comm::Communicator& world = groups_.world();
  const std::string tmp = model::checkpoint_temp_dir(dir);
  std::vector<std::vector<float>> ms(chunks_.size()), vs(chunks_.size());
  for (std::size_t c = 0; c < chunks_.size(); ++c) full_moments(c, ms[c], vs[c]);

  std::exception_ptr error;
  if (world.rank() == 0) try {
      model::prepare_checkpoint_temp_dir(tmp);
    } catch (const Error&) {
      error = std::current_exception();
    }
  agree(error, fmt::format("saving '{}'", dir));

  // One writer per (stage, tp rank): the rank at position 0 of the gradient group (dp x
  // cp), which holds the parameters and, after the gather above, the whole moments.
  // Replicated-over-tp parameters are written by tp rank 0 only; a tied head's copy of
  // the token table is not written (the embedding's is).
  std::string part;
  if (grad_.rank() == 0) try {
      model::ShardFileWriter writer(tmp, fmt::format("shard-pp{:03}-tp{:03}.bin", stage_, tp_.rank()));
      std::vector<model::TensorRecord> records;
      for (std::size_t c = 0; c < chunks_.size(); ++c) {
        const model::Gpt& g = *chunks_[c];
        const float* p = g.params().params().data();
        for (const ParamView& view : g.params().views()) {
          if (!view.shard.sharded() && tp_.rank() != 0) continue;
          if (view.name == "embed.tokens" && g.has_head() && !g.has_embedding()) continue;
          model::TensorRecord r{view.name, view.shard.sharded() ? view.shard.full_shape : view.shape, {}};
          r.slices.push_back(writer.append(view.shard, view.shape, p + view.offset, ms[c].data() + view.offset,
                                           vs[c].data() + view.offset));
          records.push_back(std::move(r));
        }
      }
      part = model::manifest_part(records, writer.close());
    } catch (const Error&) {
      error = std::current_exception();
    }
  agree(error, fmt::format("saving '{}'", dir));

  // A test hook: a kill during this pause must leave the previous checkpoint in place.
  if (env::raw("NDMESH_CHECKPOINT_PAUSE_S"))
    std::this_thread::sleep_for(std::chrono::duration<double>(env::seconds("NDMESH_CHECKPOINT_PAUSE_S", 0)));
  // The parts travel to rank 0, which writes the manifest, checks it and swaps the
  // directory in.
  std::vector<std::int64_t> words = part.empty() ? std::vector<std::int64_t>{} : to_words(part);
  const std::int64_t mine = static_cast<std::int64_t>(words.size());
  std::vector<std::int64_t> counts(static_cast<std::size_t>(world.size()));
  world.all_gather(std::span<const std::int64_t>(&mine, 1), std::span<std::int64_t>(counts));
  if (world.rank() != 0) {
    if (mine > 0) world.send(std::span<const std::int64_t>(words), 0, {.tag = 78});
  } else {
    try {
      model::Manifest manifest;
      manifest.spec = options_.model;
      manifest.step = step_;
      manifest.adam_steps = adams_.front()->steps();
      manifest.data = data_->describe();
      manifest.layout = checkpoint_layout();
      if (mine > 0) model::add_manifest_part(manifest, part);
      for (int k = 1; k < world.size(); ++k) {
        const std::int64_t count = counts[static_cast<std::size_t>(k)];
        if (count == 0) continue;
        std::vector<std::int64_t> theirs(static_cast<std::size_t>(count));
        world.recv(std::span<std::int64_t>(theirs), k, {.tag = 78});
        model::add_manifest_part(manifest, from_words(theirs));
      }
      model::write_manifest(tmp, manifest);
      model::read_manifest(tmp);  // what --load will check, before it replaces anything
      model::commit_checkpoint_dir(tmp, dir);
    } catch (const Error&) {
      error = std::current_exception();
    }
  }
  agree(error, fmt::format("saving '{}'", dir));
}

void Trainer::check_matches(const std::string& path, const ModelSpec& spec, const std::string& data) const {
  auto diffs = model::spec_differences(spec, options_.model);
  if (data != data_->describe())
    diffs.push_back(fmt::format("data: checkpoint has '{}', the run has '{}'", data, data_->describe()));
  if (!diffs.empty())
    fail<ConfigError>("checkpoint", "'{}' does not match this run ({}); pass the flags it was saved with", path,
                      fmt::join(diffs, "; "));
}

void Trainer::load(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(path, ec)) {
    load_file(path);
    return;
  }
  std::exception_ptr error;
  try {
    const model::Manifest manifest = model::read_manifest(path);
    check_matches(path, manifest.spec, manifest.data);
    for (std::size_t c = 0; c < chunks_.size(); ++c) {
      model::Gpt& g = *chunks_[c];
      auto params = g.params().params();
      std::vector<float> m(params.size(), 0.0f), v(params.size(), 0.0f);
      for (const ParamView& view : g.params().views()) {
        const model::TensorRecord* t = manifest.find(view.name);
        if (t == nullptr)
          fail<IoError>("checkpoint", "'{}/{}' has no tensor '{}' although its model spec matches; the checkpoint "
                        "is corrupt",
                        path, model::kManifestFile, view.name);
        model::read_tensor(path, manifest, *t, view, params.data() + view.offset, m.data() + view.offset,
                           v.data() + view.offset);
      }
      set_moments(c, m, v);
      adams_[c]->set_steps(manifest.adam_steps);
    }
    step_ = manifest.step;
  } catch (const Error&) {
    error = std::current_exception();
  }
  agree(error, fmt::format("loading '{}'", path));
}

void Trainer::load_file(const std::string& path) {
  NDMESH_CHECK_CONFIG(stages_ == 1, "train",
                      "--load={} with --pp={}: a single-file checkpoint (format 2) loads only without pipeline "
                      "parallelism; load it with --pp 1 and save a checkpoint directory, which loads under any layout",
                      path, stages_);
  model::Checkpoint c = model::load_checkpoint(path);
  check_matches(path, c.spec, c.data);
  auto params = model().params().params();
  // The file holds the logical (serial) layout, perhaps padded (ZeRO pads to the dp
  // size): the logical parameters are the same up to the padding; each rank takes its
  // tp slices.
  std::int64_t logical = 0;
  model().params().logical_offsets(&logical);
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
  set_moments(0, m, v);
  adams_.front()->set_steps(c.adam_steps);
  step_ = c.step;
}

namespace {
char kind_letter(pp::ActionKind k) {
  switch (k) {
    case pp::ActionKind::kForward:
      return 'F';
    case pp::ActionKind::kBackward:
    case pp::ActionKind::kBackwardInput:
      return 'B';
    case pp::ActionKind::kBackwardWeight:
      return 'W';
    case pp::ActionKind::kSendActivation:
    case pp::ActionKind::kSendGradient:
      return 'S';
    default:
      return 'R';
  }
}
}  // namespace

PipelineReport Trainer::pipeline_report(const std::string& trace_path) {
  const comm::Communicator& world = groups_.world();
  const int n = world.size();
  constexpr std::size_t kFields = 8;
  std::array<std::int64_t, 3> mine = {static_cast<std::int64_t>(trace_.size()), stage_,
                                      executor_->peak_live_activations()};
  std::vector<std::int64_t> all(3 * static_cast<std::size_t>(n));
  world.all_gather(std::span<const std::int64_t>(mine), std::span<std::int64_t>(all));
  PipelineReport r;
  if (world.rank() != 0) {
    if (!trace_.empty()) world.send(std::span<const double>(trace_), 0, {.tag = 77});
    return r;
  }
  std::vector<double> events = trace_;
  for (int k = 1; k < n; ++k) {
    const auto count = static_cast<std::size_t>(all[3 * static_cast<std::size_t>(k)]);
    if (count == 0) continue;
    std::vector<double> theirs(count);
    world.recv(std::span<double>(theirs), k, {.tag = 77});
    events.insert(events.end(), theirs.begin(), theirs.end());
  }
  const pp::PipelineSchedule& s = schedule();
  const std::size_t count = events.size() / kFields;
  r.valid = true;
  r.events = static_cast<std::int64_t>(count);
  r.peak_activations.assign(static_cast<std::size_t>(s.stages), 0);
  for (int k = 0; k < n; ++k) {
    auto& peak = r.peak_activations[static_cast<std::size_t>(all[3 * static_cast<std::size_t>(k) + 1])];
    peak = std::max(peak, static_cast<int>(all[3 * static_cast<std::size_t>(k) + 2]));
  }
  r.expected_peak_activations = pp::simulate(s).peak_in_flight_chunks;

  // Bubble per (pipeline, step), leaving out the first step (allocation, warm caches).
  double min_step = 1e300;
  for (std::size_t e = 0; e < count; ++e) min_step = std::min(min_step, events[e * kFields + 2]);
  struct Window {
    double start = 1e300, end = -1e300, busy = 0;
  };
  std::map<std::pair<int, int>, Window> windows;
  double sum_f = 0, sum_b = 0, sum_w = 0;
  int n_f = 0, n_b = 0, n_w = 0;
  // Per stage: sums and counts of forward, backward (or B) and W durations.
  std::vector<std::array<double, 6>> per_stage(static_cast<std::size_t>(s.stages), std::array<double, 6>{});
  bool split = false;
  for (std::size_t e = 0; e < count; ++e) {
    const double* ev = &events[e * kFields];
    const auto kind = static_cast<pp::ActionKind>(static_cast<int>(ev[3]));
    if (ev[2] == min_step && step_ > 1) continue;
    Window& w = windows[{static_cast<int>(ev[0]), static_cast<int>(ev[2])}];
    w.start = std::min(w.start, ev[6]);
    w.end = std::max(w.end, ev[7]);
    const double d = ev[7] - ev[6];
    if (pp::is_p2p(kind)) continue;
    w.busy += d;
    if (kind == pp::ActionKind::kForward) sum_f += d, ++n_f;
    if (kind == pp::ActionKind::kBackward || kind == pp::ActionKind::kBackwardInput) sum_b += d, ++n_b;
    if (kind == pp::ActionKind::kBackwardWeight) sum_w += d, ++n_w, split = true;
    auto& st = per_stage[static_cast<std::size_t>(ev[1])];
    const int slot = kind == pp::ActionKind::kForward ? 0 : kind == pp::ActionKind::kBackwardWeight ? 2 : 1;
    st[static_cast<std::size_t>(slot)] += d;
    st[static_cast<std::size_t>(slot + 3)] += 1;
  }
  double bubble = 0;
  for (const auto& [k, w] : windows)
    bubble += w.end > w.start ? 1.0 - w.busy / (static_cast<double>(s.stages) * (w.end - w.start)) : 0.0;
  r.bubble_measured = windows.empty() ? 0.0 : bubble / static_cast<double>(windows.size());
  const double v = s.chunks;
  const double f = n_f ? sum_f / n_f * v : 1.0, b = n_b ? sum_b / n_b * v : 2.0, w = n_w ? sum_w / n_w * v : 0.0;
  // A full backward is simulated as B + W; the simulator wants both positive.
  const double tiny = 1e-6 * std::max(f, 1e-12);
  r.costs = split ? pp::Costs{.forward = std::max(f, tiny), .backward_input = std::max(b, tiny),
                              .backward_weight = std::max(w, tiny)}
                  : pp::Costs{.forward = std::max(f, tiny), .backward_input = std::max(b / 2, tiny),
                              .backward_weight = std::max(b / 2, tiny)};
  r.bubble_simulated = pp::simulate(s, r.costs).bubble_fraction;
  std::vector<pp::Costs> stage_costs;
  for (const auto& st : per_stage) {
    auto mean = [&](int k, double fallback) { return st[static_cast<std::size_t>(k + 3)] > 0 ? st[static_cast<std::size_t>(k)] / st[static_cast<std::size_t>(k + 3)] * v : fallback; };
    const double sf = std::max(mean(0, f), tiny), sb = mean(1, b), sw = mean(2, w);
    stage_costs.push_back(split ? pp::Costs{.forward = sf, .backward_input = std::max(sb, tiny),
                                            .backward_weight = std::max(sw, tiny)}
                                : pp::Costs{.forward = sf, .backward_input = std::max(sb / 2, tiny),
                                            .backward_weight = std::max(sb / 2, tiny)});
  }
  r.bubble_simulated_stages = pp::simulate_stages(s, stage_costs).bubble_fraction;

  if (!trace_path.empty()) {
    std::ofstream out(trace_path);
    if (!out) fail<IoError>("train", "--trace={}: cannot write the file; check the folder", trace_path);
    out << fmt::format(
        "{{\"ndmesh\": {{\"schedule\": \"{}\", \"stages\": {}, \"microbatches\": {}, \"chunks\": {}}},\n"
        "\"displayTimeUnit\": \"ms\",\n\"traceEvents\": [\n",
        schedule_name(s.kind), s.stages, s.microbatches, s.chunks);
    bool first = true;
    for (std::size_t e = 0; e < count; ++e) {
      const double* ev = &events[e * kFields];
      const auto kind = static_cast<pp::ActionKind>(static_cast<int>(ev[3]));
      out << (first ? "" : ",\n")
          << fmt::format("{{\"name\": \"{}{}{}\", \"cat\": \"{}\", \"ph\": \"X\", \"pid\": {}, \"tid\": {}, "
                         "\"ts\": {:.3f}, \"dur\": {:.3f}, \"args\": {{\"step\": {}, \"microbatch\": {}, "
                         "\"chunk\": {}}}}}",
                         kind_letter(kind), static_cast<int>(ev[4]),
                         s.chunks > 1 ? fmt::format(".{}", static_cast<int>(ev[5])) : std::string(),
                         pp::action_kind_name(kind), static_cast<int>(ev[0]), static_cast<int>(ev[1]),
                         ev[6] * 1e6, (ev[7] - ev[6]) * 1e6, static_cast<int>(ev[2]) + 1, static_cast<int>(ev[4]),
                         static_cast<int>(ev[5]));
      first = false;
    }
    std::set<int> pipelines;
    for (std::size_t e = 0; e < count; ++e) pipelines.insert(static_cast<int>(events[e * kFields]));
    for (int pl : pipelines) {
      out << (first ? "" : ",\n")
          << fmt::format("{{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": {}, \"args\": {{\"name\": "
                         "\"pipeline {}\"}}}}",
                         pl, pl);
      first = false;
      for (int st = 0; st < s.stages; ++st)
        out << fmt::format(",\n{{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": {}, \"tid\": {}, \"args\": "
                           "{{\"name\": \"stage {}\"}}}}",
                           pl, st, st);
    }
    out << "\n]}\n";
    if (!out) fail<IoError>("train", "--trace={}: writing failed (disk full?)", trace_path);
  }
  return r;
}

}  // namespace ndmesh::parallel
