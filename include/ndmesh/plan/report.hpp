// What `ndmesh plan --json` and `ndmesh plan memory --json` print, built in one place so that
// the CLI and the Python module (ndmesh.plan / ndmesh.plan_memory) cannot drift apart. The
// functions return JSON text; the JSON library stays a private dependency of the plan layer.
#pragma once

#include <string>

#include "ndmesh/plan/search.hpp"

namespace ndmesh::plan {

/// The search's JSON object: model, parameters, gpus, hardware, seq, global_batch,
/// considered, invalid, too_big, fitting, constraints, attention, layouts (best first),
/// smallest (when nothing fits) and problems (when nothing is valid).
std::string search_json(const PlanModel& model, const Hardware& hw, const SearchOptions& options,
                        const SearchResult& result, int indent = 2);

/// One layout's JSON object (the fields of a `layouts` entry) plus parameters, model,
/// hardware, seq and global_batch.
std::string memory_json(const PlanModel& model, const Hardware& hw, const Workload& workload,
                        const Estimate& estimate, int indent = 2);

}  // namespace ndmesh::plan
