// Search over layouts: every (tp, cp, pp, dp, ep, vpp, micro-batch, schedule, recompute, ZeRO
// stage) for N GPUs that passes config validation and fits in memory, ranked by predicted
// time per step.
//
// The enumeration skips choices that cannot matter or are dominated, so a search over
// thousands of GPUs takes milliseconds: sequence parallelism is always on when tp > 1
// (same traffic as plain tensor parallelism, less memory; Korthikanti et al. 2022);
// schedules other than 1F1B only when pp > 1; vpp > 1 only with the interleaved schedule;
// ZeRO 2 and 3 only without pipeline parallelism (DeepSpeed does not combine them, and
// their per-micro-batch traffic makes no sense under a pipeline). Placement and validation
// are computed once per dim split and schedule, not per recompute or ZeRO choice. Under
// flash attention selective recompute equals none and is skipped when none is tried.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ndmesh/plan/estimate.hpp"

namespace ndmesh::plan {

/// Dims and options the user fixed (`ndmesh plan --tp 4,8 --max-zero 1 ...`). An empty list
/// leaves that choice free; a list restricts it to its values.
struct Constraints {
  std::vector<std::int64_t> tp, cp, pp, dp, vpp, micro_batch;
  /// Expert parallelism (folded into dp x cp) of a mixture of experts; empty: every ep that
  /// divides dp x cp and the experts (1 for a dense model).
  std::vector<std::int64_t> ep;
  int max_zero = 3;                   ///< highest ZeRO stage tried
  int min_zero = 0;                   ///< lowest ZeRO stage tried (--memory aggressive: 2)
  bool offload_optimizer = false;     ///< every layout offloads its optimizer state (--offload optimizer)
  bool offload_to_host = false;       ///< ... to pinned host memory, not disk (--offload-to host)
  std::vector<Schedule> schedules;    ///< empty: every schedule
  std::vector<Recompute> recomputes;  ///< empty: every recompute mode
  bool sequence_parallel = true;      ///< false: never use sequence parallelism
  bool dp_overlap = true;             ///< false: the gradient reduction never overlaps the backward
  /// Blocks per pipeline chunk for every layout (pp*vpp entries); empty: balanced.
  std::vector<std::int64_t> stage_layers;

  /// True when anything is fixed.
  bool any() const;
  /// "tp=4,8 recompute=none,selective", or "none".
  std::string text() const;
};

/// What to search.
/// The largest GPU count search() accepts: it walks every (tp, cp, pp) divisor triple,
/// and past 2^20 GPUs a plan takes minutes without being any more useful.
inline constexpr std::int64_t kMaxSearchGpus = std::int64_t{1} << 20;
/// The most layouts search() returns.
inline constexpr std::size_t kMaxTop = 10000;

struct SearchOptions {
  std::int64_t gpus = 0;
  Workload workload;
  std::size_t top = 10;  ///< layouts returned
  std::vector<std::int64_t> micro_batches = {1, 2, 4, 8};
  std::int64_t max_vpp = 8;  ///< largest virtual-stage count tried
  Precision precision = {};
  Constraints constraints = {};
  Attention attention = Attention::kStandard;  ///< the CLI defaults to flash
};

/// The outcome of a search.
struct SearchResult {
  std::vector<Estimate> layouts;  ///< valid and fitting, fastest first, at most `top`
  std::int64_t considered = 0;    ///< layouts looked at
  std::int64_t invalid = 0;       ///< rejected by config validation
  std::int64_t too_big = 0;       ///< valid but over the memory of a GPU
  std::int64_t fitting = 0;       ///< valid and fitting (before keeping the top)
  /// When nothing fits: the valid layout with the smallest footprint.
  std::optional<Estimate> smallest;
  /// When nothing is valid: one validation problem per rejected dim split (a few).
  std::vector<std::string> sample_problems;
};

/// Searches every layout of `options.gpus` GPUs that meets the constraints. ConfigError when
/// the options themselves are bad (gpus, seq or global batch below 1), or when the
/// constraints leave no valid layout (naming the constraints and the first conflict, e.g.
/// "--tp 3: heads=32 is not divisible by tp=3").
SearchResult search(const PlanModel& model, const Hardware& hw, const SearchOptions& options);

}  // namespace ndmesh::plan
