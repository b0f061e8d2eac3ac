#include "ndmesh/parallel/train_options.hpp"

#include <cmath>

#include <fmt/format.h>

namespace ndmesh::parallel {

const char* precision_name(Precision p) { return p == Precision::kBf16 ? "bf16" : "fp32"; }

const char* offload_name(Offload o) {
  switch (o) {
    case Offload::kOptimizer:
      return "optimizer";
    case Offload::kOptimizerParams:
      return "optimizer+params";
    case Offload::kNone:
      break;
  }
  return "none";
}

std::optional<Offload> parse_offload(std::string_view text) {
  for (Offload o : {Offload::kNone, Offload::kOptimizer, Offload::kOptimizerParams})
    if (text == offload_name(o)) return o;
  return std::nullopt;
}

std::vector<std::string> train_option_problems(const TrainOptions& o) {
  std::vector<std::string> out;
  auto need = [&](bool ok, std::string_view flag, auto value, std::string_view rule,
                  std::string_view example) {
    if (!ok) out.push_back(fmt::format("{}={} {}; e.g. {} {}", flag, value, rule, flag, example));
  };
  need(o.batch >= 1, "--global-batch", o.batch, "must be at least 1", "16");
  need(o.micro_batch >= 0, "--micro-batch", o.micro_batch, "must be >= 0 (0: the whole local batch)", "4");
  need(o.steps >= 1, "--steps", o.steps, "must be at least 1", "1000");
  need(o.warmup >= 0, "--warmup", o.warmup, "must be >= 0", "20");
  need(o.lr > 0 && std::isfinite(o.lr), "--lr", o.lr, "must be a positive number", "3e-3");
  need(o.min_lr_ratio >= 0 && o.min_lr_ratio <= 1, "--min-lr-ratio", o.min_lr_ratio, "must be in [0, 1]",
       "0.1");
  need(o.decay_fraction > 0 && o.decay_fraction <= 1, "--decay-fraction", o.decay_fraction, "must be in (0, 1]",
       "0.2");
  need(o.adamw.weight_decay >= 0, "--weight-decay", o.adamw.weight_decay, "must be >= 0", "0.1");
  need(o.adamw.clip_norm >= 0, "--clip", o.adamw.clip_norm, "must be >= 0 (0: no clipping)", "1.0");
  need(o.pp.virtual_stages >= 1, "--vpp", o.pp.virtual_stages, "must be at least 1", "2");
  need(o.pp.trace_steps >= 1, "--trace-steps", o.pp.trace_steps, "must be at least 1", "32");
  for (std::string& p : data_parallel_option_problems(o.dp)) out.push_back(std::move(p));
  if (o.offload.what == Offload::kOptimizerParams && o.dp.zero != 3)
    out.push_back(fmt::format(
        "--offload=optimizer+params with --zero {}: the parameters live in files between uses only under ZeRO-3 "
        "(gathered per unit); add --zero 3 or use --offload optimizer",
        o.dp.zero));
  const bool on_gpu = o.device != Device::kCpu;  // --offload optimizer goes to pinned host memory there
  if (o.offload.what != Offload::kNone && o.offload.dir.empty() && !on_gpu)
    out.push_back(
        fmt::format("--offload={} needs --offload-dir DIR (a folder on a local disk for the state files); "
                    "e.g. --offload-dir /tmp",
                    offload_name(o.offload.what)));
  if (o.offload.what == Offload::kNone && !o.offload.dir.empty())
    out.push_back(
        fmt::format("--offload-dir={} is given without --offload; add --offload optimizer or leave it out",
                    o.offload.dir));
  if (o.offload.what == Offload::kOptimizerParams && on_gpu)
    out.push_back(
        "--offload=optimizer+params with --device cuda: the parameter shard's files are read into host "
        "memory "
        "around each gather (CPU runs only); use --offload optimizer (pinned host memory) or --device cpu");
  // ndmesh's own all-reduce programs (comm/allreduce.hpp) add the received chunks in host
  // loops; on a GPU the device communicator's all-reduce (NCCL's ring or tree) is the one.
  if (on_gpu && o.dp.algorithm != comm::AllReduceAlgorithm::kMpi)
    out.push_back(fmt::format(
        "--allreduce={} with --device cuda: ndmesh's all-reduce programs sum on the host (CPU runs only); "
        "leave --allreduce out (NCCL picks its ring or tree: NCCL_ALGO=Ring|Tree chooses)",
        comm::algorithm_name(o.dp.algorithm)));
  if (o.offload.what == Offload::kOptimizer && on_gpu && !o.offload.dir.empty())
    out.push_back(
        fmt::format("--offload-dir={} with --device cuda: the optimizer state goes to pinned host memory, not to "
                    "files; leave --offload-dir out",
                    o.offload.dir));
  return out;
}

}  // namespace ndmesh::parallel
