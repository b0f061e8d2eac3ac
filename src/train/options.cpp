#include "ndmesh/train/options.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ndmesh/comm/allreduce.hpp"
#include "ndmesh/config/presets.hpp"
#include "ndmesh/config/training.hpp"
#include "ndmesh/core/env.hpp"
#include "ndmesh/core/error.hpp"
#include "ndmesh/core/recompute.hpp"
#include "ndmesh/model/checkpoint_dir.hpp"
#include "ndmesh/model/data.hpp"
#include "ndmesh/model/hf.hpp"
#include "ndmesh/plan/hardware_file.hpp"

namespace ndmesh::train {

namespace fs = std::filesystem;

parallel::TrainOptions default_train_options() {
  parallel::TrainOptions t;
  t.model = ModelSpec{.layers = 2, .hidden = 64, .heads = 4, .kv_heads = 2, .ffn = 0, .seq = 64, .vocab = 0};
  t.batch = 16;
  t.micro_batch = 0;
  t.steps = 1000;
  t.lr = 6e-4;  // nanoGPT's and GPT-2 small's rate: 3e-3 spiked on byte-level texts (docs/train.md)
  t.warmup = 20;
  t.min_lr_ratio = 0.1;
  t.adamw.weight_decay = 0.1;
  t.adamw.clip_norm = 1.0;
  t.seed = 1;
  return t;
}

namespace {

// Bad flag values are ConfigErrors (exit 2) naming the flag, the value and a fix.
void need(bool ok, std::string_view flag, auto value, std::string_view rule, std::string_view example) {
  if (!ok) fail<ConfigError>("train", "{}={} {}; e.g. {} {}", flag, value, rule, flag, example);
}

// A file the run writes (--metrics): its folder exists and is writable, and it is no folder.
void check_output_file(std::string_view flag, const std::string& path) {
  std::error_code ec;
  if (path.empty())
    fail<ConfigError>("train", "{} is empty; pass a file name such as run.jsonl, or leave it out", flag);
  if (fs::is_directory(path, ec))
    fail<ConfigError>("train", "{}={}: is a directory; pass a file name such as run.jsonl", flag, path);
  const fs::path dir = fs::path(path).has_parent_path() ? fs::path(path).parent_path() : fs::path(".");
  if (!fs::is_directory(dir, ec) || ::access(dir.c_str(), W_OK) != 0)
    fail<ConfigError>("train",
                      "{}={}: the folder '{}' does not exist or is not writable; create it or pick another",
                      flag, path, dir.string());
  if (fs::exists(path, ec) && ::access(path.c_str(), W_OK) != 0)
    fail<ConfigError>("train", "{}={}: cannot write the file; check its permissions", flag, path);
}

// A folder the run writes into (--tensorboard): it exists writable, or its parent does.
void check_output_dir(std::string_view flag, const std::string& path) {
  std::error_code ec;
  if (path.empty())
    fail<ConfigError>("train", "{} is empty; pass a folder such as runs/tb, or leave it out", flag);
  if (fs::exists(path, ec)) {
    if (!fs::is_directory(path, ec))
      fail<ConfigError>("train", "{}={}: is a file; pass a folder (it is created when missing)", flag, path);
    if (::access(path.c_str(), W_OK) != 0)
      fail<ConfigError>("train", "{}={}: the folder is not writable; check its permissions or pick another",
                        flag, path);
    return;
  }
  fs::path p(path);
  while (!p.empty() && p.filename().empty()) p = p.parent_path();
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  if (!fs::is_directory(dir, ec) || ::access(dir.c_str(), W_OK) != 0)
    fail<ConfigError>("train",
                      "{}={}: the folder '{}' does not exist or is not writable; create it or pick another",
                      flag, path, dir.string());
}

}  // namespace

void expand_memory(RunOptions& o) {
  std::string name = o.memory, from = "--memory";
  if (name.empty() && !o.config_path.empty()) {
    name = load_config_file(o.config_path).parallel.memory;
    from = o.config_path + " [training] memory";
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
  pick(o.given.recompute, "--recompute", std::string(s.recompute), o.recompute);
  if (!o.given.recompute) o.recompute = s.recompute;
  pick(o.given.zero, "--zero", std::to_string(s.zero), std::to_string(o.train.dp.zero));
  if (!o.given.zero) o.train.dp.zero = s.zero;
  if (s.offload) {
    pick(o.given.offload, "--offload", "optimizer", o.offload);
    if (!o.given.offload) {
      o.offload = "optimizer";
      if (!o.given.offload_dir) o.offload_dir = fs::temp_directory_path().string();
      chose.push_back(fmt::format("--offload-dir {}", o.offload_dir));
    }
  }
  o.memory_choice =
      fmt::format("memory: {} ({}) = {}{}", name, from,
                  chose.empty() ? "nothing" : fmt::format("{}", fmt::join(chose, " ")),
                  kept.empty() ? "" : fmt::format("; given explicitly: {}", fmt::join(kept, " ")));
}

void resolve_model(RunOptions& o) {
  const ModelSpec flags = o.train.model;
  ModelSpec m =
      o.model_preset.empty() ? default_train_options().model : model_preset(o.model_preset, "--model").spec;
  // --load DIR without --model: the checkpoint's (or a Hugging Face folder's config.json's)
  // description is the base, so that `--load DIR` alone continues the run; a model flag that contradicts it
  // is refused when the run loads it, naming both values.
  if (o.model_preset.empty() && !o.load.empty() && model::is_checkpoint_dir(o.load)) {
    try {
      m = model::read_manifest(o.load).spec;
    } catch (const IoError&) {
      // An unreadable manifest is the load's own error, with its message.
    }
  } else if (o.model_preset.empty() && !o.load.empty() && model::is_hf_dir(o.load)) {
    m = model::hf_config_to_spec((std::filesystem::path(o.load) / model::kHfConfigFile).string());
  }
  if (!o.config_path.empty()) {
    const ConfigFile file = load_config_file(o.config_path);
    if (!file.model_values.empty())
      set_model_keys(m, file.model_values, fmt::format("{}: model", o.config_path));
  }
  if (!o.arch.empty()) m = with_arch(m, o.arch, "--arch");
  if (!o.norm.empty()) m.norm = parse_norm(o.norm, "--norm");
  if (!o.mlp.empty()) m.mlp = parse_mlp_kind(o.mlp, "--mlp");
  if (!o.positions.empty()) m.positions = parse_positions(o.positions, "--positions");
  if (!o.router.empty()) m.router = parse_router(o.router, "--router");
  // The values the flags wrote, for the keys they name (each flag's own check ran at parsing).
  std::vector<std::pair<std::string, ModelValue>> given;
  for (auto& [key, value] : model_values(flags))
    if (std::find(o.model_given.begin(), o.model_given.end(), key) != o.model_given.end())
      given.emplace_back(key, std::move(value));
  set_model_keys(m, given, "flags");
  if (o.untied) m.tied_embeddings = false;
  o.train.model = m;
}

void resolve_elastic(RunOptions& o) {
  if (o.coordinator.empty()) o.coordinator = env::string("NDMESH_COORDINATOR", "");
  if (o.replica_id >= 0 && o.coordinator.empty())
    fail<ConfigError>("train",
                      "--replica-id={} belongs to an elastic run; add --coordinator HOST:PORT (or set "
                      "NDMESH_COORDINATOR), or drop --replica-id",
                      o.replica_id);
  if (o.replica_id < 0 && env::raw("NDMESH_REPLICA_ID"))
    o.replica_id = env::integer("NDMESH_REPLICA_ID", 0, 0, 1 << 20);
}

parallel::TrainOptions train_options(const RunOptions& o, std::int64_t vocab, std::int64_t ranks_per_node) {
  parallel::TrainOptions t = o.train;
  t.model.vocab = vocab;
  if (o.untied) t.model.tied_embeddings = false;
  t.lr_schedule = parallel::parse_lr_schedule(o.lr_schedule).value_or(parallel::LrSchedule::kCosine);
  t.dp.overlap = !o.no_overlap;
  t.dp.algorithm = comm::parse_algorithm(o.allreduce);
  t.dp.ranks_per_node = ranks_per_node;
  t.dp.progress_thread = !o.no_progress_thread;
  t.dp.bf16 = o.grad_dtype == "bf16";
  t.pp.schedule = parse_schedule(o.schedule);
  t.cp_layout = parallel::parse_cp_layout(o.cp_layout);
  t.recompute = parse_recompute(o.recompute);
  t.device = parse_device(o.device).value_or(Device::kCpu);
  t.precision = o.precision == "bf16" ? parallel::Precision::kBf16 : parallel::Precision::kFp32;
  t.offload = {.what = parallel::parse_offload(o.offload).value_or(parallel::Offload::kNone),
               .dir = o.offload_dir,
               // MiB of both moments: 8 bytes an element
               .chunk_elements = static_cast<std::int64_t>(o.offload_chunk_mb * 1024 * 1024 / 8)};
  return t;
}

void check_run_options(const RunOptions& o) {
  need(o.markov_vocab >= 2 && o.markov_vocab <= 1024, "--markov-vocab", o.markov_vocab,
       "must be in [2, 1024]", "32");
  need(o.markov_sharpness >= 0 && std::isfinite(o.markov_sharpness), "--markov-sharpness", o.markov_sharpness,
       "must be a finite number >= 0", "2.5");
  need(o.threads >= 0 && o.threads <= 1024, "--threads", o.threads,
       "must be in [0, 1024] (0: NDMESH_THREADS)", "1");
  const std::int64_t steps = o.train.steps;
  // (--steps below 1 is train_option_problems' line, not --until's.)
  need(steps < 1 || (o.until >= 0 && o.until <= steps), "--until", o.until,
       fmt::format("must be in [0, --steps={}]", steps), "100");
  need(o.save_every >= 0, "--save-every", o.save_every, "must be >= 0 (0: only at the end)", "100");
  need(o.save_every == 0 || !o.save.empty(), "--save-every", o.save_every, "needs --save PATH",
       "100 --save run.ckpt");
  need(o.keep >= 1, "--keep", o.keep,
       "must be at least 1 (the checkpoints kept: --save DIR and those before it)", "3");
  need(o.keep == 1 || !o.save.empty(), "--keep", o.keep, "needs --save DIR (and --save-every N)",
       "3 --save run.ckpt --save-every 100");
  need(o.eval_batches >= 0, "--eval-batches", o.eval_batches, "must be >= 0", "8");
  need(o.eval_every >= 0, "--eval-every", o.eval_every,
       "must be at least 1 (evaluations after steps N, 2N, ... and after the last)", "100");
  if (o.eval_every > 0 && o.eval_batches == 0)
    fail<ConfigError>(
        "train",
        "--eval-every={} with --eval-batches=0: an evaluation needs batches; give --eval-batches "
        "8, or leave --eval-every out",
        o.eval_every);
  need(o.log_every >= 1, "--log-every", o.log_every, "must be at least 1 (a progress line every N steps)",
       "10");
  need(o.grad_dtype == "fp32" || o.grad_dtype == "bf16", "--grad-dtype", o.grad_dtype, "must be fp32 or bf16",
       "bf16");
  need(parallel::parse_lr_schedule(o.lr_schedule).has_value(), "--lr-schedule", o.lr_schedule,
       "is not a learning-rate schedule (cosine, linear, wsd, constant)", "wsd");
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
  if (o.given.offload_dir && o.offload_dir.empty())
    fail<ConfigError>("train",
                      "--offload-dir is empty; pass a folder on a local disk, e.g. --offload-dir /tmp");
  if (!o.offload_dir.empty() &&
      (!fs::is_directory(o.offload_dir) || ::access(o.offload_dir.c_str(), W_OK) != 0))
    fail<ConfigError>("train", "--offload-dir={}: not a writable folder; create it or pick another",
                      o.offload_dir);
  need(o.offload_chunk_mb >= 0.001 && o.offload_chunk_mb <= 4096, "--offload-chunk-mb", o.offload_chunk_mb,
       "must be in [0.001, 4096] (MiB of both moments per streamed chunk)", "32");
  need(parse_device(o.device).has_value(), "--device", o.device, "is not a device (cpu, cuda)", "cuda");
  need(o.precision == "fp32" || o.precision == "bf16", "--precision", o.precision, "must be fp32 or bf16",
       "fp32");
  if (o.kernel_times && o.device != "cuda")
    fail<ConfigError>(
        "train",
        "--kernel-times with --device={}: it times the GPU's kernels; add --device cuda or drop "
        "--kernel-times",
        o.device);
  // The model's shape rules (config's model_problems, named as the flags) and the options
  // the runtime checks itself (parallel::train_option_problems), checked here too so that
  // a bad value fails before any rank starts. --vocab 0 is the data's vocabulary: the
  // Markov source's or the 256 byte values.
  const std::int64_t vocab = o.train.model.vocab != 0 ? o.train.model.vocab
                             : o.data.empty()         ? o.markov_vocab
                                                      : 256;
  if (auto problems = model_problems(train_options(o, vocab, 0).model, ModelFieldNames::kFlags);
      !problems.empty())
    fail<ConfigError>("train", "{}", fmt::join(problems, "; "));
  if (auto problems = parallel::train_option_problems(train_options(o, 0, 0)); !problems.empty())
    fail<ConfigError>("train", "{}", fmt::join(problems, "; "));
  std::error_code ec;
  // An empty value must not silently switch the feature off.
  if (o.given.data && o.data.empty())
    fail<ConfigError>("train",
                      "--data is empty; pass a text file, or leave --data out for the Markov source");
  if (o.given.save && o.save.empty())
    fail<ConfigError>("train",
                      "--save is empty; pass a directory name such as run.ckpt, or leave --save out");
  if (o.given.load && o.load.empty())
    fail<ConfigError>("train", "--load is empty; pass a checkpoint written with --save, or leave --load out");
  // Held-out data: a file, or the end of --data; evaluated every --eval-every steps.
  if (o.given.val_data && o.val_data.empty())
    fail<ConfigError>("train", "--val-data is empty; pass a file of held-out data, or leave --val-data out");
  if (o.given.val_fraction || o.val_fraction != 0) {
    need(o.val_fraction > 0 && o.val_fraction < 1, "--val-fraction", o.val_fraction,
         "must be in (0, 1) (the share at the end of --data that training never reads)", "0.1");
    if (!o.val_data.empty())
      fail<ConfigError>(
          "train",
          "--val-fraction={} with --val-data={}: give one held-out set, a file (--val-data) or the end "
          "of --data (--val-fraction)",
          o.val_fraction, o.val_data);
    if (o.data.empty())
      fail<ConfigError>(
          "train",
          "--val-fraction={} needs --data FILE to hold out the end of; the Markov source's evaluation "
          "batches are drawn apart from training already (or give --val-data FILE)",
          o.val_fraction);
  }
  if (o.given.eval_every && o.eval_every == 0)
    need(false, "--eval-every", 0,
         "must be at least 1 (evaluations after steps N, 2N, ... and after the last)", "100");
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
    // The longest sibling: ".NAME.saving.previous" (17 more bytes), or with --keep "NAME.step-N".
    const std::size_t extra = o.keep > 1 ? 26 : 17;
    if (target.filename().string().size() + extra > 255)
      fail<ConfigError>(
          "train", "--save={}: the name is too long ({} bytes with the temporary suffix; the limit is 255)",
          o.save, target.filename().string().size() + extra);
  }
  if (!o.metrics.empty() || o.given.metrics) check_output_file("--metrics", o.metrics);
  if (!o.tensorboard.empty() || o.given.tensorboard) check_output_dir("--tensorboard", o.tensorboard);
  if (!o.hardware.empty() || o.given.hardware) {
    if (o.hardware.empty())
      fail<ConfigError>("train", "--hardware is empty; pass a preset ({}) or a file of ndmesh calibrate",
                        plan::hardware_preset_names());
    plan::hardware_by_name_or_file(o.hardware);  // ConfigError naming the file or the presets
  }
}

void check_elastic(RunOptions& o, [[maybe_unused]] const Mesh& mesh) {
  if (o.coordinator.empty()) return;
#ifndef NDMESH_HAVE_ELASTIC
  fail<ConfigError>("train",
                    "--coordinator={}: this ndmesh is built without Gloo, which elastic training needs "
                    "(Debian: apt-get install libgloo-dev, then rebuild)",
                    o.coordinator);
#endif
  if (o.replica_id < 0)
    fail<ConfigError>("train",
                      "--coordinator={} needs the replica's id: set NDMESH_REPLICA_ID or --replica-id "
                      "(0..R-1, the same across restarts)",
                      o.coordinator);
  if (o.offload != "none")
    fail<ConfigError>("train",
                      "--offload={} with a coordinator: a replica's state must be in memory to be copied to "
                      "a healing replica; use --offload none for elastic runs",
                      o.offload);
  if (o.train.micro_batch == 0)
    o.train.micro_batch = 1;  // the global batch is split over replicas by micro-batches
}

}  // namespace ndmesh::train
