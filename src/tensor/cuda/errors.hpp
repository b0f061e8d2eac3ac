// Errors from CUDA code. The .cu files include no ndmesh/core header (fmt's compile-time
// format strings do not compile under nvcc): they build their message as a std::string and
// throw through these, defined in src/tensor/device.cpp (host compiler).
#pragma once

#include <string>

namespace ndmesh::cuda::detail {

/// Throws ndmesh::Error("[cuda] " + message).
[[noreturn]] void fail_error(const std::string& message);
/// Throws ndmesh::ConfigError("[cuda] " + message) (bad input: exit 2).
[[noreturn]] void fail_config(const std::string& message);

}  // namespace ndmesh::cuda::detail
