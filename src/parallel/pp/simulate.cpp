// Event-order simulation of a schedule: stages advance in turn; compute and sends take
// their cost at once (sends are buffered, so they never wait), a receive completes when
// the matching send on its channel (one FIFO per ordered pair of stages) has delivered.
// Because every cross-stage dependency travels through a receive, this gives the exact
// start and end of every action.
#include "ndmesh/parallel/pp/simulate.hpp"

#include <algorithm>
#include <cmath>
#include <deque>

#include <fmt/core.h>

#include "ndmesh/core/error.hpp"

namespace ndmesh::pp {

std::vector<std::string> cost_problems(const Costs& c) {
  std::vector<std::string> out;
  auto positive = [&](const char* name, double v) {
    if (!std::isfinite(v) || v <= 0)
      out.push_back(fmt::format("cost-{}={} must be a positive number; use cost-{}=1", name, v, name));
  };
  positive("forward", c.forward);
  positive("backward-input", c.backward_input);
  positive("backward-weight", c.backward_weight);
  if (!std::isfinite(c.p2p) || c.p2p < 0)
    out.push_back(fmt::format("cost-p2p={} must be zero or positive; use cost-p2p=0", c.p2p));
  return out;
}

double action_cost(const PipelineSchedule& s, const Action& a, const Costs& c) {
  const double per_chunk = 1.0 / s.chunks;
  switch (a.kind) {
    case ActionKind::kForward:
      return c.forward * per_chunk;
    case ActionKind::kBackward:
      return (c.backward_input + c.backward_weight) * per_chunk;
    case ActionKind::kBackwardInput:
      return c.backward_input * per_chunk;
    case ActionKind::kBackwardWeight:
      return c.backward_weight * per_chunk;
    case ActionKind::kSendActivation:
    case ActionKind::kSendGradient:
      return c.p2p;
    case ActionKind::kRecvActivation:
    case ActionKind::kRecvGradient:
      return 0.0;
  }
  return 0.0;
}

Simulation simulate(const PipelineSchedule& s, const Costs& costs) {
  return simulate_stages(s, std::vector<Costs>(static_cast<std::size_t>(std::max(s.stages, 0)), costs));
}

Simulation simulate_stages(const PipelineSchedule& s, const std::vector<Costs>& stage_costs) {
  const int p = s.stages;
  NDMESH_CHECK(p >= 1 && static_cast<int>(s.actions.size()) == p, "pp",
               "the schedule lists actions for {} stages but pp={}", s.actions.size(), p);
  NDMESH_CHECK(static_cast<int>(stage_costs.size()) == p, "pp", "{} stage costs for pp={} stages",
               stage_costs.size(), p);
  for (const Costs& costs : stage_costs)
    if (auto problems = cost_problems(costs); !problems.empty()) fail<ConfigError>("pp", "{}", problems[0]);
  Simulation out;
  out.busy.assign(p, 0.0);
  out.spans.resize(p);
  for (int r = 0; r < p; ++r) out.spans[r].resize(s.actions[r].size());

  std::vector<std::deque<double>> channel(static_cast<std::size_t>(p) * p);  // [src * p + dst]
  std::vector<std::size_t> pc(p, 0);
  std::vector<double> clock(p, 0.0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < p; ++r) {
      for (; pc[r] < s.actions[r].size(); ++pc[r]) {
        const Action& a = s.actions[r][pc[r]];
        NDMESH_CHECK(!is_p2p(a.kind) || (a.peer >= 0 && a.peer < p), "pp",
                     "stage {} action {} ({}) has no valid peer", r, pc[r], to_string(a));
        Span& span = out.spans[r][pc[r]];
        span.start = clock[r];
        if (is_recv(a.kind)) {
          auto& q = channel[static_cast<std::size_t>(a.peer) * p + r];
          if (q.empty()) break;
          span.end = std::max(clock[r], q.front());
          q.pop_front();
        } else {
          span.end = clock[r] + action_cost(s, a, stage_costs[static_cast<std::size_t>(r)]);
          if (is_send(a.kind))
            channel[static_cast<std::size_t>(r) * p + a.peer].push_back(span.end);
          else
            out.busy[r] += span.end - span.start;
        }
        clock[r] = span.end;
        progress = true;
      }
    }
  }
  for (int r = 0; r < p; ++r)
    NDMESH_CHECK(pc[r] == s.actions[r].size(), "pp",
                 "stage {} action {} ({}) never completes; run check_schedule() for the cause", r, pc[r],
                 to_string(s.actions[r][pc[r]]));

  out.makespan = *std::max_element(clock.begin(), clock.end());
  double busy = 0;
  for (double b : out.busy) busy += b;
  out.bubble_fraction = out.makespan > 0 ? 1.0 - busy / (p * out.makespan) : 0.0;

  // Actions of one stage are sequential, so the running count in list order is exact.
  for (int r = 0; r < p; ++r) {
    int now = 0, peak = 0;
    for (const Action& a : s.actions[r]) {
      if (a.kind == ActionKind::kForward) peak = std::max(peak, ++now);
      if (a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardInput) --now;
    }
    out.peak_in_flight_chunks.push_back(peak);
    out.peak_in_flight.push_back(static_cast<double>(peak) / s.chunks);
  }
  return out;
}

}  // namespace ndmesh::pp
