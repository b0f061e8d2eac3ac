// The one place that dispatches on device and element type (docs/gpu.md): a tensor or
// layer function written for the CPU starts with NDMESH_CUDA_TWIN(device, body...), which
// runs `body` (its CUDA twin, nn/cuda_ops.hpp) and returns its result when the elements are
// float (or bfloat16, for the byte copies that serve both) on CUDA, refuses every other type
// on CUDA (ops::check_device: double is the finite-difference path, CPU only), and falls through to the CPU code on the CPU. `body`
// is the body of a lambda that captures by reference: a call (`cuda::fill(x, 0.0f, n)`), a
// block of statements, or `return expr` in a function that returns a value. A build without
// CUDA has no device memory (ParamStore::to refuses it), so there the macro only checks the
// device and the CPU code always runs.
#pragma once

#include <type_traits>

#include "ndmesh/tensor/device.hpp"
#include "ndmesh/tensor/ops.hpp"

#if NDMESH_WITH_CUDA
#include "ndmesh/nn/cuda_ops.hpp"
#define NDMESH_CUDA_TWIN(device, ...)                                  \
  if ((device) == ::ndmesh::Device::kCuda) {                           \
    if constexpr (::ndmesh::ops::kCudaHolds<T>)                        \
      return [&] { __VA_ARGS__; }();                                   \
    else                                                               \
      ::ndmesh::ops::check_device<T>(device);                          \
  }
#else
#define NDMESH_CUDA_TWIN(device, ...) ::ndmesh::ops::check_device<T>(device);
#endif
