// Shared by the GPU tests: skip without a usable GPU (fail with NDMESH_REQUIRE_GPU=1), and
// move buffers between the host and the device.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ndmesh/core/env.hpp"
#include "ndmesh/tensor/device.hpp"

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

}  // namespace ndmesh::testing

/// First statement of every GPU test: skips (reported as skipped) without a usable GPU,
/// fails instead when NDMESH_REQUIRE_GPU=1; otherwise selects GPU 0 and its stream.
#define NDMESH_GPU_OR_SKIP()                                               \
  do {                                                                     \
    const std::string why_ = ::ndmesh::cuda::unavailable_reason();         \
    if (!why_.empty()) {                                                   \
      if (::ndmesh::testing::require_gpu()) FAIL() << why_;                \
      GTEST_SKIP() << why_;                                                \
    }                                                                      \
    ::ndmesh::cuda::init(0);                                               \
  } while (0)
