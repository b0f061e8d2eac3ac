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
/// Logs "[cuda] " + message at info level (one line on stderr).
void note(const std::string& message);
/// After every operation enqueued on the compute stream: its place in the kernel times
/// (cuda::kernel_times_start); nothing unless they are on. `what` names the operation.
void timed(const char* what);
/// True while kernel times are on: names that cost a string to build are built only then.
bool timing();

}  // namespace ndmesh::cuda::detail

#if defined(__CUDACC__) || defined(NDMESH_CUDA_EMULATOR)
#include <cuda_runtime.h>

namespace ndmesh::cuda::detail {

/// Error naming `what` and the CUDA error unless `e` is cudaSuccess.
inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    fail_error(std::string(what) + " failed: " + cudaGetErrorString(e) + " (" + cudaGetErrorName(e) + ")");
}

/// After a kernel launch: a launch that did not happen (bad grid, too much shared memory,
/// no kernel image for this GPU) as an Error naming the kernel. Faults inside the kernel
/// surface at the next synchronizing call (cuda::synchronize names them). Then its mark in
/// the kernel times (timed).
inline void check_launch(const char* kernel) {
  check(cudaGetLastError(), kernel);
  timed(kernel);
}

}  // namespace ndmesh::cuda::detail
#endif
