// Expert-parallel context of a mixture-of-experts layer (nn::Moe): the token exchange
// over its expert group (GShard, Megatron-core, torchtitan), and the two sums the layer
// needs under the other strategies: over the ranks that hold the other tokens of its
// micro-batch (context parallelism: the auxiliary loss is the micro-batch's) and over its
// tensor-parallel group (each rank holds a slice of every expert: partial dot products).
//
// The nn layer does not know the communication layer: a MoE layer whose experts are
// sharded over an expert group talks to it through EpComm, which parallel/ep implements
// over a Communicator. The base class is the group of one (the serial model): its
// exchanges are copies, so a serial run goes through exactly the code of an ep run.
#pragma once

#include <algorithm>
#include <cstdint>

namespace ndmesh::nn {

/// The collectives a MoE layer's dispatch and combine need, over its expert group. This
/// base class is the group of one: rank 0 of size 1, every exchange a copy.
class EpComm {
 public:
  virtual ~EpComm() = default;
  /// This rank's index in the expert group: it holds experts [rank * E/size, (rank+1) * E/size).
  virtual int rank() const { return 0; }
  /// Ranks in the expert group.
  virtual int size() const { return 1; }
  /// in[size() * n]: block j goes to member j, which stores it as block rank() of its out.
  virtual void all_to_all(const std::int64_t* in, std::int64_t* out, std::int64_t n) { std::copy(in, in + n, out); }
  /// Blocks of send_counts[j] elements to member j, back to back; out receives
  /// recv_counts[i] elements from member i, back to back (Communicator::all_to_all_v).
  virtual void all_to_all_v(const float* in, const std::int64_t* send_counts, float* out,
                            const std::int64_t* recv_counts) {
    (void)recv_counts;
    std::copy(in, in + send_counts[0], out);
  }
  virtual void all_to_all_v(const double* in, const std::int64_t* send_counts, double* out,
                            const std::int64_t* recv_counts) {
    (void)recv_counts;
    std::copy(in, in + send_counts[0], out);
  }
  /// Ranks that hold the tokens of this rank's micro-batch (the cp group's size).
  virtual int batch_ranks() const { return 1; }
  /// v[0, n) summed over those ranks, in place (the group of one: as it is).
  virtual void sum_over_batch(double* v, std::int64_t n) {
    (void)v;
    (void)n;
  }
  /// v[0, n) summed over the tensor-parallel group, in place (the group of one: as it is).
  virtual void sum_over_tp(double* v, std::int64_t n) {
    (void)v;
    (void)n;
  }
};

}  // namespace ndmesh::nn
