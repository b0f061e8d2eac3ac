// Model and hardware presets for the planner.
//
// Model shapes are typed in from their papers (cited per group below). Hardware numbers are
// vendor datasheet figures; the achievable fraction of peak and the reserved memory are our
// assumptions (stated in `ndmesh plan --explain` and overridable from the command line).
#include "ndmesh/plan/presets.hpp"

#include <fmt/core.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/plan/formulas.hpp"
#include "units.hpp"

namespace ndmesh::plan {
namespace {

using units::kGiB;
using units::kMiB;

std::string join_names(const auto& items) {
  std::string out;
  for (const auto& item : items) {
    if (!out.empty()) out += ", ";
    out += item.name;
  }
  return out;
}

}  // namespace

const std::vector<ModelPreset>& model_presets() { return ndmesh::model_presets(); }

PlanModel model_preset(std::string_view name) {
  for (const ModelPreset& p : ndmesh::model_presets())
    if (p.name == name) return {.spec = p.spec, .dropout = p.dropout};
  fail<ConfigError>("plan",
                    "--model '{}' is not a preset; use one of {}, or describe the model with --layers --hidden "
                    "--heads --vocab",
                    name, model_preset_names());
}

std::string model_preset_names() { return ndmesh::model_preset_names(); }

const std::vector<GemmPoint>& h100_gemm_points() {
  // OpenXLA's default matmul performance table for sm_90 (H100 SXM), bf16 x bf16 -> bf16,
  // batch 1: xla/service/gpu/model/matmul_interpolator_data.h (tensorflow/tensorflow,
  // third_party/xla, 2025), the entries with every dimension >= 512, in TFLOP/s.
  static const std::vector<GemmPoint> kPoints = [] {
    const double t[][4] = {{4096, 512, 512, 238.8},   {2048, 2048, 2048, 632.0}, {4096, 1024, 512, 343.7},
                           {512, 4096, 1024, 373.3},  {4096, 4096, 4096, 783.3}, {4096, 2048, 512, 447.0},
                           {1024, 1024, 2048, 350.0}, {1024, 512, 2048, 220.0},  {512, 2048, 1024, 232.6},
                           {4096, 512, 1024, 370.8},  {1024, 2048, 2048, 524.3}, {2048, 512, 2048, 347.7},
                           {2048, 1024, 2048, 523.3}, {4096, 1024, 1024, 488.1}, {1024, 2048, 1024, 373.3},
                           {4096, 4096, 512, 543.1},  {512, 2048, 2048, 342.4},  {512, 1024, 2048, 216.5},
                           {2048, 4096, 1024, 594.2}, {4096, 4096, 2048, 738.7}, {512, 512, 2048, 114.7},
                           {4096, 512, 4096, 650.0},  {1024, 4096, 1024, 490.3}, {4096, 1024, 4096, 738.5},
                           {4096, 2048, 4096, 758.4}, {2048, 2048, 1024, 493.9}, {1024, 1024, 512, 145.6},
                           {2048, 512, 1024, 235.9},  {512, 2048, 4096, 430.5},  {2048, 1024, 1024, 373.3},
                           {2048, 4096, 512, 450.4},  {1024, 512, 512, 82.2},    {1024, 2048, 512, 237.6},
                           {1024, 4096, 4096, 738.5}, {512, 1024, 4096, 309.6},  {4096, 512, 2048, 521.7},
                           {512, 512, 4096, 174.5}};
    std::vector<GemmPoint> out;
    for (const auto& r : t) out.push_back({.m = r[0], .n = r[1], .k = r[2], .flops = r[3] * 1e12});
    return out;
  }();
  return kPoints;
}

const std::vector<Hardware>& hardware_presets() {
  // Memory: what nvidia-smi reports as total. Peak: dense bf16 from the datasheets.
  // Intra-node: NVLink bandwidth per GPU in one direction (half the bidirectional figure).
  // Inter-node: one NIC per GPU as in DGX systems (HDR 200 Gb/s on A100, NDR 400 Gb/s on
  // H100/H200). HBM bandwidth: the datasheets (A100 SXM 80GB 2,039 GB/s, H100 SXM 3.35 TB/s,
  // H200 4.8 TB/s). Achievable fraction: our assumption for the arithmetic of a whole
  // transformer layer (large GEMMs reach ~70-80% of peak, softmax and norms pull it down);
  // Narayanan et al. 2021 report 44-52% of peak end to end on A100 including bubbles and
  // communication. Kernel overhead: the alpha of the alpha-beta fit of OpenXLA's measured
  // H100 bf16 table (h100_gemm_points, fit_gemm: 807 TFLOP/s and 6.75 us per kernel); no
  // A100 table was found, so the A100 uses the same per-kernel cost (an assumption). Latency
  // per message: our assumption (a few microseconds per NCCL step over NVLink, about twice
  // that over InfiniBand); `ndmesh calibrate` measures the machine's.
  static const std::vector<Hardware> kPresets = [] {
    const double overhead = fit_gemm(h100_gemm_points()).overhead_s;
    return std::vector<Hardware>{
        Hardware{.name = "a100-80gb",
                 .memory_bytes = 81920 * kMiB,
                 .reserved_bytes = 4 * kGiB,
                 .peak_flops = 312e12,
                 .achievable_fraction = 0.6,
                 .intra_node_bw = 300e9,
                 .inter_node_bw = 25e9,
                 .gpus_per_node = 8,
                 .source = "NVIDIA A100 datasheet (SXM4 80GB, NVLink 3 600 GB/s, HBM2e 2039 GB/s, PCIe Gen4 "
                           "64 GB/s both ways), DGX A100 (8x HDR 200 Gb/s)",
                 .memory_bw = 2039e9,
                 .intra_node_latency = 5e-6,
                 .inter_node_latency = 10e-6,
                 .gemm_overhead = overhead,
                 .host_to_device_bw = 32e9,
                 .device_to_host_bw = 32e9},
        Hardware{.name = "h100",
                 .memory_bytes = 81559 * kMiB,
                 .reserved_bytes = 4 * kGiB,
                 .peak_flops = 989e12,
                 .achievable_fraction = 0.55,
                 .intra_node_bw = 450e9,
                 .inter_node_bw = 50e9,
                 .gpus_per_node = 8,
                 .source =
                     "NVIDIA H100 datasheet (SXM5 80GB, NVLink 4 900 GB/s, HBM3 3.35 TB/s, PCIe Gen5 128 GB/s both ways), DGX H100 (8x "
                     "NDR 400 Gb/s)",
                 .memory_bw = 3.35e12,
                 .intra_node_latency = 5e-6,
                 .inter_node_latency = 10e-6,
                 .gemm_overhead = overhead,
                 .host_to_device_bw = 64e9,
                 .device_to_host_bw = 64e9},
        Hardware{.name = "h200",
                 .memory_bytes = 143771 * kMiB,
                 .reserved_bytes = 4 * kGiB,
                 .peak_flops = 989e12,
                 .achievable_fraction = 0.55,
                 .intra_node_bw = 450e9,
                 .inter_node_bw = 50e9,
                 .gpus_per_node = 8,
                 .source =
                     "NVIDIA H200 datasheet (SXM 141GB, NVLink 4 900 GB/s, HBM3e 4.8 TB/s, PCIe Gen5 128 GB/s both ways), DGX H200 (8x "
                     "NDR 400 Gb/s)",
                 .memory_bw = 4.8e12,
                 .intra_node_latency = 5e-6,
                 .inter_node_latency = 10e-6,
                 .gemm_overhead = overhead,
                 .host_to_device_bw = 64e9,
                 .device_to_host_bw = 64e9},
    };
  }();
  return kPresets;
}

Hardware hardware_preset(std::string_view name) {
  for (const auto& h : hardware_presets())
    if (h.name == name) return h;
  fail<ConfigError>("plan",
                    "--hardware '{}' is not a preset; use one of {}, and override single numbers with "
                    "--gpu-memory-gib, --peak-tflops, --intra-node-gbps, --inter-node-gbps, --gpus-per-node",
                    name, hardware_preset_names());
}

std::string hardware_preset_names() { return join_names(hardware_presets()); }

std::vector<std::string> plan_model_problems(const PlanModel& model) {
  return model_problems(model.spec);
}

Hardware for_precision(Hardware hw, bool bf16_products) {
  if (bf16_products && hw.bf16_flops > 0) hw.peak_flops = hw.bf16_flops, hw.bf16_flops = 0;
  if (bf16_products) hw.attention_flops = hw.bf16_attention_flops;
  return hw;
}

std::vector<std::string> hardware_problems(const Hardware& hw) {
  std::vector<std::string> out;
  if (!(hw.memory_bytes > 0))
    out.push_back(fmt::format("--gpu-memory-gib {} must be positive, e.g. 80", hw.memory_bytes / kGiB));
  if (!(hw.reserved_bytes >= 0) || !(hw.reserved_bytes < hw.memory_bytes))
    out.push_back(fmt::format("--reserved-gib {} must be at least 0 and below the GPU memory {} GiB, e.g. 4",
                              hw.reserved_bytes / kGiB, hw.memory_bytes / kGiB));
  if (!(hw.peak_flops > 0))
    out.push_back(
        fmt::format("--peak-tflops {} must be positive, e.g. 989 for an H100", hw.peak_flops / 1e12));
  if (!(hw.achievable_fraction > 0 && hw.achievable_fraction <= 1))
    out.push_back(fmt::format("--efficiency {} must be in (0, 1], e.g. 0.55", hw.achievable_fraction));
  if (!(hw.intra_node_bw > 0))
    out.push_back(fmt::format("--intra-node-gbps {} must be positive, e.g. 450", hw.intra_node_bw / 1e9));
  if (!(hw.inter_node_bw > 0))
    out.push_back(fmt::format("--inter-node-gbps {} must be positive, e.g. 50", hw.inter_node_bw / 1e9));
  if (hw.gpus_per_node < 1)
    out.push_back(fmt::format("--gpus-per-node {} must be at least 1, e.g. 8", hw.gpus_per_node));
  if (!(hw.memory_bw >= 0))
    out.push_back(fmt::format(
        "--memory-gbps {} must be positive (or 0: memory-bound work not counted), e.g. 3350 for an H100",
        hw.memory_bw / 1e9));
  if (!(hw.intra_node_latency >= 0 && hw.intra_node_latency < 1))
    out.push_back(
        fmt::format("--intra-node-latency-us {} must be in [0, 1e6), e.g. 5", hw.intra_node_latency * 1e6));
  if (!(hw.inter_node_latency >= 0 && hw.inter_node_latency < 1))
    out.push_back(
        fmt::format("--inter-node-latency-us {} must be in [0, 1e6), e.g. 10", hw.inter_node_latency * 1e6));
  if (!(hw.attention_flops >= 0))
    out.push_back(
        fmt::format("attention_tflops {} must be positive (or 0: the products' rate), e.g. 20", hw.attention_flops / 1e12));
  if (!(hw.bf16_attention_flops >= 0))
    out.push_back(fmt::format("bf16_attention_tflops {} must be positive (or 0: the products' rate), e.g. 300",
                              hw.bf16_attention_flops / 1e12));
  if (!(hw.bf16_flops >= 0))
    out.push_back(fmt::format("bf16_tflops {} must be positive (or 0: the peak), e.g. 700", hw.bf16_flops / 1e12));
  if (!(hw.host_to_device_bw >= 0 && hw.device_to_host_bw >= 0))
    out.push_back(fmt::format("host_to_device_gbps {} and device_to_host_gbps {} must be positive (or 0: unknown)",
                              hw.host_to_device_bw / 1e9, hw.device_to_host_bw / 1e9));
  if (!(hw.gemm_overhead >= 0 && hw.gemm_overhead < 1))
    out.push_back(
        fmt::format("--gemm-overhead-us {} must be in [0, 1e6), e.g. 6.75", hw.gemm_overhead * 1e6));
  return out;
}

}  // namespace ndmesh::plan
