// A build without CUDA has no device communicator: --device cuda stops at cuda::init before
// any group is made, and this says why where it is reached all the same.
#include "backends/staged/staged_backend.hpp"
#include "ndmesh/core/error.hpp"
#include "ndmesh/tensor/device.hpp"

namespace ndmesh::comm {

Communicator gpu_communicator(const Communicator&) { fail<ConfigError>("cuda", "{}", cuda::unavailable_reason()); }

}  // namespace ndmesh::comm
