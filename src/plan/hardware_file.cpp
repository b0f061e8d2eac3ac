// Hardware files (toml++): every key of [hardware] is checked by name and type, so a typo
// is an error naming the key rather than a silent default.
#include "ndmesh/plan/hardware_file.hpp"

#include <algorithm>
#include <filesystem>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <toml++/toml.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/plan/formulas.hpp"
#include "units.hpp"

namespace ndmesh::plan {
namespace {

using units::kGiB;

const std::vector<std::string_view> kKeys = {"name",
                                             "memory_gib",
                                             "reserved_gib",
                                             "peak_tflops",
                                             "achievable_fraction",
                                             "intra_node_gbps",
                                             "inter_node_gbps",
                                             "gpus_per_node",
                                             "memory_gbps",
                                             "intra_node_latency_us",
                                             "inter_node_latency_us",
                                             "gemm_overhead_us",
                                             "disk_read_gbps",
                                             "disk_write_gbps",
                                             "bf16_tflops",
                                             "attention_tflops",
                                             "bf16_attention_tflops",
                                             "host_to_device_gbps",
                                             "device_to_host_gbps",
                                             "source"};

// The [gemm] section: measured products, four arrays of one length.
const std::vector<std::string_view> kGemmKeys = {"m", "n", "k", "tflops", "source"};

// The [gemm] arrays as points; ConfigError naming the key for a wrong type, length or value.
std::vector<GemmPoint> gemm_points(const toml::table& g, const std::string& path) {
  for (const auto& [key, value] : g) {
    (void)value;
    NDMESH_CHECK_CONFIG(std::find(kGemmKeys.begin(), kGemmKeys.end(), key.str()) != kGemmKeys.end(), "plan",
                        "--hardware {}: unknown key 'gemm.{}'; known keys: {}", path, key.str(),
                        fmt::join(kGemmKeys, ", "));
  }
  auto array = [&](std::string_view key) {
    const toml::array* a = g[key].as_array();
    NDMESH_CHECK_CONFIG(a != nullptr, "plan",
                        "--hardware {}: gemm.{} must be an array of numbers, e.g. {} = [4096, 8192]", path,
                        key, key);
    std::vector<double> out;
    for (const toml::node& n : *a) {
      NDMESH_CHECK_CONFIG(n.is_number(), "plan", "--hardware {}: gemm.{} holds a value that is not a number",
                          path, key);
      out.push_back(n.is_integer() ? static_cast<double>(*n.value<std::int64_t>()) : *n.value<double>());
    }
    return out;
  };
  const auto m = array("m"), n = array("n"), k = array("k"), tflops = array("tflops");
  NDMESH_CHECK_CONFIG(
      n.size() == m.size() && k.size() == m.size() && tflops.size() == m.size(), "plan",
      "--hardware {}: gemm.m, n, k and tflops have {}, {}, {} and {} entries; give one per product", path,
      m.size(), n.size(), k.size(), tflops.size());
  std::vector<GemmPoint> out;
  for (std::size_t i = 0; i < m.size(); ++i)
    out.push_back({.m = m[i], .n = n[i], .k = k[i], .flops = tflops[i] * 1e12});
  return out;
}

// The keys a GPU calibration adds (none when the file is a CPU's).
std::string gpu_keys(const Hardware& hw) {
  std::string out;
  if (hw.bf16_flops > 0) out += fmt::format("bf16_tflops = {:.6g}\n", hw.bf16_flops / 1e12);
  if (hw.attention_flops > 0) out += fmt::format("attention_tflops = {:.6g}\n", hw.attention_flops / 1e12);
  if (hw.bf16_attention_flops > 0)
    out += fmt::format("bf16_attention_tflops = {:.6g}\n", hw.bf16_attention_flops / 1e12);
  if (hw.host_to_device_bw > 0 || hw.device_to_host_bw > 0)
    out += fmt::format("host_to_device_gbps = {:.6g}\ndevice_to_host_gbps = {:.6g}\n", hw.host_to_device_bw / 1e9,
                       hw.device_to_host_bw / 1e9);
  return out;
}

}  // namespace

Hardware load_hardware_file(const std::string& path) {
  toml::table root;
  try {
    root = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    fail<ConfigError>("plan", "--hardware {}: not a TOML hardware file: {} (line {})", path, e.description(),
                      e.source().begin.line);
  }
  for (const auto& [key, value] : root) {
    (void)value;
    NDMESH_CHECK_CONFIG(
        key.str() == "hardware" || key.str() == "measured" || key.str() == "gemm", "plan",
        "--hardware {}: unknown section '{}'; a hardware file has [hardware], [gemm] and [measured]", path,
        key.str());
  }
  const toml::table* hw_table = root["hardware"].as_table();
  NDMESH_CHECK_CONFIG(hw_table != nullptr, "plan",
                      "--hardware {}: no [hardware] section; write one with `ndmesh calibrate --output {}`",
                      path, path);
  for (const auto& [key, value] : *hw_table) {
    (void)value;
    NDMESH_CHECK_CONFIG(std::find(kKeys.begin(), kKeys.end(), key.str()) != kKeys.end(), "plan",
                        "--hardware {}: unknown key 'hardware.{}'; known keys: {}", path, key.str(),
                        fmt::join(kKeys, ", "));
  }
  auto number = [&](std::string_view key, std::optional<double> fallback) -> double {
    const toml::node* n = hw_table->get(key);
    if (n == nullptr) {
      NDMESH_CHECK_CONFIG(fallback.has_value(), "plan", "--hardware {}: missing key 'hardware.{}'", path,
                          key);
      return *fallback;
    }
    NDMESH_CHECK_CONFIG(n->is_number(), "plan", "--hardware {}: hardware.{} must be a number, e.g. {} = 1.5",
                        path, key, key);
    return n->is_integer() ? static_cast<double>(*n->value<std::int64_t>()) : *n->value<double>();
  };
  auto text = [&](std::string_view key, const std::string& fallback) {
    const toml::node* n = hw_table->get(key);
    if (n == nullptr) return fallback;
    NDMESH_CHECK_CONFIG(n->is_string(), "plan", "--hardware {}: hardware.{} must be a string", path, key);
    return std::string(*n->value<std::string_view>());
  };

  Hardware hw;
  hw.name = text("name", std::filesystem::path(path).stem().string());
  hw.source = text("source", "hardware file " + path);
  hw.memory_bytes = number("memory_gib", std::nullopt) * kGiB;
  hw.reserved_bytes = number("reserved_gib", 0.0) * kGiB;
  hw.peak_flops = number("peak_tflops", std::nullopt) * 1e12;
  hw.achievable_fraction = number("achievable_fraction", 1.0);
  hw.intra_node_bw = number("intra_node_gbps", std::nullopt) * 1e9;
  hw.inter_node_bw = number("inter_node_gbps", hw.intra_node_bw / 1e9) * 1e9;
  const double per_node = number("gpus_per_node", std::nullopt);
  NDMESH_CHECK_CONFIG(per_node >= 1 && per_node == static_cast<double>(static_cast<std::int64_t>(per_node)),
                      "plan", "--hardware {}: hardware.gpus_per_node = {} must be a whole number >= 1", path,
                      per_node);
  hw.gpus_per_node = static_cast<std::int64_t>(per_node);
  hw.memory_bw = number("memory_gbps", 0.0) * 1e9;
  hw.intra_node_latency = number("intra_node_latency_us", 0.0) * 1e-6;
  hw.disk_read_bw = number("disk_read_gbps", 0.0) * 1e9;
  hw.disk_write_bw = number("disk_write_gbps", 0.0) * 1e9;
  NDMESH_CHECK_CONFIG(hw.disk_read_bw >= 0 && hw.disk_write_bw >= 0, "plan",
                      "--hardware {}: hardware.disk_read_gbps and disk_write_gbps must be >= 0 (0: unknown)",
                      path);
  hw.inter_node_latency = number("inter_node_latency_us", hw.intra_node_latency * 1e6) * 1e-6;
  hw.bf16_flops = number("bf16_tflops", 0.0) * 1e12;
  hw.attention_flops = number("attention_tflops", 0.0) * 1e12;
  hw.bf16_attention_flops = number("bf16_attention_tflops", 0.0) * 1e12;
  hw.host_to_device_bw = number("host_to_device_gbps", 0.0) * 1e9;
  hw.device_to_host_bw = number("device_to_host_gbps", 0.0) * 1e9;
  if (const toml::table* g = root["gemm"].as_table()) {
    hw.gemm_points = gemm_points(*g, path);
    // Measured products give the per-kernel overhead unless the file states it.
    if (hw_table->get("gemm_overhead_us") == nullptr)
      hw.gemm_overhead = fit_gemm(hw.gemm_points, "--hardware " + path + ": [gemm]").overhead_s;
  }
  if (hw_table->get("gemm_overhead_us") != nullptr) hw.gemm_overhead = number("gemm_overhead_us", 0.0) * 1e-6;
  const auto probs = hardware_problems(hw);
  if (!probs.empty()) {
    // Name the file keys rather than the override flags.
    std::string p = probs.front();
    for (auto [flag, key] : {std::pair{"--gpu-memory-gib", "memory_gib"},
                             {"--reserved-gib", "reserved_gib"},
                             {"--peak-tflops", "peak_tflops"},
                             {"--efficiency", "achievable_fraction"},
                             {"--intra-node-gbps", "intra_node_gbps"},
                             {"--inter-node-gbps", "inter_node_gbps"},
                             {"--gpus-per-node", "gpus_per_node"},
                             {"--memory-gbps", "memory_gbps"},
                             {"--intra-node-latency-us", "intra_node_latency_us"},
                             {"--inter-node-latency-us", "inter_node_latency_us"},
                             {"--gemm-overhead-us", "gemm_overhead_us"},
                             {"bf16_tflops", "bf16_tflops"},
                             {"attention_tflops", "attention_tflops"},
                             {"host_to_device_gbps", "host_to_device_gbps"}}) {
      const std::string f(flag);
      if (p.rfind(f, 0) == 0) p = "hardware." + std::string(key) + p.substr(f.size());
    }
    fail<ConfigError>("plan", "--hardware {}: {}", path, p);
  }
  return hw;
}

Hardware hardware_by_name_or_file(const std::string& name_or_path) {
  for (const Hardware& h : hardware_presets())
    if (h.name == name_or_path) return h;
  std::error_code ec;
  if (std::filesystem::is_regular_file(name_or_path, ec)) return load_hardware_file(name_or_path);
  const bool looks_like_path =
      name_or_path.find('/') != std::string::npos || name_or_path.find(".toml") != std::string::npos;
  if (looks_like_path)
    fail<ConfigError>("plan",
                      "--hardware {}: no such file; write one with `ndmesh calibrate --output {}` or use "
                      "a preset: {}",
                      name_or_path, name_or_path, hardware_preset_names());
  return hardware_preset(name_or_path);  // ConfigError listing the presets
}

std::string hardware_file_text(const Hardware& hw) {
  return fmt::format(
      "[hardware]\n"
      "name = \"{}\"\n"
      "memory_gib = {:.3f}\n"
      "reserved_gib = {:.3f}\n"
      "peak_tflops = {:.6g}\n"
      "achievable_fraction = {:.6g}\n"
      "intra_node_gbps = {:.6g}\n"
      "inter_node_gbps = {:.6g}\n"
      "gpus_per_node = {}\n"
      "memory_gbps = {:.6g}\n"
      "intra_node_latency_us = {:.6g}\n"
      "inter_node_latency_us = {:.6g}\n"
      "gemm_overhead_us = {:.6g}\n"
      "disk_read_gbps = {:.6g}\n"
      "disk_write_gbps = {:.6g}\n"
      "{}"
      "source = \"{}\"\n",
      hw.name, hw.memory_bytes / kGiB, hw.reserved_bytes / kGiB, hw.peak_flops / 1e12, hw.achievable_fraction,
      hw.intra_node_bw / 1e9, hw.inter_node_bw / 1e9, hw.gpus_per_node, hw.memory_bw / 1e9,
      hw.intra_node_latency * 1e6, hw.inter_node_latency * 1e6, hw.gemm_overhead * 1e6, hw.disk_read_bw / 1e9,
      hw.disk_write_bw / 1e9, gpu_keys(hw), hw.source);
}

}  // namespace ndmesh::plan
