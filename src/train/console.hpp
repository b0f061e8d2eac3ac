// What a training run prints on world rank 0 (internal to the train layer): the header
// (model, data, layout, schedule), a progress line per step (--log-every N: every N steps
// and the last), held-out losses, the summary and, with --json, the report as the last line.
//
// On a terminal the progress is one line redrawn in place ("[####....] step 412/1000 loss
// 1.7712 | 30012 tok/s | ETA 0:19"); otherwise plain lines that logs keep greppable ("step
// 412/1000 loss 1.7712 lr 0.003 grad_norm 0.281 tok/s 30012 eta 0:19"). Under a launcher
// stdout is often a pseudo-terminal of the launcher (Open MPI) whatever mpirun's own stdout
// is: plain lines there.
#pragma once

#include <chrono>
#include <string>

#include "ndmesh/train/run.hpp"

namespace ndmesh::train {

class Console : public RunObserver {
 public:
  explicit Console(const RunOptions& options);
  void on_start(const RunStart& start) override;
  void on_step(const StepRecord& step) override;
  void on_end(const RunReport& report) override;

 private:
  const RunOptions& options_;
  bool lead_ = false;
  bool tty_ = false;
  bool bar_open_ = false;  // a redrawn line waits for its newline
  bool entropy_known_ = false;
  double entropy_ = 0;
  std::int64_t first_ = 0, stop_ = 0;
  double tokens_per_step_ = 0;
  std::string heldout_;  // describe() of the held-out data, or empty
};

/// "m:ss" or "h:mm:ss".
std::string clock_text(double seconds);

}  // namespace ndmesh::train
