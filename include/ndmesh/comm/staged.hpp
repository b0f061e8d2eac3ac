// The staged communicator: device buffers staged through host memory over a CPU backend
// (MPI, Gloo, in-process), for several GPU ranks that share a GPU (NCCL refuses that) and for
// GPUs whose MPI is not CUDA-aware (docs/gpu.md). An operation on device buffers copies them
// to host buffers and waits, runs the CPU backend's operation on the copies (nonblocking when
// asked: its Work polls it), then divides an average and copies the result back, waiting
// again. Host buffers go to the CPU backend as they are. Slow and exact: the reduction is the
// CPU backend's.
#pragma once

#include <cstddef>
#include <memory>

#include "ndmesh/comm/communicator.hpp"

namespace ndmesh::comm {

/// Device memory as the staged communicator sees it: CUDA in a GPU run (pinned host
/// buffers), a fake in the tests.
class StagingMemory {
 public:
  virtual ~StagingMemory() = default;
  /// True when `p` is device memory (nullptr is not).
  virtual bool is_device(const void* p) const = 0;
  /// Copies `bytes` from `src` to `dst` (either may be host or device memory) and returns
  /// once the copy is done.
  virtual void copy(void* dst, const void* src, std::size_t bytes) = 0;
  /// A host buffer of at least `bytes` (at least 1) for staging, given back with its handle.
  virtual std::shared_ptr<char> host_buffer(std::size_t bytes) = 0;
};

/// The members of `cpu`, with the operations on device buffers staged through `memory`'s
/// host buffers; backend() is "<cpu's>-staged". Its splits and duplicates are staged too.
Communicator staged(const Communicator& cpu, std::shared_ptr<StagingMemory> memory);

}  // namespace ndmesh::comm
