// What `ndmesh plan --json` and `ndmesh plan memory --json` print, built in one place so that
// the CLI and the Python module (ndmesh.plan / ndmesh.plan_memory) cannot drift apart. The
// functions return JSON text; the JSON library stays a private dependency of the plan layer.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "ndmesh/plan/search.hpp"

namespace ndmesh::plan {

/// The search's JSON object: model, parameters, layers, hidden, vocab, gpus, hardware, seq, global_batch,
/// considered, invalid, too_big, fitting, constraints, attention, layouts (best first),
/// smallest (when nothing fits) and problems (when nothing is valid).
std::string search_json(const PlanModel& model, const Hardware& hw, const SearchOptions& options,
                        const SearchResult& result, int indent = 2);

/// One layout's JSON object (the fields of a `layouts` entry) plus parameters, model,
/// hardware, seq and global_batch.
std::string memory_json(const PlanModel& model, const Hardware& hw, const Workload& workload,
                        const Estimate& estimate, int indent = 2);

/// One term of the step time (TimeBreakdown), for `plan --explain`.
enum class Term {
  kCompute,
  kRecompute,
  kMemory,
  kTensorParallel,
  kContextParallel,
  kPipelineSends,
  kBubble,
  kDataParallel,
  kExpertParallel  ///< a mixture of experts' token all-to-alls
};

/// Its name as --explain prints it ("compute", "context parallel", ...).
std::string_view term_name(Term t);
/// Its seconds in `t`.
double term_seconds(const TimeBreakdown& t, Term term);

/// How a term of `e` comes about, in the layout's own numbers, e.g. "cp 16: ring transfer
/// 76% exposed at 512 tokens per rank (across nodes)" or "tp 8: products at 93% of the rate
/// (8192 tokens per GPU, 18 kernels per layer)".
std::string term_reason(const Estimate& e, Term term);

/// The terms in which `worse` and `better` differ, largest (worse - better) first: what
/// separates two ranked layouts (the positive ones), and what makes up for it (the negative
/// ones, last).
struct TermDelta {
  Term term;
  double seconds = 0;  ///< worse - better
};
std::vector<TermDelta> separating_terms(const Estimate& worse, const Estimate& better);

/// The `ndmesh train` flags that run `layout` on `model` for `workload`: the four dims, the
/// batch, micro-batch, schedule, virtual stages, recompute mode, ZeRO stage, sequence
/// parallelism, an uneven partition when it is not the balanced one, and the model shape
/// (what `ndmesh train` takes: its MLP is GeLU, so a SwiGLU model runs as its GeLU twin).
std::string train_flags(const PlanModel& model, const Layout& layout, const Workload& workload);

/// How to start `train_flags` on `gpus` ranks: on this machine (`ndmesh launch -n N --
/// ndmesh train ...`), and on a cluster of `gpus_per_node` per node with Slurm (`srun -N
/// nodes --ntasks-per-node G ndmesh train ...`) or Open MPI (`mpirun -np N --map-by
/// ppr:G:node ndmesh train ...`).
struct TrainCommands {
  std::string local, srun, mpirun;
};
TrainCommands train_commands(const std::string& flags, std::int64_t gpus, std::int64_t gpus_per_node);

}  // namespace ndmesh::plan
