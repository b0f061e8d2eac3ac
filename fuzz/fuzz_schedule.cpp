// Schedule options as `ndmesh schedule` takes them: a schedule name (first line), then
// pp, micro-batches and vpp as integers and the four costs as numbers, one per line.
// Valid options are generated, checked and simulated when small enough to be quick.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "fuzz_common.hpp"
#include "ndmesh/config/config.hpp"
#include "ndmesh/core/error.hpp"
#include "ndmesh/parallel/pp/check.hpp"
#include "ndmesh/parallel/pp/schedule.hpp"
#include "ndmesh/parallel/pp/simulate.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ndmesh;
  std::vector<std::string> lines;
  std::string_view rest = fuzz::text(data, size);
  while (!rest.empty() && lines.size() < 8) {
    auto [line, next] = fuzz::first_line(rest);
    lines.emplace_back(line);
    rest = next;
  }
  lines.resize(8);
  auto integer = [](const std::string& s, long long fallback) {
    return s.empty() ? fallback : std::strtoll(s.c_str(), nullptr, 10);
  };
  auto number = [](const std::string& s, double fallback) {
    return s.empty() ? fallback : std::strtod(s.c_str(), nullptr);
  };
  try {
    pp::ScheduleOptions o;
    o.schedule = parse_schedule(lines[0].empty() ? "1f1b" : lines[0]);
    // The CLI's int flags: values outside int are refused by CLI11 before they get here.
    auto to_int = [](long long v) { return static_cast<int>(std::clamp<long long>(v, INT32_MIN, INT32_MAX)); };
    o.stages = to_int(integer(lines[1], 4));
    o.microbatches = to_int(integer(lines[2], 8));
    o.chunks = to_int(integer(lines[3], 1));
    pp::Costs costs{.forward = number(lines[4], 1),
                    .backward_input = number(lines[5], 1),
                    .backward_weight = number(lines[6], 1),
                    .p2p = number(lines[7], 0)};
    if (!pp::schedule_option_problems(o).empty() || !pp::cost_problems(costs).empty()) return 0;
    if (static_cast<long long>(o.stages) * o.microbatches * o.chunks > 2048) return 0;
    pp::PipelineSchedule s = pp::make_schedule(o);
    pp::check_schedule(s);
    (void)pp::simulate(s, costs);
  } catch (const ConfigError&) {
  }
  return 0;
}
