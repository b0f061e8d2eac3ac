#include "console.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string_view>
#include <utility>

#include <fmt/core.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "ndmesh/launch/launch_env.hpp"
#include "ndmesh/parallel/lr_schedule.hpp"

namespace ndmesh::train {

using json = nlohmann::ordered_json;

std::string clock_text(double seconds) {
  auto s = static_cast<long long>(std::max(0.0, seconds) + 0.5);
  return s >= 3600 ? fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
                   : fmt::format("{}:{:02}", s / 60, s % 60);
}

namespace {

constexpr double kMiB = 1 << 20;

// "cosine to 0.1x", "wsd: constant to step 800, then linear to 0.1x", ...
std::string schedule_text(const parallel::TrainOptions& t) {
  const parallel::LrScheduleOptions s = t.lr_schedule_options();
  switch (s.schedule) {
    case parallel::LrSchedule::kConstant:
      return "constant";
    case parallel::LrSchedule::kLinear:
      return fmt::format("linear to {}x", s.min_lr_ratio);
    case parallel::LrSchedule::kWsd:
      return fmt::format("wsd: constant to step {}, then linear to {}x", parallel::wsd_decay_start(s),
                         s.min_lr_ratio);
    case parallel::LrSchedule::kCosine:
      break;
  }
  return fmt::format("cosine to {}x", s.min_lr_ratio);
}

// The schedule flags on which two records differ, as `saved` and `now` spell them.
std::pair<std::string, std::string> schedule_differences(const model::ScheduleRecord& saved,
                                                         const model::ScheduleRecord& now) {
  std::string a, b;
  auto add = [&](std::string_view flag, auto x, auto y) {
    if (x == y) return;
    a += fmt::format("{}{} {}", a.empty() ? "" : " ", flag, x);
    b += fmt::format("{}{} {}", b.empty() ? "" : " ", flag, y);
  };
  add("--lr-schedule", saved.name, now.name);
  add("--lr", saved.lr, now.lr);
  add("--warmup", saved.warmup, now.warmup);
  add("--steps", saved.steps, now.steps);
  add("--min-lr-ratio", saved.min_lr_ratio, now.min_lr_ratio);
  add("--decay-fraction", saved.decay_fraction, now.decay_fraction);
  return {a, b};
}

// --kernel-times: rank 0's table, the operations by GPU time per step, the longest first.
void print_kernel_times(const json& t, std::int64_t from, std::int64_t to) {
  constexpr std::size_t kRows = 30;
  const double steps = static_cast<double>(std::max<std::int64_t>(to - from + 1, 1));
  const double total = t["seconds"].get<double>();
  fmt::print(
      "kernel times (rank 0, steps {}..{}): {:.3f} ms of GPU time a step, the host waited for the GPU {:.1f} "
      "times a step ({:.3f} ms)\n",
      from, to, 1e3 * total / steps, t["host_waits"].get<double>() / steps,
      1e3 * t["host_wait_seconds"].get<double>() / steps);
  fmt::print("  {:>10} {:>7} {:>10}  {}\n", "ms/step", "share", "calls/step", "operation");
  double rest = 0;
  std::int64_t rest_rows = 0;
  const json& rows = t["rows"];
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const double seconds = rows[i]["seconds"].get<double>();
    if (i >= kRows) {
      rest += seconds;
      ++rest_rows;
      continue;
    }
    fmt::print("  {:>10.3f} {:>6.1f}% {:>10.1f}  {}\n", 1e3 * seconds / steps,
               total > 0 ? 100 * seconds / total : 0.0, rows[i]["calls"].get<double>() / steps,
               rows[i]["name"].get<std::string>());
  }
  if (rest_rows > 0)
    fmt::print("  {:>10.3f} {:>6.1f}% {:>10}  ({} more operations; every row is in --json's kernel_times)\n",
               1e3 * rest / steps, total > 0 ? 100 * rest / total : 0.0, "", rest_rows);
}

}  // namespace

Console::Console(const RunOptions& options) : options_(options) {}

void Console::on_start(const RunStart& r) {
  lead_ = r.lead;
  first_ = r.first;
  stop_ = r.stop;
  tokens_per_step_ = static_cast<double>(r.trainer.tokens_per_step());
  heldout_ = r.val_data;
  entropy_known_ = r.entropy_rate.has_value();
  entropy_ = r.entropy_rate.value_or(0);
  tty_ = ::isatty(::fileno(stdout)) != 0 && LaunchEnv::detect().launcher == Launcher::kNone;
  if (!lead_) return;
  const RunOptions& o = options_;
  const parallel::TrainOptions& t = r.trainer.options();
  const ModelSpec& m = t.model;
  fmt::print("model: {} layers, hidden {}, heads {}/{} kv, ffn {}, seq {}, vocab {}, {} parameters ({})\n",
             m.layers, m.hidden, m.heads, m.kv_heads_or_heads(), m.ffn_or_default(), m.seq, m.vocab,
             r.parameters, m.tied_embeddings ? "tied head" : "untied head");
  // The layers' kinds, when they are not the default GPT-2's (or a preset names them).
  if (arch_name(m) != "gpt2" || !m.name.empty() || !m.biases)
    fmt::print("architecture: {}{}: {} (eps {:g}), {} MLP, {} positions{}, {}\n", arch_name(m),
               m.name.empty() ? "" : fmt::format(" ({})", m.name), norm_name(m.norm), m.norm_eps,
               mlp_name(m.mlp), positions_name(m.positions),
               m.positions == PositionsKind::kRope ? fmt::format(" (theta {:g})", m.rope_theta) : "",
               m.biases ? "biases" : "no biases");
  if (m.experts > 0)
    fmt::print(
        "experts: {} routed (top-{}, {} router){}, expert ffn {}, MoE blocks: every {} after the first {} dense; aux "
        "loss {:g}, {}{}\n",
        m.experts, m.top_k, router_name(m.router),
        m.shared_experts > 0 ? fmt::format(" + {} shared", m.shared_experts) : "", m.expert_ffn_or_default(),
        m.moe_every, m.moe_first_dense, m.aux_loss,
        m.capacity_factor > 0 ? fmt::format("capacity factor {:g}", m.capacity_factor) : "dropless",
        t.ep > 1 ? fmt::format("; expert parallel over {} ranks ({} experts each)", t.ep, m.experts / t.ep) : "");
  fmt::print("data: {}{}\n", r.data,
             r.entropy_rate
                 ? fmt::format(", entropy rate {:.4f} nats/token (best achievable loss)", *r.entropy_rate)
                 : "");
  const Mesh& mesh = r.mesh;
  if (r.world_size > 1)
    fmt::print(
        "layout: {} on {} ranks; micro-batches {} of {} sequences per dp rank; ZeRO {}, all-reduce {} in {}, "
        "buckets of {} MiB{}{}\n",
        mesh.to_string(), r.world_size, r.trainer.microbatches(), r.trainer.model().batch(), t.dp.zero,
        o.allreduce, o.grad_dtype, t.dp.bucket_mb,
        o.no_overlap ? ", no overlap" : ", overlapped with backward",
        mesh.size_of("tp") > 1
            ? fmt::format("; tp {} ({} parameters per rank{})", mesh.size_of("tp"), r.parameters_per_rank,
                          t.sequence_parallel ? ", sequence parallel" : "")
            : "");
  if (mesh.size_of("cp") > 1)
    fmt::print(
        "context parallel: {} ranks, {} layout, {} of {} tokens per sequence per rank, ring attention\n",
        mesh.size_of("cp"), o.cp_layout, r.trainer.model().seq(), m.seq);
  if (!o.load.empty()) {
    if (r.first == 0)  // weights only (an import): a fresh run from them
      fmt::print("starting from the weights of {} (step 0, new optimizer state)\n", o.load);
    else
      fmt::print("resumed from {} at step {}\n", o.load, r.first);
    const parallel::LrScheduleOptions s = t.lr_schedule_options();
    const model::ScheduleRecord mine{.name = parallel::lr_schedule_name(s.schedule),
                                     .lr = s.lr,
                                     .warmup = s.warmup,
                                     .steps = s.steps,
                                     .min_lr_ratio = s.min_lr_ratio,
                                     .decay_fraction = s.decay_fraction};
    if (r.loaded_schedule && !r.loaded_schedule->name.empty() && !(*r.loaded_schedule == mine)) {
      const auto [saved, now] = schedule_differences(*r.loaded_schedule, mine);
      fmt::print(
          "note: {} was saved by a run with {}; this run has {}, so its learning rates do not continue that "
          "run's\n",
          o.load, saved, now);
    }
  }
  if (o.eval_every > 0 || !heldout_.empty())
    fmt::print("eval: {} batches of {} {}\n", o.eval_batches,
               heldout_.empty() ? std::string("the training data's evaluation stream")
                                : fmt::format("held-out data ({})", heldout_),
               o.eval_every > 0 ? fmt::format("every {} steps and after step {}", o.eval_every, r.stop)
                                : fmt::format("after step {}", r.stop));
  fmt::print("train: batch {}, steps {}..{}, lr {} (warmup {}, {}), {} BLAS thread{}{}\n", t.batch,
             r.first + 1, r.stop, t.lr, t.warmup, schedule_text(t), r.threads, r.threads == 1 ? "" : "s",
             r.world_size > 1 ? " per rank" : "");
  std::fflush(stdout);
}

void Console::on_step(const StepRecord& r) {
  if (!lead_) return;
  const parallel::StepStats& s = r.stats;
  const bool last = s.step == stop_;
  if (s.step % options_.log_every == 0 || last) {
    const double elapsed = r.elapsed_s;
    const double done = static_cast<double>(s.step - first_);
    const double tps = done * tokens_per_step_ / std::max(elapsed, 1e-9);
    const double eta = elapsed / done * static_cast<double>(stop_ - s.step);
    if (tty_) {
      constexpr int kWidth = 30;
      const int filled = static_cast<int>(kWidth * static_cast<double>(s.step) / static_cast<double>(stop_));
      fmt::print("\r[{}{}] step {}/{} loss {:.4f} | {:.0f} tok/s | ETA {}   ", std::string(filled, '#'),
                 std::string(kWidth - filled, '.'), s.step, stop_, s.loss, tps, clock_text(eta));
      bar_open_ = !last;
      if (last) fmt::print("\n");
    } else {
      // A mixture of experts' auxiliary loss after the LM loss, reported apart, and the step's
      // most uneven routing: the largest max / mean tokens per expert of any MoE block.
      std::string aux;
      if (const std::int64_t e = options_.train.model.experts; !s.expert_load.empty() && e > 0) {
        double worst = 0;
        for (std::size_t b = 0; b + static_cast<std::size_t>(e) <= s.expert_load.size();
             b += static_cast<std::size_t>(e)) {
          const auto first = s.expert_load.begin() + static_cast<std::ptrdiff_t>(b);
          const auto end = first + static_cast<std::ptrdiff_t>(e);
          const double mean = std::accumulate(first, end, 0.0) / static_cast<double>(e);
          if (mean > 0) worst = std::max(worst, *std::max_element(first, end) / mean);
        }
        aux = fmt::format(" aux_loss {:.4f} load_max {:.2f}", s.aux_loss, worst);
      }
      fmt::print("step {}/{} loss {:.4f}{} lr {:.3g} grad_norm {:.3f} tok/s {:.0f} eta {}\n", s.step, stop_,
                 s.loss, aux, s.lr, s.grad_norm, tps, clock_text(eta));
    }
  }
  if (r.val_loss) {
    if (bar_open_) fmt::print("\n");
    bar_open_ = false;
    fmt::print("val_loss {:.4f} at step {} ({} batches of {})\n", *r.val_loss, s.step, options_.eval_batches,
               heldout_.empty() ? "the evaluation stream" : "the held-out data");
  }
  std::fflush(stdout);
}

void Console::on_end(const RunReport& report) {
  if (!lead_) return;
  if (bar_open_) fmt::print("\n");
  const RunOptions& o = options_;
  const json j = json::parse(report.json);
  const double final_loss = j["final_loss"].get<double>();
  const double last_loss = j["last_batch_loss"].is_number() ? j["last_batch_loss"].get<double>() : NAN;
  const std::int64_t steps = j["steps"].get<std::int64_t>();
  const std::int64_t run_steps = steps - j["first_step"].get<std::int64_t>() + 1;
  const int world = j["world_size"].get<int>();
  fmt::print("final loss {:.4f} (mean of {} evaluation batches{}; last training batch {:.4f})\n", final_loss,
             o.eval_batches, heldout_.empty() ? "" : " of the held-out data", last_loss);
  if (entropy_known_)
    fmt::print("entropy rate {:.4f} nats/token: final loss is {:.1f}% above the best achievable\n", entropy_,
               100.0 * (final_loss - entropy_) / entropy_);
  fmt::print("{} steps in {:.1f} s, {:.0f} tokens/s", run_steps, j["seconds"].get<double>(),
             j["tokens_per_second"].get<double>());
  if (world > 1)
    fmt::print(", gradient reduction {:.3f} s from first bucket to last, {:.3f} s of it exposed",
               j["comm_seconds"].get<double>(), j["exposed_comm_seconds"].get<double>());
  fmt::print("\n");
  {
    std::vector<std::string> per_stage;
    for (const json& b : j["activation_bytes_per_stage"])
      per_stage.push_back(fmt::format("{:.3f}", b.get<double>() / kMiB));
    double largest = 0;
    for (const json& b : j["activation_bytes_per_rank"]) largest = std::max(largest, b.get<double>());
    fmt::print(
        "activations: recompute {}, measured peak {:.3f} MiB per rank (the largest rank; per pipeline stage "
        "{} MiB); rank 0 also holds {:.3f} MiB of gather and send buffers\n",
        o.recompute, largest / kMiB, fmt::join(per_stage, ","),
        j["memory_bytes"]["activation_buffers"].get<double>() / kMiB);
  }
  const json& pipe = j["pipeline"];
  if (pipe["stages"].get<int>() > 1 || !o.trace.empty()) {
    const int chunks = pipe["chunks"].get<int>();
    fmt::print("pipeline: {} over {} stages x {} chunk{}, {} micro-batches, blocks per chunk {}\n",
               pipe["schedule"].get<std::string>(), pipe["stages"].get<int>(), chunks, chunks == 1 ? "" : "s",
               pipe["microbatches"].get<int>(),
               fmt::join(pipe["partition"].get<std::vector<std::int64_t>>(), ","));
    fmt::print(
        "pipeline bubble: measured {:.1f}%, simulated {:.1f}% for the measured mean costs (forward {:.3g} "
        "ms, "
        "backward {:.3g} + {:.3g} ms per stage), {:.1f}% for each stage's own\n",
        100 * pipe["bubble_measured"].get<double>(), 100 * pipe["bubble_simulated"].get<double>(),
        1e3 * pipe["forward_seconds"].get<double>(), 1e3 * pipe["backward_input_seconds"].get<double>(),
        1e3 * pipe["backward_weight_seconds"].get<double>(),
        100 * pipe["bubble_simulated_stages"].get<double>());
    fmt::print("pipeline activations held per stage: measured peak {}, schedule {}\n",
               fmt::join(pipe["peak_activations"].get<std::vector<int>>(), ","),
               fmt::join(pipe["expected_peak_activations"].get<std::vector<int>>(), ","));
    if (!o.trace.empty())
      fmt::print("trace: {} actions written to {}\n", pipe["trace_events"].get<std::int64_t>(), o.trace);
  }
  if (!o.save.empty()) fmt::print("saved checkpoint {} (step {})\n", o.save, steps);
  if (j.contains("kernel_times"))
    print_kernel_times(j["kernel_times"], run_steps > 1 ? first_ + 2 : first_ + 1, stop_);
  const json& mem = j["memory_bytes"];
  if (j.contains("offload_pcie"))
    fmt::print(
        "offload: optimizer state {:.1f} MiB per rank in pinned host memory ({:.1f} MiB with the fp32 master "
        "and "
        "the staging chunks), {:.1f} MiB over PCIe per step (rank 0)\n",
        mem["optimizer_offloaded"].get<double>() / kMiB, mem["optimizer_host"].get<double>() / kMiB,
        (j["offload_pcie"]["bytes_to_host_per_step"].get<double>() +
         j["offload_pcie"]["bytes_to_device_per_step"].get<double>()) /
            kMiB);
  else if (j.contains("offload_io"))
    fmt::print(
        "offload: optimizer state {:.1f} MiB per rank in {} (rank 0), streamed through a {:.0f} MiB window\n",
        mem["optimizer_offloaded"].get<double>() / kMiB, o.offload_dir,
        mem["optimizer"].get<double>() / kMiB);
  if (o.json) fmt::print("{}\n", report.json);
  std::fflush(stdout);
}

}  // namespace ndmesh::train
