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
//   memory_gbps = 20                optional, memory bandwidth per rank, GB/s (0: memory-bound work
//                                   not counted)
//   intra_node_latency_us = 12      optional, seconds per message inside a node, in us (default 0)
//   inter_node_latency_us = 12      optional, the same across nodes (default = intra)
//   gemm_overhead_us = 6.75         optional, fixed us per matrix-product kernel; default: fitted
//                                   to [gemm] when present, else 0
//   disk_read_gbps = 2.5            optional, the disk offload uses, GB/s (0: unknown)
//   disk_write_gbps = 1.8           optional, likewise
//   bf16_tflops = 600               optional, products with bf16 operands, TFLOP/s, where
//                                   peak_tflops is the fp32 rate (a GPU's calibration); plans
//                                   of 16-bit precisions take it as the peak (0: peak_tflops)
//   attention_tflops = 20           optional, the fp32 attention kernel, TFLOP/s as the planner
//                                   counts its FLOPs (0: the attention core at the products' rate)
//   host_to_device_gbps = 50        optional, pinned host memory to one GPU, GB/s (0: unknown)
//   device_to_host_gbps = 50        optional, the other way
//   source = "..."                  optional, where the numbers come from
//   [gemm]                          optional, measured matrix products (what `ndmesh calibrate`
//   m = [512, 1024], n = [...],     times): arrays of one length; the planner fits t = F / rate +
//   k = [...], tflops = [...]       overhead to them (fit_gemm) for gemm_overhead_us
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
