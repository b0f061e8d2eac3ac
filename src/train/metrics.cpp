#include "ndmesh/train/metrics.hpp"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "ndmesh/core/error.hpp"

namespace ndmesh::train {

using json = nlohmann::ordered_json;

namespace {
// A number or null (NaN and infinities are not JSON).
json number(double x) { return std::isfinite(x) ? json(x) : json(nullptr); }
}  // namespace

MetricsFile::MetricsFile(std::string path, std::optional<std::int64_t> resumed_at) : path_(std::move(path)) {
  if (resumed_at && std::filesystem::exists(path_)) {
    // Keep what the earlier run wrote up to the checkpoint; lines that are not ours stay.
    std::ifstream in(path_);
    std::string kept, line;
    while (std::getline(in, line)) {
      const json j = json::parse(line, nullptr, false);
      if (!j.is_discarded() && j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
          j["step"].get<std::int64_t>() > *resumed_at)
        continue;
      kept += line + "\n";
    }
    const std::string tmp = path_ + ".tmp";
    std::FILE* out = std::fopen(tmp.c_str(), "wb");
    const bool ok = out != nullptr && std::fwrite(kept.data(), 1, kept.size(), out) == kept.size() &&
                    std::fclose(out) == 0 && std::rename(tmp.c_str(), path_.c_str()) == 0;
    if (!ok)
      fail<IoError>("train", "--metrics={}: cannot rewrite the file to resume it: {}", path_,
                    std::strerror(errno));
  }
  file_ = std::fopen(path_.c_str(), resumed_at ? "ab" : "wb");
  if (file_ == nullptr)
    fail<IoError>("train", "--metrics={}: cannot open the file: {}", path_, std::strerror(errno));
}

MetricsFile::~MetricsFile() {
  if (file_ != nullptr) std::fclose(file_);
}

void MetricsFile::on_step(const StepRecord& r) {
  json j;
  j["step"] = r.stats.step;
  j["loss"] = number(r.stats.loss);
  j["lr"] = r.stats.lr;
  j["grad_norm"] = number(r.stats.grad_norm);
  if (!r.stats.expert_load.empty()) {  // a mixture of experts
    j["aux_loss"] = number(r.stats.aux_loss);
    j["expert_load"] = r.stats.expert_load;
  }
  j["tokens_per_second"] = r.tokens_per_second;
  j["mfu"] = r.mfu ? number(*r.mfu) : json(nullptr);
  j["peak_memory_bytes"] = static_cast<std::int64_t>(r.peak_memory_bytes);
  j["elapsed_s"] = r.elapsed_s;
  if (r.val_loss) j["val_loss"] = number(*r.val_loss);
  const std::string line = j.dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0)
    fail<IoError>("train", "--metrics={}: cannot write: {} (disk full?)", path_, std::strerror(errno));
}

std::vector<MetricsRow> read_metrics_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    fail<ConfigError>(
        "plot", "{}: no such file; pass a metrics file written by ndmesh train --metrics FILE.jsonl", path);
  std::ifstream in(path);
  if (!in) fail<ConfigError>("plot", "{}: cannot read the file; check its permissions", path);
  std::vector<MetricsRow> rows;
  std::string line;
  for (std::int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const json j = json::parse(line, nullptr, false);
    auto bad = [&](const std::string& what) {
      fail<ConfigError>(
          "plot",
          "{}:{}: {}; each line of a metrics file is one JSON object with \"step\" and \"loss\" "
          "(ndmesh train --metrics)",
          path, n, what);
    };
    if (j.is_discarded()) bad("not JSON");
    if (!j.is_object()) bad("not a JSON object");
    if (!j.contains("step") || !j["step"].is_number_integer()) bad("no whole-number \"step\"");
    MetricsRow r;
    r.step = j["step"].get<std::int64_t>();
    if (!j.contains("loss") || !(j["loss"].is_number() || j["loss"].is_null())) bad("no numeric \"loss\"");
    r.loss = j["loss"].is_number() ? j["loss"].get<double>() : NAN;
    if (j.contains("lr")) {
      if (!j["lr"].is_number()) bad("\"lr\" is not a number");
      r.lr = j["lr"].get<double>();
    }
    if (j.contains("val_loss") && !j["val_loss"].is_null()) {
      if (!j["val_loss"].is_number()) bad("\"val_loss\" is not a number");
      r.val_loss = j["val_loss"].get<double>();
    }
    if (!rows.empty() && r.step <= rows.back().step)
      bad(fmt::format("step {} after step {}; the steps of a metrics file increase (two runs in one file?)",
                      r.step, rows.back().step));
    rows.push_back(r);
  }
  if (rows.empty())
    fail<ConfigError>("plot", "{}: no metrics lines; pass a file written by ndmesh train --metrics", path);
  return rows;
}

}  // namespace ndmesh::train
