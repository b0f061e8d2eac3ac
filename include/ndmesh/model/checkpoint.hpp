// Single-file checkpoints (format 2, read only to convert them into checkpoint directories,
// model/checkpoint_dir.hpp): everything needed to continue a run bit for bit (model shape, parameters,
// AdamW moments and step count, the step, and the data source; batches are a function of
// the step, so the step is the data position).
//
// File layout (little-endian):
//   header: magic "NDMESHCK" | u32 version | u32 header crc32 | u64 body bytes | u32 body crc32
//   body:   model spec, step, data description, AdamW step count, parameter count, then
//           params, m and v as float32 (the logical model: the flat buffer of the whole
//           model, whatever layout wrote it).
// Version 1 files (a data stream position instead of indexable batches) are refused.
// Files are written to "<path>.tmp.<pid>" and renamed over <path>, so a crash never
// leaves a half-written checkpoint under the real name.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ndmesh/config/config.hpp"

namespace ndmesh::model {

/// The checkpoint format this build writes and reads.
inline constexpr std::uint32_t kCheckpointVersion = 2;

/// What a checkpoint holds.
struct Checkpoint {
  ModelSpec spec;
  std::int64_t step = 0;            ///< optimizer steps done
  std::string data;  ///< DataSource::describe() of the run
  std::int64_t adam_steps = 0;
  std::vector<float> params, adam_m, adam_v;  ///< flat buffers, padding included
};

/// Writes atomically (temporary file, then rename). IoError naming the path on failure.
void save_checkpoint(const std::string& path, const Checkpoint& checkpoint);

/// Reads and verifies a checkpoint. IoError naming the path when it cannot be read, is
/// not a regular file, is not a checkpoint, has another version, is truncated, fails its
/// checksum, or holds a field out of range (negative step, a model spec that is not a
/// model, a parameter count that does not fit the file).
Checkpoint load_checkpoint(const std::string& path);

/// Writes single-file checkpoint `file` (format 2) as checkpoint directory `dir` (format 3,
/// model/checkpoint_dir.hpp; the serial layout, one shard file), which `ndmesh train --load`
/// reads under any layout. IoError naming the file when it is not a readable checkpoint.
void convert_to_checkpoint_dir(const std::string& file, const std::string& dir);

/// Every difference between a checkpoint's model spec and `spec`, as "field: checkpoint
/// has X, the run has Y" lines; empty when they match.
std::vector<std::string> spec_differences(const ModelSpec& checkpoint, const ModelSpec& spec);

}  // namespace ndmesh::model
