// How a layer's CPU function hands over to its CUDA twin (nn/cuda_ops.hpp): the first
// statement of the function, NDMESH_CUDA_TWIN(device, call), runs `call` and returns when
// the elements are float on CUDA. A build without CUDA has no device memory (ParamStore::to
// refuses it), so there the macro only reads the device (a parameter may serve nothing
// else) and the CPU code always runs.
#pragma once

#include <type_traits>

#include "ndmesh/tensor/device.hpp"

#if NDMESH_WITH_CUDA
#include "ndmesh/nn/cuda_ops.hpp"
#define NDMESH_CUDA_TWIN(device, call)                \
  if constexpr (std::is_same_v<T, float>) {           \
    if ((device) == ::ndmesh::Device::kCuda) {        \
      call;                                           \
      return;                                         \
    }                                                 \
  }
#else
#define NDMESH_CUDA_TWIN(device, call) static_cast<void>(device);
#endif
