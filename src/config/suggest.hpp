// Suggestions for validation messages ("use tp=6 or tp=12"), shared by the config layer's
// checks (config.cpp, training.cpp). Internal to src/config.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace ndmesh::detail {

// The divisors of n closest to `around` from below and above (excluding `around`). The
// search steps at most kSteps values each way, so a huge n or `around` (--tp 2^40) answers
// at once: past that, gcd(n, around) (a divisor of n below `around`) and n itself stand in.
inline std::string nearest_divisors(std::int64_t n, std::int64_t around, std::string_view field) {
  constexpr std::int64_t kSteps = 1 << 16;
  std::int64_t below = 0, above = 0;
  if (n >= 1 && around >= 1) {
    const std::int64_t start = std::min(around - 1, n);
    for (std::int64_t d = start; d >= 1 && start - d < kSteps; --d)
      if (n % d == 0) {
        below = d;
        break;
      }
    if (below == 0 && around > 1) below = std::gcd(n, around) < around ? std::gcd(n, around) : 0;
    if (around < n)  // else no divisor lies above (and around + 1 could overflow)
      for (std::int64_t d = around + 1; d <= n && d - around <= kSteps; ++d)
        if (n % d == 0) {
          above = d;
          break;
        }
    if (above == 0 && n > around) above = n;
  }
  if (below && above) return fmt::format("{}={} or {}={}", field, below, field, above);
  if (below) return fmt::format("{}={}", field, below);
  if (above) return fmt::format("{}={}", field, above);
  return fmt::format("{}=1", field);
}

// The multiples of `of` closest to `value` ("28 or 32").
inline std::string nearest_multiples(std::int64_t value, std::int64_t of, std::string_view field) {
  std::int64_t below = value / of * of;
  std::int64_t above = below + of;
  if (below <= 0) return fmt::format("{}={}", field, above);
  return fmt::format("{}={} or {}={}", field, below, field, above);
}

}  // namespace ndmesh::detail
