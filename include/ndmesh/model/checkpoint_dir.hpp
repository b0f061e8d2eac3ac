// Checkpoint directories (format 3): one directory per checkpoint, written in parallel by
// the ranks that own the model's shards, readable under any other layout.
//
//   DIR/manifest.json         format and version, model spec, the layout that wrote it,
//                             step, data source and position, AdamW step count, every
//                             logical parameter with its full shape and the slices that
//                             hold it (file, byte offset, tensor-parallel split, crc32),
//                             and every shard file with its size in bytes
//   DIR/shard-ppPPP-tpTTT.bin float32 little-endian, written by the rank at dp = cp = 0 of
//                             that pipeline stage and tensor-parallel rank; each slice is
//                             its parameter values, then AdamW m, then v (3 x elements)
//
// A slice is what one tensor-parallel rank held of a logical (serial) tensor: along
// dimension `dim` the concatenation of `pieces` ([start, start + length) each), every other
// dimension whole; dim -1 is the whole tensor (replicated parameters are written once).
// A reader under another layout takes from the slices only the elements it holds.
//
// Saving writes into a temporary sibling directory, then swaps it in with one rename
// (renameat2 RENAME_EXCHANGE over an existing checkpoint, then the old one is removed), so
// at every moment DIR is either the previous complete checkpoint or the new one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ndmesh/config/config.hpp"
#include "ndmesh/tensor/params.hpp"

namespace ndmesh::model {

/// The directory format this build writes and reads.
inline constexpr std::uint32_t kCheckpointDirVersion = 3;
/// The manifest's file name inside a checkpoint directory.
inline constexpr const char* kManifestFile = "manifest.json";

/// Where one slice of a logical tensor lives.
struct SliceRecord {
  std::string file;                      ///< shard file name inside the directory
  std::int64_t offset = 0;               ///< bytes from the start of the file
  int dim = -1;                          ///< split dimension of the logical tensor; -1: whole
  std::vector<ParamShard::Piece> pieces;  ///< along dim (absolute starts)
  std::vector<std::int64_t> shape;       ///< the slice's own shape
  std::uint32_t crc32 = 0;               ///< of its 3 x elements float32 values
  std::int64_t elements() const;
};

/// One logical parameter.
struct TensorRecord {
  std::string name;
  std::vector<std::int64_t> shape;  ///< of the logical (serial) tensor
  std::vector<SliceRecord> slices;
};

/// One shard file.
struct FileRecord {
  std::string name;
  std::int64_t bytes = 0;
  std::int64_t rank = -1;  ///< the world rank that wrote it; -1: not recorded
  std::string host;        ///< the node (host name) it was written on; empty: not recorded
};

/// The layout that wrote a checkpoint (informative: any layout can read it).
struct CheckpointLayout {
  std::string mesh;  ///< Mesh::to_string()
  std::int64_t world = 1;
  int zero = 0;
  std::int64_t virtual_stages = 1;
  std::vector<std::int64_t> partition;  ///< blocks per pipeline chunk
  bool sequence_parallel = false;
  std::string cp_layout;
};

/// The learning-rate schedule of the run that wrote a checkpoint (parallel/lr_schedule.hpp).
/// A resumed run follows its own flags; `ndmesh train --load` says when they differ from
/// these, since the rates then do not continue the saved run's curve.
struct ScheduleRecord {
  std::string name;  ///< "cosine", "linear", "wsd", "constant"; empty: not recorded (older manifests)
  double lr = 0;
  std::int64_t warmup = 0;
  std::int64_t steps = 0;
  double min_lr_ratio = 0;
  double decay_fraction = 0;
  bool operator==(const ScheduleRecord&) const = default;
};

/// Everything manifest.json holds.
struct Manifest {
  std::uint32_t version = kCheckpointDirVersion;
  ModelSpec spec;
  std::int64_t step = 0;        ///< optimizer steps done (= the data position: batches are a function of the step)
  std::int64_t adam_steps = 0;  ///< AdamW's step count
  std::string data;             ///< DataSource::describe() of the run
  CheckpointLayout layout;
  ScheduleRecord schedule;  ///< "lr_schedule" (optional)
  std::vector<TensorRecord> tensors;
  std::vector<FileRecord> files;

  /// The record of a tensor, or nullptr.
  const TensorRecord* find(const std::string& name) const;
  /// Weights without training state (an import: step 0, no AdamW steps, no data source):
  /// a run that loads it starts fresh at step 0 on any data.
  bool weights_only() const { return step == 0 && adam_steps == 0 && data.empty(); }
};

/// The manifest as JSON text (what manifest.json holds).
std::string manifest_json(const Manifest& manifest);
/// Writes DIR/manifest.json and flushes it to disk. IoError naming the file.
void write_manifest(const std::string& dir, const Manifest& manifest);
/// Reads and checks DIR/manifest.json: IoError naming the directory or file when DIR is
/// not a directory, has no manifest (an incomplete or foreign directory), the manifest is
/// not JSON, has another format or version, or holds a field out of range (a slice outside
/// its tensor or its file, a file it does not list, sizes that do not add up, an element
/// count that does not fit 64 bits: named with its tensor, never wrapped).
Manifest read_manifest(const std::string& dir);
/// True when `path` is a directory holding a manifest.json.
bool is_checkpoint_dir(const std::string& path);

/// Appends slices to one shard file.
class ShardFileWriter {
 public:
  /// Creates DIR/FILE, written by world rank `rank` (recorded with this host's name, so
  /// that a file rank 0 cannot see names the node that wrote it). IoError naming it on
  /// failure.
  ShardFileWriter(std::string dir, std::string file, std::int64_t rank = -1);
  ~ShardFileWriter();
  ShardFileWriter(const ShardFileWriter&) = delete;
  ShardFileWriter& operator=(const ShardFileWriter&) = delete;
  /// Writes this rank's slice of a parameter (`shard` as the tp split describes it;
  /// replicated: the whole tensor) with its AdamW moments: `local` elements each.
  /// The rows a padded vocabulary holds past the logical tensor are left out; a view holding
  /// nothing but such rows writes nothing (nullopt).
  std::optional<SliceRecord> append(const ParamShard& shard, const std::vector<std::int64_t>& local_shape,
                                    const float* params, const float* m, const float* v);
  /// Flushes and syncs the file to disk; its record. IoError on failure.
  FileRecord close();

 private:
  std::string dir_, file_;
  void* f_ = nullptr;  // std::FILE*
  std::int64_t bytes_ = 0;
  std::int64_t rank_ = -1;
};

/// Fills this rank's view `local` (its shape and tp split) of `tensor`'s parameters and
/// moments from the slices of checkpoint DIR, reading only slices that overlap what the
/// rank holds (just its own slice when the checkpoint was written under the same tp
/// split). IoError naming the file when a slice cannot be read or fails its checksum.
void read_tensor(const std::string& dir, const Manifest& manifest, const TensorRecord& tensor,
                 const ParamView& local, float* params, float* m, float* v);

/// One writer's part of a manifest (its shard file and the slices in it) as text, for
/// sending to the rank that writes the manifest; add_manifest_part() merges one in
/// (slices join the tensor of the same name).
std::string manifest_part(const std::vector<TensorRecord>& tensors, const FileRecord& file);
void add_manifest_part(Manifest& manifest, const std::string& part);

/// Reads every slice of every tensor and checks its checksum; the number of bytes read.
std::int64_t verify_checkpoint_dir(const std::string& dir, const Manifest& manifest);

/// The temporary sibling a save of DIR writes into.
std::string checkpoint_temp_dir(const std::string& dir);
/// Removes a leftover temporary directory (with a warning naming it: a save was
/// interrupted) and creates it empty. IoError on failure.
void prepare_checkpoint_temp_dir(const std::string& tmp);
/// Removes the temporary directory of a save that failed (a warning, no error, when that
/// fails too: the save's own error is the one to report).
void discard_checkpoint_temp_dir(const std::string& tmp);
/// Checks that every shard file the manifest lists is in DIR with the size its writer
/// recorded. IoError naming the file and the rank and node that wrote it otherwise: with
/// node-local disks a writer on another node saved its shard where this node cannot see it
/// (a multi-node save needs a shared file system).
void check_shard_files(const std::string& dir, const Manifest& manifest);
/// Puts the complete directory `tmp` in place of DIR in one step, after checking its
/// manifest and that every shard file it lists is there with its size (check_shard_files).
/// The previous checkpoint, if any, is removed afterwards, or with `keep` > 1 renamed to
/// retired_checkpoint_dir(DIR, its step), and the retired ones beyond the newest keep - 1
/// are removed (so DIR and its retired siblings are the last `keep` checkpoints). IoError on
/// failure (DIR then still holds the previous one).
void commit_checkpoint_dir(const std::string& tmp, const std::string& dir, int keep = 1);
/// Where --keep puts an earlier checkpoint of DIR: the sibling "DIR.step-NNNNNN" (its step,
/// at least six digits).
std::string retired_checkpoint_dir(const std::string& dir, std::int64_t step);

}  // namespace ndmesh::model
