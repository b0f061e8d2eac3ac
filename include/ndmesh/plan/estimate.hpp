// Memory per GPU and time per step of one layout.
//
// Memory: the worst pipeline stage (the first holds the embedding and the most
// micro-batches in flight, the last the output layer and the fp32 logits) of model states
// (ZeRO over dp) plus activations (Korthikanti et al. 2022) times the micro-batches in
// flight for the schedule.
//
// Time: the slowest stage's compute at the achievable FLOP/s, recompute, tensor-parallel
// all-reduces at the bandwidth of where the tp group sits (the mesh says whether its groups
// stay inside a node), the exposed part of the context-parallel ring, pipeline sends, the
// bubble of the schedule, and the part of the data-parallel gradient reduction that does
// not overlap the backward pass. Every term is kept so `ndmesh plan --explain` can show it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ndmesh/config/config.hpp"
#include "ndmesh/plan/formulas.hpp"
#include "ndmesh/plan/presets.hpp"

namespace ndmesh::plan {

/// One way to run the model: sizes of the standard dims and the training options.
struct Layout {
  std::int64_t tp = 1;
  std::int64_t cp = 1;
  std::int64_t pp = 1;
  std::int64_t dp = 1;
  std::int64_t vpp = 1;  ///< virtual stages per rank (interleaved schedule)
  std::int64_t micro_batch = 1;
  Schedule schedule = Schedule::k1F1B;
  Recompute recompute = Recompute::kNone;
  bool sequence_parallel = false;
  int zero = 0;                                ///< ZeRO stage 0-3 over dp
  Attention attention = Attention::kStandard;  ///< the CLI defaults to flash
  /// The gradient reduction overlaps the backward pass (false: it runs after the last
  /// micro-batch, as Megatron-LM's local DDP and DeepSpeed's pipeline engine did).
  bool dp_overlap = true;
  /// Blocks per pipeline chunk (pp*vpp entries, chunk k on rank k mod pp); empty: the
  /// balanced partition of config/partition.hpp, what the pipeline executor runs.
  std::vector<std::int64_t> stage_layers;
  /// --offload optimizer: the optimizer state (fp32 master weights and AdamW moments) lives
  /// on the node's disk and is streamed through each step (read once, written once).
  bool offload_optimizer = false;
  /// With offload_optimizer: the state lives in the node's pinned host memory instead of on
  /// disk (ndmesh train --device cuda --offload optimizer, ZeRO-Offload): the host holds the
  /// moments and an fp32 master copy of the shard, and each step moves the shard's gradients
  /// to the host and its parameters back over the GPU's host link.
  bool offload_to_host = false;
  /// ZeRO-3: units (blocks) gathered ahead of the one in use, forward and backward.
  std::int64_t zero3_prefetch = 1;
  /// Expert parallelism of a mixture of experts, folded into dp x cp (as `ndmesh train --ep`
  /// and Megatron-core fold it: no ranks of its own): each MoE layer's experts are sharded over
  /// groups of ep ranks that exchange tokens by all-to-all; the expert-data-parallel group,
  /// dp x cp / ep, reduces (and with ZeRO shards) the experts' gradients.
  std::int64_t ep = 1;

  std::int64_t gpus() const { return tp * cp * pp * dp; }
};

/// What one step trains on.
struct Workload {
  std::int64_t seq = 0;           ///< tokens per sequence
  std::int64_t global_batch = 0;  ///< sequences per step
};

/// The ParallelConfig of a layout (dims dp, pp, cp, tp outer to inner), for validation.
ParallelConfig parallel_config(const Layout& layout, const Workload& workload, std::int64_t gpus_per_node);

/// Micro-batches per step per pipeline: global_batch / (micro_batch * dp).
std::int64_t microbatches(const Layout& layout, const Workload& workload);

/// Bytes per GPU on the worst stage.
struct MemoryBreakdown {
  double params = 0;  ///< with ZeRO-3: the shard plus 1 + zero3_prefetch gathered layers (less the own block)
  /// With ZeRO 2 and 3: the shard plus two layers' full gradients (one written, one being
  /// reduce-scattered) and, with a tied head on the embedding's rank, the token table's.
  double grads = 0;
  double optimizer = 0;  ///< 0 when offloaded
  double optimizer_offloaded = 0;   ///< --offload optimizer: the optimizer bytes on disk (or host memory) instead
  /// offload_to_host: the pinned host bytes per GPU (the moments, and with fp32 parameters the
  /// fp32 master copy the host updates; mixed precision counts it in the optimizer bytes).
  double optimizer_host = 0;
  double activations = 0;           ///< layers x in flight, plus embedding masks / logits on the end stages
  double total = 0;                 ///< params + grads + optimizer + activations
  std::int64_t stage = 0;           ///< which stage is the worst (0 = first)
  double stage_parameters = 0;      ///< parameters held by one GPU of that stage
  double layers_on_stage = 0;       ///< decoder layers on that stage (rank)
  double in_flight = 0;             ///< micro-batches whose activations it holds
  double activation_per_layer = 0;  ///< bytes per layer per micro-batch (mean over the stage's layers)
  /// Of stage_parameters, the routed experts' (E/ep of each MoE layer on the stage): their
  /// gradients are reduced, and with ZeRO their states sharded, over dp x cp / ep.
  double stage_expert_parameters = 0;
  double moe_layers_on_stage = 0;  ///< mixture-of-experts layers among layers_on_stage
};

/// Blocks per chunk of a layout: layout.stage_layers, or balanced_partition(layers, pp, vpp).
std::vector<std::int64_t> stage_chunks(const PlanModel& model, const Layout& layout);

/// Memory of the worst stage. Each rank holds the blocks of its chunks (stage_chunks); the
/// heaviest rank, the first (embedding, most micro-batches in flight) and the last (output
/// layer, logits) are evaluated.
MemoryBreakdown estimate_memory(const PlanModel& model, const Layout& layout, const Workload& workload,
                                const Precision& precision = {});

/// Where a layout's groups sit on the nodes (from Mesh::groups_within_node).
struct Placement {
  bool tp_in_node = true;
  bool cp_in_node = true;
  bool pp_in_node = true;
  bool dp_in_node = true;  ///< the gradient-reduction group, dims dp and cp
  bool ep_in_node = true;   ///< the expert group (Mesh::fold_group kInner of dp-cp)
  bool edp_in_node = true;  ///< the expert-data-parallel group (Mesh::fold_group kOuter)
  std::int64_t ep_per_node = 1;  ///< members of an expert group on one node (the fewest)
};
/// Asks the mesh dp, pp, cp, tp (outer to inner) with `gpus_per_node` ranks per node.
Placement placement(const Layout& layout, std::int64_t gpus_per_node);

/// Seconds per step, by term.
struct TimeBreakdown {
  double compute = 0;     ///< weight products and attention core of the slowest stage (with kernel overheads)
  double recompute = 0;   ///< what recomputation adds on that stage
  double memory = 0;      ///< memory-bound work: standard attention's scores, the loss, the embedding,
                          ///< ndmesh's unfused element-wise passes and optimizer step
  double elementwise_bytes_per_token = 0;  ///< of one layer (elementwise_bytes_per_token; 0: fused kernels)
  double tp_comm = 0;     ///< tensor-parallel all-reduces (on the critical path)
  double cp_comm = 0;     ///< context-parallel ring traffic in total
  double cp_exposed = 0;  ///< the part of it attention compute does not hide
  double pp_comm = 0;     ///< stage-to-stage sends
  double bubble = 0;      ///< pipeline idle time
  double dp_comm = 0;     ///< data-parallel gradient (and ZeRO parameter) traffic in total
  double dp_overlap = 0;  ///< backward time it can hide under
  double dp_exposed = 0;  ///< max(0, dp_comm - dp_overlap)
  /// Mixture of experts under ep > 1: the token all-to-alls (dispatch and combine, forward and
  /// backward: 4 per MoE layer and micro-batch, 6 with full recompute), on the critical path.
  double ep_comm = 0;
  double ep_bytes = 0;        ///< bytes one GPU sends in one of those all-to-alls
  double dp_expert_comm = 0;  ///< of dp_comm, the experts' gradients over dp x cp / ep
  /// --offload optimizer: reading and writing the optimizer state once per step at the
  /// node's disk rates (shared by the node's GPUs); not overlapped (the update needs it).
  double offload = 0;
  double offload_bytes = 0;  ///< bytes one GPU reads (and writes) per step; to the host: PCIe bytes both ways
  double total = 0;
  double bubble_fraction = 0;
  double tp_bw = 0, cp_bw = 0, pp_bw = 0, dp_bw = 0;  ///< bytes/s used for each
  double ep_bw = 0, edp_bw = 0;  ///< the all-to-all's slowest link, the experts' gradient reduction
  // What the terms are made of, for `plan --explain`:
  double gemm_efficiency = 1;  ///< the weight products' rate over the achievable rate (kernel overheads)
  double tokens_per_gpu = 0;   ///< rows of those products: micro_batch x seq / cp
  double layers_on_stage = 0;  ///< decoder layers on the slowest rank
  double ring_exposed_fraction = 0;  ///< cp_exposed / cp_comm
  double end_stage_extra = 0;        ///< the slowest rank's head / loss / embedding work per step
};

/// Everything the planner says about one layout.
struct Estimate {
  Layout layout;
  MemoryBreakdown memory;
  TimeBreakdown time;
  Placement where;
  std::int64_t microbatches = 0;
  double parameters = 0;   ///< of the whole model
  double active_parameters = 0;  ///< what one token goes through (a mixture of experts: top_k + shared experts)
  double model_flops = 0;  ///< per step, without recompute
  double tokens_per_second = 0;
  double mfu = 0;  ///< model FLOPs / (step time x GPUs x peak), a fraction
  double capacity_bytes = 0;
  bool fits = false;  ///< memory.total <= hardware usable bytes
};

/// Memory and time of one layout. Does not validate it: call problems() first.
Estimate estimate(const PlanModel& model, const Hardware& hw, const Layout& layout, const Workload& workload,
                  const Precision& precision = {});

/// Time per step given the memory estimate (for its per-stage parameters) and placement.
TimeBreakdown estimate_time(const PlanModel& model, const Hardware& hw, const Layout& layout,
                            const Workload& workload, const MemoryBreakdown& memory, const Placement& where,
                            const Precision& precision = {});

}  // namespace ndmesh::plan
