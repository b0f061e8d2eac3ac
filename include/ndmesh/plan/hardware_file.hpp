// Hardware description files: what `ndmesh calibrate` measures on a machine, in the units
// of the built-in presets, so `ndmesh plan --hardware FILE` plans for the machine it ran on.
//
//   [hardware]                      required unless noted
//   name = "calibrated-host"        optional, default the file name
//   memory_gib = 24.0               memory per rank (GPU)
//   reserved_gib = 1.0              optional, default 0
//   peak_tflops = 0.05              FLOP/s per rank of the matrix multiplications, in TFLOP/s
//   achievable_fraction = 1.0       optional, default 1 (a measured rate already is achieved)
//   intra_node_gbps = 2.1           all-reduce bus bandwidth inside a node, GB/s
//   inter_node_gbps = 2.1           the same across nodes (= intra when one node was measured)
//   gpus_per_node = 2               ranks per node
//   source = "..."                  optional, where the numbers come from
//   [measured]                      optional, free-form numbers kept for the record
//
// Bandwidths are bus bandwidths in the sense of the planner's ring formula: an all-reduce of
// N bytes over n ranks takes 2 (n-1)/n N / bandwidth.
#pragma once

#include <string>

#include "ndmesh/plan/presets.hpp"

namespace ndmesh::plan {

/// Reads a hardware file. ConfigError naming the file and the key (unknown, missing, wrong
/// type, out of range) or saying the file cannot be read.
Hardware load_hardware_file(const std::string& path);

/// A preset name, or else the path of a hardware file (ConfigError listing the preset names
/// when it is neither).
Hardware hardware_by_name_or_file(const std::string& name_or_path);

/// The [hardware] section of a file for `hw` (what calibrate writes before its [measured]).
std::string hardware_file_text(const Hardware& hw);

}  // namespace ndmesh::plan
