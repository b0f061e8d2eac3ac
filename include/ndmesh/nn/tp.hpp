// Tensor-parallel context of the layers (Megatron-LM, Shoeybi et al. 2019; sequence
// parallelism, Korthikanti et al. 2022).
//
// The nn layer does not know the communication layer: a layer that is split over a
// tensor-parallel group talks to it through TpComm, which parallel/tp implements over a
// Communicator. The base class is the group of one (the serial model): its collectives
// are copies, so a serial run goes through exactly the code of a tp run.
//
// The conjugate operators around a column-parallel -> row-parallel pair:
//   f (before the column-parallel linear): identity forward, all-reduce backward;
//   g (after the row-parallel linear):     all-reduce forward, identity backward.
// With sequence parallelism the activations between the pairs hold 1/tp of the token rows
// (the norms, residuals and dropout-free element-wise work), f becomes all-gather forward /
// reduce-scatter backward and g reduce-scatter forward / all-gather backward. TpContext
// holds both spellings so that the layers call one function per operator.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>

#include "ndmesh/core/error.hpp"
#include "ndmesh/tensor/ops.hpp"
#include "ndmesh/tensor/params.hpp"

namespace ndmesh::nn {

/// The collectives a tensor-parallel layer needs, over its tp group. This base class is
/// the group of one: rank 0 of size 1, every collective a copy (or nothing in place).
template <typename T>
class TpComm {
 public:
  virtual ~TpComm() = default;
  /// This rank's index in the tp group.
  virtual int rank() const { return 0; }
  /// Ranks in the tp group.
  virtual int size() const { return 1; }
  /// In place: the element-wise sum over the group.
  virtual void all_reduce_sum(T* /*data*/, std::int64_t /*n*/) {}
  /// In place: the element-wise maximum over the group.
  virtual void all_reduce_max(T* /*data*/, std::int64_t /*n*/) {}
  /// out[size() * n] receives every member's in[n], in rank order (in and out distinct).
  virtual void all_gather(const T* in, T* out, std::int64_t n) { std::copy(in, in + n, out); }
  /// The same for bfloat16 rows (the norms' outputs under bf16 products, which the
  /// column-parallel products read rounded anyway: half the bytes of T = float).
  virtual void all_gather(const BFloat16* in, BFloat16* out, std::int64_t n) { std::copy(in, in + n, out); }
  /// in[size() * n]: out[n] receives the sum over the group of every member's block rank().
  virtual void reduce_scatter(const T* in, T* out, std::int64_t n) { std::copy(in, in + n, out); }
};

/// Where a layer sits in its tp group (what it needs to declare its shards).
struct TpShape {
  int rank = 0;                    ///< this rank in the tp group
  int size = 1;                    ///< ranks in the tp group
  bool sequence_parallel = false;  ///< replicated parameters see 1/size of the tokens

  /// The shard of a [full_out, in] weight split on its rows (column-parallel; one
  /// range per entry of `pieces`, given for the full tensor as (start, total length)).
  ParamShard rows(std::vector<std::int64_t> full_shape, std::vector<ParamShard::Piece> pieces = {}) const {
    ParamShard s{.dim = 0, .full_shape = std::move(full_shape), .rank = rank, .size = size};
    if (pieces.empty()) pieces.push_back({0, s.full_shape[0]});
    for (auto p : pieces) s.pieces.push_back({p.start, p.length / size});
    return s;
  }
  /// The shard of a [out, full_in] weight split on its columns (row-parallel).
  ParamShard columns(std::vector<std::int64_t> full_shape) const {
    ParamShard s{.dim = 1, .full_shape = std::move(full_shape), .rank = rank, .size = size};
    s.pieces.push_back({0, s.full_shape[1] / size});
    return s;
  }
  /// A replicated parameter; its gradient is summed over tp when the tokens are split.
  ParamShard replicated() const {
    return ParamShard{.rank = rank, .size = size, .grad_sum = sequence_parallel && size > 1};
  }
};

/// A layer's view of its tensor-parallel group.
template <typename T>
struct TpContext {
  std::shared_ptr<TpComm<T>> comm = std::make_shared<TpComm<T>>();  ///< the group (default: of one)
  bool sequence_parallel = false;  ///< norms and residuals hold 1/size() of the token rows
  Device device = Device::kCpu;    ///< where the layers' buffers live (the copies below run there)

  int rank() const { return comm->rank(); }
  int size() const { return comm->size(); }
  TpShape shape() const { return {rank(), size(), sequence_parallel}; }
  /// Token rows a rank holds between the tp regions: rows / size() with sequence
  /// parallelism, all of them otherwise.
  std::int64_t local_rows(std::int64_t rows) const { return sequence_parallel ? rows / size() : rows; }
  /// First (global) row of this rank's local rows.
  std::int64_t first_row(std::int64_t rows) const { return sequence_parallel ? rows / size() * rank() : 0; }

  /// f forward: `local` [local_rows(rows), width] -> the full [rows, width] the
  /// column-parallel linear reads. Without sequence parallelism that is `local` itself;
  /// with it, `full` gathered (and returned).
  const T* f_forward(const T* local, T* full, std::int64_t rows, std::int64_t width) const {
    return gathered(local, full, rows, width);
  }
  /// f forward of bfloat16 rows (the norms' outputs under bf16 products).
  const BFloat16* f_forward(const BFloat16* local, BFloat16* full, std::int64_t rows, std::int64_t width) const {
    return gathered(local, full, rows, width);
  }
  /// f backward: the partial d input `full` [rows, width] of the column-parallel linear ->
  /// `local` [local_rows(rows), width], summed over the group. Without sequence
  /// parallelism `full` is all-reduced in place and `local` may be `full`.
  void f_backward(T* full, T* local, std::int64_t rows, std::int64_t width) const {
    sum_rows(full, local, rows, width);
  }
  /// g forward: the partial output `full` [rows, width] of the row-parallel linear ->
  /// `local` [local_rows(rows), width] summed over the group (`local` may be `full`
  /// without sequence parallelism).
  void g_forward(T* full, T* local, std::int64_t rows, std::int64_t width) const {
    sum_rows(full, local, rows, width);
  }
  /// g backward: d output `local` -> the full [rows, width] d output the row-parallel
  /// linear reads (`local` itself without sequence parallelism).
  const T* g_backward(const T* local, T* full, std::int64_t rows, std::int64_t width) const {
    return f_forward(local, full, rows, width);
  }

 private:
  template <typename E>
  const E* gathered(const E* local, E* full, std::int64_t rows, std::int64_t width) const {
    if (!sequence_parallel) return local;
    comm->all_gather(local, full, local_rows(rows) * width);
    return full;
  }
  // Sums partial [rows, width] over the group into this rank's local rows.
  void sum_rows(T* full, T* local, std::int64_t rows, std::int64_t width) const {
    const std::int64_t n = local_rows(rows) * width;
    if (sequence_parallel) {
      comm->reduce_scatter(full, local, n);
      return;
    }
    comm->all_reduce_sum(full, n);
    if (local != full) ops::copy(local, full, n, device);
  }
};

}  // namespace ndmesh::nn
