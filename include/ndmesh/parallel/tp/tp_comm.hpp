// Tensor parallelism over a Communicator: the nn layers' TpComm implemented on the tp
// group of the mesh, with every call counted.
//
// The layers (nn/block, nn/embedding, nn/cross_entropy and the model) do the Megatron
// split themselves through nn::TpContext; this file only gives them their group. Counts
// are per collective kind over the tp group: calls and bytes, where the bytes of a call
// are those of the full (unsplit) buffer, in its element type (bf16 gathers count 2 B): n elements for an all-reduce of n, size * n for
// an all-gather into or a reduce-scatter from size blocks of n. A test compares one step's
// counts with closed forms (tests/mpi/train_tp.sh).
#pragma once

#include <cstdint>
#include <memory>

#include "ndmesh/comm/communicator.hpp"
#include "ndmesh/nn/tp.hpp"

namespace ndmesh::parallel {

/// Calls and bytes of one kind of collective.
struct CommCount {
  std::int64_t calls = 0;
  std::int64_t bytes = 0;
};

/// What the tp group moved (since the last reset).
struct TpCommStats {
  CommCount all_reduce;      ///< sums and maxima (activations, losses, sequence-parallel gradients, norms)
  CommCount all_gather;      ///< sequence parallelism: before the column-parallel linears
  CommCount reduce_scatter;  ///< sequence parallelism: after the row-parallel linears
  double seconds = 0;        ///< wall time inside these calls (blocking: waiting for peers included)
  void reset() { *this = {}; }
};

/// nn::TpComm over a communicator of the tp group; counts into a shared TpCommStats.
template <typename T>
class CommunicatorTpComm : public nn::TpComm<T> {
 public:
  CommunicatorTpComm(comm::Communicator group, std::shared_ptr<TpCommStats> stats)
      : group_(std::move(group)), stats_(std::move(stats)) {}

  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }
  void all_reduce_sum(T* data, std::int64_t n) override { reduce(data, n, comm::ReduceOp::kSum); }
  void all_reduce_max(T* data, std::int64_t n) override { reduce(data, n, comm::ReduceOp::kMax); }
  void all_gather(const T* in, T* out, std::int64_t n) override;
  void all_gather(const BFloat16* in, BFloat16* out, std::int64_t n) override;
  void reduce_scatter(const T* in, T* out, std::int64_t n) override;

 private:
  void reduce(T* data, std::int64_t n, comm::ReduceOp op);
  template <typename E>
  void gather(const E* in, E* out, std::int64_t n);
  comm::Communicator group_;
  std::shared_ptr<TpCommStats> stats_;
};

/// A TpContext<T> over `group` (its size may be 1: the serial model).
template <typename T>
nn::TpContext<T> make_tp_context(const comm::Communicator& group, bool sequence_parallel,
                                 std::shared_ptr<TpCommStats> stats) {
  return nn::TpContext<T>{.comm = std::make_shared<CommunicatorTpComm<T>>(group, std::move(stats)),
                          .sequence_parallel = sequence_parallel};
}

}  // namespace ndmesh::parallel
