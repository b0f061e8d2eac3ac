// Per-step metrics of a training run as JSON Lines (--metrics FILE.jsonl), written by world
// rank 0: one object per step, in this order,
//
//   {"step": 12, "loss": 2.31, "lr": 0.003, "grad_norm": 0.41, "tokens_per_second": 30412.5,
//    "mfu": 0.012, "peak_memory_bytes": 182452224, "elapsed_s": 3.2, "val_loss": 2.35}
//
// val_loss only on evaluation steps (--eval-every); mfu null without --hardware. Each line is
// flushed when written, so a dashboard can follow the file during the run. A resumed run
// (--load) appends, after dropping any lines past the checkpoint's step (what the killed run
// wrote after its last checkpoint, which the resumed run computes again).
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "ndmesh/train/run.hpp"

namespace ndmesh::train {

/// The JSONL writer (an observer of the loop; rank 0 only).
class MetricsFile : public RunObserver {
 public:
  /// Creates (truncates) `path`, or with `resumed_at` keeps its lines up to that step and
  /// appends. IoError naming the file when it cannot be written.
  MetricsFile(std::string path, std::optional<std::int64_t> resumed_at);
  ~MetricsFile() override;
  MetricsFile(const MetricsFile&) = delete;
  MetricsFile& operator=(const MetricsFile&) = delete;
  void on_step(const StepRecord& step) override;

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

/// One line of a metrics file, as `ndmesh plot` reads it.
struct MetricsRow {
  std::int64_t step = 0;
  double loss = 0;
  std::optional<double> lr;
  std::optional<double> val_loss;
};

/// Reads a metrics file (any JSON Lines whose objects have a whole-number "step" and a
/// numeric "loss"; "lr" and "val_loss" when present; blank lines skipped). ConfigError naming
/// the file and the line ("run.jsonl:7: ...") when a line is not such an object, when steps
/// do not increase, or when the file cannot be read or holds no line.
std::vector<MetricsRow> read_metrics_file(const std::string& path);

}  // namespace ndmesh::train
