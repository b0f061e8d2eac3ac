// `ndmesh train`: trains the GPT model, alone or under a launcher (mpirun, srun, ndmesh
// launch) with the layout flags of `ndmesh mesh` (--dp N, --cp N, --tp N). A layout of size 1 is
// the serial run, on the same code path. With no data flag it trains on a seeded Markov
// chain whose entropy rate is known exactly, so the printout shows how far the loss is
// from the best possible. Rank 0 prints one progress line per step (a redrawn bar when
// stdout is a terminal); with --json the last line is one JSON object. An error on any
// rank is printed with its rank and ends the whole job at once.
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

#include <filesystem>

#include "mesh_flags.hpp"
#include "ndmesh/comm/communicator.hpp"
#include "ndmesh/comm/process_groups.hpp"
#include "ndmesh/config/partition.hpp"
#include "ndmesh/config/training.hpp"
#include "ndmesh/core/env.hpp"
#include "ndmesh/core/error.hpp"
#include "ndmesh/core/log.hpp"
#ifdef NDMESH_HAVE_ELASTIC
#include "ndmesh/elastic/replica.hpp"
#endif
#include "ndmesh/model/checkpoint_dir.hpp"
#include "ndmesh/model/data.hpp"
#include "ndmesh/parallel/trainer.hpp"
#include "ndmesh/plan/estimate.hpp"
#include "ndmesh/tensor/blas.hpp"
#include "ndmesh/tensor/device.hpp"
#include "subcommand.hpp"

namespace ndmesh::cli {
namespace {

struct Options {
  MeshFlags layout;
  std::int64_t micro_batch = 0;
  double bucket_mb = 25;
  bool no_overlap = false;
  bool no_progress_thread = false;
  std::string grad_dtype = "fp32";
  bool sequence_parallel = false;
  int zero = 0;
  bool zero3_reshard_after_forward = true, zero3_prefetch = true;
  std::string offload = "none", offload_dir;
  double offload_chunk_mb = 32;
  std::string memory;  // --memory: a strategy that sets --recompute, --zero and --offload (given ones win)
  std::string memory_choice;  // what it chose, printed by rank 0
  bool zero_given = false, recompute_given = false, offload_given = false, offload_dir_given = false;
  std::string allreduce = "mpi";
  std::string cp_layout = "zigzag";
  std::string recompute = "none";
  std::string device = "cpu", precision = "fp32";
  std::int64_t layers = 2, hidden = 64, heads = 4, kv_heads = 2, ffn = 0, seq = 64, vocab = 0;
  bool untied = false;
  std::int64_t batch = 16, steps = 1000, warmup = 20;
  double lr = 6e-4, min_lr_ratio = 0.1, weight_decay = 0.1, clip = 1.0;
  std::uint64_t seed = 1;
  std::string data, data_format = "auto";
  bool data_given = false;
  std::int64_t markov_vocab = 32;
  double markov_sharpness = 2.5;
  std::uint64_t data_seed = 1;
  std::int64_t threads = 0;
  std::string save, load;
  bool save_given = false, load_given = false;
  std::int64_t until = 0, save_every = 0;
  std::int64_t eval_batches = 8;
  bool json = false;
  bool kernel_times = false;
  std::string schedule = "1f1b";
  std::int64_t virtual_stages = 1;
  std::string pp_layers, trace, drop_action;
  std::int64_t trace_steps = 32;
  std::string coordinator;  // elastic: --coordinator or NDMESH_COORDINATOR
  std::int64_t replica_id = -1;
};

// Elastic data parallelism (docs/elastic.md): each replica is its own job with dp = 1 (the
// dp dimension is the set of live replicas); what cannot live in one replica is refused.
void check_elastic(Options& o, const Mesh& mesh) {
  if (o.coordinator.empty()) return;
#ifndef NDMESH_HAVE_ELASTIC
  fail<ConfigError>("train", "--coordinator={}: this ndmesh is built without Gloo, which elastic training needs "
                    "(Debian: apt-get install libgloo-dev, then rebuild)", o.coordinator);
#endif
  if (o.replica_id < 0)
    fail<ConfigError>("train", "--coordinator={} needs the replica's id: set NDMESH_REPLICA_ID or --replica-id "
                      "(0..R-1, the same across restarts)", o.coordinator);
  if (mesh.size_of("dp") != 1)
    fail<ConfigError>("train", "--dp={} with a coordinator: the dp dimension of an elastic run is the set of live "
                      "replicas; run each replica with --dp 1 (its ranks as tp x pp x cp)", mesh.size_of("dp"));
  if (o.zero != 0)
    fail<ConfigError>("train", "--zero={} with a coordinator: the reduction across replicas and the healing of a "
                      "replica move whole gradient and optimizer buffers, not ZeRO shards; use --zero 0 for elastic "
                      "runs", o.zero);
  if (o.offload != "none")
    fail<ConfigError>("train", "--offload={} with a coordinator: a replica's state must be in memory to be copied to "
                      "a healing replica; use --offload none for elastic runs", o.offload);
  if (o.device != "cpu")
    fail<ConfigError>("train", "--device={} with a coordinator: elastic runs are CPU-only for now; use --device cpu",
                      o.device);
  if (o.micro_batch == 0) o.micro_batch = 1;  // the global batch is split over replicas by micro-batches
}

// Bad flag values are ConfigErrors (exit 2) naming the flag, the value and a fix.
void need(bool ok, std::string_view flag, auto value, std::string_view rule, std::string_view example) {
  if (!ok) fail<ConfigError>("train", "{}={} {}; e.g. {} {}", flag, value, rule, flag, example);
}

// The run's options from the flags (the names, schedule and mode strings already checked).
parallel::TrainOptions train_options(const Options& o, std::int64_t vocab, std::int64_t ranks_per_node) {
  return parallel::TrainOptions{.model = ModelSpec{.name = {},
                                              .layers = o.layers,
                                              .hidden = o.hidden,
                                              .heads = o.heads,
                                              .kv_heads = o.kv_heads,
                                              .ffn = o.ffn,
                                              .seq = o.seq,
                                              .vocab = vocab,
                                              .tied_embeddings = !o.untied},
                           .batch = o.batch,
                           .micro_batch = o.micro_batch,
                           .steps = o.steps,
                           .lr = o.lr,
                           .warmup = o.warmup,
                           .min_lr_ratio = o.min_lr_ratio,
                           .adamw = {.weight_decay = o.weight_decay, .clip_norm = o.clip},
                           .seed = o.seed,
                           .dp = {.bucket_mb = o.bucket_mb,
                                  .overlap = !o.no_overlap,
                                  .zero = o.zero,
                                  .algorithm = comm::parse_algorithm(o.allreduce),
                                  .ranks_per_node = ranks_per_node,
                                  .progress_thread = !o.no_progress_thread,
                                  .bf16 = o.grad_dtype == "bf16",
                                  .zero3 = {.reshard_after_forward = o.zero3_reshard_after_forward,
                                            .prefetch = o.zero3_prefetch}},
                           .pp = {.schedule = parse_schedule(o.schedule),
                                  .virtual_stages = o.virtual_stages,
                                  .layers = o.pp_layers,
                                  .drop_action = o.drop_action,
                                  .trace_steps = o.trace_steps},
                           .cp_layout = parallel::parse_cp_layout(o.cp_layout),
                           .sequence_parallel = o.sequence_parallel,
                           .recompute = parse_recompute(o.recompute),
                           .device = parse_device(o.device).value_or(Device::kCpu),
                           .precision = o.precision == "bf16" ? parallel::Precision::kBf16 : parallel::Precision::kFp32,
                           .offload = {.what = parallel::parse_offload(o.offload).value_or(parallel::Offload::kNone),
                                       .dir = o.offload_dir,
                                       // MiB of both moments: 8 bytes an element
                                       .chunk_elements = static_cast<std::int64_t>(o.offload_chunk_mb * 1024 * 1024 / 8)}};
}

void validate(const Options& o) {
  need(o.markov_vocab >= 2 && o.markov_vocab <= 1024, "--markov-vocab", o.markov_vocab,
       "must be in [2, 1024]", "32");
  need(o.markov_sharpness >= 0 && std::isfinite(o.markov_sharpness), "--markov-sharpness", o.markov_sharpness,
       "must be a finite number >= 0", "2.5");
  need(o.threads >= 0 && o.threads <= 1024, "--threads", o.threads,
       "must be in [0, 1024] (0: NDMESH_THREADS)", "1");
  // (--steps below 1 is train_option_problems' line, not --until's.)
  need(o.steps < 1 || (o.until >= 0 && o.until <= o.steps), "--until", o.until,
       fmt::format("must be in [0, --steps={}]", o.steps), "100");
  need(o.save_every >= 0, "--save-every", o.save_every, "must be >= 0 (0: only at the end)", "100");
  need(o.save_every == 0 || !o.save.empty(), "--save-every", o.save_every, "needs --save PATH",
       "100 --save run.ckpt");
  need(o.eval_batches >= 0, "--eval-batches", o.eval_batches, "must be >= 0", "8");
  need(o.grad_dtype == "fp32" || o.grad_dtype == "bf16", "--grad-dtype", o.grad_dtype, "must be fp32 or bf16",
       "bf16");
  comm::parse_algorithm(o.allreduce);
  {
    bool known = false;
    for (Schedule sc : {Schedule::kGpipe, Schedule::k1F1B, Schedule::kInterleaved, Schedule::kZbH1})
      known = known || schedule_name(sc) == o.schedule;
    need(known, "--schedule", o.schedule, "is not a pipeline schedule (gpipe, 1f1b, interleaved, zb-h1)",
         "1f1b");
  }
  parse_recompute(o.recompute);
  model::parse_data_format(o.data_format);
  need(parallel::parse_offload(o.offload).has_value(), "--offload", o.offload,
       "is not an offload mode (none, optimizer, optimizer+params)", "optimizer");
  if (o.offload_dir_given && o.offload_dir.empty())
    fail<ConfigError>("train",
                      "--offload-dir is empty; pass a folder on a local disk, e.g. --offload-dir /tmp");
  if (!o.offload_dir.empty() &&
      (!std::filesystem::is_directory(o.offload_dir) || ::access(o.offload_dir.c_str(), W_OK) != 0))
    fail<ConfigError>("train", "--offload-dir={}: not a writable folder; create it or pick another",
                      o.offload_dir);
  need(o.offload_chunk_mb >= 0.001 && o.offload_chunk_mb <= 4096, "--offload-chunk-mb", o.offload_chunk_mb,
       "must be in [0.001, 4096] (MiB of both moments per streamed chunk)", "32");
  need(parse_device(o.device).has_value(), "--device", o.device, "is not a device (cpu, cuda)", "cuda");
  need(o.precision == "fp32" || o.precision == "bf16", "--precision", o.precision, "must be fp32 or bf16", "fp32");
  if (o.kernel_times && o.device != "cuda")
    fail<ConfigError>("train",
                      "--kernel-times with --device={}: it times the GPU's kernels; add --device cuda or drop "
                      "--kernel-times",
                      o.device);
  // The model's shape rules (config's model_problems, named as the flags) and the options
  // the runtime checks itself (parallel::train_option_problems), checked here too so that
  // a bad value fails before any rank starts. --vocab 0 is the data's vocabulary: the
  // Markov source's or the 256 byte values.
  const std::int64_t vocab = o.vocab != 0 ? o.vocab : o.data.empty() ? o.markov_vocab : 256;
  if (auto problems = model_problems(train_options(o, vocab, 0).model, ModelFieldNames::kFlags); !problems.empty())
    fail<ConfigError>("train", "{}", fmt::join(problems, "; "));
  if (auto problems = parallel::train_option_problems(train_options(o, 0, 0)); !problems.empty())
    fail<ConfigError>("train", "{}", fmt::join(problems, "; "));
  namespace fs = std::filesystem;
  std::error_code ec;
  // An empty value must not silently switch the feature off.
  if (o.data_given && o.data.empty())
    fail<ConfigError>("train",
                      "--data is empty; pass a text file, or leave --data out for the Markov source");
  if (o.save_given && o.save.empty())
    fail<ConfigError>("train",
                      "--save is empty; pass a directory name such as run.ckpt, or leave --save out");
  if (o.load_given && o.load.empty())
    fail<ConfigError>("train", "--load is empty; pass a checkpoint written with --save, or leave --load out");
  if (!o.load.empty()) {
    if (!fs::exists(o.load, ec))
      fail<ConfigError>(
          "train", "--load={}: no such file or directory; pass a checkpoint written with --save", o.load);
    if (!fs::is_regular_file(o.load, ec) && !fs::is_directory(o.load, ec))
      fail<ConfigError>(
          "train", "--load={}: not a checkpoint directory or file; pass a checkpoint written with --save",
          o.load);
    if (::access(o.load.c_str(), R_OK) != 0)
      fail<ConfigError>("train", "--load={}: cannot read it; check its permissions", o.load);
  }
  if (!o.save.empty()) {
    // Found now, not after the whole run: the folder must exist and be writable, the
    // temporary sibling's name must be a valid file name, and --save replaces only a
    // checkpoint directory (never a file or a directory of something else).
    fs::path target(o.save);
    while (!target.empty() && target.filename().empty()) target = target.parent_path();  // "ck/" -> "ck"
    const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
    if (fs::exists(target, ec) && !fs::is_directory(target, ec))
      fail<ConfigError>(
          "train",
          "--save={}: is a file (a single-file checkpoint of an older ndmesh?); --save writes a "
          "checkpoint directory: pick a new name",
          o.save);
    if (fs::is_directory(target, ec) && !model::is_checkpoint_dir(target.string()) &&
        !fs::is_empty(target, ec))
      fail<ConfigError>("train",
                        "--save={}: is a directory that is not an ndmesh checkpoint; --save replaces only a "
                        "checkpoint directory: pick a new name",
                        o.save);
    if (!fs::is_directory(dir, ec) || ::access(dir.c_str(), W_OK) != 0)
      fail<ConfigError>(
          "train", "--save={}: the folder '{}' does not exist or is not writable; create it or pick another",
          o.save, dir.string());
    if (target.filename().string().size() + 17 > 255)
      fail<ConfigError>(
          "train", "--save={}: the name is too long ({} bytes with the temporary suffix; the limit is 255)",
          o.save, target.filename().string().size() + 17);
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
    l.stage_layers = t.pp.layers.empty() ? plan::stage_chunks(model, l)
                                         : parse_partition(t.pp.layers, t.model.layers, l.pp, l.vpp, "--pp-layers");
    return plan::estimate_memory(model, l, {.seq = t.model.seq, .global_batch = t.batch},
                                 plan::parse_precision("fp32"))
        .total;
  } catch (const ConfigError&) {
    return 0.0;  // a layout the trainer refuses: its own line (training_problems) is the one to show
  }
}

std::string clock(double seconds) {
  auto s = static_cast<long long>(std::max(0.0, seconds) + 0.5);
  return s >= 3600 ? fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
                   : fmt::format("{}:{:02}", s / 60, s % 60);
}

// What rank 0 prints and returns; every rank runs it.
// --kernel-times: rank 0's table, the operations by GPU time per step, the longest first.
void print_kernel_times(const cuda::KernelTimes& t, std::int64_t from, std::int64_t to) {
  constexpr std::size_t kRows = 30;
  const double steps = static_cast<double>(std::max<std::int64_t>(to - from + 1, 1));
  fmt::print("kernel times (rank 0, steps {}..{}): {:.3f} ms of GPU time a step, the host waited for the GPU {:.1f} "
             "times a step ({:.3f} ms)\n",
             from, to, 1e3 * t.seconds / steps, static_cast<double>(t.host_waits) / steps,
             1e3 * t.host_wait_seconds / steps);
  fmt::print("  {:>10} {:>7} {:>10}  {}\n", "ms/step", "share", "calls/step", "operation");
  double rest = 0;
  std::int64_t rest_rows = 0;
  for (std::size_t i = 0; i < t.rows.size(); ++i) {
    const cuda::KernelTime& r = t.rows[i];
    if (i >= kRows) {
      rest += r.seconds;
      ++rest_rows;
      continue;
    }
    fmt::print("  {:>10.3f} {:>6.1f}% {:>10.1f}  {}\n", 1e3 * r.seconds / steps,
               t.seconds > 0 ? 100 * r.seconds / t.seconds : 0.0, static_cast<double>(r.calls) / steps, r.name);
  }
  if (rest_rows > 0)
    fmt::print("  {:>10.3f} {:>6.1f}% {:>10}  ({} more operations; every row is in --json's kernel_times)\n",
               1e3 * rest / steps, t.seconds > 0 ? 100 * rest / t.seconds : 0.0, "", rest_rows);
}

int train(Options o, comm::Communicator& world) {
  // Under a launcher with no layout flag every rank is data-parallel.
  o.layout.set_default_sizes({{"dp", -1}});
  MeshSetup layout = o.layout.resolve(world.size());
  check_elastic(o, layout.mesh);
  // Several GPU ranks: every group carries device buffers (NCCL, or staged).
  ProcessGroups groups(layout.mesh,
                       parallel::device_communicator(world, parse_device(o.device).value_or(Device::kCpu)));
  const bool lead = world.rank() == 0;
  const int threads =
      o.threads > 0 ? static_cast<int>(o.threads)
                    : threads_from_env(std::max(1, static_cast<int>(std::thread::hardware_concurrency()) /
                                                       static_cast<int>(world.size())));
  set_blas_threads(threads);

  std::unique_ptr<model::DataSource> data;
  if (o.data.empty())
    data = std::make_unique<model::MarkovSource>(
        model::MarkovOptions{.vocab = o.markov_vocab, .seed = o.data_seed, .sharpness = o.markov_sharpness});
  else
    data = model::open_data_file(o.data, model::parse_data_format(o.data_format), o.vocab, o.data_seed);
  const std::optional<double> entropy = data->entropy_rate();
  if (o.vocab > 0 && o.vocab != data->vocab())
    fail<ConfigError>(
        "train",
        "--vocab={} does not match the data ({}), which has {} tokens; use --vocab {} or leave it out",
        o.vocab, data->describe(), data->vocab(), data->vocab());

  const parallel::TrainOptions t =
      train_options(o, o.vocab > 0 ? o.vocab : data->vocab(), layout.config.ranks_per_node);
  // Refuse sizes that would not fit instead of being killed half-way through allocation:
  // the ranks of one node share its memory, so the node's ranks times one rank's need
  // against the node's memory, agreed over the world (the fullest node decides for all).
  // One rank's need is the planner's (rank_memory_bytes: pp, ZeRO, tp, cp and recompute
  // counted as `ndmesh plan memory` counts them). On a GPU the model lives in device
  // memory: the device allocator reports what does not fit.
  const double rank_bytes = t.device != Device::kCpu ? 0.0 : rank_memory_bytes(t, layout.mesh);
  const std::int64_t node_ranks = world.size() > 1 ? comm::resolve_launch_env(world).local_world_size.value_or(1) : 1;
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
        "--batch={} --seq={} with this model and layout needs about {:.1f} GiB on a node of {} ranks ({:.2f} GiB a "
        "rank, as 'ndmesh plan memory' counts it) but the node has {:.1f} GiB; lower --batch, --seq or "
        "--micro-batch, add --recompute full or --zero 1, or run fewer ranks per node",
        o.batch, o.seq, fullest[0] * fullest[2] / (1 << 30), static_cast<std::int64_t>(fullest[1]),
        fullest[0] * fullest[2] / fullest[1] / (1 << 30), fullest[2] / (1 << 30));
  const std::int64_t stages = layout.mesh.size_of("pp");
  const std::string source = data->describe();
  parallel::Trainer trainer(t, std::move(data), groups);
  if (!o.load.empty()) {
    try {
      trainer.load(o.load);
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
  const std::int64_t stop = o.until > 0 ? o.until : o.steps;
  if (first >= stop)
    fail<ConfigError>(
        "train",
        "the checkpoint '{}' is already at step {} >= the last step {}; pass a larger --steps or --until",
        o.load, first, stop);

  // Under a launcher stdout is often a pseudo-terminal of the launcher (Open MPI) whatever
  // mpirun's own stdout is: print plain lines there.
  const bool tty = ::isatty(::fileno(stdout)) != 0 && LaunchEnv::detect().launcher == Launcher::kNone;
  // The logical model's parameters (what the serial run has) and this rank's share.
  std::int64_t params = 0;
  for (const ParamView& v : trainer.model().params().views()) params += v.full_numel();
  const auto params_per_rank = trainer.model().params().parameter_count();
  const std::string layout_text = layout.mesh.to_string();
  if (lead) {
    fmt::print("model: {} layers, hidden {}, heads {}/{} kv, ffn {}, seq {}, vocab {}, {} parameters ({})\n",
               o.layers, o.hidden, o.heads, t.model.kv_heads_or_heads(), t.model.ffn_or_default(), o.seq,
               t.model.vocab, params, t.model.tied_embeddings ? "tied head" : "untied head");
    fmt::print(
        "data: {}{}\n", source,
        entropy ? fmt::format(", entropy rate {:.4f} nats/token (best achievable loss)", *entropy) : "");
    if (world.size() > 1)
      fmt::print(
          "layout: {} on {} ranks; micro-batches {} of {} sequences per dp rank; ZeRO {}, all-reduce {} in "
          "{}, "
          "buckets of {} MiB{}{}\n",
          layout_text, world.size(), trainer.microbatches(), trainer.model().batch(), o.zero, o.allreduce,
          o.grad_dtype, o.bucket_mb, o.no_overlap ? ", no overlap" : ", overlapped with backward",
          layout.mesh.size_of("tp") > 1
              ? fmt::format("; tp {} ({} parameters per rank{})", layout.mesh.size_of("tp"), params_per_rank,
                            o.sequence_parallel ? ", sequence parallel" : "")
              : "");
    if (layout.mesh.size_of("cp") > 1)
      fmt::print(
          "context parallel: {} ranks, {} layout, {} of {} tokens per sequence per rank, ring attention\n",
          layout.mesh.size_of("cp"), o.cp_layout, trainer.model().seq(), o.seq);
    if (!o.load.empty()) fmt::print("resumed from {} at step {}\n", o.load, first);
    fmt::print("train: batch {}, steps {}..{}, lr {} (warmup {}, cosine to {}x), {} BLAS thread{}{}\n",
               o.batch, first + 1, stop, o.lr, o.warmup, o.min_lr_ratio, threads, threads == 1 ? "" : "s",
               world.size() > 1 ? " per rank" : "");
    std::fflush(stdout);
  }

  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  double last_loss = NAN;
  std::vector<double> losses, grad_norms;
  double comm_seconds = 0, exposed_seconds = 0, step_seconds = 0;
  std::int64_t grad_comm_bytes = 0;  // the last step's
  parallel::TpCommStats tp_comm;     // of the last step
  parallel::CommCount cp_kv, cp_dkv;  // of the last step
  double tp_seconds = 0;             // in tp communication, all steps
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
      fail<Error>("train", "loss became {} at step {}; lower --lr (now {})", s.loss, s.step, o.lr);
    last_loss = s.loss;
    losses.push_back(s.loss);
    grad_norms.push_back(s.grad_norm);
    comm_seconds += s.comm_seconds;
    grad_comm_bytes = s.grad_comm_bytes;
    exposed_seconds += s.exposed_comm_seconds;
    step_seconds += s.seconds;
    tp_comm = s.tp_comm;
    cp_kv = s.cp_kv, cp_dkv = s.cp_dkv;
    tp_seconds += s.tp_comm.seconds;
    if (o.save_every > 0 && s.step % o.save_every == 0 && s.step < stop && write_checkpoint) trainer.save(o.save);
    if (!lead) continue;
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    const double done = static_cast<double>(s.step - first);
    const double tps = done * tokens_per_step / std::max(elapsed, 1e-9);
    const double eta = elapsed / done * static_cast<double>(stop - s.step);
    if (tty) {
      constexpr int kWidth = 30;
      const int filled = static_cast<int>(kWidth * static_cast<double>(s.step) / static_cast<double>(stop));
      fmt::print("\r[{}{}] step {}/{} loss {:.4f} | {:.0f} tok/s | ETA {}   ", std::string(filled, '#'),
                 std::string(kWidth - filled, '.'), s.step, stop, s.loss, tps, clock(eta));
      if (s.step == stop) fmt::print("\n");
    } else {
      fmt::print("step {}/{} loss {:.4f} lr {:.3g} grad_norm {:.3f} tok/s {:.0f} eta {}\n", s.step, stop,
                 s.loss, s.lr, s.grad_norm, tps, clock(eta));
    }
    std::fflush(stdout);
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const double tokens_per_second = static_cast<double>(stop - first) * tokens_per_step / seconds;
  const cuda::KernelTimes kernel_times = o.kernel_times ? cuda::kernel_times_stop() : cuda::KernelTimes{};
#ifdef NDMESH_HAVE_ELASTIC
  if (replica) replica->finish();
#endif
  if (!o.save.empty() && write_checkpoint) trainer.save(o.save);
  // The final loss is measured on evaluation batches drawn from another stream of the same
  // source: one training batch is too noisy to compare with the entropy rate. (For --data
  // this is the same file, not a held-out split.)
  const double final_loss = o.eval_batches > 0 ? trainer.evaluate(o.eval_batches) : last_loss;
  // Rank 0 reports the slowest rank's communication and the largest memory.
  // Peak resident memory of the process (Linux: ru_maxrss in KiB), the largest rank's.
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  std::array<double, 5> slowest = {comm_seconds, exposed_seconds, step_seconds, tp_seconds,
                                   1024.0 * static_cast<double>(usage.ru_maxrss)};
  world.all_reduce(std::span<double>(slowest), {.op = comm::ReduceOp::kMax});
  const parallel::MemoryBytes mem = trainer.memory();
  // Each rank's measured activation bytes, and the largest of each pipeline stage.
  std::vector<double> act_per_rank(static_cast<std::size_t>(world.size()), 0.0);
  act_per_rank[static_cast<std::size_t>(world.rank())] = mem.activations;
  world.all_reduce(std::span<double>(act_per_rank));
  std::vector<double> act_per_stage(static_cast<std::size_t>(stages), 0.0);
  act_per_stage[static_cast<std::size_t>(groups.pp().rank())] = mem.activations;
  world.all_reduce(std::span<double>(act_per_stage), {.op = comm::ReduceOp::kMax});
  const parallel::PipelineReport pipe = trainer.pipeline_report(o.trace);
  if (!lead) return 0;
  const double steps_run = static_cast<double>(stop - first);
  fmt::print("final loss {:.4f} (mean of {} evaluation batches; last training batch {:.4f})\n", final_loss,
             o.eval_batches, last_loss);
  if (entropy)
    fmt::print("entropy rate {:.4f} nats/token: final loss is {:.1f}% above the best achievable\n", *entropy,
               100.0 * (final_loss - *entropy) / *entropy);
  fmt::print("{} steps in {:.1f} s, {:.0f} tokens/s", stop - first, seconds, tokens_per_second);
  if (world.size() > 1)
    fmt::print(", gradient reduction {:.3f} s from first bucket to last, {:.3f} s of it exposed", slowest[0],
               slowest[1]);
  fmt::print("\n");
  {
    std::vector<std::string> per_stage;
    for (double b : act_per_stage) per_stage.push_back(fmt::format("{:.3f}", b / (1 << 20)));
    fmt::print(
        "activations: recompute {}, measured peak {:.3f} MiB per rank (the largest rank; per pipeline stage "
        "{} MiB); rank 0 also holds {:.3f} MiB of gather and send buffers\n",
        o.recompute, *std::max_element(act_per_rank.begin(), act_per_rank.end()) / (1 << 20),
        fmt::join(per_stage, ","), mem.activation_buffers / (1 << 20));
  }
  if (stages > 1 || !o.trace.empty()) {
    const auto& sc = trainer.schedule();
    fmt::print("pipeline: {} over {} stages x {} chunk{}, {} micro-batches, blocks per chunk {}\n",
               schedule_name(sc.kind), sc.stages, sc.chunks, sc.chunks == 1 ? "" : "s", sc.microbatches,
               fmt::join(trainer.partition(), ","));
    fmt::print(
        "pipeline bubble: measured {:.1f}%, simulated {:.1f}% for the measured mean costs (forward {:.3g} "
        "ms, "
        "backward {:.3g} + {:.3g} ms per stage), {:.1f}% for each stage's own\n",
        100 * pipe.bubble_measured, 100 * pipe.bubble_simulated, 1e3 * pipe.costs.forward,
        1e3 * pipe.costs.backward_input, 1e3 * pipe.costs.backward_weight,
        100 * pipe.bubble_simulated_stages);
    fmt::print("pipeline activations held per stage: measured peak {}, schedule {}\n",
               fmt::join(pipe.peak_activations, ","), fmt::join(pipe.expected_peak_activations, ","));
    if (!o.trace.empty()) fmt::print("trace: {} actions written to {}\n", pipe.events, o.trace);
  }
  if (!o.save.empty()) fmt::print("saved checkpoint {} (step {})\n", o.save, trainer.steps_done());
  if (o.kernel_times) print_kernel_times(kernel_times, stop - first > 1 ? first + 2 : first + 1, stop);
  if (trainer.optimizer().pinned())
    fmt::print(
        "offload: optimizer state {:.1f} MiB per rank in pinned host memory ({:.1f} MiB with the fp32 master and "
        "the staging chunks), {:.1f} MiB over PCIe per step (rank 0)\n",
        mem.optimizer_offloaded / (1 << 20), mem.optimizer_host / (1 << 20),
        static_cast<double>(trainer.optimizer().pinned_bytes_to_host() + trainer.optimizer().pinned_bytes_to_device()) /
            steps_run / (1 << 20));
  else if (trainer.optimizer().offloaded())
    fmt::print(
        "offload: optimizer state {:.1f} MiB per rank in {} (rank 0), streamed through a {:.0f} MiB window\n",
        mem.optimizer_offloaded / (1 << 20), o.offload_dir, mem.optimizer / (1 << 20));
  if (o.json) {
    nlohmann::ordered_json j;
    j["final_loss"] = final_loss;
    j["last_batch_loss"] = last_loss;
    j["entropy_rate"] = entropy ? nlohmann::ordered_json(*entropy) : nlohmann::ordered_json(nullptr);
    j["tokens_per_second"] = tokens_per_second;
    j["steps"] = trainer.steps_done();
    j["first_step"] = first + 1;
    j["seconds"] = seconds;
    j["parameters"] = params;
    j["parameters_per_rank"] = params_per_rank;
    j["threads"] = threads;
    j["data"] = source;
    nlohmann::ordered_json dims = nlohmann::ordered_json::object();
    for (const Dim& d : layout.mesh.dims()) dims[d.name] = d.size;
    j["layout"] = dims;
    j["world_size"] = world.size();
    j["micro_batches"] = trainer.microbatches();
    j["zero"] = o.zero;
    j["sequence_parallel"] = o.sequence_parallel;
    j["recompute"] = o.recompute;
    j["offload"] = o.offload;
    if (trainer.optimizer().pinned()) {  // rank 0's copies over PCIe (the first step also reads the master)
      j["offload_pcie"] = {
          {"bytes_to_host_per_step", static_cast<double>(trainer.optimizer().pinned_bytes_to_host()) / steps_run},
          {"bytes_to_device_per_step", static_cast<double>(trainer.optimizer().pinned_bytes_to_device()) / steps_run}};
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
      nlohmann::ordered_json rows = nlohmann::ordered_json::array();
      for (const cuda::KernelTime& r : kernel_times.rows)
        rows.push_back({{"name", r.name}, {"calls", r.calls}, {"seconds", r.seconds}});
      j["kernel_times"] = {{"steps", stop - first > 1 ? stop - first - 1 : 1},
                           {"seconds", kernel_times.seconds},
                           {"host_waits", kernel_times.host_waits},
                           {"host_wait_seconds", kernel_times.host_wait_seconds},
                           {"rows", rows}};
    }
    // What the last step moved over this rank's tp group (bytes of the full buffers).
    auto count = [](const parallel::CommCount& c) {
      return nlohmann::ordered_json{{"calls", c.calls}, {"bytes", c.bytes}};
    };
    j["tp_comm_per_step"] = {{"all_reduce", count(tp_comm.all_reduce)},
                             {"all_gather", count(tp_comm.all_gather)},
                             {"reduce_scatter", count(tp_comm.reduce_scatter)}};
    j["tp_comm_seconds"] = slowest[3] / steps_run;  // per step, the slowest rank
    // The cp ring (rank 0's sends; every cp rank sends as much): key/value blocks, in bf16
    // under --precision bf16, and the dK/dV accumulators.
    j["cp_comm_per_step"] = {{"kv", count(cp_kv)}, {"dkv", count(cp_dkv)}};
    j["allreduce"] = o.allreduce;
    j["losses"] = losses;
    if (!o.coordinator.empty()) {
      j["elastic_steps"] = elastic_steps;  // the step of each entry of losses, grad_norms, param_hashes
      j["param_hashes"] = param_hashes;
    }
    j["grad_norms"] = grad_norms;
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
                       {"peak_activations", pipe.peak_activations},
                       {"expected_peak_activations", pipe.expected_peak_activations}};
    }
    // Full precision: the losses are compared with other layouts' to 1e-5.
    fmt::print("{}\n", j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace));
  }
  return 0;
}

// --memory (or [training] memory of --config): the strategy's flags, except those given.
void expand_memory(Options& o) {
  std::string name = o.memory, from = "--memory";
  if (name.empty() && !o.layout.config_path().empty()) {
    name = load_config_file(o.layout.config_path()).parallel.memory;
    from = o.layout.config_path() + " [training] memory";
  }
  if (name.empty()) return;
  const MemoryStrategy s = memory_strategy(name);
  std::vector<std::string> chose, kept;
  auto pick = [&](bool given, std::string flag, std::string value, std::string mine) {
    if (given && value != mine)
      kept.push_back(fmt::format("{} {}", flag, mine));
    else if (!given && value != "none" && value != "0")
      chose.push_back(fmt::format("{} {}", flag, value));
  };
  pick(o.recompute_given, "--recompute", std::string(s.recompute), o.recompute);
  if (!o.recompute_given) o.recompute = s.recompute;
  pick(o.zero_given, "--zero", std::to_string(s.zero), std::to_string(o.zero));
  if (!o.zero_given) o.zero = s.zero;
  if (s.offload) {
    pick(o.offload_given, "--offload", "optimizer", o.offload);
    if (!o.offload_given) {
      o.offload = "optimizer";
      if (!o.offload_dir_given) o.offload_dir = std::filesystem::temp_directory_path().string();
      chose.push_back(fmt::format("--offload-dir {}", o.offload_dir));
    }
  }
  o.memory_choice =
      fmt::format("memory: {} ({}) = {}{}", name, from,
                  chose.empty() ? "nothing" : fmt::format("{}", fmt::join(chose, " ")),
                  kept.empty() ? "" : fmt::format("; given explicitly: {}", fmt::join(kept, " ")));
}

int run(Options o) {
  expand_memory(o);
  if (o.coordinator.empty()) o.coordinator = env::string("NDMESH_COORDINATOR", "");
  if (o.replica_id >= 0 && o.coordinator.empty())
    fail<ConfigError>("train",
                      "--replica-id={} belongs to an elastic run; add --coordinator HOST:PORT (or set "
                      "NDMESH_COORDINATOR), or drop --replica-id",
                      o.replica_id);
  if (o.replica_id < 0 && env::raw("NDMESH_REPLICA_ID")) o.replica_id = env::integer("NDMESH_REPLICA_ID", 0, 0, 1 << 20);
  // Printed before anything is checked, so that what the strategy chose shows with any refusal.
  if (!o.memory_choice.empty() && LaunchEnv::detect().rank == 0) {
    fmt::print("{}\n", o.memory_choice);
    std::fflush(stdout);
  }
  validate(o);
  comm::Communicator world = comm::Communicator::world();
  try {
    return train(o, world);
  } catch (const Error& e) {
    // One rank's error ends the whole job now, not after the peers' timeout.
    const int code = dynamic_cast<const ConfigError*>(&e) != nullptr ? kExitUsage : 1;
    if (world.size() == 1) throw;
    fmt::print(stderr, "ndmesh: [rank {}] {}\n", world.rank(), e.what());
    world.abort_job(code);
  } catch (const std::exception& e) {
    if (world.size() == 1) throw;
    fmt::print(stderr, "ndmesh: [rank {}] internal error: {}\n", world.rank(), e.what());
    world.abort_job(1);
  }
}

Action setup(CLI::App& app) {
  auto o = std::make_shared<Options>();
  o->layout.add_to(app);
  app.add_option(
         "--micro-batch", o->micro_batch,
         "sequences per micro-batch per data-parallel rank (0: the whole local batch, no accumulation)")
      ->capture_default_str()
      ->group("Parallel");
  app.add_option("--bucket-mb", o->bucket_mb, "gradient bucket size in MiB for the data-parallel reduction")
      ->capture_default_str()
      ->group("Parallel");
  app.add_flag("--no-overlap", o->no_overlap,
               "reduce gradients after the whole backward instead of overlapping it (the baseline)")
      ->group("Parallel");
  app.add_option("--grad-dtype", o->grad_dtype,
                 "element type of the gradient reduction: fp32, or bf16 (half the bytes; fp32 master weights "
                 "and optimizer state)")
      ->capture_default_str()
      ->group("Parallel");
  app.add_flag("--no-progress-thread", o->no_progress_thread,
               "with overlap: advance the buckets in flight from the backward itself (between sub-layers) "
               "instead of from a helper thread")
      ->group("Parallel");
  app.add_flag(
         "--sequence-parallel", o->sequence_parallel,
         "with --tp: norms and residuals hold 1/tp of the tokens (all-gather before the column-parallel "
         "linears, reduce-scatter after the row-parallel ones)")
      ->group("Parallel");
  app.add_option("--zero", o->zero,
                 "ZeRO stage over dp (x cp): 0, 1 (shard optimizer state), 2 (and gradients) or 3 (and parameters: "
                 "each block, the embedding and the head gathered before use and freed after)")
      ->capture_default_str()
      ->each([o](const std::string&) { o->zero_given = true; })
      ->group("Parallel");
  app.add_option("--zero3-reshard-after-forward", o->zero3_reshard_after_forward,
                 "with --zero 3: free a unit's gathered parameters after its forward and gather them again for "
                 "its backward (true), or keep them until the backward (false: less communication, more memory)")
      ->capture_default_str()
      ->group("Parallel");
  app.add_option("--zero3-prefetch", o->zero3_prefetch,
                 "with --zero 3: start gathering the next unit while the current one computes (true), or only "
                 "when it is needed (false: the baseline the prefetch is measured against)")
      ->capture_default_str()
      ->group("Parallel");
  app.add_option(
         "--offload", o->offload,
         "keep state in files under --offload-dir instead of memory: none, optimizer (the AdamW moments, "
         "streamed through the step in chunks; the same results bit for bit) or optimizer+params (with "
         "--zero 3: the rank's parameter shard too, read back around each gather)")
      ->capture_default_str()
      ->each([o](const std::string&) { o->offload_given = true; })
      ->group("Memory");
  app.add_option(
         "--offload-dir", o->offload_dir,
         "folder for the offload files (a local disk; one file per rank; removed at the end, and files "
         "left by a killed run are refused)")
      ->each([o](const std::string&) { o->offload_dir_given = true; })
      ->group("Memory");
  app.add_option(
         "--offload-chunk-mb", o->offload_chunk_mb,
         "MiB of optimizer state (both moments) per streamed chunk; three chunks are in memory at once")
      ->capture_default_str()
      ->group("Memory");
  app.add_option("--allreduce", o->allreduce,
                 "gradient all-reduce: mpi, ring, tree, hierarchical or adaptive")
      ->capture_default_str()
      ->group("Parallel");
  app.add_option("--schedule", o->schedule, "pipeline schedule: gpipe, 1f1b, interleaved or zb-h1")
      ->capture_default_str()
      ->group("Parallel");
  app.add_option(
         "--device", o->device,
         "where the model runs: cpu (the fp32 reference) or cuda (one GPU per rank; built where the CUDA "
         "toolkit is found; several ranks talk over NCCL, or over NDMESH_BACKEND=gloo|mpi staged "
         "through host memory: docs/gpu.md)")
      ->capture_default_str();
  app.add_option("--precision", o->precision,
                 "fp32, or bf16: mixed precision (bf16 products with fp32 accumulation, the activations "
                 "they read kept in bf16; fp32 master weights, AdamW moments, residual stream, norms and "
                 "loss; checkpoints stay fp32)")
      ->capture_default_str();
  app.add_option(
         "--recompute", o->recompute,
         "activation recompute: none, selective (the backward re-runs the attention core; its "
         "output and log-sum-exp are not kept) or full (a block keeps only its input and the backward "
         "re-runs its forward); the losses are the same bit for bit")
      ->capture_default_str()
      ->each([o](const std::string&) { o->recompute_given = true; })
      ->group("Parallel");
  app.add_option("--vpp,--virtual-stages", o->virtual_stages,
                 "virtual stages: model chunks per pipeline rank (--schedule interleaved)")
      ->capture_default_str()
      ->group("Parallel");
  app.add_option("--pp-layers", o->pp_layers,
                 "blocks per pipeline chunk, e.g. 3,3,2 (pp x virtual-stages entries; default: balanced)")
      ->group("Parallel");
  app.add_option(
         "--trace", o->trace,
         "write every pipeline action of every rank with start and end as Chrome trace-event JSON (the "
         "last --trace-steps steps)")
      ->group("Parallel");
  app.add_option("--trace-steps", o->trace_steps,
                 "steps each rank keeps in its pipeline trace, the latest (the bubble is measured over them)")
      ->capture_default_str()
      ->group("Parallel");
  app.add_option("--pp-drop-action", o->drop_action,
                 "testing: stage STAGE skips action INDEX of its list (STAGE:INDEX), a mismatched schedule")
      ->group("Testing");
  app.add_option(
         "--cp-layout", o->cp_layout,
         "chunks of each sequence a context-parallel rank holds: zigzag (chunks i and 2cp-1-i of 2cp, "
         "balanced causal work) or contiguous (chunk i of cp)")
      ->capture_default_str()
      ->group("Parallel");
  app.add_option("--layers", o->layers, "transformer blocks")->capture_default_str();
  app.add_option("--hidden", o->hidden, "model width")->capture_default_str();
  app.add_option("--heads", o->heads, "attention heads (divides --hidden)")->capture_default_str();
  app.add_option("--kv-heads", o->kv_heads, "key/value heads (divides --heads; 0: same as --heads)")
      ->capture_default_str();
  app.add_option("--ffn", o->ffn, "MLP width (0: 4 * hidden)")->capture_default_str();
  app.add_option("--seq", o->seq, "tokens per sequence")->capture_default_str();
  app.add_option("--vocab", o->vocab, "vocabulary (0: the data's: --markov-vocab, or 256 for a text --data; token files need it)")
      ->capture_default_str();
  app.add_flag("--untied", o->untied, "give the LM head its own weight instead of the token embedding");
  app.add_option("--global-batch,--batch", o->batch, "sequences per step over all ranks")
      ->capture_default_str();
  app.add_option("--steps", o->steps, "total steps (a --load run continues up to this step)")
      ->capture_default_str();
  app.add_option("--lr", o->lr, "peak learning rate")->capture_default_str();
  app.add_option("--warmup", o->warmup, "linear warmup steps")->capture_default_str();
  app.add_option("--min-lr-ratio", o->min_lr_ratio, "cosine decay floor, as a fraction of --lr")
      ->capture_default_str();
  app.add_option("--weight-decay", o->weight_decay, "AdamW weight decay (matrices only)")
      ->capture_default_str();
  app.add_option("--clip", o->clip, "global gradient-norm clip (0: off)")->capture_default_str();
  app.add_option("--seed", o->seed, "model initialisation seed")->capture_default_str();
  app.add_option("--data", o->data,
                 "train on this file: bytes of a text file, or tokens of a .bin file or glob of .bin shards (llm.c's "
                 "shards, nanoGPT's uint16 train.bin; give --vocab); default: the Markov source")
      ->each([o](const std::string&) { o->data_given = true; });
  app.add_option("--data-format", o->data_format,
                 "how --data is read: auto (.bin: llm.c shard when its header says so, else raw uint16 tokens; other "
                 "files: bytes), bytes, llmc or uint16")
      ->capture_default_str();
  app.add_option("--markov-vocab", o->markov_vocab, "states of the Markov source")->capture_default_str();
  app.add_option("--markov-sharpness", o->markov_sharpness,
                 "how peaked the Markov transitions are (0: uniform, larger: lower entropy)")
      ->capture_default_str();
  app.add_option("--data-seed", o->data_seed, "seed of the data (Markov chain and sampling, or byte windows)")
      ->capture_default_str();
  app.add_option("--threads", o->threads, "BLAS threads (0: NDMESH_THREADS, else the core count)")
      ->capture_default_str();
  app.add_option(
         "--until", o->until,
         "stop after this step (0: --steps); the learning-rate schedule still spans --steps, so a run "
         "resumed with --load continues exactly")
      ->capture_default_str();
  app.add_option(
         "--save", o->save,
         "write a checkpoint directory here at the end: a manifest and one shard file per stage and tp "
         "rank, replacing the previous one atomically; it loads under any layout")
      ->each([o](const std::string&) { o->save_given = true; });
  app.add_option("--save-every", o->save_every,
                 "also checkpoint to --save every N steps (0: only at the end)")
      ->capture_default_str();
  app.add_option("--load", o->load,
                 "continue from this checkpoint directory (any layout; same model and data flags), or from a "
                 "single-file checkpoint of an older ndmesh (--pp 1)")
      ->each([o](const std::string&) { o->load_given = true; });
  app.add_option("--eval-batches", o->eval_batches,
                 "evaluation batches for the final loss (a sampling stream apart from training)")
      ->capture_default_str();
  app.add_flag("--json", o->json, "print one JSON summary object as the last line");
  app.add_flag("--kernel-times", o->kernel_times,
               "with --device cuda: where rank 0's GPU time goes, per kernel, matrix product (by shape) and "
               "copy, over every step after the first (an event after each operation; docs/gpu.md)");
  app.add_option("--coordinator", o->coordinator,
                 "HOST:PORT of an 'ndmesh coordinator': run as one replica of elastic data parallelism "
                 "(docs/elastic.md; NDMESH_COORDINATOR)")
      ->group("Elastic");
  app.add_option("--replica-id", o->replica_id,
                 "with --coordinator: this replica's id, 0..R-1, the same across restarts (NDMESH_REPLICA_ID)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 20))
      ->group("Elastic");
  app.footer(
      "Examples:\n"
      "  ndmesh train                                   # small model on the Markov source, about a minute\n"
      "  ndmesh train --data README.md --vocab 256 --steps 200\n"
      "  ndmesh train --steps 200 --until 100 --save run.ckpt && ndmesh train --steps 200 --load run.ckpt\n"
      "  mpirun -np 4 ndmesh train --dp 4                # data parallel: the same losses as the serial run\n"
      "  mpirun -np 2 ndmesh train --dp 2 --micro-batch 2 --zero 1 --allreduce ring\n"
      "  mpirun -np 4 ndmesh train --cp 2 --dp 2 --seq 64  # context parallel: ring attention over --cp "
      "ranks\n"
      "  mpirun -np 4 ndmesh train --dp 2 --tp 2 --sequence-parallel   # tensor parallel: the same losses "
      "too\n"
      "  mpirun -np 4 ndmesh train --pp 4 --schedule 1f1b --batch 8 --micro-batch 1 --layers 4 --trace "
      "pp.json");
  app.add_option(
         "--memory", o->memory,
         "memory strategy, expanded to flags (printed): basic (nothing), standard (--recompute selective), "
         "aggressive (--recompute full --zero 2), extreme (--recompute full --zero 3 --offload optimizer "
         "--offload-dir $TMPDIR); a flag given explicitly wins")
      ->group("Memory");
  return [o] { return run(*o); };
}

const Subcommand kTrain{
    "train",
    "Train the GPT model, alone or data-, context- and tensor-parallel under mpirun (Markov source "
    "or a file)",
    setup};

}  // namespace
}  // namespace ndmesh::cli
