// Timeline pictures of a simulated schedule: an ASCII chart for terminals and an SVG.
//
// Both draw one row per stage and time left to right. A cell holds the action's kind
// letter and micro-batch number: F (forward), B (full backward, or the input-gradient
// half of a split one), W (weight gradient); with several chunks per stage the chunk
// index follows after a dot in the SVG and picks the colour shade. Idle time is '.'.
#pragma once

#include <string>

#include "ndmesh/parallel/pp/schedule.hpp"
#include "ndmesh/parallel/pp/simulate.hpp"

namespace ndmesh::pp {

/// How to draw the ASCII timeline.
struct AsciiOptions {
  bool color = false;     ///< ANSI background colours per kind (only for terminals)
  int max_columns = 400;  ///< time cells at most; longer schedules are scaled down
};

/// One line per stage, "stage r |F0 F1 B0 ... |", a time axis, and a legend.
std::string ascii_timeline(const PipelineSchedule& schedule, const Simulation& sim,
                           const AsciiOptions& options = {});

/// A standalone SVG picture of the timeline with a title line of the numbers.
std::string svg_timeline(const PipelineSchedule& schedule, const Simulation& sim);

}  // namespace ndmesh::pp
