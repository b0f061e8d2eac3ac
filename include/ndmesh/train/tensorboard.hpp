// TensorBoard event files (--tensorboard DIR), written by world rank 0 with no dependency:
// the format is small and fixed. A file "events.out.tfevents.<time>.<host>.<pid>.ndmesh" is a
// sequence of TFRecords (uint64 length, uint32 masked CRC-32C of the length, the data,
// uint32 masked CRC-32C of the data; little-endian), each holding one serialized
// tensorflow.Event protocol buffer (tensorboard/compat/proto/event.proto):
//
//   Event      1 wall_time (double), 2 step (int64), 3 file_version (string),
//              5 summary (Summary), 7 session_log (SessionLog)
//   Summary    1 value (repeated Summary.Value)
//   Value      1 tag (string), 2 simple_value (float)
//   SessionLog 1 status (enum; START = 1)
//
// The first record is the file version "brain.Event:2"; each step then holds the scalars of
// the metrics file under the same names (loss, lr, grad_norm, tokens_per_second, mfu,
// peak_memory_bytes, val_loss). A resumed run starts a new file with a SessionLog START at
// its first step, which tells TensorBoard to drop what an earlier file holds from that step
// on (the steps the killed run did after its last checkpoint).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ndmesh/train/run.hpp"

namespace ndmesh::train {

/// CRC-32C (Castagnoli; reflected polynomial 0x82F63B78), continuing from `crc`.
std::uint32_t crc32c(const void* data, std::size_t bytes, std::uint32_t crc = 0);

/// One TFRecord holding `data`.
std::string tfrecord(std::string_view data);

/// A serialized Event with a Summary of simple values.
std::string scalar_event(double wall_time, std::int64_t step,
                         const std::vector<std::pair<std::string, float>>& values);
/// A serialized Event with the file version.
std::string file_version_event(double wall_time);
/// A serialized Event with a SessionLog START at `step`.
std::string session_start_event(double wall_time, std::int64_t step);

/// The event-file writer (an observer of the loop; rank 0 only).
class TensorBoardWriter : public RunObserver {
 public:
  /// Creates DIR when missing and a new event file in it (a SessionLog START at
  /// resumed_at + 1 when resumed). IoError naming the file when it cannot be written.
  TensorBoardWriter(const std::string& dir, std::optional<std::int64_t> resumed_at);
  ~TensorBoardWriter() override;
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;
  void on_step(const StepRecord& step) override;
  /// The event file.
  const std::string& path() const { return path_; }

 private:
  void write(const std::string& event);

  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace ndmesh::train
