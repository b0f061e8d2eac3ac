// A Google Benchmark reporter that, after the usual table, prints each benchmark's time
// as a ratio against a baseline measured in the same run. These machines are shared and
// noisy: absolute times move from run to run, ratios far less.
//
//   int main(int argc, char** argv) {
//     return ndmesh::bench::run_with_ratios(argc, argv, {{"BM_Query", "BM_Baseline"}});
//   }
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <benchmark/benchmark.h>
#include <fmt/core.h>

namespace ndmesh::bench {

/// Records every run's time per iteration (ns) while printing the usual console table.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    // With repetitions the median (reported after the single runs) wins.
    for (const auto& run : runs)
      if (run.run_type == Run::RT_Iteration || run.aggregate_name == "median") {
        ns_[run.run_name.str()] = run.GetAdjustedRealTime() * to_ns(run.time_unit);
        cpu_ns_[run.run_name.str()] = run.GetAdjustedCPUTime() * to_ns(run.time_unit);
      }
    ConsoleReporter::ReportRuns(runs);
  }
  /// Wall time per iteration in ns of the benchmark `name` (median over repetitions), or -1.
  double ns(const std::string& name) const { return find(ns_, name); }
  /// CPU time per iteration in ns (less disturbed than wall time on a busy machine), or -1.
  double cpu_ns(const std::string& name) const { return find(cpu_ns_, name); }

 private:
  static double to_ns(benchmark::TimeUnit unit) {
    switch (unit) {
      case benchmark::kNanosecond:
        return 1;
      case benchmark::kMicrosecond:
        return 1e3;
      case benchmark::kMillisecond:
        return 1e6;
      case benchmark::kSecond:
        return 1e9;
    }
    return 1;
  }
  static double find(const std::map<std::string, double>& m, const std::string& name) {
    auto it = m.find(name);
    return it == m.end() ? -1 : it->second;
  }
  std::map<std::string, double> ns_, cpu_ns_;
};

/// Runs the registered benchmarks, then prints "name / baseline = ratio" for each pair.
inline int run_with_ratios(int argc, char** argv,
                           const std::vector<std::pair<std::string, std::string>>& pairs,
                           const std::string& ratio_name = "ratio") {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  fmt::print("\n{:<40} {:>14} {:>14} {:>8} {:>10}\n", "benchmark vs baseline (same run)", "ns", "baseline ns",
             ratio_name, "cpu " + ratio_name);
  for (const auto& [name, baseline] : pairs) {
    double a = reporter.ns(name), b = reporter.ns(baseline);
    double ca = reporter.cpu_ns(name), cb = reporter.cpu_ns(baseline);
    if (a < 0 || b <= 0 || cb <= 0) continue;
    fmt::print("{:<40} {:>14.2f} {:>14.2f} {:>8.2f} {:>10.2f}\n", name, a, b, a / b, ca / cb);
  }
  benchmark::Shutdown();
  return 0;
}

}  // namespace ndmesh::bench
