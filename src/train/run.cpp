// train::run: the loop of a training run (see run.hpp). The elastic step loop is here
// unchanged from `ndmesh train`, behind the same build option (NDMESH_HAVE_ELASTIC: Gloo).
#include "ndmesh/train/run.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include <fmt/core.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "console.hpp"
#include "ndmesh/comm/communicator.hpp"
#include "ndmesh/comm/process_groups.hpp"
#include "ndmesh/config/partition.hpp"
#include "ndmesh/core/env.hpp"
#include "ndmesh/core/error.hpp"
#include "ndmesh/launch/launch_env.hpp"
#include "ndmesh/model/data.hpp"
#include "ndmesh/model/hf.hpp"
#include "ndmesh/parallel/checkpoint_io.hpp"
#include "ndmesh/plan/estimate.hpp"
#include "ndmesh/plan/formulas.hpp"
#include "ndmesh/plan/hardware_file.hpp"
#include "ndmesh/tensor/blas.hpp"
#include "ndmesh/tensor/device.hpp"
#include "ndmesh/train/metrics.hpp"
#include "ndmesh/train/tensorboard.hpp"
#ifdef NDMESH_HAVE_ELASTIC
#include "ndmesh/elastic/replica.hpp"
#endif

namespace ndmesh::train {
namespace {

using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

// BLAS threads of a rank: --threads, else NDMESH_THREADS, else the cores shared by the ranks.
int blas_threads(const RunOptions& o, const comm::Communicator& world) {
  return o.threads > 0 ? static_cast<int>(o.threads)
                       : threads_from_env(std::max(1, static_cast<int>(std::thread::hardware_concurrency()) /
                                                          static_cast<int>(world.size())));
}

// work() on this rank of `world`. Alone, an error is thrown as it is; among several ranks,
// one rank's error ends the whole job now (exit 2 for bad input, 1 otherwise) with the
// message and the rank, not after the peers' timeout.
template <typename F>
auto ending_the_job_on_error(comm::Communicator& world, F&& work) -> decltype(work()) {
  try {
    return work();
  } catch (const Error& e) {
    const int code = dynamic_cast<const ConfigError*>(&e) != nullptr ? 2 : 1;
    if (world.size() == 1) throw;
    std::fflush(stdout);
    fmt::print(stderr, "ndmesh: [rank {}] {}\n", world.rank(), e.what());
    // Another rank failed and says why: its own abort ends this rank, normally at once. Ending
    // the job first could kill it before its line is out (seen under load), so wait for it.
    if (dynamic_cast<const parallel::PeersFailed*>(&e) != nullptr) std::this_thread::sleep_for(std::chrono::seconds(5));
    world.abort_job(code);
  } catch (const std::exception& e) {
    if (world.size() == 1) throw;
    std::fflush(stdout);
    fmt::print(stderr, "ndmesh: [rank {}] internal error: {}\n", world.rank(), e.what());
    world.abort_job(1);
  }
}

// One rank's memory as the planner predicts it (plan::estimate_memory, the worst stage) for
// the model the trainer builds: fp32 weights, gradients and AdamW moments (4 + 4 + 8 bytes
// a parameter), fp32 activations, no dropout, the blockwise (flash-style) attention.
double rank_memory_bytes(const parallel::TrainOptions& t, const Mesh& mesh) {
  const plan::PlanModel model{.spec = t.model, .dropout = false};
  plan::Layout l{.tp = mesh.size_of("tp"),
                 .cp = mesh.size_of("cp"),
                 .pp = mesh.size_of("pp"),
                 .dp = mesh.size_of("dp"),
                 .vpp = t.pp.virtual_stages,
                 .schedule = t.pp.schedule,
                 .recompute = t.recompute,
                 .sequence_parallel = t.sequence_parallel,
                 .zero = t.dp.zero,
                 .attention = plan::Attention::kFlash};
  l.micro_batch = t.micro_batch > 0 ? t.micro_batch : std::max<std::int64_t>(1, t.batch / l.dp);
  l.offload_optimizer = t.offload.what != parallel::Offload::kNone;  // the moments are in files
  try {
    l.stage_layers = t.pp.layers.empty()
                         ? plan::stage_chunks(model, l)
                         : parse_partition(t.pp.layers, t.model.layers, l.pp, l.vpp, "--pp-layers");
    return plan::estimate_memory(model, l, {.seq = t.model.seq, .global_batch = t.batch},
                                 plan::parse_precision("fp32"))
        .total;
  } catch (const ConfigError&) {
    return 0.0;  // a layout the trainer refuses: its own line (training_problems) is the one to show
  }
}

// Refuse sizes that would not fit instead of being killed half-way through allocation: the
// ranks of one node share its memory, so the node's ranks times one rank's need against the
// node's memory, agreed over the world (the fullest node decides for all). One rank's need
// is the planner's (rank_memory_bytes: pp, ZeRO, tp, cp and recompute counted as `ndmesh
// plan memory` counts them). On a GPU the model lives in device memory: the device
// allocator reports what does not fit.
void check_node_memory(const RunOptions& o, const parallel::TrainOptions& t, const Mesh& mesh,
                       const comm::Communicator& world) {
  const double rank_bytes = t.device != Device::kCpu ? 0.0 : rank_memory_bytes(t, mesh);
  const std::int64_t node_ranks =
      world.size() > 1 ? comm::resolve_launch_env(world).local_world_size.value_or(1) : 1;
  const double node_memory =
      static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGE_SIZE));
  // The fullest node: its share of memory needed, its ranks and its memory.
  std::array<double, 3> fullest = {
      node_memory > 0 ? rank_bytes * static_cast<double>(node_ranks) / node_memory : 0.0,
      static_cast<double>(node_ranks), node_memory};
  if (world.size() > 1) {
    std::vector<double> all(3 * static_cast<std::size_t>(world.size()));
    world.all_gather(std::span<const double>(fullest), std::span<double>(all));
    for (std::size_t k = 0; k < all.size(); k += 3)
      if (all[k] > fullest[0]) fullest = {all[k], all[k + 1], all[k + 2]};
  }
  if (fullest[0] > 0.8)
    fail<ConfigError>(
        "train",
        "--batch={} --seq={} with this model and layout needs about {:.1f} GiB on a node of {} ranks ({:.2f} "
        "GiB a "
        "rank, as 'ndmesh plan memory' counts it) but the node has {:.1f} GiB; lower --batch, --seq or "
        "--micro-batch, add --recompute full or --zero 1, or run fewer ranks per node",
        o.train.batch, o.train.model.seq, fullest[0] * fullest[2] / (1 << 30),
        static_cast<std::int64_t>(fullest[1]), fullest[0] * fullest[2] / fullest[1] / (1 << 30),
        fullest[2] / (1 << 30));
}

// The training data: the Markov source, or --data (without its held-out end, --val-fraction).
std::unique_ptr<model::DataSource> training_data(const RunOptions& o) {
  if (o.data.empty())
    return std::make_unique<model::MarkovSource>(
        model::MarkovOptions{.vocab = o.markov_vocab, .seed = o.data_seed, .sharpness = o.markov_sharpness});
  model::DataPart part;
  if (o.val_fraction > 0) part.end = 1 - o.val_fraction;
  return model::open_data_file(o.data, model::parse_data_format(o.data_format), o.train.model.vocab,
                               o.data_seed, part);
}

// The held-out data: --val-data, or the end of --data (--val-fraction); null: none.
std::unique_ptr<model::DataSource> heldout_data(const RunOptions& o, std::int64_t vocab) {
  if (!o.val_data.empty())
    return model::open_data_file(o.val_data, model::parse_data_format(o.data_format), vocab, o.data_seed,
                                 {.flag = "--val-data"});
  if (o.val_fraction > 0)
    return model::open_data_file(o.data, model::parse_data_format(o.data_format), vocab, o.data_seed,
                                 {.begin = 1 - o.val_fraction});
  return nullptr;
}

// The peak memory of this process so far: device memory on CUDA, else the resident set.
double peak_memory_bytes(Device device) {
  if (device == Device::kCuda) return static_cast<double>(cuda::allocator_stats().peak_allocated_bytes);
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return 1024.0 * static_cast<double>(usage.ru_maxrss);  // Linux: KiB
}

RunReport fit(RunOptions o, comm::Communicator& world, const std::vector<RunObserver*>& callers) {
  // Under a launcher with no layout flag every rank is data-parallel.
  ParallelConfig config;
  if (o.layout) {
    config = o.layout(world.size());
  } else {
    config.dims = layout_dims({.sizes = {{"dp", -1}}});
    config.world = world.size();
    config = resolve(config);
    validate(config, nullptr);
  }
  const Mesh mesh = config.mesh();
  check_elastic(o, mesh);
  // Several GPU ranks: every group carries device buffers (NCCL, or staged).
  ProcessGroups groups(mesh,
                       parallel::device_communicator(world, parse_device(o.device).value_or(Device::kCpu)));
  const bool lead = world.rank() == 0;
  const int threads = blas_threads(o, world);
  set_blas_threads(threads);

  std::unique_ptr<model::DataSource> data = training_data(o);
  const std::optional<double> entropy = data->entropy_rate();
  const std::int64_t vocab_flag = o.train.model.vocab;
  const bool vocab_given =
      std::find(o.model_given.begin(), o.model_given.end(), "vocab") != o.model_given.end();
  if (vocab_flag > 0 && vocab_given && vocab_flag != data->vocab())
    fail<ConfigError>(
        "train",
        "--vocab={} does not match the data ({}), which has {} tokens; use --vocab {} or leave it out",
        vocab_flag, data->describe(), data->vocab(), data->vocab());
  // A description's vocabulary (--model, the config's [model]) may be larger than the data's.
  if (vocab_flag > 0 && !vocab_given && data->vocab() > vocab_flag)
    fail<ConfigError>("train",
                      "the data ({}) has {} tokens but the model{} has a vocabulary of {}; give --vocab {} "
                      "or a model with a larger one",
                      data->describe(), data->vocab(),
                      o.model_preset.empty() ? std::string() : fmt::format(" (--model {})", o.model_preset),
                      vocab_flag, data->vocab());
  const std::int64_t vocab = vocab_flag > 0 ? vocab_flag : data->vocab();
  std::unique_ptr<model::DataSource> heldout = heldout_data(o, vocab);
  if (heldout && heldout->vocab() != vocab)
    fail<ConfigError>(
        "train",
        "--val-data={}: the held-out data ({}) has {} tokens but the training data has {}; give held-out "
        "data of the same vocabulary",
        o.val_data, heldout->describe(), heldout->vocab(), vocab);
  parallel::TrainOptions t = train_options(o, vocab, config.ranks_per_node);
  t.ep = config.folded_ep;
  check_node_memory(o, t, mesh, world);
  const std::string source = data->describe();
  const std::string heldout_source = heldout ? heldout->describe() : std::string();
  parallel::Trainer trainer(t, std::move(data), groups);
  if (heldout) trainer.set_eval_data(std::move(heldout));
  std::optional<model::ScheduleRecord> loaded_schedule;
  if (!o.load.empty()) {
    try {
      loaded_schedule = trainer.load(o.load).schedule;
    } catch (const IoError& e) {
      // A corrupt or foreign file is bad input to this command: exit 2 like a bad flag.
      fail<ConfigError>("train", "--load={}: {}; pass a checkpoint written by ndmesh train --save", o.load,
                        e.what());
    }
  }
#ifdef NDMESH_HAVE_ELASTIC
  std::unique_ptr<elastic::ElasticReplica> replica;
  if (!o.coordinator.empty()) {
    auto [host, port] = elastic::parse_address(o.coordinator, "--coordinator");
    replica = std::make_unique<elastic::ElasticReplica>(
        elastic::ReplicaOptions{.host = host,
                                .port = port,
                                .replica = static_cast<int>(o.replica_id),
                                .reduce_timeout_s = env::seconds("NDMESH_ELASTIC_TIMEOUT_S", 10),
                                .reconnect_s = env::seconds("NDMESH_ELASTIC_RECONNECT_S", 30)},
        trainer, world);
  }
#endif
  std::vector<std::string> param_hashes;    // elastic: after each committed step
  std::vector<std::int64_t> elastic_steps;  // elastic: the committed steps this replica computed
  // Elastic: only the first member of the generation of the last committed step writes
  // checkpoints, and only committed state (a replica that committed nothing writes none).
  bool write_checkpoint = o.coordinator.empty();
  const std::int64_t first = trainer.steps_done();
  const std::int64_t stop = o.until > 0 ? o.until : o.train.steps;
  if (first >= stop)
    fail<ConfigError>(
        "train",
        "the checkpoint '{}' is already at step {} >= the last step {}; pass a larger --steps or --until",
        o.load, first, stop);

  // What is written while training: the console, the metrics file, TensorBoard (world rank
  // 0), then the caller's observers.
  Console console(o);
  std::unique_ptr<MetricsFile> metrics;
  std::unique_ptr<TensorBoardWriter> tensorboard;
  std::vector<RunObserver*> observers = {&console};
  if (lead && !o.metrics.empty()) {
    metrics = std::make_unique<MetricsFile>(o.metrics, o.load.empty() ? std::nullopt : std::optional(first));
    observers.push_back(metrics.get());
  }
  if (lead && !o.tensorboard.empty()) {
    tensorboard = std::make_unique<TensorBoardWriter>(o.tensorboard,
                                                      o.load.empty() ? std::nullopt : std::optional(first));
    observers.push_back(tensorboard.get());
  }
  observers.insert(observers.end(), callers.begin(), callers.end());

  // The logical model's parameters (what the serial run has) and this rank's share.
  std::int64_t params = 0;
  // (A rank stores 1/ep of the routed experts, the same shapes on every ep rank.)
  for (const ParamView& v : trainer.model().params().views())
    params += v.full_numel() * (v.expert ? t.ep : 1);
  const RunStart start_info{.options = o,
                            .trainer = trainer,
                            .mesh = mesh,
                            .rank = world.rank(),
                            .world_size = world.size(),
                            .lead = lead,
                            .first = first,
                            .stop = stop,
                            .threads = threads,
                            .parameters = params,
                            .parameters_per_rank = trainer.model().params().parameter_count(),
                            .data = source,
                            .val_data = heldout_source,
                            .entropy_rate = entropy,
                            .loaded_schedule = loaded_schedule};
  for (RunObserver* obs : observers) obs->on_start(start_info);

  // MFU: the planner's model FLOPs of a step over the hardware's peak of every rank.
  std::optional<double> peak_flops;
  if (!o.hardware.empty())
    peak_flops = plan::for_precision(plan::hardware_by_name_or_file(o.hardware),
                                     t.precision == parallel::Precision::kBf16)
                     .peak_flops *
                 world.size();
  const double flops_per_step =
      plan::model_flops_per_step(plan::PlanModel{.spec = t.model, .dropout = false},
                                 static_cast<double>(t.model.seq), static_cast<double>(t.batch));

  const auto start = Clock::now();
  double last_loss = NAN;
  std::vector<double> losses, grad_norms, lrs, val_losses;
  std::vector<double> aux_losses;                 // mixture of experts: each step's auxiliary loss
  std::vector<std::vector<double>> expert_loads;  // and its tokens per expert (MoE block by block)
  std::vector<std::int64_t> eval_steps;
  double comm_seconds = 0, exposed_seconds = 0, step_seconds = 0;
  std::int64_t grad_comm_bytes = 0;                   // the last step's
  parallel::TpCommStats tp_comm;                      // of the last step
  parallel::CommCount cp_kv, cp_dkv;                  // of the last step
  parallel::EpCommStats ep_comm;                      // of the last step
  double tp_seconds = 0;                              // in tp communication, all steps
  std::unique_ptr<parallel::BackgroundSave> pending;  // the checkpoint being written (--save-every)
  const double tokens_per_step = static_cast<double>(trainer.tokens_per_step());
  if (o.kernel_times && stop - first == 1) cuda::kernel_times_start();
  while (trainer.steps_done() < stop) {
    parallel::StepStats s;
#ifdef NDMESH_HAVE_ELASTIC
    if (replica) {
      const elastic::CommittedStep c = replica->step();
      if (c.finished) {  // the others committed the last step while this one waited to join
        write_checkpoint = false;
        break;
      }
      s = c.stats;
      write_checkpoint = c.first_member;
      param_hashes.push_back(fmt::format("{:016x}", c.param_hash));
      elastic_steps.push_back(s.step);
      if (lead && o.json) {
        nlohmann::ordered_json j;
        j["elastic_step"] = s.step;
        j["loss"] = s.loss;
        j["grad_norm"] = s.grad_norm;
        j["param_hash"] = param_hashes.back();
        j["generation"] = c.generation;
        j["replicas"] = c.replicas;
        j["replica"] = o.replica_id;
        fmt::print("{}\n", j.dump());
        std::fflush(stdout);
      }
    } else
#endif
      s = trainer.step();
    // Kernel times leave out the first step (cuBLASLt's and cuDNN's plans, the allocator's
    // first requests), unless it is the only one.
    if (o.kernel_times && s.step == first + 1 && stop - first > 1) cuda::kernel_times_start();
    if (!std::isfinite(s.loss))
      fail<Error>("train", "loss became {} at step {}; lower --lr (now {})", s.loss, s.step, o.train.lr);
    last_loss = s.loss;
    losses.push_back(s.loss);
    grad_norms.push_back(s.grad_norm);
    if (o.train.model.experts > 0) {
      aux_losses.push_back(s.aux_loss);
      expert_loads.push_back(s.expert_load);
    }
    lrs.push_back(s.lr);
    comm_seconds += s.comm_seconds;
    grad_comm_bytes = s.grad_comm_bytes;
    exposed_seconds += s.exposed_comm_seconds;
    step_seconds += s.seconds;
    tp_comm = s.tp_comm;
    cp_kv = s.cp_kv, cp_dkv = s.cp_dkv;
    ep_comm = s.ep_comm;
    tp_seconds += s.tp_comm.seconds;
    StepRecord r{.stats = s, .first = first, .stop = stop, .lead = lead};
    // Held-out evaluation after steps N, 2N, ... and the last.
    if (o.eval_every > 0 && (s.step % o.eval_every == 0 || s.step == stop)) {
      r.val_loss = trainer.evaluate(o.eval_batches);
      eval_steps.push_back(s.step);
      val_losses.push_back(*r.val_loss);
    }
    // Checkpoints: written in the background, the one in flight committed once every rank's
    // file is (a poll each step); the next save waits for it. An elastic replica saves in the
    // step, as it always did: the replica that writes can change with every generation, and
    // two replicas must never write the same directory at once.
    if (pending && pending->try_finish()) pending.reset();
    if (o.save_every > 0 && s.step % o.save_every == 0 && s.step < stop && write_checkpoint) {
      if (pending) pending->finish();
      if (o.coordinator.empty())
        pending = trainer.save_in_background(o.save, static_cast<int>(o.keep));
      else
        trainer.save(o.save, static_cast<int>(o.keep));
    }
    r.elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
    r.tokens_per_second = tokens_per_step / std::max(s.seconds, 1e-9);
    if (peak_flops) r.mfu = flops_per_step / std::max(s.seconds, 1e-9) / *peak_flops;
    r.peak_memory_bytes = peak_memory_bytes(t.device);
    for (RunObserver* obs : observers) obs->on_step(r);
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const double tokens_per_second = static_cast<double>(stop - first) * tokens_per_step / seconds;
  const cuda::KernelTimes kernel_times = o.kernel_times ? cuda::kernel_times_stop() : cuda::KernelTimes{};
#ifdef NDMESH_HAVE_ELASTIC
  if (replica) replica->finish();
#endif
  if (pending) pending->finish();
  pending.reset();
  if (!o.save.empty() && write_checkpoint) trainer.save(o.save, static_cast<int>(o.keep));
  // The final loss is measured on evaluation batches: of the held-out data when there is
  // some, else of another stream of the training source (one training batch is too noisy to
  // compare with the entropy rate). An evaluation of the last step is that number already.
  double final_loss = last_loss;
  if (o.eval_batches > 0)
    final_loss = !eval_steps.empty() && eval_steps.back() == trainer.steps_done()
                     ? val_losses.back()
                     : trainer.evaluate(o.eval_batches);
  // Rank 0 reports the slowest rank's communication and the largest memory.
  // Peak resident memory of the process (Linux: ru_maxrss in KiB), the largest rank's.
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  std::array<double, 5> slowest = {comm_seconds, exposed_seconds, step_seconds, tp_seconds,
                                   1024.0 * static_cast<double>(usage.ru_maxrss)};
  world.all_reduce(std::span<double>(slowest), {.op = comm::ReduceOp::kMax});
  const parallel::MemoryBytes mem = trainer.memory();
  // Each rank's measured activation bytes, and the largest of each pipeline stage.
  const std::int64_t stages = mesh.size_of("pp");
  std::vector<double> act_per_rank(static_cast<std::size_t>(world.size()), 0.0);
  act_per_rank[static_cast<std::size_t>(world.rank())] = mem.activations;
  world.all_reduce(std::span<double>(act_per_rank));
  std::vector<double> act_per_stage(static_cast<std::size_t>(stages), 0.0);
  act_per_stage[static_cast<std::size_t>(groups.pp().rank())] = mem.activations;
  world.all_reduce(std::span<double>(act_per_stage), {.op = comm::ReduceOp::kMax});
  const parallel::PipelineReport pipe = trainer.pipeline_report(o.trace);

  const double steps_run = static_cast<double>(stop - first);
  json j;
  j["final_loss"] = final_loss;
  j["last_batch_loss"] = last_loss;
  j["entropy_rate"] = entropy ? json(*entropy) : json(nullptr);
  j["tokens_per_second"] = tokens_per_second;
  j["steps"] = trainer.steps_done();
  j["first_step"] = first + 1;
  j["seconds"] = seconds;
  j["parameters"] = params;
  j["parameters_per_rank"] = start_info.parameters_per_rank;
  j["threads"] = threads;
  j["data"] = source;
  json dims = json::object();
  for (const Dim& d : mesh.dims()) dims[d.name] = d.size;
  j["layout"] = dims;
  j["world_size"] = world.size();
  j["micro_batches"] = trainer.microbatches();
  j["zero"] = t.dp.zero;
  j["sequence_parallel"] = t.sequence_parallel;
  j["recompute"] = o.recompute;
  j["offload"] = o.offload;
  if (trainer.optimizer().pinned()) {  // rank 0's copies over PCIe (the first step also reads the master)
    j["offload_pcie"] = {{"bytes_to_host_per_step",
                          static_cast<double>(trainer.optimizer().pinned_bytes_to_host()) / steps_run},
                         {"bytes_to_device_per_step",
                          static_cast<double>(trainer.optimizer().pinned_bytes_to_device()) / steps_run}};
  } else if (trainer.optimizer().offloaded()) {
    // Rank 0's files: bytes moved per step and the rate of the I/O tasks (read and write
    // run beside each other and beside the update).
    const auto& opt = trainer.optimizer();
    j["offload_io"] = {
        {"bytes_read_per_step", static_cast<double>(opt.offload_bytes_read()) / steps_run},
        {"bytes_written_per_step", static_cast<double>(opt.offload_bytes_written()) / steps_run},
        {"io_seconds_per_step", opt.offload_io_seconds() / steps_run}};
  }
  j["device"] = o.device;
  j["precision"] = o.precision;
  if (o.kernel_times) {  // rank 0's GPU, over the steps after the first
    json rows = json::array();
    for (const cuda::KernelTime& kt : kernel_times.rows)
      rows.push_back({{"name", kt.name}, {"calls", kt.calls}, {"seconds", kt.seconds}});
    j["kernel_times"] = {{"steps", stop - first > 1 ? stop - first - 1 : 1},
                         {"seconds", kernel_times.seconds},
                         {"host_waits", kernel_times.host_waits},
                         {"host_wait_seconds", kernel_times.host_wait_seconds},
                         {"rows", rows}};
  }
  // What the last step moved over this rank's tp group (bytes of the full buffers).
  auto count = [](const parallel::CommCount& c) { return json{{"calls", c.calls}, {"bytes", c.bytes}}; };
  j["tp_comm_per_step"] = {{"all_reduce", count(tp_comm.all_reduce)},
                           {"all_gather", count(tp_comm.all_gather)},
                           {"reduce_scatter", count(tp_comm.reduce_scatter)}};
  j["tp_comm_seconds"] = slowest[3] / steps_run;  // per step, the slowest rank
  // The cp ring (rank 0's sends; every cp rank sends as much): key/value blocks, in bf16
  // under --precision bf16, and the dK/dV accumulators.
  j["cp_comm_per_step"] = {{"kv", count(cp_kv)}, {"dkv", count(cp_dkv)}};
  // A mixture of experts under --ep (rank 0's): the exchanges of the dispatch and combine (the
  // per-expert counts' all-to-alls are calls without bytes) and the fp32 rows it sent.
  if (o.train.model.experts > 0)
    j["ep_comm_per_step"] = {
        {"calls", ep_comm.calls},
        {"bytes", ep_comm.elements * static_cast<std::int64_t>(sizeof(float))},
        {"seconds", ep_comm.seconds}};
  j["allreduce"] = o.allreduce;
  j["losses"] = losses;
  if (!o.coordinator.empty()) {
    j["elastic_steps"] = elastic_steps;  // the step of each entry of losses, grad_norms, param_hashes
    j["param_hashes"] = param_hashes;
  }
  j["grad_norms"] = grad_norms;
  if (o.train.model.experts > 0) {
    j["aux_losses"] = aux_losses;  // beside losses, which are the LM loss alone
    j["expert_loads"] = expert_loads;
  }
  j["lrs"] = lrs;
  j["lr_schedule"] = o.lr_schedule;
  j["eval_steps"] = eval_steps;  // --eval-every: the steps of val_losses
  j["val_losses"] = val_losses;
  j["val_data"] = heldout_source.empty() ? json(nullptr) : json(heldout_source);
  j["step_seconds"] = slowest[2] / steps_run;
  j["grad_dtype"] = o.grad_dtype;
  j["grad_comm_bytes_per_step"] = grad_comm_bytes;  // rank 0's, handed to the dp reductions
  j["comm_seconds"] = slowest[0];
  j["exposed_comm_seconds"] = slowest[1];
  j["memory_bytes"] = {{"params", mem.params},
                       {"params_gathered", mem.params_gathered},
                       {"params_offloaded", mem.params_offloaded},
                       {"grads", mem.grads},
                       {"optimizer", mem.optimizer},
                       {"optimizer_offloaded", mem.optimizer_offloaded},
                       {"optimizer_host", mem.optimizer_host},
                       {"activations", mem.activations},
                       {"activation_buffers", mem.activation_buffers},
                       {"grad_workspace", mem.grad_workspace},
                       {"device_peak", mem.device_peak},
                       {"peak_rss", slowest[4]}};
  // memory_bytes.activations is rank 0's; every rank's, and each stage's largest:
  j["activation_bytes_per_rank"] = act_per_rank;
  j["activation_bytes_per_stage"] = act_per_stage;
  if (!o.save.empty()) j["checkpoint"] = o.save;
  {
    const auto& sc = trainer.schedule();
    j["pipeline"] = {{"schedule", std::string(schedule_name(sc.kind))},
                     {"stages", sc.stages},
                     {"chunks", sc.chunks},
                     {"microbatches", sc.microbatches},
                     {"partition", trainer.partition()},
                     {"bubble_measured", pipe.bubble_measured},
                     {"bubble_simulated", pipe.bubble_simulated},
                     {"bubble_simulated_stages", pipe.bubble_simulated_stages},
                     {"forward_seconds", pipe.costs.forward},
                     {"backward_input_seconds", pipe.costs.backward_input},
                     {"backward_weight_seconds", pipe.costs.backward_weight},
                     {"trace_steps", pipe.steps},
                     {"trace_events", pipe.events},
                     {"peak_activations", pipe.peak_activations},
                     {"expected_peak_activations", pipe.expected_peak_activations}};
  }
  RunReport report;
  // Full precision: the losses are compared with other layouts' to 1e-5.
  report.json = j.dump(-1, ' ', false, json::error_handler_t::replace);
  report.final_loss = final_loss;
  report.losses = std::move(losses);
  report.eval_steps = std::move(eval_steps);
  report.val_losses = std::move(val_losses);
  report.lead = lead;
  for (RunObserver* obs : observers) obs->on_end(report);
  return report;
}

}  // namespace

EvalReport evaluate(RunOptions o, std::int64_t batches) {
  NDMESH_CHECK_CONFIG(
      !o.load.empty() && (model::is_checkpoint_dir(o.load) || model::is_hf_dir(o.load)), "eval",
      "--load={}: not a checkpoint directory; pass one written by ndmesh train --save or ndmesh "
      "checkpoint import-hf, or a Hugging Face folder (config.json, model.safetensors)",
      o.load);
  NDMESH_CHECK_CONFIG(!o.data.empty(), "eval", "--data is missing; pass the token file to evaluate on");
  NDMESH_CHECK_CONFIG(batches > 0, "eval", "--batches={} must be at least 1; e.g. --batches 8", batches);
  resolve_model(o);  // the checkpoint's description, --seq over it
  if (auto problems = model_problems(o.train.model, ModelFieldNames::kFlags); !problems.empty())
    fail<ConfigError>("eval", "{}", fmt::join(problems, "; "));
  comm::Communicator world = comm::Communicator::world();
  auto work = [&]() -> EvalReport {
    const ParallelConfig config = o.layout(world.size());
    const Mesh mesh = config.mesh();
    ProcessGroups groups(mesh,
                         parallel::device_communicator(world, parse_device(o.device).value_or(Device::kCpu)));
    set_blas_threads(blas_threads(o, world));
    const ModelSpec& spec = o.train.model;
    auto data = std::make_unique<model::ConsecutiveSource>(o.data, model::parse_data_format(o.data_format),
                                                           spec.vocab, o.train.batch, spec.seq, batches);
    const std::int64_t tokens = batches * o.train.batch * spec.seq;
    parallel::TrainOptions t = train_options(o, spec.vocab, config.ranks_per_node);
    t.ep = config.folded_ep;
    parallel::Trainer trainer(t, std::move(data), groups);
    try {
      trainer.load(o.load, true);
    } catch (const IoError& e) {
      fail<ConfigError>("eval", "--load={}: {}", o.load, e.what());
    }
    EvalReport r;
    r.loss = trainer.evaluate(batches);
    r.perplexity = std::exp(r.loss);
    r.tokens = tokens;
    r.lead = world.rank() == 0;
    json j;
    j["loss"] = r.loss;
    j["perplexity"] = r.perplexity;
    j["tokens"] = r.tokens;
    r.json = j.dump();
    return r;
  };
  return ending_the_job_on_error(world, work);
}

RunReport run(RunOptions o, const std::vector<RunObserver*>& observers) {
  resolve_model(o);
  expand_memory(o);
  resolve_elastic(o);
  // Printed before anything is checked, so that what the strategy chose shows with any refusal.
  if (!o.memory_choice.empty() && LaunchEnv::detect().rank == 0) {
    fmt::print("{}\n", o.memory_choice);
    std::fflush(stdout);
  }
  check_run_options(o);
  comm::Communicator world = comm::Communicator::world();
  return ending_the_job_on_error(world, [&] { return fit(std::move(o), world, observers); });
}

}  // namespace ndmesh::train
