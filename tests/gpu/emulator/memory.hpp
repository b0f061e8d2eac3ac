// What the emulator's "device" memory is, for the tests that need to tell it from host memory
// (a staging memory that stages only device buffers): defined in emulator/device.cpp, linked
// into the emulated test binaries only (NDMESH_CUDA_EMULATED).
#pragma once

namespace ndmesh::cuda::emulator {

/// True when `p` points into a block handed out by cuda::alloc and not freed yet.
bool is_device(const void* p);

}  // namespace ndmesh::cuda::emulator
