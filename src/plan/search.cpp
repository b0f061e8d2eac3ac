// Search over layouts (see search.hpp for what is enumerated and what is skipped).
//
// For each split of the GPUs into tp x cp x pp x dp the mesh placement is computed once;
// for each schedule, vpp and micro-batch size the config is validated once (problems(), which
// applies training_problems(): the rules `ndmesh train` runs by, so no layout train refuses is
// ranked; zb-h1 is validated once more with recompute on); then every recompute mode and
// ZeRO stage is estimated. Fitting layouts are ranked by time per step, ties broken by less
// traffic, then the smaller footprint, then the layout itself so the order is deterministic.
#include "ndmesh/plan/search.hpp"

#include <algorithm>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ndmesh/config/partition.hpp"
#include "ndmesh/config/training.hpp"
#include "ndmesh/core/error.hpp"

namespace ndmesh::plan {
namespace {

std::vector<std::int64_t> divisors(std::int64_t n) {
  std::vector<std::int64_t> out;
  for (std::int64_t i = 1; i * i <= n; ++i) {
    if (n % i != 0) continue;
    out.push_back(i);
    if (i != n / i) out.push_back(n / i);
  }
  std::sort(out.begin(), out.end());
  return out;
}

auto order_key(const Estimate& e) {
  const Layout& l = e.layout;
  // Equal predicted times: prefer less traffic (hidden traffic still competes for the
  // network in practice, e.g. ZeRO-3 over ZeRO-1), then the smaller footprint.
  const double traffic = e.time.tp_comm + e.time.cp_comm + e.time.pp_comm + e.time.dp_comm + e.time.ep_comm;
  return std::make_tuple(e.time.total, traffic, e.memory.total, l.tp, l.cp, l.pp, l.ep, l.vpp,
                         static_cast<int>(l.schedule), l.micro_batch, static_cast<int>(l.recompute), l.zero);
}

bool faster(const Estimate& a, const Estimate& b) { return order_key(a) < order_key(b); }

struct ScheduleChoice {
  Schedule schedule;
  std::int64_t vpp;
};

template <typename T>
bool allowed(const std::vector<T>& list, const T& value) {
  return list.empty() || std::find(list.begin(), list.end(), value) != list.end();
}

}  // namespace

bool Constraints::any() const {
  return !tp.empty() || !cp.empty() || !pp.empty() || !dp.empty() || !ep.empty() || !vpp.empty() ||
         !micro_batch.empty() || max_zero < 3 || min_zero > 0 || offload_optimizer || !schedules.empty() ||
         !recomputes.empty() || !sequence_parallel || !dp_overlap || !stage_layers.empty();
}

std::string Constraints::text() const {
  std::vector<std::string> parts;
  auto add = [&](const char* name, const std::vector<std::int64_t>& v) {
    if (!v.empty()) parts.push_back(fmt::format("{}={}", name, fmt::join(v, ",")));
  };
  add("tp", tp);
  add("cp", cp);
  add("pp", pp);
  add("dp", dp);
  add("ep", ep);
  add("vpp", vpp);
  add("micro_batch", micro_batch);
  if (min_zero > 0) parts.push_back(fmt::format("zero>={}", min_zero));
  if (max_zero < 3) parts.push_back(fmt::format("zero<={}", max_zero));
  if (offload_optimizer) parts.push_back("offload=optimizer");
  if (!schedules.empty()) {
    std::vector<std::string_view> n;
    for (Schedule x : schedules) n.push_back(schedule_name(x));
    parts.push_back(fmt::format("schedule={}", fmt::join(n, ",")));
  }
  if (!recomputes.empty()) {
    std::vector<std::string_view> n;
    for (Recompute x : recomputes) n.push_back(recompute_name(x));
    parts.push_back(fmt::format("recompute={}", fmt::join(n, ",")));
  }
  if (!sequence_parallel) parts.push_back("sequence_parallel=off");
  if (!dp_overlap) parts.push_back("dp_overlap=off");
  add("pp_layers", stage_layers);
  return parts.empty() ? std::string("none") : fmt::format("{}", fmt::join(parts, " "));
}

SearchResult search(const PlanModel& model, const Hardware& hw, const SearchOptions& o) {
  NDMESH_CHECK_CONFIG(o.gpus >= 1, "plan", "--gpus {} must be at least 1, e.g. --gpus 512", o.gpus);
  NDMESH_CHECK_CONFIG(o.gpus <= kMaxSearchGpus, "plan",
                      "--gpus {} is above the planner's limit of {} GPUs; plan a smaller job, e.g. --gpus {}",
                      o.gpus, kMaxSearchGpus, kMaxSearchGpus);
  NDMESH_CHECK_CONFIG(o.workload.seq >= 1, "plan", "--seq {} must be at least 1, e.g. --seq 4096",
                      o.workload.seq);
  NDMESH_CHECK_CONFIG(o.workload.global_batch >= 1, "plan", "--global-batch {} must be at least 1, e.g. 1024",
                      o.workload.global_batch);
  NDMESH_CHECK_CONFIG(o.top >= 1 && o.top <= kMaxTop, "plan", "--top {} must be in 1..{}, e.g. --top 10",
                      o.top, kMaxTop);

  ModelSpec spec = model.spec;
  spec.seq = o.workload.seq;

  SearchResult result;
  std::vector<Estimate> kept;
  auto keep = [&](Estimate&& e) {
    kept.push_back(std::move(e));
    if (kept.size() >= 8 * o.top) {
      std::nth_element(kept.begin(), kept.begin() + static_cast<std::ptrdiff_t>(o.top), kept.end(), faster);
      kept.resize(o.top);
    }
  };

  const Constraints& c = o.constraints;
  NDMESH_CHECK_CONFIG(c.max_zero >= 0 && c.max_zero <= 3, "plan",
                      "--max-zero {} is not a ZeRO stage; use 0, 1, 2 or 3", c.max_zero);
  const std::vector<std::int64_t>& micro_batches = c.micro_batch.empty() ? o.micro_batches : c.micro_batch;
  std::vector<Recompute> recomputes = {Recompute::kNone, Recompute::kSelective, Recompute::kFull};
  if (!c.recomputes.empty()) recomputes = c.recomputes;
  // Under flash attention selective recompute is the same as none (no scores are stored
  // either way): keep one of the two rows.
  if (o.attention == Attention::kFlash &&
      std::find(recomputes.begin(), recomputes.end(), Recompute::kNone) != recomputes.end())
    std::erase(recomputes, Recompute::kSelective);
  // ZeRO stages ndmesh train runs (the same rules as every layout: training_problems).
  bool zero_runs[4];
  for (int z = 0; z < 4; ++z)
    zero_runs[z] = training_problems(TrainingRun{.global_batch = 1, .zero = z}).empty();
  std::int64_t max_vpp = o.max_vpp;
  for (std::int64_t v : c.vpp) max_vpp = std::max(max_vpp, v);

  for (std::int64_t tp : divisors(o.gpus)) {
    if (!allowed(c.tp, tp)) continue;
    for (std::int64_t cp : divisors(o.gpus / tp)) {
      if (!allowed(c.cp, cp)) continue;
      for (std::int64_t pp : divisors(o.gpus / (tp * cp))) {
        const std::int64_t dp = o.gpus / (tp * cp * pp);
        if (!allowed(c.pp, pp) || !allowed(c.dp, dp)) continue;
        // Expert parallelism folds into dp x cp: every size that divides it and the experts.
        std::vector<std::int64_t> eps;
        for (std::int64_t ep : divisors(dp * cp))
          if ((ep == 1 || (model.spec.experts > 0 && model.spec.experts % ep == 0)) && allowed(c.ep, ep))
            eps.push_back(ep);
        for (std::int64_t ep : eps) {
          Layout base{.tp = tp,
                      .cp = cp,
                      .pp = pp,
                      .dp = dp,
                      .sequence_parallel = tp > 1 && c.sequence_parallel,
                      .attention = o.attention,
                      .dp_overlap = c.dp_overlap,
                      .stage_layers = c.stage_layers,
                      .ep = ep};
          const Placement where = placement(base, hw.gpus_per_node);

          std::vector<ScheduleChoice> schedules;
          if (pp == 1) {
            // Without a pipeline every schedule is the same; keep the layout when any is allowed.
            if (allowed(c.vpp, std::int64_t{1})) schedules.push_back({Schedule::k1F1B, 1});
          } else {
            for (Schedule s : {Schedule::kGpipe, Schedule::k1F1B, Schedule::kZbH1})
              if (allowed(c.schedules, s) && allowed(c.vpp, std::int64_t{1})) schedules.push_back({s, 1});
            if (allowed(c.schedules, Schedule::kInterleaved))
              for (std::int64_t v = 2; v <= max_vpp; ++v)
                if (allowed(c.vpp, v)) schedules.push_back({Schedule::kInterleaved, v});
          }
          // An explicit partition fits one chunk count only.
          if (!c.stage_layers.empty())
            std::erase_if(schedules, [&](const ScheduleChoice& sc) {
              return static_cast<std::int64_t>(c.stage_layers.size()) != pp * sc.vpp;
            });

          std::string first_problem;
          bool any_valid = false;
          for (const ScheduleChoice& sc : schedules) {
            for (std::int64_t mb : micro_batches) {
              Layout layout = base;
              layout.schedule = sc.schedule;
              layout.vpp = sc.vpp;
              layout.micro_batch = mb;
              const int zero_max = std::min(pp == 1 ? 3 : 1, c.max_zero);
              const int zeros = std::max(0, zero_max - c.min_zero + 1);
              const std::int64_t variants = static_cast<std::int64_t>(recomputes.size()) * zeros;
              result.considered += variants;

              const auto probs = problems(parallel_config(layout, o.workload, hw.gpus_per_node), &spec);
              if (!probs.empty()) {
                result.invalid += variants;
                if (first_problem.empty()) first_problem = probs.front();
                continue;
              }
              any_valid = true;
              // The same rules with recompute on: zb-h1 cannot recompute under ndmesh train.
              bool recompute_ok = true;
              if (sc.schedule == Schedule::kZbH1) {
                Layout with = layout;
                with.recompute = Recompute::kFull;
                recompute_ok = problems(parallel_config(with, o.workload, hw.gpus_per_node), &spec).empty();
              }
              // Partition once per layout rather than once per estimate (validation above
              // guarantees every chunk gets a block).
              if (layout.stage_layers.empty())
                layout.stage_layers = balanced_partition(model.spec.layers, pp, sc.vpp);
              for (Recompute rc : recomputes) {
                if (rc != Recompute::kNone && !recompute_ok) {
                  result.invalid += zeros;
                  continue;
                }
                for (int zero = c.min_zero; zero <= zero_max; ++zero) {
                  if (!zero_runs[static_cast<std::size_t>(zero)]) {
                    ++result.invalid;
                    continue;
                  }
                  layout.recompute = rc;
                  layout.zero = zero;
                  layout.offload_optimizer = c.offload_optimizer;
                  layout.offload_to_host = c.offload_to_host;
                  Estimate e;
                  e.layout = layout;
                  e.microbatches = microbatches(layout, o.workload);
                  e.memory = estimate_memory(model, layout, o.workload, o.precision);
                  e.where = where;
                  e.capacity_bytes = hw.usable_bytes();
                  e.fits = e.memory.total <= e.capacity_bytes;
                  if (!e.fits) {
                    ++result.too_big;
                    if (!result.smallest || e.memory.total < result.smallest->memory.total) {
                      e.time = estimate_time(model, hw, layout, o.workload, e.memory, where, o.precision);
                      result.smallest = e;
                    }
                    continue;
                  }
                  ++result.fitting;
                  e.time = estimate_time(model, hw, layout, o.workload, e.memory, where, o.precision);
                  keep(std::move(e));
                }
              }
            }
          }
          if (!any_valid && !first_problem.empty() && result.sample_problems.size() < 5)
            result.sample_problems.push_back(fmt::format("tp={} cp={} pp={} dp={}{}: {}", tp, cp, pp, dp,
                                                         ep > 1 ? fmt::format(" ep={}", ep) : std::string(),
                                                         first_problem));
        }
      }
    }
  }

  if (c.any()) {
    NDMESH_CHECK_CONFIG(
        result.considered > 0, "plan",
        "the constraints ({}) leave no layout of --gpus {}: the fixed dims must multiply to a "
        "divisor of the GPU count (all four to the count itself), --vpp above 1 needs the "
        "interleaved schedule and pp > 1, --pp-layers needs pp*vpp entries; relax one",
        c.text(), o.gpus);
    NDMESH_CHECK_CONFIG(
        result.invalid < result.considered, "plan",
        "no layout of --gpus {} meets the constraints ({}): {}; relax the constraint it names", o.gpus,
        c.text(),
        result.sample_problems.empty() ? std::string("every one fails validation")
                                       : result.sample_problems.front());
  }
  std::sort(kept.begin(), kept.end(), faster);
  if (kept.size() > o.top) kept.resize(o.top);
  // Fill in the whole-model numbers once for the layouts we return.
  const ParameterCount count = count_parameters(model);
  const double params = count.total();
  const double flops = model_flops_per_step(model, static_cast<double>(o.workload.seq),
                                            static_cast<double>(o.workload.global_batch));
  auto finish = [&](Estimate& e) {
    e.parameters = params;
    e.active_parameters = count.active();
    e.model_flops = flops;
    e.tokens_per_second =
        static_cast<double>(o.workload.global_batch) * static_cast<double>(o.workload.seq) / e.time.total;
    e.mfu = flops / (e.time.total * static_cast<double>(o.gpus) * hw.peak_flops);
  };
  for (Estimate& e : kept) finish(e);
  if (result.smallest) finish(*result.smallest);
  if (!kept.empty()) result.smallest.reset();
  result.layouts = std::move(kept);
  return result;
}

}  // namespace ndmesh::plan
