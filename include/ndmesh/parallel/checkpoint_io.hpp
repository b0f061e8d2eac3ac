// Saving and loading checkpoint directories (model/checkpoint_dir.hpp) from a StateDict,
// under any layout: each writer writes its slices into its shard file, rank 0 merges the
// writers' parts into the manifest, checks it and swaps the directory in with one rename; a
// reader takes from the slices only the elements its entries hold.
//
// Every rank agrees on the outcome of each phase (agree_or_throw): a failure on any rank,
// whatever it throws, ends the phase on every rank (the failing rank rethrows its own
// exception, the others get an IoError saying that another rank failed), so no rank is
// left waiting in the next collective and the previous checkpoint stays in place.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "ndmesh/comm/communicator.hpp"
#include "ndmesh/config/config.hpp"
#include "ndmesh/model/checkpoint_dir.hpp"
#include "ndmesh/parallel/state_dict.hpp"

namespace ndmesh::parallel {

/// What a checkpoint says besides the tensors.
struct CheckpointInfo {
  ModelSpec spec;
  std::int64_t step = 0;        ///< optimizer steps done (the data position)
  std::int64_t adam_steps = 0;  ///< AdamW's step count
  std::string data;             ///< DataSource::describe() of the run
  model::CheckpointLayout layout;  ///< the layout that wrote it (informative)
};

/// Runs `work` on this rank, then agrees with every rank of `world` on whether any failed
/// (collective): returns when none did; otherwise rethrows this rank's exception (any type)
/// or throws IoError "<what>: N other rank(s) failed".
void agree_or_throw(const comm::Communicator& world, const std::string& what, const std::function<void()>& work);

/// Writes checkpoint directory `dir` from `state` (collective over `world`). IoError on
/// every rank when any rank fails; the previous checkpoint in `dir` then stays, and rank 0
/// removes the temporary `.DIR.saving` (of a shared folder: all of it).
void save_checkpoint_dir(const std::string& dir, const StateDict& state, const CheckpointInfo& info,
                         const comm::Communicator& world);

/// Reads checkpoint directory `dir` into `state`'s entries and commits the moments
/// (collective over `world`); returns what the manifest says. ConfigError naming every
/// difference when it was written for another model (`spec`) or data (`data`); IoError
/// naming the file when it is incomplete or corrupt; ConfigError with the conversion
/// command when `dir` is a single-file (format 2) checkpoint.
CheckpointInfo load_checkpoint_dir(const std::string& dir, StateDict& state, const ModelSpec& spec,
                                   const std::string& data, const comm::Communicator& world);

}  // namespace ndmesh::parallel
