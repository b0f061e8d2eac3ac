// What the emulator's "device" memory is, for the tests that need to tell it from host memory
// (a staging memory that stages only device buffers), and when its work runs: defined in emulator/device.cpp,
// linked into the emulated test binaries only (NDMESH_CUDA_EMULATED).
#pragma once

namespace ndmesh::cuda::emulator {

/// True when `p` points into a block handed out by cuda::alloc and not freed yet.
bool is_device(const void* p);

/// Device work (launches, products, asynchronous copies) runs in its call when true, or, by
/// default, in stream order when the host waits for it (emulator/cuda_runtime.h's device_op).
/// The in-process communicator copies device buffers with memcpy in no stream's order (on a
/// GPU NCCL's copies are stream work), so tests that hand it device buffers directly run the
/// emulator at once.
void run_device_work_at_once(bool at_once);

}  // namespace ndmesh::cuda::emulator
