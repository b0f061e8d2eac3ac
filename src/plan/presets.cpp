// Model and hardware presets for the planner.
//
// Model shapes are typed in from their papers (cited per group below). Hardware numbers are
// vendor datasheet figures; the achievable fraction of peak and the reserved memory are our
// assumptions (stated in `ndmesh plan --explain` and overridable from the command line).
#include "ndmesh/plan/presets.hpp"

#include <fmt/core.h>

#include "ndmesh/core/error.hpp"

namespace ndmesh::plan {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kMiB = 1024.0 * 1024.0;

// A GPT model of Narayanan et al. 2021 Table 1: vocab 51200, seq 2048, ffn 4h, learned
// positions, LayerNorm, biases, tied embeddings, dropout.
ModelPreset gpt(std::string name, std::int64_t heads, std::int64_t hidden, std::int64_t layers,
                std::string source) {
  PlanModel m;
  m.spec = ModelSpec{.name = name,
                     .layers = layers,
                     .hidden = hidden,
                     .heads = heads,
                     .kv_heads = heads,
                     .ffn = 4 * hidden,
                     .seq = 2048,
                     .vocab = 51200,
                     .experts = 0,
                     .tied_embeddings = true};
  m.mlp = Mlp::kGelu;
  m.biases = true;
  m.learned_positions = true;
  m.layer_norm = true;
  m.dropout = true;
  return {std::move(name), std::move(source), m};
}

// A Llama model: SwiGLU, no biases, rotary positions, RMSNorm, untied output layer, no
// dropout.
ModelPreset llama(std::string name, std::int64_t layers, std::int64_t hidden, std::int64_t ffn,
                  std::int64_t heads, std::int64_t kv_heads, std::int64_t vocab, std::int64_t seq,
                  std::string source) {
  PlanModel m;
  m.spec = ModelSpec{.name = name,
                     .layers = layers,
                     .hidden = hidden,
                     .heads = heads,
                     .kv_heads = kv_heads,
                     .ffn = ffn,
                     .seq = seq,
                     .vocab = vocab,
                     .experts = 0,
                     .tied_embeddings = false};
  m.mlp = Mlp::kSwiglu;
  m.biases = false;
  m.learned_positions = false;
  m.layer_norm = false;
  m.dropout = false;
  return {std::move(name), std::move(source), m};
}

std::string join_names(const auto& items) {
  std::string out;
  for (const auto& item : items) {
    if (!out.empty()) out += ", ";
    out += item.name;
  }
  return out;
}

}  // namespace

std::string_view mlp_name(Mlp mlp) { return mlp == Mlp::kGelu ? "gelu" : "swiglu"; }

Mlp parse_mlp(std::string_view name, std::string_view flag) {
  if (name == "gelu") return Mlp::kGelu;
  if (name == "swiglu") return Mlp::kSwiglu;
  fail<ConfigError>("plan",
                    "{} '{}' is not an MLP kind; use gelu (GPT, 2 matrices) or swiglu (Llama, 3 matrices)",
                    flag, name);
}

const std::vector<ModelPreset>& model_presets() {
  static const std::vector<ModelPreset> kPresets = [] {
    const std::string t1 = "Narayanan et al. 2021, Table 1";
    const std::string l2 = "Touvron et al. 2023 (Llama 2), Table 1 and model card";
    const std::string l3 = "Llama Team 2024 (The Llama 3 Herd of Models), Table 3";
    return std::vector<ModelPreset>{
        gpt("gpt3-1.7b", 24, 2304, 24, t1),
        gpt("gpt3-3.6b", 32, 3072, 30, t1),
        gpt("gpt3-7.5b", 32, 4096, 36, t1),
        gpt("gpt3-18b", 48, 6144, 40, t1),
        gpt("gpt3-39b", 64, 8192, 48, t1),
        gpt("gpt3-76b", 80, 10240, 60, t1),
        gpt("gpt3-145b", 96, 12288, 80, t1),
        gpt("gpt3-310b", 128, 16384, 96, t1),
        gpt("gpt3-530b", 128, 20480, 105, t1),
        gpt("gpt3-1t", 160, 25600, 128, t1),
        gpt("gpt3-175b", 96, 12288, 96,
            "Brown et al. 2020, Table 2.1 (vocab padded to 51200 as in Megatron)"),
        llama("llama2-7b", 32, 4096, 11008, 32, 32, 32000, 4096, l2),
        llama("llama2-13b", 40, 5120, 13824, 40, 40, 32000, 4096, l2),
        llama("llama2-70b", 80, 8192, 28672, 64, 8, 32000, 4096, l2),
        llama("llama3-8b", 32, 4096, 14336, 32, 8, 128256, 8192, l3),
        llama("llama3-70b", 80, 8192, 28672, 64, 8, 128256, 8192, l3),
        llama("llama3-405b", 126, 16384, 53248, 128, 8, 128256, 8192, l3),
    };
  }();
  return kPresets;
}

PlanModel model_preset(std::string_view name) {
  for (const auto& p : model_presets())
    if (p.name == name) return p.model;
  fail<ConfigError>("plan",
                    "--model '{}' is not a preset; use one of {}, or describe the model with "
                    "--layers --hidden --heads --vocab",
                    name, model_preset_names());
}

std::string model_preset_names() { return join_names(model_presets()); }

const std::vector<Hardware>& hardware_presets() {
  // Memory: what nvidia-smi reports as total. Peak: dense bf16 from the datasheets.
  // Intra-node: NVLink bandwidth per GPU in one direction (half the bidirectional figure).
  // Inter-node: one NIC per GPU as in DGX systems (HDR 200 Gb/s on A100, NDR 400 Gb/s on
  // H100/H200). Achievable fraction: our assumption for a whole transformer layer (large
  // GEMMs reach ~70-80% of peak, softmax and norms pull it down); Narayanan et al. 2021
  // report 44-52% of peak end to end on A100 including bubbles and communication.
  static const std::vector<Hardware> kPresets = {
      Hardware{.name = "a100-80gb",
               .memory_bytes = 81920 * kMiB,
               .reserved_bytes = 4 * kGiB,
               .peak_flops = 312e12,
               .achievable_fraction = 0.6,
               .intra_node_bw = 300e9,
               .inter_node_bw = 25e9,
               .gpus_per_node = 8,
               .source = "NVIDIA A100 datasheet (SXM4 80GB, NVLink 3 600 GB/s), DGX A100 (8x HDR 200 Gb/s)"},
      Hardware{.name = "h100",
               .memory_bytes = 81559 * kMiB,
               .reserved_bytes = 4 * kGiB,
               .peak_flops = 989e12,
               .achievable_fraction = 0.55,
               .intra_node_bw = 450e9,
               .inter_node_bw = 50e9,
               .gpus_per_node = 8,
               .source = "NVIDIA H100 datasheet (SXM5 80GB, NVLink 4 900 GB/s), DGX H100 (8x NDR 400 Gb/s)"},
      Hardware{.name = "h200",
               .memory_bytes = 143771 * kMiB,
               .reserved_bytes = 4 * kGiB,
               .peak_flops = 989e12,
               .achievable_fraction = 0.55,
               .intra_node_bw = 450e9,
               .inter_node_bw = 50e9,
               .gpus_per_node = 8,
               .source = "NVIDIA H200 datasheet (SXM 141GB, NVLink 4 900 GB/s), DGX H200 (8x NDR 400 Gb/s)"},
  };
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
  std::vector<std::string> out = model_problems(model.spec);
  if (model.spec.experts > 0)
    out.push_back(
        fmt::format("model experts = {}: the planner models dense models only for now; use experts = 0",
                    model.spec.experts));
  return out;
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
  return out;
}

}  // namespace ndmesh::plan
