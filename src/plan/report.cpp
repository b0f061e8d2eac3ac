#include "ndmesh/plan/report.hpp"

#include <nlohmann/json.hpp>

namespace ndmesh::plan {
namespace {

nlohmann::json estimate_json(const Estimate& e) {
  const Layout& l = e.layout;
  const auto& m = e.memory;
  const auto& t = e.time;
  return nlohmann::json{
      {"tp", l.tp},
      {"cp", l.cp},
      {"pp", l.pp},
      {"dp", l.dp},
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
        {"activations", m.activations},
        {"total", m.total}}},
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
        {"dp_exposed", t.dp_exposed}}},
      {"tokens_per_second", e.tokens_per_second},
      {"mfu", e.mfu},
      {"tp_in_node", e.where.tp_in_node},
      {"cp_in_node", e.where.cp_in_node},
      {"dp_in_node", e.where.dp_in_node},
  };
}

}  // namespace

std::string search_json(const PlanModel& model, const Hardware& hw, const SearchOptions& options,
                        const SearchResult& r, int indent) {
  nlohmann::json out;
  out["model"] = model.spec.name;
  out["parameters"] = count_parameters(model).total();
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
  for (const Estimate& e : r.layouts) out["layouts"].push_back(estimate_json(e));
  if (r.smallest) out["smallest"] = estimate_json(*r.smallest);
  if (!r.sample_problems.empty()) out["problems"] = r.sample_problems;
  return out.dump(indent);
}

std::string memory_json(const PlanModel& model, const Hardware& hw, const Workload& w, const Estimate& e,
                        int indent) {
  nlohmann::json out = estimate_json(e);
  out["parameters"] = e.parameters;
  out["model"] = model.spec.name;
  out["hardware"] = hw.name;
  out["seq"] = w.seq;
  out["global_batch"] = w.global_batch;
  return out.dump(indent);
}

}  // namespace ndmesh::plan
