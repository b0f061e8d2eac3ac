// Expert parallelism's communication: nn::EpComm over a communicator of the expert group
// (ProcessGroups::expert: ep consecutive members of a dp-cp group, folded as in
// Megatron-core and torchtitan), counting what the dispatch and combine move.
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
  CommunicatorEpComm(comm::Communicator group, std::shared_ptr<EpCommStats> stats)
      : group_(std::move(group)), stats_(std::move(stats)) {}
  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }
  void all_to_all(const std::int64_t* in, std::int64_t* out, std::int64_t n) override;
  void all_to_all_v(const float* in, const std::int64_t* send_counts, float* out,
                    const std::int64_t* recv_counts) override;
  void all_to_all_v(const double* in, const std::int64_t* send_counts, double* out,
                    const std::int64_t* recv_counts) override;

 private:
  template <typename T>
  void exchange(const T* in, const std::int64_t* send_counts, T* out, const std::int64_t* recv_counts);
  comm::Communicator group_;
  std::shared_ptr<EpCommStats> stats_;
};

}  // namespace ndmesh::parallel
