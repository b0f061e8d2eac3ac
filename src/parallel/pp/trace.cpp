#include "ndmesh/parallel/pp/trace.hpp"

#include <algorithm>
#include <array>
#include <fstream>
#include <map>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ndmesh/core/error.hpp"

namespace ndmesh::pp {

void TraceRecorder::add(int pipeline, int stage, int step, const std::vector<ActionTiming>& timings) {
  std::vector<TraceEvent> events;
  events.reserve(timings.size());
  for (const ActionTiming& t : timings)
    events.push_back({.pipeline = pipeline, .stage = stage, .step = step, .action = t.action, .start = t.start, .end = t.end});
  steps_.push_back(std::move(events));
  while (static_cast<std::int64_t>(steps_.size()) > window_) steps_.pop_front();
}

std::vector<TraceEvent> TraceRecorder::events() const {
  std::vector<TraceEvent> out;
  for (const auto& s : steps_) out.insert(out.end(), s.begin(), s.end());
  return out;
}

namespace {
// An event as 8 doubles on the wire: pipeline, stage, step, kind, micro-batch, chunk, start, end.
constexpr std::size_t kFields = 8;
}  // namespace

std::vector<TraceEvent> gather_trace(const comm::Communicator& world, const std::vector<TraceEvent>& mine) {
  constexpr int kTraceTag = 77;  // every rank's events, to rank 0
  std::vector<double> flat;
  flat.reserve(mine.size() * kFields);
  for (const TraceEvent& e : mine)
    flat.insert(flat.end(), {static_cast<double>(e.pipeline), static_cast<double>(e.stage), static_cast<double>(e.step),
                             static_cast<double>(e.action.kind), static_cast<double>(e.action.microbatch),
                             static_cast<double>(e.action.chunk), e.start, e.end});
  const auto count = static_cast<std::int64_t>(flat.size());
  std::vector<std::int64_t> counts(static_cast<std::size_t>(world.size()));
  world.all_gather(std::span<const std::int64_t>(&count, 1), std::span<std::int64_t>(counts));
  if (world.rank() != 0) {
    if (count > 0) world.send(std::span<const double>(flat), 0, {.tag = kTraceTag});
    return {};
  }
  std::vector<TraceEvent> all = mine;
  for (int k = 1; k < world.size(); ++k) {
    const auto n = static_cast<std::size_t>(counts[static_cast<std::size_t>(k)]);
    if (n == 0) continue;
    std::vector<double> theirs(n);
    world.recv(std::span<double>(theirs), k, {.tag = kTraceTag});
    for (std::size_t i = 0; i + kFields <= n; i += kFields) {
      const double* f = &theirs[i];
      all.push_back({.pipeline = static_cast<int>(f[0]),
                     .stage = static_cast<int>(f[1]),
                     .step = static_cast<int>(f[2]),
                     .action = {.kind = static_cast<ActionKind>(static_cast<int>(f[3])),
                                .microbatch = static_cast<int>(f[4]),
                                .chunk = static_cast<int>(f[5])},
                     .start = f[6],
                     .end = f[7]});
    }
  }
  return all;
}

TraceAnalysis analyse_trace(const std::vector<TraceEvent>& events, const PipelineSchedule& s, int first_step_of_run) {
  TraceAnalysis r;
  r.events = static_cast<std::int64_t>(events.size());
  // Leave out the run's first step (allocation, cold caches) unless it is all there is.
  bool later = false;
  for (const TraceEvent& e : events) later = later || e.step != first_step_of_run;
  struct Window {
    double start = 1e300, end = -1e300, busy = 0;
  };
  std::map<std::pair<int, int>, Window> windows;  // by (pipeline, step)
  double sum_f = 0, sum_b = 0, sum_w = 0;
  int n_f = 0, n_b = 0, n_w = 0;
  // Per stage: sums and counts of forward, backward (or B) and W durations.
  std::vector<std::array<double, 6>> per_stage(static_cast<std::size_t>(s.stages), std::array<double, 6>{});
  bool split = false;
  for (const TraceEvent& e : events) {
    if (later && e.step == first_step_of_run) continue;
    Window& w = windows[{e.pipeline, e.step}];
    w.start = std::min(w.start, e.start);
    w.end = std::max(w.end, e.end);
    const double d = e.end - e.start;
    const ActionKind kind = e.action.kind;
    if (is_p2p(kind)) continue;
    w.busy += d;
    if (kind == ActionKind::kForward) sum_f += d, ++n_f;
    if (kind == ActionKind::kBackward || kind == ActionKind::kBackwardInput) sum_b += d, ++n_b;
    if (kind == ActionKind::kBackwardWeight) sum_w += d, ++n_w, split = true;
    if (e.stage < 0 || e.stage >= s.stages) continue;
    auto& st = per_stage[static_cast<std::size_t>(e.stage)];
    const int slot = kind == ActionKind::kForward ? 0 : kind == ActionKind::kBackwardWeight ? 2 : 1;
    st[static_cast<std::size_t>(slot)] += d;
    st[static_cast<std::size_t>(slot + 3)] += 1;
  }
  std::set<int> steps;
  double bubble = 0;
  for (const auto& [k, w] : windows) {
    steps.insert(k.second);
    bubble += w.end > w.start ? 1.0 - w.busy / (static_cast<double>(s.stages) * (w.end - w.start)) : 0.0;
  }
  r.steps = static_cast<int>(steps.size());
  r.bubble_measured = windows.empty() ? 0.0 : bubble / static_cast<double>(windows.size());
  const double v = s.chunks;
  const double f = n_f ? sum_f / n_f * v : 1.0, b = n_b ? sum_b / n_b * v : 2.0, w = n_w ? sum_w / n_w * v : 0.0;
  // A full backward is simulated as B + W; the simulator wants both positive.
  const double tiny = 1e-6 * std::max(f, 1e-12);
  auto costs = [&](double cf, double cb, double cw) {
    return split ? Costs{.forward = std::max(cf, tiny), .backward_input = std::max(cb, tiny),
                         .backward_weight = std::max(cw, tiny)}
                 : Costs{.forward = std::max(cf, tiny), .backward_input = std::max(cb / 2, tiny),
                         .backward_weight = std::max(cb / 2, tiny)};
  };
  r.costs = costs(f, b, w);
  r.bubble_simulated = simulate(s, r.costs).bubble_fraction;
  std::vector<Costs> stage_costs;
  for (const auto& st : per_stage) {
    auto mean = [&](int k, double fallback) {
      const double n = st[static_cast<std::size_t>(k + 3)];
      return n > 0 ? st[static_cast<std::size_t>(k)] / n * v : fallback;
    };
    stage_costs.push_back(costs(mean(0, f), mean(1, b), mean(2, w)));
  }
  r.bubble_simulated_stages = simulate_stages(s, stage_costs).bubble_fraction;
  return r;
}

void write_chrome_trace(const std::string& path, const PipelineSchedule& s, const std::vector<TraceEvent>& events) {
  std::ofstream out(path);
  if (!out) fail<IoError>("train", "--trace={}: cannot write the file; check the folder", path);
  out << fmt::format(
      "{{\"ndmesh\": {{\"schedule\": \"{}\", \"stages\": {}, \"microbatches\": {}, \"chunks\": {}}},\n"
      "\"displayTimeUnit\": \"ms\",\n\"traceEvents\": [\n",
      schedule_name(s.kind), s.stages, s.microbatches, s.chunks);
  bool first = true;
  for (const TraceEvent& e : events) {
    const Action& a = e.action;
    out << (first ? "" : ",\n")
        << fmt::format("{{\"name\": \"{}{}{}\", \"cat\": \"{}\", \"ph\": \"X\", \"pid\": {}, \"tid\": {}, "
                       "\"ts\": {:.3f}, \"dur\": {:.3f}, \"args\": {{\"step\": {}, \"microbatch\": {}, "
                       "\"chunk\": {}}}}}",
                       action_kind_letter(a.kind), a.microbatch, s.chunks > 1 ? fmt::format(".{}", a.chunk) : "",
                       action_kind_name(a.kind), e.pipeline, e.stage, e.start * 1e6, (e.end - e.start) * 1e6,
                       e.step + 1, a.microbatch, a.chunk);
    first = false;
  }
  std::set<int> pipelines;
  for (const TraceEvent& e : events) pipelines.insert(e.pipeline);
  for (int pl : pipelines) {
    out << (first ? "" : ",\n")
        << fmt::format("{{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": {}, \"args\": {{\"name\": "
                       "\"pipeline {}\"}}}}",
                       pl, pl);
    first = false;
    for (int st = 0; st < s.stages; ++st)
      out << fmt::format(",\n{{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": {}, \"tid\": {}, \"args\": "
                         "{{\"name\": \"stage {}\"}}}}",
                         pl, st, st);
  }
  out << "\n]}\n";
  if (!out) fail<IoError>("train", "--trace={}: writing failed (disk full?)", path);
}

std::pair<PipelineSchedule, std::vector<TraceEvent>> read_chrome_trace(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    fail<ConfigError>("schedule", "--trace {}: cannot read the file; pass a file written by ndmesh train --trace",
                      path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    fail<ConfigError>("schedule", "--trace {}: not JSON ({}); pass a file written by ndmesh train --trace", path,
                      e.what());
  }
  if (!j.is_object() || !j.contains("ndmesh") || !j.contains("traceEvents"))
    fail<ConfigError>("schedule", "--trace {}: no ndmesh pipeline header; pass a file written by ndmesh train --trace",
                      path);
  PipelineSchedule s;
  std::vector<TraceEvent> events;
  try {
    s.kind = parse_schedule(j["ndmesh"]["schedule"].get<std::string>());
    s.stages = j["ndmesh"]["stages"].get<int>();
    s.microbatches = j["ndmesh"]["microbatches"].get<int>();
    s.chunks = j["ndmesh"]["chunks"].get<int>();
    for (const auto& e : j["traceEvents"]) {
      if (e.value("ph", "") != "X") continue;
      const std::string cat = e["cat"].get<std::string>();
      bool known = false;
      TraceEvent t;
      for (int k = 0; k <= static_cast<int>(ActionKind::kRecvGradient); ++k)
        if (action_kind_name(static_cast<ActionKind>(k)) == cat) {
          t.action.kind = static_cast<ActionKind>(k);
          known = true;
        }
      if (!known) continue;
      t.pipeline = e["pid"].get<int>();
      t.stage = e["tid"].get<int>();
      t.step = e["args"]["step"].get<int>() - 1;
      t.action.microbatch = e["args"]["microbatch"].get<int>();
      t.action.chunk = e["args"]["chunk"].get<int>();
      t.start = e["ts"].get<double>() * 1e-6;
      t.end = t.start + e["dur"].get<double>() * 1e-6;
      events.push_back(t);
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    fail<ConfigError>("schedule", "--trace {}: malformed ({}); pass a file written by ndmesh train --trace", path,
                      e.what());
  }
  return {std::move(s), std::move(events)};
}

std::pair<PipelineSchedule, Simulation> measured_timeline(const PipelineSchedule& shape,
                                                          const std::vector<TraceEvent>& events, int pipeline,
                                                          int step) {
  PipelineSchedule s = shape;
  s.actions.assign(static_cast<std::size_t>(s.stages), {});
  int last_step = -1;
  for (const TraceEvent& e : events)
    if (e.pipeline == pipeline) last_step = std::max(last_step, e.step);
  const int want = step >= 0 ? step : last_step;
  std::vector<std::vector<const TraceEvent*>> timed(static_cast<std::size_t>(s.stages));
  double origin = 1e300;
  for (const TraceEvent& e : events) {
    if (e.pipeline != pipeline || e.step != want || e.stage < 0 || e.stage >= s.stages) continue;
    origin = std::min(origin, e.start);
    timed[static_cast<std::size_t>(e.stage)].push_back(&e);
  }
  if (origin == 1e300)
    fail<ConfigError>("schedule",
                      "no actions of pipeline {} at step {} in the trace; use --trace-pipeline and --trace-step "
                      "with values from the file",
                      pipeline, want + 1);
  Simulation sim;
  sim.busy.assign(static_cast<std::size_t>(s.stages), 0.0);
  sim.spans.resize(static_cast<std::size_t>(s.stages));
  double busy = 0;
  for (int r = 0; r < s.stages; ++r) {
    auto& list = timed[static_cast<std::size_t>(r)];
    std::stable_sort(list.begin(), list.end(), [](const TraceEvent* x, const TraceEvent* y) { return x->start < y->start; });
    int now = 0, peak = 0;
    for (const TraceEvent* t : list) {
      s.actions[static_cast<std::size_t>(r)].push_back(t->action);
      sim.spans[static_cast<std::size_t>(r)].push_back({t->start - origin, t->end - origin});
      sim.makespan = std::max(sim.makespan, t->end - origin);
      if (!is_p2p(t->action.kind)) sim.busy[static_cast<std::size_t>(r)] += t->end - t->start;
      if (t->action.kind == ActionKind::kForward) peak = std::max(peak, ++now);
      if (t->action.kind == ActionKind::kBackward || t->action.kind == ActionKind::kBackwardInput) --now;
    }
    busy += sim.busy[static_cast<std::size_t>(r)];
    sim.peak_in_flight_chunks.push_back(peak);
    sim.peak_in_flight.push_back(static_cast<double>(peak) / s.chunks);
  }
  sim.bubble_fraction = sim.makespan > 0 ? 1.0 - busy / (s.stages * sim.makespan) : 0.0;
  return {std::move(s), std::move(sim)};
}

}  // namespace ndmesh::pp
