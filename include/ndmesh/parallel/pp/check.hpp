// Checker for pipeline schedules.
//
// Proves that a schedule trains correctly and cannot hang:
//  - every field is in range and every (micro-batch, virtual stage) has exactly one
//    forward and exactly one backward (either a full backward, or one backward-input
//    followed by one backward-weight), on the stage that holds that virtual stage;
//  - on every stage each compute action has its input: a forward after the activation
//    arrived (receive, or the local forward of the previous virtual stage), a backward
//    after its own forward and after the gradient arrived, a weight gradient after its
//    input gradient, a send after the compute that produced the data;
//  - running all stages with blocking rendezvous point-to-point (a send waits until the
//    matching receive is posted and vice versa) finishes: sends and receives pair up in
//    order between every two stages, carry the same micro-batch and chunk, and there is
//    no waiting cycle.
// The first problem found is reported naming the stage, the action index and the action,
// and what was expected instead.
#pragma once

#include <optional>
#include <string>

#include "ndmesh/parallel/pp/schedule.hpp"

namespace ndmesh::pp {

/// The first problem with the schedule, or nullopt when it is correct.
std::optional<std::string> schedule_problem(const PipelineSchedule& schedule);

/// Throws ndmesh::Error("[pp] ...") with the first problem, or returns.
void check_schedule(const PipelineSchedule& schedule);

}  // namespace ndmesh::pp
