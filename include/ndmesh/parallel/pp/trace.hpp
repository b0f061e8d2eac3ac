// Pipeline traces: what the executor measured, in one place. Each rank records the timing
// of every action of its walks, for a bounded window of the latest steps (so a long run
// holds a fixed amount); a gather brings every rank's window to world rank 0, which
// analyses it (the measured bubble, the mean costs of forward and backward halves, the
// bubble the simulator predicts for those costs) and writes it as Chrome trace-event JSON
// (chrome://tracing, Perfetto), which `ndmesh schedule --trace` reads back and draws with
// the same renderer as a simulated schedule. Action kinds are named by action_kind_name()
// and lettered by action_kind_letter() everywhere.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "ndmesh/comm/communicator.hpp"
#include "ndmesh/parallel/pp/executor.hpp"
#include "ndmesh/parallel/pp/schedule.hpp"
#include "ndmesh/parallel/pp/simulate.hpp"

namespace ndmesh::pp {

/// One action as it ran.
struct TraceEvent {
  int pipeline = 0;  ///< the pp group's color (one pipeline per dp x cp x tp coordinate)
  int stage = 0;
  int step = 0;  ///< 0-based training step
  Action action;
  double start = 0, end = 0;  ///< seconds since the executor's origin
};

/// This rank's events of the last `window` steps.
class TraceRecorder {
 public:
  explicit TraceRecorder(std::int64_t window = 32) : window_(window) {}
  /// Adds one step's walk; drops the oldest step beyond the window.
  void add(int pipeline, int stage, int step, const std::vector<ActionTiming>& timings);
  /// Every event kept, oldest step first.
  std::vector<TraceEvent> events() const;
  std::int64_t window() const { return window_; }

 private:
  std::int64_t window_;
  std::deque<std::vector<TraceEvent>> steps_;
};

/// Every rank's events, on world rank 0 (empty elsewhere). Collective over `world`.
std::vector<TraceEvent> gather_trace(const comm::Communicator& world, const std::vector<TraceEvent>& mine);

/// What a trace says about the pipeline.
struct TraceAnalysis {
  double bubble_measured = 0;  ///< idle share of stage time, mean over pipelines and steps (the first step of the run left out)
  double bubble_simulated = 0;         ///< simulate() of the schedule with the measured mean costs
  double bubble_simulated_stages = 0;  ///< the same with each stage's own measured costs
  Costs costs;  ///< measured mean forward / backward-input / backward-weight of a stage, seconds
  std::int64_t events = 0;
  int steps = 0;  ///< steps the analysis covers
};

/// Analyses `events` of `schedule`; `first_step_of_run`: the run's first step, left out
/// (allocation, cold caches) when the trace holds later ones.
TraceAnalysis analyse_trace(const std::vector<TraceEvent>& events, const PipelineSchedule& schedule,
                            int first_step_of_run);

/// Writes Chrome trace-event JSON: one complete event per action (name "F3" / "B3.1" for
/// chunk 1 / ..., category action_kind_name, pid the pipeline, tid the stage, args step,
/// microbatch, chunk) and the schedule in an "ndmesh" header. IoError naming the path.
void write_chrome_trace(const std::string& path, const PipelineSchedule& schedule,
                        const std::vector<TraceEvent>& events);

/// What write_chrome_trace() wrote: the schedule's kind and shape (no actions) and the
/// events. ConfigError naming `path` and the fix when it is not such a file.
std::pair<PipelineSchedule, std::vector<TraceEvent>> read_chrome_trace(const std::string& path);

/// One pipeline's actions of one step as a schedule in the order they ran, with their
/// measured spans as its Simulation (seconds from the step's first action), so the
/// renderer draws a measured run like a simulated one. `step` < 0: the last step in the
/// trace. ConfigError naming the flags when the trace has no such actions.
std::pair<PipelineSchedule, Simulation> measured_timeline(const PipelineSchedule& shape,
                                                          const std::vector<TraceEvent>& events, int pipeline,
                                                          int step);

}  // namespace ndmesh::pp
