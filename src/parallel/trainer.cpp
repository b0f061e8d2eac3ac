#include "ndmesh/parallel/trainer.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>

#include <fmt/format.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/parallel/checkpoint_io.hpp"
#include "ndmesh/parallel/state_dict.hpp"

namespace ndmesh::parallel {

namespace {
// The options, once the data has been checked against them (before anything is built).
TrainOptions check_data(TrainOptions o, const model::DataSource* data) {
  NDMESH_CHECK(data != nullptr, "train", "no data source");
  // The model's vocabulary may be larger than the data's (a preset's): tokens past the data's
  // are never seen. A smaller one could not embed the data.
  NDMESH_CHECK_CONFIG(o.model.vocab >= data->vocab(), "train",
                      "vocab={} but the data ({}) has {} tokens; use --vocab {}", o.model.vocab,
                      data->describe(), data->vocab(), data->vocab());
  data->check_seq(o.model.seq);
  return o;
}
}  // namespace

Trainer::Trainer(TrainOptions options, std::unique_ptr<model::DataSource> data, ProcessGroups& groups)
    : options_(check_data(std::move(options), data.get())),
      groups_(groups),
      model_(parallelize(options_, groups_)),
      batches_(model_.plan.batch, std::move(data)),
      sync_(model_, groups_, options_.dp),
      optimizer_(model_, sync_, options_.adamw, options_.offload, static_cast<int>(groups_.rank())),
      trace_(options_.pp.trace_steps) {
  std::vector<model::Model*> raw;
  for (auto& c : model_.chunks) raw.push_back(c.get());
  executor_ = std::make_unique<pp::Executor>(model_.plan.schedule, model_.plan.pp, std::move(raw),
                                             pp::ExecutorOptions{.timeout_s = options_.pp.timeout_s});
  active_ = executor_.get();
  // Between the layers of a chunk: drive the gradient buckets and the pipeline transfers in flight.
  for (std::size_t c = 0; c < model_.chunks.size(); ++c)
    model_.chunks[c]->set_progress_hook([this, c] {
      sync_.progress(static_cast<int>(c));
      active_->poll();
    });
  if (!options_.pp.drop_action.empty()) {
    int st = -1, index = -1;
    NDMESH_CHECK_CONFIG(std::sscanf(options_.pp.drop_action.c_str(), "%d:%d", &st, &index) == 2, "train",
                        "--pp-drop-action={} is not STAGE:INDEX; e.g. --pp-drop-action 0:1",
                        options_.pp.drop_action);
    if (st == executor_->stage()) executor_->drop_action(index);
  }
  const Mesh& mesh = groups_.mesh();
  pipeline_ = static_cast<int>(mesh.color(groups_.rank(), mesh.dims_present("pp")));
  groups_.world().barrier();
  executor_->set_origin(std::chrono::steady_clock::now());
}

double Trainer::lr_at(std::int64_t step) const { return learning_rate(options_.lr_schedule_options(), step); }

StepStats Trainer::step() {
  StepStats s = compute_step(true);
  apply_step(s);
  return s;
}

std::unique_ptr<StateDict> Trainer::state_dict(bool gather_moments) {
  return std::make_unique<StateDict>(model_, optimizer_, sync_, gather_moments);
}

void Trainer::set_replica(std::int64_t position, std::int64_t replicas) {
  const pp::PipelineSchedule& base = model_.plan.schedule;
  // The interleaved schedule runs a multiple of pp micro-batches: so does each share.
  const std::int64_t granule = base.kind == Schedule::kInterleaved ? base.stages : 1;
  const std::int64_t count = batches_.set_replica(position, replicas, granule).count;
  if (count == base.microbatches) {
    active_ = executor_.get();
    return;
  }
  auto& e = shares_[count];
  if (!e) {
    std::vector<model::Model*> raw;
    for (auto& c : model_.chunks) raw.push_back(c.get());
    e = std::make_unique<pp::Executor>(pp::make_schedule({.schedule = base.kind,
                                                          .stages = base.stages,
                                                          .microbatches = static_cast<int>(count),
                                                          .chunks = base.chunks}),
                                       model_.plan.pp, std::move(raw),
                                       pp::ExecutorOptions{.timeout_s = options_.pp.timeout_s});
  }
  active_ = e.get();
}

void Trainer::set_progress(std::int64_t steps, std::int64_t adam_steps) {
  step_ = steps;
  optimizer_.set_steps(adam_steps);
  sync_.params_updated();
}

StepStats Trainer::compute_step() { return compute_step(false); }

StepStats Trainer::compute_step(bool leave_sums_pending) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  sync_.start_step();
  model_.plan.tp_stats->reset();
  *model_.plan.ep_stats = {};
  if (model_.plan.ring) model_.plan.ring->reset();
  pp::StageHooks hooks;
  hooks.data = [&](int mb, std::int32_t* tokens, std::int32_t* targets) {
    batches_.fill(model::DataSource::kTrainStream, step_, mb, tokens, targets);
  };
  hooks.before_backward = [&](int c, bool last) { sync_.begin_backward(c, last); };
  hooks.after_backward = [&](int c) { sync_.end_backward(c); };
  hooks.take_loss = false;  // GradSync takes it with the norm
  const pp::WalkResult walk = active_->train_step(hooks);
  if (active_ == executor_.get())
    trace_.add(pipeline_, executor_->stage(), static_cast<int>(step_), walk.timings);

  sums_ = sync_.finish_step_from_heads(leave_sums_pending);
  StepStats s;
  take_moe_sums(s);
  s.loss = sums_.loss;  // 0 while the sums are pending
  s.grad_norm = sums_.grad_norm;
  s.lr = lr_at(step_);
  s.comm_seconds = sync_.comm_seconds();
  s.exposed_comm_seconds = sync_.exposed_seconds();
  s.grad_comm_bytes = sync_.reduced_bytes();
  s.step = step_ + 1;
  s.tp_comm = *model_.plan.tp_stats;
  s.ep_comm = *model_.plan.ep_stats;
  if (model_.plan.ring) {
    s.cp_kv = model_.plan.ring->stats().kv;
    s.cp_dkv = model_.plan.ring->stats().dkv;
  }
  s.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return s;
}

void Trainer::take_moe_sums(StepStats& s) {
  expert_load_.clear();
  if (options_.model.experts == 0) return;
  // Each chunk's loads are in the whole model's layout (its blocks at their places): summed
  // over the chunks and the world they are every MoE block's, whatever the stages hold.
  std::size_t all_experts = 0;
  for (std::int64_t l = 0; l < options_.model.layers; ++l)
    if (options_.model.is_moe_layer(l)) all_experts += static_cast<std::size_t>(options_.model.experts);
  std::vector<double> sums(1 + all_experts, 0.0);
  for (const auto& c : model_.chunks) {
    sums[0] += c->take_aux_loss_sum();
    const std::vector<double> load = c->take_expert_loads();
    NDMESH_CHECK(load.empty() || load.size() + 1 == sums.size(), "train",
                 "{} expert loads for the model's {}", load.size(), sums.size() - 1);
    for (std::size_t e = 0; e < load.size(); ++e) sums[e + 1] += load[e];
  }
  sync_.sum_over_world(sums);
  s.aux_loss = sums[0];
  expert_load_.assign(sums.begin() + 1, sums.end());
  s.expert_load = expert_load_;
}

void Trainer::apply_step(StepStats& s) {
  const auto t0 = std::chrono::steady_clock::now();
  // The norm as compute_step left it: pending (read after the update is enqueued), or
  // the number it returned.
  optimizer_.step(s.lr, sums_.pending != nullptr ? sums_.norm() : nn::GradNorm(s.grad_norm));
  // Then the sigmoid routers' balancing biases from the step's loads (not by the optimizer).
  if (!expert_load_.empty())
    for (const auto& c : model_.chunks) c->update_router_biases(expert_load_);
  if (sums_.pending != nullptr) {
    sync_.read_sums(sums_);
    s.loss = sums_.loss;
    s.grad_norm = sums_.grad_norm;
  }
  sums_ = {};
  s.step = ++step_;
  s.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double Trainer::evaluate(std::int64_t batches) {
  // The whole evaluation batch on the executor of the whole batch (an elastic replica's
  // share is set again before its next step).
  batches_.set_replica(0, 1);
  active_ = executor_.get();
  double sum = 0;
  for (std::int64_t b = 0; b < batches; ++b) {
    pp::StageHooks hooks;
    hooks.data = [&](int mb, std::int32_t* tokens, std::int32_t* targets) {
      batches_.fill(eval_data_ ? *eval_data_ : batches_.data(), model::DataSource::kEvalStream, b, mb, tokens,
                    targets);
    };
    sum += executor_->evaluate(hooks).loss_sum;
  }
  for (const auto& c : model_.chunks) {  // an evaluation's routing is not the next step's
    c->take_aux_loss_sum();
    c->take_expert_loads();
  }
  return sync_.global_loss(sum, static_cast<double>(batches * tokens_per_step()));
}

void Trainer::set_eval_data(std::unique_ptr<model::DataSource> data) {
  NDMESH_CHECK(data != nullptr, "train", "no held-out data source");
  NDMESH_CHECK_CONFIG(
      data->vocab() == options_.model.vocab, "train",
      "the held-out data ({}) has {} tokens but the model's vocabulary is {}; give held-out data of "
      "the training data's vocabulary",
      data->describe(), data->vocab(), options_.model.vocab);
  data->check_seq(options_.model.seq);
  eval_data_ = std::move(data);
}

MemoryBytes Trainer::memory() const {
  double elements = 0;
  for (const auto& c : model_.chunks) elements += static_cast<double>(c->params().size());
  const double optimizer = static_cast<double>(optimizer_.state_elements());
  MemoryBytes m;
  m.params = elements * sizeof(float);
  if (sync_.zero() == 3) {  // the own blocks, plus the most gathered at once (measured)
    m.params_gathered = 0;
    for (std::size_t c = 0; c < model_.chunks.size(); ++c) {
      m.params_gathered += static_cast<double>(sync_.gatherer(c)->peak_gathered_elements()) * sizeof(float);
      // The experts' gathers over edp (their own peak: an upper bound of the sum's).
      if (const ParamGatherer* eg = sync_.expert_gatherer(c))
        m.params_gathered += static_cast<double>(eg->peak_gathered_elements()) * sizeof(float);
    }
    m.params = optimizer / 2 * sizeof(float) + m.params_gathered;
    // The experts a rank stores (an expert partition) over an edp group of one are whole, not
    // only the owned shard (over 2 or more they are sharded and gathered as above).
    for (std::size_t c = 0; c < model_.chunks.size(); ++c)
      if (const GradReducer* e = sync_.expert_reducer(c);
          e != nullptr && sync_.expert_gatherer(c) == nullptr) {
        double owned = 0;
        for (const nn::Segment& seg : e->shard()) owned += static_cast<double>(seg.count);
        m.params +=
            (static_cast<double>(model_.chunks[c]->params().size() - sync_.expert_offset(c)) - owned) *
            sizeof(float);
      }
    // --offload optimizer+params: the shard is in files; memory holds what was gathered
    // (own blocks included) and, during the step, one streamed chunk (within the window).
    m.params_offloaded = static_cast<double>(optimizer_.offloaded_param_elements()) * sizeof(float);
    m.params -= m.params_offloaded;
  }
  for (const auto& c : model_.chunks)  // bf16 products on a GPU: the optimizer's bfloat16 copy
    if (c->params().keeps_bf16_copy()) m.params += static_cast<double>(c->params().size()) * sizeof(BFloat16);
  m.grads = (sync_.zero() >= 2 ? optimizer / 2 : elements) * sizeof(float);
  // Offloaded: the moments are in files; memory holds the streaming window.
  m.optimizer = optimizer_.offloaded() ? static_cast<double>(optimizer_.offload_window_bytes())
                                       : optimizer * sizeof(float);
  m.optimizer_offloaded = optimizer_.offloaded() ? optimizer * sizeof(float) : 0.0;
  m.optimizer_host = static_cast<double>(optimizer_.pinned_host_bytes());
  // ZeRO 2/3 over 2 or more ranks go per unit (GradSync gives the reducers the units):
  // measured, the pages (on a GPU the chunks) of the work space resident at once; 0 otherwise.
  m.grad_workspace = 0;
  for (std::size_t c = 0; c < model_.chunks.size(); ++c)
    m.grad_workspace += static_cast<double>(sync_.reducer(c).peak_workspace_bytes());
  // Activations: measured, not estimated. The micro-batch activations the executor held at
  // once at its peak, plus the recompute workspace the chunks share.
  m.activations = static_cast<double>(executor_->peak_live_activation_bytes() +
                                      model_.chunks.front()->recompute_workspace_bytes());
  m.activation_buffers = static_cast<double>(model_.chunks.front()->workspace_buffer_bytes());
  for (const auto& c : model_.chunks) m.activation_buffers += static_cast<double>(c->own_buffer_bytes());
  m.device_peak = static_cast<double>(ops::peak_device_bytes(model_.plan.device));
  return m;
}

model::CheckpointLayout Trainer::checkpoint_layout() const {
  model::CheckpointLayout l;
  l.mesh = groups_.mesh().to_string();
  l.world = groups_.world().size();
  l.zero = sync_.zero();
  l.virtual_stages = options_.pp.virtual_stages;
  l.partition = model_.plan.partition;
  l.sequence_parallel = options_.sequence_parallel;
  l.cp_layout = model_.plan.batch.cp_size > 1 ? std::string(to_string(options_.cp_layout)) : "";
  return l;
}

CheckpointInfo Trainer::checkpoint_info() const {
  const LrScheduleOptions lr = options_.lr_schedule_options();
  return {.spec = options_.model,
          .step = step_,
          .adam_steps = optimizer_.steps(),
          .data = data().describe(),
          .layout = checkpoint_layout(),
          .schedule = {.name = lr_schedule_name(lr.schedule),
                       .lr = lr.lr,
                       .warmup = lr.warmup,
                       .steps = lr.steps,
                       .min_lr_ratio = lr.min_lr_ratio,
                       .decay_fraction = lr.decay_fraction}};
}

void Trainer::save(const std::string& dir, int keep) {
  sync_.own_params_in();  // --offload optimizer+params: the shard back from its files
  try {
    const StateDict state(model_, optimizer_, sync_, true);
    save_checkpoint_dir(dir, state, checkpoint_info(), groups_.world(), keep);
  } catch (...) {
    sync_.own_params_out(false);
    throw;
  }
  sync_.own_params_out(false);
}

std::unique_ptr<BackgroundSave> Trainer::save_in_background(const std::string& dir, int keep) {
  sync_.own_params_in();
  std::unique_ptr<BackgroundSave> save;
  try {
    save = std::make_unique<BackgroundSave>(dir, std::make_unique<StateDict>(model_, optimizer_, sync_, true),
                                            checkpoint_info(), keep, groups_.world());
  } catch (...) {
    sync_.own_params_out(false);
    throw;
  }
  sync_.own_params_out(false);
  return save;
}

CheckpointInfo Trainer::load(const std::string& path, bool any_data) {
  StateDict state(model_, optimizer_, sync_, false);
  const CheckpointInfo info =
      load_checkpoint_dir(path, state, options_.model, data().describe(), groups_.world(), any_data);
  sync_.own_params_out(true);  // --offload optimizer+params: the loaded shard into its files
  sync_.params_updated();
  optimizer_.set_steps(info.adam_steps);
  step_ = first_step_ = info.step;
  return info;
}

PipelineReport Trainer::pipeline_report(const std::string& trace_path) {
  const comm::Communicator& world = groups_.world();
  const int n = world.size();
  // Each stage's measured peak of live activations, from every rank.
  const std::array<std::int64_t, 2> mine = {executor_->stage(), executor_->peak_live_activations()};
  std::vector<std::int64_t> all(2 * static_cast<std::size_t>(n));
  world.all_gather(std::span<const std::int64_t>(mine), std::span<std::int64_t>(all));
  const std::vector<pp::TraceEvent> events = pp::gather_trace(world, trace_.events());
  PipelineReport r;
  if (world.rank() != 0) return r;
  const pp::PipelineSchedule& s = schedule();
  const pp::TraceAnalysis a = pp::analyse_trace(events, s, static_cast<int>(first_step_));
  r.valid = true;
  r.bubble_measured = a.bubble_measured;
  r.bubble_simulated = a.bubble_simulated;
  r.bubble_simulated_stages = a.bubble_simulated_stages;
  r.costs = a.costs;
  r.events = a.events;
  r.steps = a.steps;
  r.peak_activations.assign(static_cast<std::size_t>(s.stages), 0);
  for (int k = 0; k < n; ++k) {
    int& peak = r.peak_activations[static_cast<std::size_t>(all[2 * static_cast<std::size_t>(k)])];
    peak = std::max(peak, static_cast<int>(all[2 * static_cast<std::size_t>(k) + 1]));
  }
  r.expected_peak_activations = pp::simulate(s).peak_in_flight_chunks;
  if (!trace_path.empty()) pp::write_chrome_trace(trace_path, s, events);
  return r;
}

}  // namespace ndmesh::parallel
