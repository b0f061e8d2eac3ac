// The sharded state dict: every parameter a rank holds, by logical (serial) name, with its
// local slice (its tensor-parallel split), the AdamW moments of that slice, and whether this
// rank writes it into a checkpoint. Checkpoint save and load (parallel/checkpoint_io.hpp)
// work from this list alone, outside the trainer, and under any layout.
//
// Ownership: each (pipeline stage, tp rank) writes one shard file from the rank at position
// 0 of its gradient group (dp = cp = 0), which holds the parameters and, once the state
// dict gathered them, the whole moments; replicated-over-tp parameters are written by tp
// rank 0 only; a tied head's copy of the token table is never written (the embedding's is).
// Experts stored per ep rank (ParamView::expert) are written by the first member of their
// expert-data-parallel group: that of ep rank 0 into the file above, the others' into
// "shard-ppSSS-tpTTT-epEEE.bin". Every rank loads what it stores by name, so a checkpoint
// loads under another ep, or serially.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ndmesh/parallel/grad_sync.hpp"
#include "ndmesh/parallel/optimizer.hpp"
#include "ndmesh/parallel/parallelize.hpp"
#include "ndmesh/tensor/zeroed_allocator.hpp"

namespace ndmesh::parallel {

/// One parameter slice of this rank (host memory: on a device, or under ZeRO-3 where each
/// rank holds only its blocks, a copy).
struct StateEntry {
  const ParamView* view = nullptr;  ///< logical name, local shape, tp split
  float* params = nullptr;          ///< view->numel elements each
  float* m = nullptr;
  float* v = nullptr;
  bool writes = false;  ///< this rank writes the slice into a checkpoint
  /// The element ranges [begin, end) of the slice that a load must fill, in order: all of
  /// it, or under ZeRO-3 those in this rank's blocks of the flat buffer (commit() keeps only
  /// them; a reader may leave the rest alone).
  std::vector<std::pair<std::int64_t, std::int64_t>> keeps;
};

/// This rank's state, laid out for checkpoints.
class StateDict {
 public:
  /// Moments laid out like each chunk's flat buffer: gathered from the optimizer's owned
  /// segments (under ZeRO a sum over the gradient group, each element being owned once:
  /// collective over that group) when `gather_moments`, zero otherwise (to be loaded into).
  StateDict(RankModel& model, Optimizer& optimizer, const GradSync& sync, bool gather_moments);
  StateDict(const StateDict&) = delete;
  StateDict& operator=(const StateDict&) = delete;

  std::span<StateEntry> entries() { return entries_; }
  std::span<const StateEntry> entries() const { return entries_; }
  /// The shard file this rank writes ("shard-ppSSS-tpTTT.bin"); empty when it writes none.
  const std::string& file() const { return file_; }
  /// After a load filled the entries: their moments into the optimizer's segments, and on a
  /// device the parameters from the host copy onto it.
  void commit();

 private:
  Optimizer& optimizer_;
  const GradSync& sync_;
  std::vector<model::Model*> chunks_;
  // Per chunk, laid out like its flat buffer; zero pages until written (ZeroedVector), so that
  // a load touches only what it fills (under ZeRO-3 this rank's blocks).
  std::vector<ZeroedVector<float>> m_, v_;
  std::vector<ZeroedVector<float>> host_params_;  // per chunk on a device or under ZeRO-3: the parameters
  std::vector<StateEntry> entries_;
  std::string file_;
};

}  // namespace ndmesh::parallel
