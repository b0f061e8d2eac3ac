// What the emulated GPU tests share: the staging memory of an emulated GPU, the switch of the
// emulator's device-memory guard (emulator/cuda_runtime.h), and of when its work runs.
#pragma once

#include <cstddef>
#include <memory>

#include "ndmesh/comm/staged.hpp"
#include "ndmesh/tensor/device.hpp"

#ifdef NDMESH_CUDA_EMULATED
#include "emulator/memory.hpp"

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
/// through. The copy is done when it returns (the emulator runs device work when the host
/// waits for it, as a GPU does).
class EmulatedStaging final : public comm::StagingMemory {
 public:
  bool is_device(const void* p) const override { return p != nullptr; }
  void copy(void* dst, const void* src, std::size_t bytes) override {
    if (bytes == 0) return;
    cuda::copy_device(dst, src, bytes);  // as the staged communicator's copy on a GPU: then wait
    cuda::synchronize();
  }
  std::shared_ptr<char> host_buffer(std::size_t bytes) override {
    return std::shared_ptr<char>(new char[bytes == 0 ? 1 : bytes], std::default_delete<char[]>());
  }
};

/// While alive and `on`, the emulator runs device work in its call instead of in stream
/// order: for in-process ranks that hand device buffers to the in-process communicator
/// directly, which copies them with memcpy in no stream's order (NCCL's copies are stream
/// work on a GPU; such tests are emulator only).
class DirectDeviceExchange {
 public:
  explicit DirectDeviceExchange(bool on) : on_(on) {
    if (on_) at_once(true);
  }
  ~DirectDeviceExchange() {
    if (on_) at_once(false);
  }
  DirectDeviceExchange(const DirectDeviceExchange&) = delete;
  DirectDeviceExchange& operator=(const DirectDeviceExchange&) = delete;

 private:
  static void at_once(bool on) {
#ifdef NDMESH_CUDA_EMULATED
    cuda::emulator::run_device_work_at_once(on);
#else
    (void)on;
#endif
  }
  bool on_;
};

}  // namespace ndmesh::testing
