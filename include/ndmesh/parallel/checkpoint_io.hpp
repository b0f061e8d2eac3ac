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

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

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
  model::ScheduleRecord schedule;  ///< the learning-rate schedule of the run (informative)
  /// A load from a Hugging Face folder: the bytes of tensor data this rank read (its slices).
  std::int64_t bytes_read = 0;
};

/// The error of a rank whose own part succeeded where another rank's failed: that rank's
/// error says why. Among several ranks the first to report ends the job (MPI_Abort), so a rank
/// with this error gives the failing one time to print its reason first (train::run).
class PeersFailed : public IoError {
 public:
  using IoError::IoError;
};

/// Runs `work` on this rank, then agrees with every rank of `world` on whether any failed
/// (collective): returns when none did; otherwise rethrows this rank's exception (any type)
/// or throws PeersFailed "<what>: N other rank(s) failed". On a failure every rank first runs
/// `on_failure` (a clean-up), then waits at a barrier for the others' before throwing.
void agree_or_throw(const comm::Communicator& world, const std::string& what, const std::function<void()>& work,
                    const std::function<void()>& on_failure = {});

/// Writes checkpoint directory `dir` from `state` (collective over `world`). IoError on
/// every rank when any rank fails; the previous checkpoint in `dir` then stays, and rank 0
/// removes the temporary `.DIR.saving` (of a shared folder: all of it) before any rank throws.
/// With `keep` > 1 the previous checkpoint is kept beside it (model::commit_checkpoint_dir).
void save_checkpoint_dir(const std::string& dir, const StateDict& state, const CheckpointInfo& info,
                         const comm::Communicator& world, int keep = 1);

/// A checkpoint written from a thread while training goes on (`ndmesh train --save-every`).
///
/// The constructor (collective) prepares the temporary directory as a save does and copies
/// what this rank writes (the StateDict already holds copies of the moments; the parameters
/// it points at are copied here), then a thread writes this rank's shard file; nothing in
/// the thread communicates. try_finish() and finish() are the collective end: once every
/// rank's file is written, the writers' manifest parts go to rank 0, which writes the
/// manifest and swaps the directory in (save_checkpoint_dir's last phase). Until then DIR
/// holds the previous checkpoint, so a process killed during the write leaves it whole.
///
/// Ownership: the copies belong to the thread until it is done; training may change the
/// model and the optimizer state at once.
class BackgroundSave {
 public:
  BackgroundSave(std::string dir, std::unique_ptr<StateDict> state, CheckpointInfo info, int keep,
                 comm::Communicator world);
  /// Stops the thread between slices (or in its test pause) and joins it, leaving the
  /// temporary directory for the next save to clear; a save that was finished leaves nothing.
  ~BackgroundSave();
  BackgroundSave(const BackgroundSave&) = delete;
  BackgroundSave& operator=(const BackgroundSave&) = delete;

  /// Collective and non-blocking: false while any rank's file is being written; otherwise
  /// commits the checkpoint and returns true. IoError on every rank when any rank failed
  /// (the previous checkpoint stays; rank 0 removes the temporary directory).
  bool try_finish();
  /// Collective: waits for every rank's file (polling, so that a peer that died is noticed
  /// within the communicator's timeout), then commits as try_finish() does.
  void finish();
  /// The step the checkpoint holds.
  std::int64_t step() const { return info_.step; }

 private:
  void commit();

  std::string dir_, tmp_;
  std::unique_ptr<StateDict> state_;
  std::vector<std::vector<float>> params_;  // copies of the parameters of the entries this rank writes
  CheckpointInfo info_;
  int keep_;
  comm::Communicator world_;
  std::atomic<bool> done_{false}, cancel_{false};
  std::exception_ptr error_;  // the thread's, read after done_
  std::string part_;          // this rank's manifest part, read after done_
  bool committed_ = false;
  std::thread thread_;
};

/// Reads checkpoint directory `dir` into `state`'s entries and commits the moments
/// (collective over `world`); returns what the manifest says. ConfigError naming every
/// difference when it was written for another model (`spec`) or data (`data`); IoError
/// naming the file when it is incomplete or corrupt; ConfigError with the conversion
/// command when `dir` is a single-file (format 2) checkpoint. `any_data`: the data is not
/// compared (an evaluation reads the weights only). A Hugging Face folder (model::is_hf_dir)
/// is read as weights only (step 0, zero moments, any data), each rank reading only the
/// parts of its tensors that its entries keep (StateEntry::keeps).
CheckpointInfo load_checkpoint_dir(const std::string& dir, StateDict& state, const ModelSpec& spec,
                                   const std::string& data, const comm::Communicator& world, bool any_data = false);

}  // namespace ndmesh::parallel
