// `ndmesh schedule`: generates a pipeline schedule, proves it with the checker, simulates
// it with the given costs and shows where the stages idle and how many activations they
// hold: an ASCII timeline (coloured on a terminal), optionally an SVG picture, and the
// numbers (or all of it as JSON with --json).
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "ndmesh/config/config.hpp"
#include "ndmesh/core/error.hpp"
#include "ndmesh/parallel/pp/check.hpp"
#include "ndmesh/parallel/pp/render.hpp"
#include "ndmesh/parallel/pp/schedule.hpp"
#include "ndmesh/parallel/pp/simulate.hpp"
#include "ndmesh/parallel/pp/trace.hpp"
#include "subcommand.hpp"

// Its own namespace: the tool compiles as a unity build (CMakeLists.txt), where every
// subcommand's file shares one translation unit with the others.
namespace ndmesh::cli::schedule_command {
namespace {

struct Options {
  int pp = 4;
  int microbatches = 8;
  std::string schedule = "1f1b";
  int vpp = 0;  // 0: 2 for interleaved, 1 otherwise
  pp::Costs costs;
  std::string svg;
  bool json = false;
  std::string color = "auto";
  std::string trace;  // draw a measured run (ndmesh train --trace) instead
  int pipeline = 0;
  int step = 0;  // 0: the last step in the trace
};

// Writes the timeline of a schedule (simulated or measured) as SVG to `path`.
void write_svg(const std::string& path, const pp::PipelineSchedule& s, const pp::Simulation& sim) {
  std::ofstream file(path);
  if (file) file << pp::svg_timeline(s, sim);
  if (!file)
    fail<ConfigError>("schedule", "--svg {} cannot be written ({}); use a path in an existing writable folder",
                      path, std::strerror(errno));
}

// A measured run as a schedule and its "simulation" (pp/trace.hpp): the actions of one
// pipeline and one step in the order they ran, with their measured spans.
std::pair<pp::PipelineSchedule, pp::Simulation> read_trace(const Options& o) {
  const auto [shape, events] = pp::read_chrome_trace(o.trace);
  return pp::measured_timeline(shape, events, o.pipeline, o.step > 0 ? o.step - 1 : -1);
}

int run_trace(const Options& o) {
  const auto [s, sim] = read_trace(o);
  if (!o.svg.empty()) write_svg(o.svg, s, sim);
  const bool color = o.color == "always" || (o.color == "auto" && ::isatty(::fileno(stdout)) != 0);
  fmt::print("measured {} run from {}, pipeline {}, pp={} microbatches={}{}; times in seconds\n",
             schedule_name(s.kind), o.trace, o.pipeline, s.stages, s.microbatches,
             s.chunks > 1 ? fmt::format(" vpp={}", s.chunks) : "");
  fmt::print("{}", pp::ascii_timeline(s, sim, {.color = color}));
  fmt::print("makespan {:.6f} s, measured bubble fraction {:.4f} (idle share of stage time)\n", sim.makespan,
             sim.bubble_fraction);
  fmt::print("peak activations in flight per stage (micro-batches): {}\n",
             fmt::join(sim.peak_in_flight, " "));
  if (!o.svg.empty()) fmt::print("wrote {}\n", o.svg);
  return 0;
}

nlohmann::ordered_json to_json(const pp::PipelineSchedule& s, const pp::Simulation& sim, const pp::Costs& c) {
  nlohmann::ordered_json out;
  out["schedule"] = std::string(schedule_name(s.kind));
  out["pp"] = s.stages;
  out["microbatches"] = s.microbatches;
  out["vpp"] = s.chunks;
  out["costs"] = {{"forward", c.forward},
                  {"backward_input", c.backward_input},
                  {"backward_weight", c.backward_weight},
                  {"p2p", c.p2p}};
  out["makespan"] = sim.makespan;
  out["bubble_fraction"] = sim.bubble_fraction;
  out["busy"] = sim.busy;
  out["peak_in_flight"] = sim.peak_in_flight;
  out["peak_in_flight_chunks"] = sim.peak_in_flight_chunks;
  auto stages = nlohmann::ordered_json::array();
  for (int r = 0; r < s.stages; ++r) {
    auto actions = nlohmann::ordered_json::array();
    for (std::size_t i = 0; i < s.actions[r].size(); ++i) {
      const pp::Action& a = s.actions[r][i];
      nlohmann::ordered_json j = {{"kind", std::string(pp::action_kind_name(a.kind))},
                                  {"microbatch", a.microbatch},
                                  {"chunk", a.chunk}};
      if (a.peer >= 0) j["peer"] = a.peer;
      j["start"] = sim.spans[r][i].start;
      j["end"] = sim.spans[r][i].end;
      actions.push_back(std::move(j));
    }
    stages.push_back(std::move(actions));
  }
  out["actions"] = std::move(stages);
  return out;
}

Schedule parse_schedule_flag(const std::string& name) {
  try {
    return parse_schedule(name);
  } catch (const ConfigError&) {
    fail<ConfigError>("schedule", "--schedule '{}' is unknown; use one of {}, {}, {}, {}", name,
                      schedule_name(Schedule::kGpipe), schedule_name(Schedule::k1F1B),
                      schedule_name(Schedule::kInterleaved), schedule_name(Schedule::kZbH1));
  }
}

int run(const Options& o) {
  if (!o.trace.empty()) return run_trace(o);
  const Schedule kind = parse_schedule_flag(o.schedule);
  if (o.color != "auto" && o.color != "always" && o.color != "never")
    fail<ConfigError>("schedule", "--color '{}' is unknown; use auto, always or never", o.color);
  const int vpp = o.vpp != 0 ? o.vpp : (kind == Schedule::kInterleaved ? 2 : 1);
  const pp::PipelineSchedule s =
      pp::make_schedule({.schedule = kind, .stages = o.pp, .microbatches = o.microbatches, .chunks = vpp});
  pp::check_schedule(s);  // generated schedules always pass; this keeps the promise visible
  const pp::Simulation sim = pp::simulate(s, o.costs);

  if (!o.svg.empty()) write_svg(o.svg, s, sim);
  if (o.json) {
    fmt::print("{}\n", to_json(s, sim, o.costs).dump(2));
    return 0;
  }
  const bool color = o.color == "always" || (o.color == "auto" && ::isatty(::fileno(stdout)) != 0);
  fmt::print(
      "{} schedule, pp={} microbatches={}{}; costs: forward {:g}, backward-input {:g}, backward-weight {:g}, "
      "p2p {:g}\n",
      schedule_name(kind), s.stages, s.microbatches, s.chunks > 1 ? fmt::format(" vpp={}", s.chunks) : "",
      o.costs.forward, o.costs.backward_input, o.costs.backward_weight, o.costs.p2p);
  fmt::print("{}", pp::ascii_timeline(s, sim, {.color = color}));
  fmt::print("makespan {:g}, bubble fraction {:.4f} (idle share of stage time)\n", sim.makespan,
             sim.bubble_fraction);
  fmt::print("peak activations in flight per stage (micro-batches): {}\n",
             fmt::join(sim.peak_in_flight, " "));
  if (!o.svg.empty()) fmt::print("wrote {}\n", o.svg);
  return 0;
}

Action setup(CLI::App& app) {
  auto o = std::make_shared<Options>();
  app.add_option("--pp", o->pp, "pipeline stages")->capture_default_str();
  app.add_option("--microbatches,-m", o->microbatches, "micro-batches per step")->capture_default_str();
  app.add_option("--schedule,-s", o->schedule, "gpipe, 1f1b, interleaved or zb-h1")->capture_default_str();
  app.add_option("--vpp,--virtual-stages", o->vpp,
                 "virtual stages (model chunks) per rank for interleaved; default 2 there, else 1");
  app.add_option("--cost-forward", o->costs.forward, "time of a stage's forward")->capture_default_str();
  app.add_option("--cost-backward-input", o->costs.backward_input,
                 "time of a stage's input-gradient backward")
      ->capture_default_str();
  app.add_option("--cost-backward-weight", o->costs.backward_weight,
                 "time of a stage's weight-gradient backward")
      ->capture_default_str();
  app.add_option("--cost-p2p", o->costs.p2p, "time of one send between stages")->capture_default_str();
  app.add_option("--svg", o->svg, "also write the timeline as an SVG picture to this file");
  app.add_flag("--json", o->json,
               "print everything as JSON instead (makespan, bubble_fraction, peak_in_flight, ...)");
  app.add_option("--trace", o->trace,
                 "draw a measured run instead: a Chrome trace written by ndmesh train --trace (with --svg)");
  app.add_option("--trace-pipeline", o->pipeline, "with --trace: which pipeline (dp rank)")
      ->capture_default_str();
  app.add_option("--trace-step", o->step, "with --trace: which step (0: the last)")->capture_default_str();
  app.add_option("--color", o->color, "auto (when stdout is a terminal), always or never")
      ->capture_default_str();
  app.footer(
      "A full backward costs backward-input + backward-weight; with --vpp v each chunk costs 1/v of a "
      "stage.\n"
      "Example: ndmesh schedule --pp 4 -m 8 --schedule zb-h1 --svg zb.svg");
  return [o] { return run(*o); };
}

const Subcommand kSchedule{"schedule", "Generate, check, simulate and draw a pipeline schedule", setup};

}  // namespace
}  // namespace ndmesh::cli::schedule_command
