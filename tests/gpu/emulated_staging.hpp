// What the emulated GPU tests share: the staging memory of an emulated GPU, and the switch of
// the emulator's device-memory guard (emulator/cuda_runtime.h).
#pragma once

#include <cstddef>
#include <memory>

#include "ndmesh/comm/staged.hpp"
#include "ndmesh/tensor/device.hpp"

#ifdef NDMESH_CUDA_EMULATED
namespace emu {
/// Emulated device memory becomes inaccessible outside kernels and copies from now on
/// (emulator/device.cpp): host code touching it faults with the emulator's message.
void guard_device_memory();
}  // namespace emu
#endif

namespace ndmesh::testing {

/// Device memory is host memory in the emulator: every buffer is a device buffer to stage
/// (the staged communicator copies it through a host buffer, as NDMESH_BACKEND=gloo|mpi does
/// on a GPU), copied by the emulator's device copy, which the device-memory guard lets
/// through.
class EmulatedStaging final : public comm::StagingMemory {
 public:
  bool is_device(const void* p) const override { return p != nullptr; }
  void copy(void* dst, const void* src, std::size_t bytes) override {
    if (bytes) cuda::copy_device(dst, src, bytes);
  }
  std::shared_ptr<char> host_buffer(std::size_t bytes) override {
    return std::shared_ptr<char>(new char[bytes == 0 ? 1 : bytes], std::default_delete<char[]>());
  }
};

}  // namespace ndmesh::testing
