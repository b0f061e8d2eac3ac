// The balanced partition: binary search over the possible maximum chunk cost C (every
// candidate is a block count plus 0, the embedding or the head cost); C is feasible when
// the chunks' capacities floor(C - extra) are all >= 1 and add up to at least `layers`.
// From the capacities at the smallest feasible C, blocks are taken away from the most
// expensive chunk (the later one on ties) until they add up to `layers`.
#include "ndmesh/config/partition.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/core/strings.hpp"

namespace ndmesh {
namespace {

double extra_of(std::size_t i, std::size_t n, StageExtras x) {
  return (i == 0 ? x.embedding : 0.0) + (i + 1 == n ? x.head : 0.0);
}

}  // namespace

std::vector<std::int64_t> balanced_partition(std::int64_t layers, std::int64_t pp, std::int64_t vpp,
                                             StageExtras extras) {
  NDMESH_CHECK_CONFIG(pp >= 1 && vpp >= 1, "config", "pp={} and vpp={} must be at least 1", pp, vpp);
  NDMESH_CHECK_CONFIG(extras.embedding >= 0 && extras.head >= 0, "config",
                      "stage extras (embedding {}, head {}) must not be negative", extras.embedding,
                      extras.head);
  const std::int64_t k = pp * vpp;
  NDMESH_CHECK_CONFIG(
      layers >= k, "config",
      "layers={} cannot give each of pp*vpp = {}*{} = {} pipeline chunks a block; use at most "
      "{} chunks or at least {} layers",
      layers, pp, vpp, k, layers, k);
  const auto n = static_cast<std::size_t>(k);
  std::vector<double> cand;
  cand.reserve(static_cast<std::size_t>(3 * layers));
  for (std::int64_t b = 1; b <= layers; ++b) {
    const double bd = static_cast<double>(b);
    cand.push_back(bd);
    cand.push_back(bd + extras.embedding);
    cand.push_back(bd + extras.head);
    if (n == 1) cand.push_back(bd + extras.embedding + extras.head);
  }
  std::sort(cand.begin(), cand.end());
  cand.erase(std::unique(cand.begin(), cand.end()), cand.end());

  auto caps = [&](double c, std::vector<std::int64_t>& out) {
    std::int64_t sum = 0;
    bool ok = true;
    for (std::size_t i = 0; i < n; ++i) {
      const double cap = std::floor(c - extra_of(i, n, extras) + 1e-9);
      out[i] = cap < 1 ? 0 : static_cast<std::int64_t>(std::min(cap, static_cast<double>(layers)));
      if (out[i] < 1) ok = false;
      sum += out[i];
    }
    return ok && sum >= layers;
  };
  std::vector<std::int64_t> chunks(n);
  // layers + both extras is always feasible (every chunk can then take all the blocks).
  cand.push_back(static_cast<double>(layers) + extras.embedding + extras.head);
  std::size_t lo = 0, hi = cand.size() - 1;
  while (lo < hi) {
    const std::size_t mid = (lo + hi) / 2;
    if (caps(cand[mid], chunks))
      hi = mid;
    else
      lo = mid + 1;
  }
  caps(cand[lo], chunks);
  std::int64_t excess = -layers;
  for (auto c : chunks) excess += c;
  while (excess > 0) {
    std::size_t pick = n;
    double worst = -1;
    for (std::size_t i = 0; i < n; ++i) {
      if (chunks[i] <= 1) continue;
      const double cost = static_cast<double>(chunks[i]) + extra_of(i, n, extras);
      if (cost >= worst) worst = cost, pick = i;
    }
    NDMESH_CHECK(pick < n, "config", "partition of {} layers over {} chunks has no block to take away",
                 layers, k);
    --chunks[pick];
    --excess;
  }
  return chunks;
}

std::vector<std::int64_t> parse_partition(std::string_view text, std::int64_t layers, std::int64_t pp,
                                          std::int64_t vpp, std::string_view flag) {
  const std::int64_t k = pp * std::max<std::int64_t>(vpp, 1);
  std::vector<std::int64_t> out;
  std::int64_t sum = 0;
  for (auto part : split_list(text, ",")) {
    std::int64_t v = 0;
    const std::string s(part);
    std::size_t used = 0;
    try {
      v = std::stoll(s, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    NDMESH_CHECK_CONFIG(!s.empty() && used == s.size(), "config",
                        "{} '{}': '{}' is not a block count; give {} positive integers, e.g. {} {}", flag,
                        text, s, k, flag, fmt::join(balanced_partition(std::max(layers, k), pp, vpp), ","));
    NDMESH_CHECK_CONFIG(v >= 1, "config",
                        "{} '{}': entry {} is {}; every pipeline chunk needs at least one block", flag, text,
                        out.size() + 1, v);
    out.push_back(v);
    sum += v;
  }
  NDMESH_CHECK_CONFIG(static_cast<std::int64_t>(out.size()) == k, "config",
                      "{} '{}' has {} entries but pp*vpp = {}*{} = {} chunks need one each", flag, text,
                      out.size(), pp, vpp, k);
  NDMESH_CHECK_CONFIG(sum == layers, "config", "{} '{}' adds up to {} blocks but the model has layers={}",
                      flag, text, sum, layers);
  return out;
}

std::vector<std::int64_t> blocks_per_rank(const std::vector<std::int64_t>& chunks, std::int64_t pp) {
  std::vector<std::int64_t> out(static_cast<std::size_t>(std::max<std::int64_t>(pp, 1)), 0);
  for (std::size_t i = 0; i < chunks.size(); ++i) out[i % out.size()] += chunks[i];
  return out;
}

double max_chunk_cost(const std::vector<std::int64_t>& chunks, StageExtras extras) {
  double worst = 0;
  for (std::size_t i = 0; i < chunks.size(); ++i)
    worst = std::max(worst, static_cast<double>(chunks[i]) + extra_of(i, chunks.size(), extras));
  return worst;
}

}  // namespace ndmesh
