// The planner's units, shared by its sources: byte multiples and the count-to-double cast
// that its formulas use everywhere.
#pragma once

#include <cstdint>

namespace ndmesh::plan::units {

inline constexpr double kMiB = 1024.0 * 1024.0;
inline constexpr double kGiB = 1024.0 * kMiB;

inline double d(std::int64_t x) { return static_cast<double>(x); }

}  // namespace ndmesh::plan::units
