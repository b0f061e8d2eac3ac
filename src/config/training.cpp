// The rules of running a model on a layout (see training.hpp): every check appends one line,
// so a caller sees every problem at once and the planner can call it per layout.
#include "ndmesh/config/training.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "ndmesh/core/error.hpp"

#include "suggest.hpp"

namespace ndmesh {
namespace {

using detail::nearest_divisors;
using detail::nearest_multiples;

std::int64_t positive_or_one(std::int64_t v) { return v >= 1 ? v : 1; }

// a x b mod m for non-negative a, b and m >= 1, without overflow (doubling).
std::int64_t mulmod(std::int64_t a, std::int64_t b, std::int64_t m) {
  std::uint64_t x = static_cast<std::uint64_t>(a % m), y = static_cast<std::uint64_t>(b % m), r = 0;
  const auto mod = static_cast<std::uint64_t>(m);
  while (y > 0) {
    if (y & 1) r = (r + x) % mod;
    x = (x * 2) % mod;  // x < m < 2^63, so 2x fits
    y >>= 1;
  }
  return static_cast<std::int64_t>(r);
}

}  // namespace

MemoryStrategy memory_strategy(std::string_view name, std::string_view flag) {
  static constexpr MemoryStrategy kStrategies[] = {
      {.name = "basic", .recompute = "none", .zero = 0, .offload = false},
      {.name = "standard", .recompute = "selective", .zero = 0, .offload = false},
      {.name = "aggressive", .recompute = "full", .zero = 2, .offload = false},
      {.name = "extreme", .recompute = "full", .zero = 3, .offload = true},
  };
  for (const MemoryStrategy& s : kStrategies)
    if (s.name == name) return s;
  fail<ConfigError>(
      "config",
      "{}={} is not a memory strategy; use basic, standard (selective recompute), aggressive (full "
      "recompute + ZeRO 2) or extreme (full recompute + ZeRO 3 + optimizer offload to disk)",
      flag, name);
}

TrainingRun training_run(const ParallelConfig& c) {
  TrainingRun r;
  r.dp = positive_or_one(c.size("dp"));
  r.cp = positive_or_one(c.size("cp"));
  r.tp = positive_or_one(c.size("tp"));
  r.pp = positive_or_one(c.size("pp"));
  r.vpp = c.vpp;
  r.schedule = c.schedule;
  r.micro_batch = c.micro_batch;
  r.global_batch = c.global_batch > 0 ? c.global_batch : c.micro_batch * r.dp;
  r.sequence_parallel = c.sequence_parallel;
  r.recompute = c.recompute;
  r.zero = c.zero;
  return r;
}

std::vector<std::string> tp_problems(const ModelSpec& s, std::int64_t tp, bool sp, std::int64_t rows) {
  std::vector<std::string> out;
  if (tp <= 1) return out;
  auto need = [&](const char* flag, std::int64_t v, const char* why) {
    if (v % tp != 0)
      out.push_back(
          fmt::format("--tp={} does not divide {}={} ({}); use {}, or a {} that is a multiple of {}", tp,
                      flag, v, why, nearest_divisors(v, tp, "--tp"), flag, tp));
  };
  need("--heads", s.heads, "query heads are split over tp");
  if (s.kv_heads > 0 && s.kv_heads != s.heads)  // else the heads rule covers them
    need("--kv-heads", s.kv_heads,
         "key/value heads are split over tp, not replicated: each rank holds whole groups of query heads");
  need("--ffn", s.ffn_or_default(), "the MLP width is split over tp");
  if (sp && rows % tp != 0)
    out.push_back(fmt::format(
        "--sequence-parallel with --tp={}: the token rows of a micro-batch (micro-batch x --seq / "
        "--cp) are not divisible by {}; pick --seq or --micro-batch so they are",
        tp, tp));
  return out;
}

std::vector<std::string> cp_chunk_problems(std::int64_t seq, std::int64_t cp, bool contiguous) {
  std::vector<std::string> out;
  if (cp <= 1) return out;
  // Sizes past the sequence length first, so 2 cp cannot overflow.
  if (cp > (contiguous ? seq : seq / 2)) {
    out.push_back(fmt::format("--seq={} cannot be split into {} chunks with --cp={}; use --cp {} or less",
                              seq, contiguous ? "cp" : "2 * cp", cp,
                              std::max<std::int64_t>(contiguous ? seq : seq / 2, 1)));
    return out;
  }
  const std::int64_t chunks = contiguous ? cp : 2 * cp;
  if (seq % chunks != 0)
    out.push_back(fmt::format(
        "--seq={} is not divisible by {} (--cp={}, {} layout: {} chunks of equal length); use {} (or another "
        "multiple of {}){}",
        seq, chunks, cp, contiguous ? "contiguous" : "zigzag", contiguous ? "cp" : "2 * cp",
        nearest_multiples(seq, chunks, "--seq"), chunks, contiguous ? "" : " (or --cp-layout contiguous)"));
  return out;
}

std::vector<std::string> zero_problems(int zero) {
  if (zero >= 0 && zero <= kMaxTrainZero) return {};
  return {fmt::format(
      "--zero={} is not a ZeRO stage ndmesh train runs; use 0, 1, 2 or 3", zero)};
}

std::vector<std::string> training_problems(const TrainingRun& r, const ModelSpec* model) {
  std::vector<std::string> out;
  // The batch: dp ranks each train global / dp sequences, in micro-batches of micro_batch.
  std::int64_t local = 0, micro = 0, microbatches = 0;
  if (r.global_batch < 1) {
    out.push_back(fmt::format("--global-batch={} must be positive; e.g. --global-batch 8", r.global_batch));
  } else if (r.global_batch % r.dp != 0) {
    out.push_back(
        fmt::format("--global-batch={} is not divisible by --dp={}; use --global-batch {} (each dp rank "
                    "trains global-batch / "
                    "dp sequences)",
                    r.global_batch, r.dp, std::max(r.dp, r.global_batch / r.dp * r.dp)));
  } else {
    local = r.global_batch / r.dp;
    micro = r.micro_batch > 0 ? r.micro_batch : local;
    if (r.micro_batch < 0)
      out.push_back(fmt::format("--micro-batch={} must be >= 0 (0: the whole local batch)", r.micro_batch));
    else if (local % micro != 0)
      out.push_back(
          fmt::format("--micro-batch={} does not divide the local batch {} (--global-batch {} / --dp {}); "
                      "use a divisor of {}",
                      micro, local, r.global_batch, r.dp, local));
    else
      microbatches = local / micro;
  }

  // The pipeline: schedule, virtual stages, micro-batch count and the executor's limits.
  const bool interleaved = r.schedule == Schedule::kInterleaved;
  if (r.vpp < 1) {
    out.push_back(fmt::format("--vpp={} must be at least 1", r.vpp));
  } else if (interleaved && r.vpp < 2) {
    out.push_back(
        fmt::format("--schedule interleaved needs --vpp 2 or more (now {}); or use --schedule 1f1b", r.vpp));
  } else if (!interleaved && r.vpp != 1) {
    out.push_back(fmt::format(
        "--vpp={} applies only to --schedule interleaved (now {}); add --schedule interleaved or use --vpp 1",
        r.vpp, schedule_name(r.schedule)));
  }
  if (interleaved && r.pp < 2)
    out.push_back(
        fmt::format("--schedule interleaved needs --pp 2 or more (now --pp {}); use --schedule 1f1b", r.pp));
  if (interleaved && r.pp >= 2 && microbatches > 0 && microbatches % r.pp != 0)
    out.push_back(
        fmt::format("--schedule interleaved needs a multiple of --pp={} micro-batches per step, but "
                    "--global-batch {} / --dp "
                    "{} / --micro-batch {} gives {}; use --micro-batch {}",
                    r.pp, r.global_batch, r.dp, micro, microbatches,
                    std::max<std::int64_t>(1, local / (((microbatches + r.pp - 1) / r.pp) * r.pp))));
  // A split backward defers the weight gradients, which read a block's activations after the
  // next block has recomputed into the shared workspace.
  if (r.schedule == Schedule::kZbH1 && r.recompute)
    out.push_back(
        "--recompute with --schedule zb-h1: recompute with a split backward is not implemented yet; use "
        "--recompute none or --schedule 1f1b");
  if (r.pp > kMaxPipelineStages)
    out.push_back(fmt::format("--pp={} is above the limit of {} pipeline stages; use --pp {} or fewer", r.pp,
                              kMaxPipelineStages, kMaxPipelineStages));
  // Divisions, not products: --global-batch and --vpp may be anything up to 2^63 - 1.
  else if (microbatches > 0 && r.vpp >= 1 && r.pp >= 1 &&
           (microbatches > kMaxPipelineWork / r.pp || r.vpp > kMaxPipelineWork / (r.pp * microbatches) ||
            r.pp * microbatches * r.vpp > kMaxPipelineWork))
    out.push_back(
        fmt::format("--pp x micro-batches x --vpp = {} x {} x {} exceeds {} pipeline actions per step; use "
                    "fewer micro-batches "
                    "(a larger --micro-batch)",
                    r.pp, microbatches, r.vpp, kMaxPipelineWork));
  for (auto& p : zero_problems(r.zero)) out.push_back(std::move(p));
  if (r.sequence_parallel && r.tp <= 1)
    out.push_back(
        "--sequence-parallel needs --tp > 1 (it splits the tokens of the norms over tp); add --tp 2 or leave "
        "it "
        "out");

  if (model == nullptr) return out;
  const ModelSpec& m = *model;
  // Shape rules first: the layout rules below assume a well-formed model.
  if (!model_problems(m).empty()) return out;
  const std::int64_t chunks = r.pp * std::max<std::int64_t>(r.vpp, 1);
  if (r.pp_layers_entries == 0 && m.layers < chunks)
    out.push_back(
        fmt::format("--layers={} over --pp={} x --vpp={}: each of the {} pipeline chunks needs a block; use "
                    "--pp x --vpp <= {} "
                    "or --layers {} or more",
                    m.layers, r.pp, r.vpp, chunks, m.layers, chunks));
  const auto cp = cp_chunk_problems(m.seq, r.cp, r.cp_contiguous);
  out.insert(out.end(), cp.begin(), cp.end());
  // hidden % tp follows from heads % tp and hidden % heads (model_problems).
  // Token rows of a micro-batch on one rank, modulo tp (--micro-batch and --seq may both be
  // huge: their product is never formed).
  const std::int64_t rows = micro > 0 && cp.empty() ? mulmod(micro, m.seq / r.cp, r.tp) : 0;
  for (auto& p : tp_problems(m, r.tp, r.sequence_parallel && micro > 0 && cp.empty(), rows))
    out.push_back(std::move(p));
  return out;
}

}  // namespace ndmesh
