// Rng: a small, fully specified random generator (SplitMix64) whose whole state is one
// 64-bit integer, so that it can be stored in a checkpoint and give the same numbers on
// every platform and standard library (std::normal_distribution does not).
#pragma once

#include <cmath>
#include <cstdint>

namespace ndmesh {

/// SplitMix64 (Steele, Lea, Flood 2014) with uniform and normal draws.
class Rng {
 public:
  explicit Rng(std::uint64_t seed = 0) : state_(seed) {}

  /// The next 64 random bits.
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  /// Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  /// Uniform integer in [0, n), n > 0.
  std::uint64_t below(std::uint64_t n) {
    return static_cast<std::uint64_t>(uniform() * static_cast<double>(n));
  }
  /// Standard normal by Box-Muller (one draw per call; the pair's twin is discarded so
  /// that the state stays one integer).
  double normal() {
    double u1 = uniform();
    double u2 = uniform();
    return std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(6.283185307179586 * u2);
  }

  /// The whole state, for checkpoints.
  std::uint64_t state() const { return state_; }
  void set_state(std::uint64_t s) { state_ = s; }

 private:
  std::uint64_t state_;
};

}  // namespace ndmesh
