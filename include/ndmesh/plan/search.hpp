// Search over layouts: every (tp, cp, pp, dp, vpp, micro-batch, schedule, recompute, ZeRO
// stage) for N GPUs that passes config validation and fits in memory, ranked by predicted
// time per step.
//
// The enumeration skips choices that cannot matter or are dominated, so a search over
// thousands of GPUs takes milliseconds: sequence parallelism is always on when tp > 1
// (same traffic as plain tensor parallelism, less memory; Korthikanti et al. 2022);
// schedules other than 1F1B only when pp > 1; vpp > 1 only with the interleaved schedule;
// ZeRO 2 and 3 only without pipeline parallelism (DeepSpeed does not combine them, and
// their per-micro-batch traffic makes no sense under a pipeline). Placement and validation
// are computed once per dim split and schedule, not per recompute or ZeRO choice.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ndmesh/plan/estimate.hpp"

namespace ndmesh::plan {

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

/// Searches every layout of `options.gpus` GPUs. ConfigError when the options themselves
/// are bad (gpus, seq or global batch below 1).
SearchResult search(const PlanModel& model, const Hardware& hw, const SearchOptions& options);

}  // namespace ndmesh::plan
