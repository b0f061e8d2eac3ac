// Shared by the GPU tests: skip without a usable GPU (fail with NDMESH_REQUIRE_GPU=1), move
// buffers between the host and the device, draw inputs and compare results.
//
// Comparisons follow llm.c: |got - ref| <= atol + rtol |ref| element by element (a NaN
// anywhere fails), and a failure names the first differing index with both values, the
// number of failures and the worst one, so that a short GPU window shows what broke.
// Outputs that a kernel overwrites are poisoned with NaN first: an element it never
// writes fails the comparison.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include <gtest/gtest.h>

#include "ndmesh/core/env.hpp"
#include "ndmesh/tensor/device.hpp"
#include "ndmesh/tensor/rng.hpp"

namespace ndmesh::testing {

/// True when NDMESH_REQUIRE_GPU=1: a missing GPU fails the test instead of skipping it.
inline bool require_gpu() { return env::integer("NDMESH_REQUIRE_GPU", 0, 0, 1) == 1; }

/// Device memory holding a copy of `host` (elements of T).
template <typename T>
DeviceBuffer to_device(const std::vector<T>& host) {
  DeviceBuffer b(host.size() * sizeof(T));
  cuda::copy_to_device(b.data(), host.data(), host.size() * sizeof(T));
  return b;
}

/// `n` elements of T copied back from `buffer`.
template <typename T>
std::vector<T> to_host(const DeviceBuffer& buffer, std::size_t n) {
  std::vector<T> host(n);
  cuda::copy_to_host(host.data(), buffer.data(), n * sizeof(T));
  return host;
}

/// The buffer's elements as T (device memory).
template <typename T>
T* ptr(const DeviceBuffer& buffer) {
  return static_cast<T*>(buffer.data());
}

/// n standard-normal floats times `scale`, from `seed` (never all zeros: zeros hide
/// unwritten outputs and wrong indexing).
inline std::vector<float> normal(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(rng.normal()) * scale;
  return v;
}

/// n quiet NaNs: the poison of an output the kernel must overwrite.
inline std::vector<float> nans(std::size_t n) {
  return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN());
}

/// |got[i] - ref[i]| <= atol + rtol |ref[i]| for every i (NaN fails), sizes equal.
inline ::testing::AssertionResult all_close(const std::vector<float>& got, const std::vector<float>& ref,
                                            double atol, double rtol) {
  if (got.size() != ref.size())
    return ::testing::AssertionFailure() << "sizes differ: " << got.size() << " vs " << ref.size();
  std::size_t bad = 0, first = 0, worst = 0;
  double worst_excess = -1;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], r = ref[i], bound = atol + rtol * std::fabs(r), err = std::fabs(g - r);
    if (err <= bound) continue;  // false for NaN
    if (bad++ == 0) first = i;
    const double excess = std::isnan(err) ? std::numeric_limits<double>::infinity() : err / bound;
    if (excess > worst_excess) worst_excess = excess, worst = i;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  std::ostringstream m;
  m.precision(9);
  m << bad << " of " << got.size() << " elements differ beyond atol " << atol << " + rtol " << rtol
    << " |ref|; first at [" << first << "]: got " << got[first] << ", ref " << ref[first] << "; worst at ["
    << worst << "]: got " << got[worst] << ", ref " << ref[worst];
  return ::testing::AssertionFailure() << m.str();
}

/// Bit-for-bit equality (NaN payloads included).
template <typename T>
::testing::AssertionResult same_bits(const std::vector<T>& got, const std::vector<T>& ref) {
  if (got.size() != ref.size())
    return ::testing::AssertionFailure() << "sizes differ: " << got.size() << " vs " << ref.size();
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &ref[i], sizeof(T)) != 0 && bad++ == 0) first = i;
  if (bad == 0) return ::testing::AssertionSuccess();
  std::ostringstream m;
  m.precision(9);
  m << bad << " of " << got.size() << " elements differ in their bits; first at [" << first << "]";
  if constexpr (std::is_arithmetic_v<T>) m << ": got " << got[first] << ", ref " << ref[first];
  return ::testing::AssertionFailure() << m.str();
}

}  // namespace ndmesh::testing

/// First statement of every GPU test: skips (reported as skipped) without a usable GPU,
/// fails instead when NDMESH_REQUIRE_GPU=1; otherwise selects GPU 0 and its stream. In the
/// emulated builds (emulator/, gpu_emulated.*) the emulated GPU is always there.
#define NDMESH_GPU_OR_SKIP()                                       \
  do {                                                             \
    const std::string why_ = ::ndmesh::cuda::unavailable_reason(); \
    if (!why_.empty()) {                                           \
      if (::ndmesh::testing::require_gpu()) FAIL() << why_;        \
      GTEST_SKIP() << why_;                                        \
    }                                                              \
    ::ndmesh::cuda::init(0);                                       \
  } while (0)
