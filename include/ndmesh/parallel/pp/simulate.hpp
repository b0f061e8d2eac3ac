// Cost simulation of a pipeline schedule.
//
// Every stage runs its actions in order. Compute costs are given for a rank's whole
// share of the model; with v chunks per rank each chunk's action costs 1/v of it, so
// makespans of interleaved and plain schedules compare directly. A full backward costs
// backward_input + backward_weight. A send occupies its stage for `p2p` and delivers
// its data at the end of that time (the receiver buffers it, as an isend would); a
// receive waits until the data has arrived. Bubble fraction is the idle share of stage
// time: 1 - (compute time of all stages) / (stages * makespan); time spent sending
// counts as idle. Activations in flight on a stage are the (micro-batch, chunk) pairs
// whose forward has run and whose backward (or backward-input) has not finished.
#pragma once

#include <vector>

#include "ndmesh/parallel/pp/schedule.hpp"

namespace ndmesh::pp {

/// Per-action costs, in any time unit.
struct Costs {
  double forward = 1.0;          ///< forward of a whole stage
  double backward_input = 1.0;   ///< input-gradient half of a stage's backward ("B")
  double backward_weight = 1.0;  ///< weight-gradient half of a stage's backward ("W")
  double p2p = 0.0;              ///< one send of activations or gradients
};

/// Every problem with the costs (negative, non-finite, or zero compute), one line each,
/// naming the field, the value and a valid choice.
std::vector<std::string> cost_problems(const Costs& costs);

/// When one action ran.
struct Span {
  double start = 0.0;
  double end = 0.0;
};

/// What simulate() measures.
struct Simulation {
  double makespan = 0.0;                   ///< end of the last action of any stage
  double bubble_fraction = 0.0;            ///< idle share of stage time, 0..1
  std::vector<double> busy;                ///< compute time per stage
  std::vector<int> peak_in_flight_chunks;  ///< per stage: most (micro-batch, chunk) activations held
  std::vector<double> peak_in_flight;      ///< per stage: the same in micro-batches (chunks / v)
  std::vector<std::vector<Span>> spans;    ///< spans[stage][action index]
};

/// Runs the schedule with the given costs. Error when the schedule cannot run (call
/// check_schedule() first for a precise message) or the costs are invalid (ConfigError).
Simulation simulate(const PipelineSchedule& schedule, const Costs& costs = {});
/// The same with each stage's own costs (costs[stage], one entry per stage): what a
/// measured run with unequal stages predicts.
Simulation simulate_stages(const PipelineSchedule& schedule, const std::vector<Costs>& stage_costs);

/// Cost of one action of this schedule (0 for receives, which only wait).
double action_cost(const PipelineSchedule& schedule, const Action& action, const Costs& costs);

}  // namespace ndmesh::pp
