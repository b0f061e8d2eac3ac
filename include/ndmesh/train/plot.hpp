// `ndmesh plot`: the curves of a metrics file (--metrics FILE.jsonl) as one SVG picture: the
// training loss and the held-out loss (points at the evaluation steps) against the step on
// the left axis, the learning rate on a second axis at the right.
#pragma once

#include <string>
#include <vector>

#include "ndmesh/train/metrics.hpp"

namespace ndmesh::train {

/// A standalone SVG of `rows` (read_metrics_file()), titled `title`. Long runs are thinned
/// to at most 2000 points a curve (the last step always kept).
std::string svg_metrics_plot(const std::vector<MetricsRow>& rows, const std::string& title);

}  // namespace ndmesh::train
