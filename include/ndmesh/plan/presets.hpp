// Model and hardware descriptions for the planner, and the presets of public shapes.
//
// The planner reads the one architecture description (ModelSpec: the MLP kind, biases, the
// positions, the norm...) and adds what only a planner assumes: whether dropout masks are
// kept. The model presets are config's table (config/presets.hpp), the one `ndmesh train
// --model` reads too. Hardware presets: vendor datasheet numbers (dense bf16 peak,
// NVLink and NIC bandwidth per GPU, one direction) and an achievable fraction of peak for
// large matrix multiplications, which is our assumption and can be overridden.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ndmesh/config/config.hpp"
#include "ndmesh/config/presets.hpp"

namespace ndmesh::plan {

/// The feed-forward kinds (config's MlpKind: kGelu, kSwiglu).
using Mlp = MlpKind;

/// A model as the planner sees it: the architecture description, and whether dropout masks
/// are kept (Korthikanti's 1-byte masks; ndmesh itself trains without dropout).
struct PlanModel {
  ModelSpec spec;       ///< the architecture (layers, hidden, heads, norm, MLP, positions, biases...)
  bool dropout = true;  ///< dropout masks are stored
};

/// Every model preset (config/presets.hpp), in the order they are listed to users.
const std::vector<ModelPreset>& model_presets();
/// The named preset as the planner sees it; ConfigError naming the value and listing the
/// valid names otherwise.
PlanModel model_preset(std::string_view name);
/// "gpt3-1.7b, gpt3-3.6b, ..." for messages.
std::string model_preset_names();

/// One measured matrix product: C (m x n) = A (m x k) B (k x n) at `flops` FLOP/s.
struct GemmPoint {
  double m = 0, n = 0, k = 0;
  double flops = 0;
};

/// A GPU type and how the nodes are wired.
struct Hardware {
  std::string name;
  double memory_bytes = 0;         ///< memory per GPU
  double reserved_bytes = 0;       ///< not available to tensors: CUDA context, NCCL, allocator slack
  double peak_flops = 0;           ///< dense bf16 peak per GPU, FLOP/s
  double achievable_fraction = 0;  ///< of peak, for large matmuls (our assumption)
  double intra_node_bw = 0;        ///< bytes/s per GPU, one direction, inside a node (NVLink)
  double inter_node_bw = 0;        ///< bytes/s per GPU, one direction, across nodes (NIC)
  std::int64_t gpus_per_node = 8;
  std::string source;  ///< where the numbers come from
  /// HBM bytes/s per GPU (datasheet): the rate of the memory-bound work the planner counts
  /// (standard attention's score traffic, the loss over the vocabulary, the embedding); 0:
  /// that work is not counted.
  double memory_bw = 0;
  double intra_node_latency = 0;  ///< seconds per message inside a node (point-to-point, one ring step)
  double inter_node_latency = 0;  ///< seconds per message across nodes
  /// Fixed seconds per matrix-product kernel (launch, ramp-up, tail): a kernel of F FLOPs takes
  /// F / (peak x achievable_fraction) + gemm_overhead, the alpha-beta fit of a measured curve
  /// (fit_gemm in formulas.hpp). Small products (narrow tp splits, short sequences) run below
  /// the achievable rate by F/rate / (F/rate + gemm_overhead).
  double gemm_overhead = 0;
  /// The measured products gemm_overhead was fitted to (a hardware file's [gemm]), for the record.
  std::vector<GemmPoint> gemm_points;
  /// Bytes/s of the local disk a node's GPUs offload to (read, write; all of a node's ranks
  /// share it), measured by `ndmesh calibrate`; 0: unknown (offload cannot be planned).
  double disk_read_bw = 0, disk_write_bw = 0;
  /// FLOP/s per GPU of matrix products with bf16 operands (fp32 accumulation) where it is not
  /// peak_flops: `ndmesh calibrate --device cuda` measures peak_flops in fp32 and this in
  /// bf16; 0 (the presets, older files): peak_flops is the rate of every precision.
  double bf16_flops = 0;
  /// Bytes/s between pinned host memory and one GPU (host to device, device to host),
  /// measured by `ndmesh calibrate --device cuda` (the presets: PCIe's per-direction rate);
  /// 0: unknown (--offload optimizer --offload-to host cannot be planned).
  double host_to_device_bw = 0, device_to_host_bw = 0;
  /// FLOP/s of the fp32 attention kernel (ndmesh's flash kernel on a GPU, measured by
  /// `ndmesh calibrate --device cuda` as the planner counts its FLOPs: forward, backward and
  /// the backward's Q K^T); 0: the attention core runs at the products' rate. Plans of bf16
  /// products do not use it (their attention is another kernel: bf16_attention_flops).
  double attention_flops = 0;
  /// FLOP/s of the bf16 attention kernel (cuDNN's fused flash attention, what ndmesh's bf16
  /// runs use), measured by `ndmesh calibrate --device cuda` where cuDNN attention runs, counted
  /// as attention_flops; 0: bf16 plans run the attention core at the products' rate.
  double bf16_attention_flops = 0;

  /// Memory a GPU can give to parameters, gradients, optimizer states and activations.
  double usable_bytes() const { return memory_bytes - reserved_bytes; }
};

/// The measured H100 bf16 products the presets' gemm_overhead is fitted to (OpenXLA's
/// default matmul table for sm_90, every dimension >= 512; cited in presets.cpp).
const std::vector<GemmPoint>& h100_gemm_points();

/// Every hardware preset.
const std::vector<Hardware>& hardware_presets();
/// The named preset; ConfigError naming the value and listing the valid names otherwise.
Hardware hardware_preset(std::string_view name);
/// "a100-80gb, h100, h200" for messages.
std::string hardware_preset_names();

/// Every problem with a planner model (ModelSpec checks plus ours), one line each.
std::vector<std::string> plan_model_problems(const PlanModel& model);
/// `hw` as the planner sees it for products of `bf16_products` operands: with bf16 products,
/// peak_flops is bf16_flops where there is one (bf16_flops then 0) and attention_flops is the
/// bf16 kernel's, bf16_attention_flops (0 where not measured: the products' rate); otherwise
/// `hw` as is.
Hardware for_precision(Hardware hw, bool bf16_products);

/// Every problem with a hardware description, one line each, naming the flag.
std::vector<std::string> hardware_problems(const Hardware& hw);

}  // namespace ndmesh::plan
