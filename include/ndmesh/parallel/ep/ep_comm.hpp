// Expert parallelism's communication: nn::EpComm over a communicator of the expert group
// (ProcessGroups::expert: ep consecutive members of a dp-cp group, folded as in
// Megatron-core and torchtitan), counting what the dispatch and combine move, and the cp
// and tp groups for the layer's sums.
#pragma once

#include <cstdint>
#include <memory>

#include "ndmesh/comm/communicator.hpp"
#include "ndmesh/nn/ep.hpp"

namespace ndmesh::parallel {

/// What the expert group's exchanges moved in a run (elements this rank sent).
struct EpCommStats {
  std::int64_t calls = 0;
  std::int64_t elements = 0;
  double seconds = 0;  ///< wall time inside the exchanges (waiting for peers included)
};

/// nn::EpComm over a communicator of the expert group.
class CommunicatorEpComm final : public nn::EpComm {
 public:
  /// `group`: the expert group; `batch`: the ranks that share a micro-batch (cp); `tp`: the
  /// tensor-parallel group.
  CommunicatorEpComm(comm::Communicator group, comm::Communicator batch, comm::Communicator tp,
                     std::shared_ptr<EpCommStats> stats)
      : group_(std::move(group)), batch_(std::move(batch)), tp_(std::move(tp)), stats_(std::move(stats)) {}
  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }
  void all_to_all(const std::int64_t* in, std::int64_t* out, std::int64_t n) override;
  void all_to_all_v(const float* in, const std::int64_t* send_counts, float* out,
                    const std::int64_t* recv_counts) override;
  void all_to_all_v(const double* in, const std::int64_t* send_counts, double* out,
                    const std::int64_t* recv_counts) override;
  int batch_ranks() const override { return batch_.size(); }
  void sum_over_batch(double* v, std::int64_t n) override;
  void sum_over_tp(double* v, std::int64_t n) override;

 private:
  template <typename T>
  void exchange(const T* in, const std::int64_t* send_counts, T* out, const std::int64_t* recv_counts);
  comm::Communicator group_, batch_, tp_;
  std::shared_ptr<EpCommStats> stats_;
};

}  // namespace ndmesh::parallel
