#include "ndmesh/plan/report.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "ndmesh/config/partition.hpp"

namespace ndmesh::plan {
namespace {

nlohmann::json estimate_json(const Estimate& e, const std::string& train) {
  const Layout& l = e.layout;
  const auto& m = e.memory;
  const auto& t = e.time;
  return nlohmann::json{
      {"tp", l.tp},
      {"cp", l.cp},
      {"pp", l.pp},
      {"dp", l.dp},
      {"ep", l.ep},
      {"vpp", l.vpp},
      {"micro_batch", l.micro_batch},
      {"microbatches", e.microbatches},
      {"schedule", std::string(schedule_name(l.schedule))},
      {"recompute", std::string(recompute_name(l.recompute))},
      {"zero", l.zero},
      {"sequence_parallel", l.sequence_parallel},
      {"attention", std::string(attention_name(l.attention))},
      {"pp_layers", l.stage_layers},
      {"memory_bytes",
       {{"params", m.params},
        {"grads", m.grads},
        {"optimizer", m.optimizer},
        {"optimizer_offloaded", m.optimizer_offloaded},
        {"optimizer_host", m.optimizer_host},
        {"activations", m.activations},
        {"total", m.total}}},
      {"expert_parameters_per_gpu", m.stage_expert_parameters},
      {"worst_stage", m.stage},
      {"capacity_bytes", e.capacity_bytes},
      {"fits", e.fits},
      {"step_time_s", t.total},
      {"time_s",
       {{"compute", t.compute},
        {"recompute", t.recompute},
        {"tp", t.tp_comm},
        {"cp_exposed", t.cp_exposed},
        {"pp", t.pp_comm},
        {"bubble", t.bubble},
        {"dp_exposed", t.dp_exposed},
        {"ep", t.ep_comm},
        {"offload", t.offload}}},
      {"offload", l.offload_optimizer ? "optimizer" : "none"},
      {"offload_to", l.offload_optimizer ? (l.offload_to_host ? "host" : "disk") : "none"},
      {"offload_bytes_per_step", t.offload_bytes},
      {"tokens_per_second", e.tokens_per_second},
      {"mfu", e.mfu},
      {"tp_in_node", e.where.tp_in_node},
      {"cp_in_node", e.where.cp_in_node},
      {"dp_in_node", e.where.dp_in_node},
      {"ep_in_node", e.where.ep_in_node},
      {"train_flags", train},
  };
}

}  // namespace

std::string search_json(const PlanModel& model, const Hardware& hw, const SearchOptions& options,
                        const SearchResult& r, int indent) {
  nlohmann::json out;
  out["model"] = model.spec.name;
  out["parameters"] = count_parameters(model).total();
  out["active_parameters"] = count_parameters(model).active();
  out["layers"] = model.spec.layers;
  out["hidden"] = model.spec.hidden;
  out["vocab"] = model.spec.vocab;
  out["gpus"] = options.gpus;
  out["hardware"] = hw.name;
  out["seq"] = options.workload.seq;
  out["global_batch"] = options.workload.global_batch;
  out["considered"] = r.considered;
  out["invalid"] = r.invalid;
  out["too_big"] = r.too_big;
  out["fitting"] = r.fitting;
  out["constraints"] = options.constraints.text();
  out["attention"] = std::string(attention_name(options.attention));
  out["layouts"] = nlohmann::json::array();
  for (const Estimate& e : r.layouts)
    out["layouts"].push_back(estimate_json(e, train_flags(model, e.layout, options.workload)));
  if (r.smallest)
    out["smallest"] = estimate_json(*r.smallest, train_flags(model, r.smallest->layout, options.workload));
  if (!r.sample_problems.empty()) out["problems"] = r.sample_problems;
  return out.dump(indent);
}

std::string memory_json(const PlanModel& model, const Hardware& hw, const Workload& w, const Estimate& e,
                        int indent) {
  nlohmann::json out = estimate_json(e, train_flags(model, e.layout, w));
  out["parameters"] = e.parameters;
  out["active_parameters"] = e.active_parameters;
  out["model"] = model.spec.name;
  out["hardware"] = hw.name;
  out["seq"] = w.seq;
  out["global_batch"] = w.global_batch;
  return out.dump(indent);
}

std::string_view term_name(Term t) {
  switch (t) {
    case Term::kCompute:
      return "compute";
    case Term::kRecompute:
      return "recompute";
    case Term::kMemory:
      return "memory-bound";
    case Term::kTensorParallel:
      return "tensor parallel";
    case Term::kContextParallel:
      return "context parallel";
    case Term::kPipelineSends:
      return "pipeline sends";
    case Term::kBubble:
      return "bubble";
    case Term::kDataParallel:
      return "data parallel";
    case Term::kExpertParallel:
      return "expert parallel";
  }
  return "?";
}

double term_seconds(const TimeBreakdown& t, Term term) {
  switch (term) {
    case Term::kCompute:
      return t.compute;
    case Term::kRecompute:
      return t.recompute;
    case Term::kMemory:
      return t.memory;
    case Term::kTensorParallel:
      return t.tp_comm;
    case Term::kContextParallel:
      return t.cp_exposed;
    case Term::kPipelineSends:
      return t.pp_comm;
    case Term::kBubble:
      return t.bubble;
    case Term::kDataParallel:
      return t.dp_exposed;
    case Term::kExpertParallel:
      return t.ep_comm;
  }
  return 0;
}

std::string term_reason(const Estimate& e, Term term) {
  const Layout& l = e.layout;
  const TimeBreakdown& t = e.time;
  auto where = [](bool in_node) { return in_node ? "inside a node" : "across nodes"; };
  switch (term) {
    case Term::kCompute:
      return fmt::format(
          "tp {}: products at {:.0f}% of the achievable rate ({:.0f} tokens per GPU, {} layers on the "
          "slowest rank{})",
          l.tp, 100 * t.gemm_efficiency, t.tokens_per_gpu, t.layers_on_stage,
          t.end_stage_extra > 0 ? " with the output layer and loss" : "");
    case Term::kRecompute:
      return fmt::format(
          "recompute {}{}", recompute_name(l.recompute),
          l.attention == Attention::kFlash ? " (+ flash attention's Q K^T in the backward)" : "");
    case Term::kMemory:
      return fmt::format("{} attention: {}", attention_name(l.attention),
                         l.attention == Attention::kStandard
                             ? "the s x s scores through HBM, and the loss"
                             : "the loss over the vocabulary and the embedding");
    case Term::kTensorParallel:
      return fmt::format("tp {}: {} all-reduces per layer and micro-batch {}", l.tp,
                         l.recompute == Recompute::kFull ? 6 : 4, where(e.where.tp_in_node));
    case Term::kContextParallel:
      return fmt::format("cp {}: ring transfer {:.0f}% exposed at {:.0f} tokens per rank ({})", l.cp,
                         100 * t.ring_exposed_fraction, t.tokens_per_gpu / static_cast<double>(l.micro_batch),
                         where(e.where.cp_in_node));
    case Term::kPipelineSends:
      return fmt::format("pp {}: {} sends per micro-batch {}", l.pp, 2 * l.vpp, where(e.where.pp_in_node));
    case Term::kBubble:
      return fmt::format("pp {}{}: bubble {:.1f}% of the work ({} micro-batches, {} layers per rank)", l.pp,
                         l.vpp > 1 ? fmt::format(" x vpp {}", l.vpp) : std::string(), 100 * t.bubble_fraction,
                         e.microbatches, t.layers_on_stage);
    case Term::kDataParallel:
      return fmt::format("dp x cp = {}: {:.0f}% of the gradient reduction exposed ({}{})", l.dp * l.cp,
                         t.dp_comm > 0 ? 100 * t.dp_exposed / t.dp_comm : 0.0, where(e.where.dp_in_node),
                         l.dp_overlap ? "" : ", after the last micro-batch");
    case Term::kExpertParallel:
      return fmt::format(
          "ep {}: {} all-to-alls of {:.1f} MiB per MoE layer and micro-batch ({}{})", l.ep,
          l.recompute == Recompute::kFull ? 6 : 4, t.ep_bytes / (1024.0 * 1024.0), where(e.where.ep_in_node),
          e.where.ep_in_node ? std::string()
                             : fmt::format(", {} of {} ranks per node", e.where.ep_per_node, l.ep));
  }
  return "";
}

std::vector<TermDelta> separating_terms(const Estimate& worse, const Estimate& better) {
  std::vector<TermDelta> out;
  for (Term term :
       {Term::kCompute, Term::kRecompute, Term::kMemory, Term::kTensorParallel, Term::kContextParallel,
        Term::kPipelineSends, Term::kBubble, Term::kDataParallel, Term::kExpertParallel}) {
    const double d = term_seconds(worse.time, term) - term_seconds(better.time, term);
    if (d != 0) out.push_back({term, d});
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const TermDelta& a, const TermDelta& b) { return a.seconds > b.seconds; });
  return out;
}

std::string train_flags(const PlanModel& model, const Layout& l, const Workload& w) {
  std::string f = fmt::format("--tp {} --cp {} --pp {} --dp {} --global-batch {} --micro-batch {}", l.tp,
                              l.cp, l.pp, l.dp, w.global_batch, l.micro_batch);
  if (l.pp > 1) f += fmt::format(" --schedule {}", schedule_name(l.schedule));
  if (l.vpp > 1) f += fmt::format(" --vpp {}", l.vpp);
  if (l.recompute != Recompute::kNone) f += fmt::format(" --recompute {}", recompute_name(l.recompute));
  if (l.zero > 0) f += fmt::format(" --zero {}", l.zero);
  if (l.sequence_parallel) f += " --sequence-parallel";
  if (!l.stage_layers.empty() && l.pp * l.vpp > 1 &&
      l.stage_layers != balanced_partition(model.spec.layers, l.pp, std::max<std::int64_t>(l.vpp, 1)))
    f += fmt::format(" --pp-layers {}", fmt::join(l.stage_layers, ","));
  const ModelSpec& m = model.spec;
  f += fmt::format(" --layers {} --hidden {} --heads {} --kv-heads {} --ffn {} --seq {} --vocab {}", m.layers,
                   m.hidden, m.heads, m.kv_heads_or_heads(), m.ffn_or_default(), w.seq, m.vocab);
  if (!m.tied_embeddings) f += " --untied";
  if (m.experts > 0) {
    // A mixture of experts: its description (the flags of `ndmesh train`) and the folded ep.
    f += fmt::format(" --experts {} --top-k {}", m.experts, m.top_k);
    if (m.shared_experts > 0) f += fmt::format(" --shared-experts {}", m.shared_experts);
    if (m.expert_ffn > 0) f += fmt::format(" --expert-ffn {}", m.expert_ffn);
    if (m.moe_every != 1) f += fmt::format(" --moe-every {}", m.moe_every);
    if (m.moe_first_dense > 0) f += fmt::format(" --moe-first-dense {}", m.moe_first_dense);
    if (m.router != RouterKind::kSoftmax) f += fmt::format(" --router {}", router_name(m.router));
    if (l.ep > 1) f += fmt::format(" --ep {}", l.ep);
  }
  return f;
}

TrainCommands train_commands(const std::string& flags, std::int64_t gpus, std::int64_t gpus_per_node) {
  const std::int64_t per_node = std::max<std::int64_t>(gpus_per_node, 1);
  const std::int64_t nodes = (gpus + per_node - 1) / per_node;
  const std::int64_t tasks = std::min(gpus, per_node);
  return {.local = fmt::format("ndmesh launch -n {} -- ndmesh train {}", gpus, flags),
          .srun = fmt::format("srun -N {} --ntasks-per-node {} ndmesh train {}", nodes, tasks, flags),
          .mpirun = fmt::format("mpirun -np {} --map-by ppr:{}:node ndmesh train {}", gpus, tasks, flags)};
}

}  // namespace ndmesh::plan
