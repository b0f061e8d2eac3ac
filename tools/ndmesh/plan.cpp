// `ndmesh plan`: which layout to use for a model on N GPUs, before renting them.
//
//   ndmesh plan --model llama3-70b --gpus 512 --hardware h100 --seq 8192 --global-batch 1024
//   ndmesh plan memory --model gpt3-175b --tp 8 --pp 8 --dp 1 --micro-batch 1 --seq 2048
//
// The search ranks every valid layout that fits by predicted time per step (src/plan);
// `memory` evaluates one layout. --explain prints every term of the best layout with its
// inputs; --json prints the same numbers for scripts.
#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <string>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "ndmesh/config/config.hpp"
#include "ndmesh/config/partition.hpp"
#include "ndmesh/config/training.hpp"
#include "ndmesh/core/error.hpp"
#include "ndmesh/core/strings.hpp"
#include "ndmesh/plan/hardware_file.hpp"
#include "ndmesh/plan/report.hpp"
#include "ndmesh/plan/search.hpp"
#include "subcommand.hpp"

// Its own namespace: the tool compiles as a unity build (CMakeLists.txt), where every
// subcommand's file shares one translation unit with the others.
namespace ndmesh::cli::plan_command {
namespace {

using plan::Estimate;
using plan::Hardware;
using plan::Layout;
using plan::PlanModel;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Flags that describe the model and the hardware, shared by `plan` and `plan memory`.
struct ModelHardwareFlags {
  std::string model;
  std::string config_file;
  std::int64_t layers = 0, hidden = 0, heads = 0, kv_heads = 0, ffn = 0, vocab = 0;
  std::string mlp;
  std::string arch, norm, positions;  // the layers' kinds (the model description's)
  std::int64_t head_dim = 0;
  bool bias = false, no_bias = false;  // --bias / --no-bias
  std::string hardware = "h100";
  std::optional<double> gpu_memory_gib, reserved_gib, peak_tflops, efficiency, intra_gbps, inter_gbps;
  std::optional<std::int64_t> gpus_per_node;
  std::optional<double> memory_gbps, intra_latency_us, inter_latency_us, gemm_overhead_us;
  std::optional<double> disk_read_gbps, disk_write_gbps, host_link_gbps;
  std::string offload_to = "disk";  // --offload-to disk|host
  std::string memory;            // --memory strategy (or [training] memory of --config)
  std::string offload = "none";  // --offload none|optimizer
  bool offload_given = false;
  bool no_dp_overlap = false;
  std::int64_t seq = 0;
  std::int64_t global_batch = 0;
  std::string precision = "mixed";
  std::string attention = "flash";
  bool no_dropout = false;
  bool untied = false;
  bool json = false;
};

void add_model_hardware_flags(CLI::App& app, ModelHardwareFlags& f) {
  app.add_option("--model", f.model, "Model preset: " + plan::model_preset_names());
  app.add_option("--config", f.config_file, "TOML file whose [model] section describes a custom model");
  app.add_option("--layers", f.layers, "Custom model (or override): decoder layers");
  app.add_option("--hidden", f.hidden, "Custom model: hidden size");
  app.add_option("--heads", f.heads, "Custom model: attention heads");
  app.add_option("--kv-heads", f.kv_heads, "Custom model: key/value heads (grouped-query attention)");
  app.add_option("--ffn", f.ffn, "Custom model: MLP hidden size (default 4*hidden)");
  app.add_option("--vocab", f.vocab, "Custom model: vocabulary size");
  app.add_option("--mlp", f.mlp,
                 "Custom model: gelu (GPT: biases, learned positions, LayerNorm, dropout) or swiglu (Llama: "
                 "none of those, untied output layer); with --arch, the MLP alone");
  app.add_option("--arch", f.arch, "Model family: gpt2 or llama (its norm, MLP, positions and biases)");
  app.add_option("--norm", f.norm, "Override: layernorm or rmsnorm");
  app.add_option("--positions", f.positions, "Override: learned (a position table) or rope (rotary)");
  app.add_option("--head-dim", f.head_dim, "Override: the size of each attention head (default hidden/heads)");
  auto* bias = app.add_flag("--bias", f.bias, "Override: the linear layers carry biases");
  app.add_flag("--no-bias", f.no_bias, "Override: the linear layers carry no biases")->excludes(bias);
  app.add_option("--hardware", f.hardware,
                 "GPU preset (" + plan::hardware_preset_names() +
                     ") or a hardware file written by `ndmesh calibrate` (docs/plan.md)")
      ->capture_default_str();
  app.add_option("--gpu-memory-gib", f.gpu_memory_gib, "Override: memory per GPU in GiB");
  app.add_option("--reserved-gib", f.reserved_gib,
                 "Override: GiB per GPU not available to tensors (default 4)");
  app.add_option("--peak-tflops", f.peak_tflops, "Override: dense bf16 peak per GPU in TFLOP/s");
  app.add_option("--efficiency", f.efficiency, "Override: achievable fraction of peak FLOP/s for a layer");
  app.add_option("--intra-node-gbps", f.intra_gbps, "Override: GB/s per GPU inside a node, one direction");
  app.add_option("--inter-node-gbps", f.inter_gbps, "Override: GB/s per GPU across nodes, one direction");
  app.add_option("--gpus-per-node", f.gpus_per_node, "Override: GPUs per node");
  app.add_option("--memory-gbps", f.memory_gbps,
                 "Override: HBM GB/s per GPU (0: memory-bound work not counted)");
  app.add_option("--intra-node-latency-us", f.intra_latency_us,
                 "Override: microseconds per message inside a node");
  app.add_option("--inter-node-latency-us", f.inter_latency_us,
                 "Override: microseconds per message across nodes");
  app.add_option("--gemm-overhead-us", f.gemm_overhead_us,
                 "Override: fixed microseconds per matrix-product kernel (the alpha of t = F/rate + alpha)");
  app.add_flag("--no-dp-overlap", f.no_dp_overlap,
               "The gradient reduction runs after the last micro-batch's backward, not under it (Megatron-LM "
               "2021, DeepSpeed's pipeline engine)");
  app.add_option("--seq", f.seq, "Tokens per sequence (default: the model's)");
  app.add_option("--global-batch,--batch", f.global_batch, "Sequences per step over all GPUs");
  app.add_option("--precision", f.precision,
                 "mixed (bf16 weights and grads + 12 B fp32 Adam states, 16-bit activations), "
                 "mixed-fp32-grads (the same with fp32 gradients: Megatron's bf16 default, DeepSpeed's "
                 "BF16_Optimizer), bf16 (what ndmesh train --precision bf16 keeps: fp32 weights + a 2 B bf16 "
                 "copy, fp32 grads and Adam states, fp32 activations but the norms' outputs (gathered in bf16 "
                 "under sequence parallelism), the attention's input and output, the MLP's pre-activation and "
                 "hidden and the logits in bf16, bf16 products) or fp32 (4 + 4 + 8 B AdamW, fp32 activations "
                 "and products; a calibrated GPU file's fp32 rate)")
      ->capture_default_str();
  app.add_flag("--no-dropout", f.no_dropout,
               "The model stores no dropout masks (GPT presets do, Llama ones do not)");
  app.add_flag("--untied", f.untied,
               "Custom model: the output layer has its own matrix (as `ndmesh train --untied`)");
  app.add_option(
         "--attention", f.attention,
         "flash (no s x s scores stored, Q K^T recomputed in the backward; Dao et al. 2022) or standard "
         "(Korthikanti et al. 2022)")
      ->capture_default_str();
  app.add_option("--disk-read-gbps", f.disk_read_gbps,
                 "Override: GB/s a node reads from the disk offload uses (`ndmesh calibrate` measures it)");
  app.add_option("--disk-write-gbps", f.disk_write_gbps, "Override: GB/s a node writes to that disk");
  app.add_option("--host-link-gbps", f.host_link_gbps,
                 "Override: GB/s between a GPU and host memory, each direction (PCIe), for --offload-to host");
  app.add_option(
         "--memory", f.memory,
         "Memory strategy: basic, standard (selective recompute), aggressive (full recompute + ZeRO 2) or "
         "extreme (full recompute + ZeRO 3 + optimizer offload to disk); flags given explicitly win")
      ->group("Memory");
  app.add_option(
         "--offload", f.offload,
         "none, or optimizer: the optimizer state lives on the node's disk, read and written once per "
         "step at the hardware's disk rates")
      ->each([&f](const std::string&) { f.offload_given = true; })
      ->capture_default_str()
      ->group("Memory");
  app.add_option("--offload-to", f.offload_to,
                 "where --offload optimizer puts the state: disk (read and written once per step at the disk "
                 "rates), or host (pinned host memory, ZeRO-Offload as `ndmesh train --device cuda --offload "
                 "optimizer`: the gradients to the host and the parameters back over the host link each step)")
      ->capture_default_str()
      ->group("Memory");
  app.add_flag("--json", f.json, "Print JSON");
}

// The memory strategy of --memory or of --config's [training] memory, if any.
std::optional<MemoryStrategy> resolve_memory(const ModelHardwareFlags& f) {
  std::string name = f.memory;
  if (name.empty() && !f.config_file.empty()) {
    try {
      name = load_config_file(f.config_file).parallel.memory;
    } catch (const IoError& e) {
      throw ConfigError("plan", fmt::format("--config: {}", e.what()));
    }
  }
  if (name.empty()) return std::nullopt;
  return memory_strategy(name);
}

// Whether the optimizer state is offloaded: --offload, else the strategy's; the hardware
// must then know its disk rates.
bool resolve_offload(const ModelHardwareFlags& f, const std::optional<MemoryStrategy>& s,
                     const Hardware& hw) {
  NDMESH_CHECK_CONFIG(f.offload == "none" || f.offload == "optimizer", "plan",
                      "--offload={} is not an offload mode the planner plans; use none or optimizer",
                      f.offload);
  NDMESH_CHECK_CONFIG(f.offload_to == "disk" || f.offload_to == "host", "plan",
                      "--offload-to={} is not a place for the optimizer state; use disk or host", f.offload_to);
  const bool offload = f.offload_given ? f.offload == "optimizer" : s && s->offload;
  if (offload && f.offload_to == "host") {
    NDMESH_CHECK_CONFIG(hw.host_to_device_bw > 0 && hw.device_to_host_bw > 0, "plan",
                        "--offload-to host: the hardware '{}' has no host link rate; give --host-link-gbps "
                        "(PCIe Gen5 x16: 64), or host_to_device_gbps and device_to_host_gbps in the hardware file "
                        "(ndmesh calibrate --device cuda measures them)",
                        hw.name);
    return offload;
  }
  NDMESH_CHECK_CONFIG(
      !offload || (hw.disk_read_bw > 0 && hw.disk_write_bw > 0), "plan",
      "--offload optimizer: the hardware '{}' has no disk rates; measure this machine's with "
      "`ndmesh calibrate --output hw.toml` and pass --hardware hw.toml, or give --disk-read-gbps "
      "and --disk-write-gbps",
      hw.name);
  return offload;
}

// The line that says what a strategy chose.
void print_memory_choice(const std::optional<MemoryStrategy>& s, const std::string& recompute, int zero,
                         bool offload) {
  if (s)
    fmt::print("memory: {} = --recompute {} --zero {}{} (flags given explicitly win)\n", s->name, recompute,
               zero, offload ? " --offload optimizer" : "");
}

// The model from a preset, a TOML [model] section and/or flags (flags win).
PlanModel resolve_model(const ModelHardwareFlags& f) {
  PlanModel m;
  bool have = false;
  if (!f.model.empty()) {
    m = plan::model_preset(f.model);
    have = true;
  }
  if (!f.config_file.empty()) {
    ConfigFile file;
    try {
      file = load_config_file(f.config_file);
    } catch (const IoError& e) {
      // A file the user named that cannot be read is bad input (exit 2), not a failure.
      throw ConfigError("plan", fmt::format("--config: {}", e.what()));
    }
    NDMESH_CHECK_CONFIG(file.model.has_value(), "plan",
                        "--config '{}' has no [model] section; add one with layers, hidden, heads and vocab",
                        f.config_file);
    const std::string name = m.spec.name;
    m.spec = *file.model;
    if (m.spec.name.empty()) m.spec.name = name.empty() ? f.config_file : name;
    have = true;
  }
  const bool custom = f.layers || f.hidden || f.heads || f.kv_heads || f.ffn || f.vocab || !f.mlp.empty() ||
                      f.untied || !f.arch.empty();
  if (!have && !custom)
    fail<ConfigError>(
        "plan", "no model given; use --model with one of {}, or --layers, --hidden, --heads and --vocab",
        plan::model_preset_names());
  if (!f.arch.empty()) {
    m.spec = with_arch(m.spec, f.arch);
    if (f.model.empty()) m.dropout = f.arch == "gpt2";  // GPT runs keep dropout masks, Llama's none
  }
  if (!f.mlp.empty() && f.arch.empty()) {
    // Without --arch, a custom SwiGLU model is Llama-shaped and a custom GeLU model GPT-shaped.
    const bool llama = parse_mlp_kind(f.mlp) == MlpKind::kSwiglu;
    const bool tied = m.spec.tied_embeddings;
    m.spec = with_arch(m.spec, llama ? "llama" : "gpt2");
    m.spec.tied_embeddings = llama && f.model.empty() ? false : tied;
    m.dropout = !llama;
  } else if (!f.mlp.empty()) {
    m.spec.mlp = parse_mlp_kind(f.mlp);
  }
  if (!f.norm.empty()) m.spec.norm = parse_norm(f.norm);
  if (!f.positions.empty()) m.spec.positions = parse_positions(f.positions);
  if (f.bias || f.no_bias) m.spec.biases = f.bias;
  if (f.head_dim) m.spec.head_dim = f.head_dim;
  if (f.layers) m.spec.layers = f.layers;
  if (f.hidden) m.spec.hidden = f.hidden;
  if (f.heads) m.spec.heads = f.heads;
  if (f.kv_heads) m.spec.kv_heads = f.kv_heads;
  if (f.ffn) m.spec.ffn = f.ffn;
  if (f.vocab) m.spec.vocab = f.vocab;
  if (f.no_dropout) m.dropout = false;
  if (f.untied) m.spec.tied_embeddings = false;
  if (m.spec.name.empty()) m.spec.name = "custom";
  if (f.seq != 0) m.spec.seq = f.seq;
  NDMESH_CHECK_CONFIG(m.spec.seq >= 1, "plan", "--seq {} must be at least 1, e.g. --seq 4096", m.spec.seq);
  const auto probs = plan::plan_model_problems(m);
  NDMESH_CHECK_CONFIG(probs.empty(), "plan", "bad model: {}", fmt::join(probs, "; "));
  return m;
}

plan::Precision resolve_precision(const ModelHardwareFlags& f) { return plan::parse_precision(f.precision); }

// The flags that run a plan's layout on the plan's hardware with `ndmesh train`: the presets
// are GPUs, and so is a file `ndmesh calibrate --device cuda` wrote (it measured the GPU's host
// links); a CPU calibration's plan runs on the CPU. ndmesh train has fp32 and bf16 products, so
// a plan of 16-bit products runs --precision bf16.
std::string device_flags(const ModelHardwareFlags& f, const Hardware& hw) {
  const auto& presets = plan::hardware_presets();
  const bool preset =
      std::any_of(presets.begin(), presets.end(), [&](const Hardware& p) { return p.name == f.hardware; });
  if (!preset && hw.host_to_device_bw <= 0) return "";
  return resolve_precision(f).bf16_products ? " --device cuda --precision bf16" : " --device cuda";
}

Hardware resolve_hardware(const ModelHardwareFlags& f) {
  // A calibrated GPU file has an fp32 and a bf16 product rate: the precision's is the peak.
  Hardware hw = plan::for_precision(plan::hardware_by_name_or_file(f.hardware), resolve_precision(f).bf16_products);
  if (f.gpu_memory_gib) hw.memory_bytes = *f.gpu_memory_gib * kGiB;
  if (f.reserved_gib) hw.reserved_bytes = *f.reserved_gib * kGiB;
  if (f.peak_tflops) hw.peak_flops = *f.peak_tflops * 1e12;
  if (f.efficiency) hw.achievable_fraction = *f.efficiency;
  if (f.intra_gbps) hw.intra_node_bw = *f.intra_gbps * 1e9;
  if (f.inter_gbps) hw.inter_node_bw = *f.inter_gbps * 1e9;
  if (f.gpus_per_node) hw.gpus_per_node = *f.gpus_per_node;
  if (f.memory_gbps) hw.memory_bw = *f.memory_gbps * 1e9;
  if (f.intra_latency_us) hw.intra_node_latency = *f.intra_latency_us * 1e-6;
  if (f.inter_latency_us) hw.inter_node_latency = *f.inter_latency_us * 1e-6;
  if (f.gemm_overhead_us) hw.gemm_overhead = *f.gemm_overhead_us * 1e-6;
  if (f.disk_read_gbps) hw.disk_read_bw = *f.disk_read_gbps * 1e9;
  if (f.disk_write_gbps) hw.disk_write_bw = *f.disk_write_gbps * 1e9;
  NDMESH_CHECK_CONFIG(hw.disk_read_bw >= 0 && hw.disk_write_bw >= 0, "plan",
                      "--disk-read-gbps and --disk-write-gbps must be >= 0; e.g. --disk-read-gbps 3");
  if (f.host_link_gbps) {
    NDMESH_CHECK_CONFIG(*f.host_link_gbps >= 0, "plan", "--host-link-gbps={} must be >= 0; e.g. --host-link-gbps 64",
                        *f.host_link_gbps);
    hw.host_to_device_bw = hw.device_to_host_bw = *f.host_link_gbps * 1e9;
  }
  const auto probs = plan::hardware_problems(hw);
  NDMESH_CHECK_CONFIG(probs.empty(), "plan", "bad hardware: {}", fmt::join(probs, "; "));
  return hw;
}

// "4,8" -> {4, 8}: positive integers, one line naming the flag otherwise.
std::vector<std::int64_t> parse_sizes(const std::string& text, std::string_view flag) {
  std::vector<std::int64_t> out;
  if (text.empty()) return out;
  for (auto part : split_list(text, ",")) {
    const std::string p(part);
    std::size_t used = 0;
    std::int64_t v = 0;
    try {
      v = std::stoll(p, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    NDMESH_CHECK_CONFIG(!p.empty() && used == p.size() && v >= 1, "plan",
                        "{} '{}': '{}' is not a positive integer; give one size or a list, e.g. {} 4,8", flag,
                        text, p, flag);
    out.push_back(v);
  }
  return out;
}

std::string gib(double bytes) { return fmt::format("{:.2f}", bytes / kGiB); }

std::string human(double x) {
  const double a = std::fabs(x);
  if (a >= 1e12) return fmt::format("{:.2f}T", x / 1e12);
  if (a >= 1e9) return fmt::format("{:.2f}B", x / 1e9);
  if (a >= 1e6) return fmt::format("{:.2f}M", x / 1e6);
  if (a >= 1e3) return fmt::format("{:.1f}k", x / 1e3);
  return fmt::format("{:.0f}", x);
}

std::string layout_text(const Layout& l) {
  return fmt::format(
      "tp={} cp={} pp={} dp={} vpp={} micro_batch={} schedule={} recompute={} zero={} "
      "sequence_parallel={} attention={}{}{}",
      l.tp, l.cp, l.pp, l.dp, l.vpp, l.micro_batch, schedule_name(l.schedule),
      plan::recompute_name(l.recompute), l.zero, l.sequence_parallel ? "on" : "off",
      plan::attention_name(l.attention),
      l.pp * l.vpp > 1 && !l.stage_layers.empty()
          ? fmt::format(" pp_layers={}", fmt::join(l.stage_layers, ","))
          : std::string(),
      l.ep > 1 ? fmt::format(" ep={}", l.ep) : std::string());
}

std::string where_text(bool in_node, double bw) {
  return fmt::format("{} node, {:.0f} GB/s", in_node ? "inside a" : "across", bw / 1e9);
}

// Every term of one layout with its inputs.
void print_explain(const PlanModel& model, const Hardware& hw, const plan::Precision& pr, const Estimate& e,
                   std::int64_t seq, std::int64_t global_batch) {
  const Layout& l = e.layout;
  const auto& m = e.memory;
  const auto& t = e.time;
  const double rate = hw.peak_flops * hw.achievable_fraction;
  fmt::print("layout: {}\n", layout_text(l));
  fmt::print("  {} micro-batches of {} per step per pipeline ({} / ({} x {}))\n", e.microbatches,
             l.micro_batch, global_batch, l.micro_batch, l.dp);
  fmt::print("memory per GPU, worst stage = {} of {} (GiB):\n", m.stage, l.pp);
  fmt::print("  parameters on the GPU   {} ({} layers split over tp={}{}{})\n", human(m.stage_parameters),
             m.layers_on_stage, l.tp, m.stage == 0 ? " + embedding" : "",
             m.stage == l.pp - 1 ? " + output layer" : "");
  if (model.spec.experts > 0)
    fmt::print(
        "  experts on the GPU      {} ({} MoE layers x {} of {} routed experts, ep={}: sharded over the expert "
        "group, as planned; ndmesh train today stores all of them on every rank), their states / dp x cp / ep = "
        "{}\n",
        human(m.stage_expert_parameters), m.moe_layers_on_stage, model.spec.experts / l.ep, model.spec.experts,
        l.ep, l.dp * l.cp / l.ep);
  fmt::print("  params                  {:>8}  {} B each{}\n", gib(m.params), pr.param_bytes,
             l.zero >= 3
                 ? fmt::format(", / dp x cp (ZeRO-3), plus {} gathered layers (in use + prefetch depth {})",
                               1 + l.zero3_prefetch, l.zero3_prefetch)
             : pr.weight_copy_bytes > 0
                 ? fmt::format(" + {} B of a bf16 copy (what the products read, written by the optimizer step)",
                               pr.weight_copy_bytes)
                 : "");
  fmt::print("  grads                   {:>8}  {} B each{}\n", gib(m.grads), pr.grad_bytes,
             l.zero >= 2 ? fmt::format(", / dp x cp (ZeRO-{}), plus two layers' full gradients (written, reduce-scattered)", l.zero)
                           : "");
  fmt::print("  optimizer               {:>8}  {} B each ({}momentum, variance){}\n", gib(m.optimizer),
             pr.optimizer_bytes, pr.optimizer_bytes > 8 ? "fp32 weights, " : "",
             l.zero >= 1 ? ", / dp x cp (ZeRO-1+)" : "");
  if (l.offload_optimizer && l.offload_to_host)
    fmt::print("  optimizer in host RAM   {:>8}  --offload-to host: pinned, {} with the fp32 master copy\n",
               gib(m.optimizer_offloaded), gib(m.optimizer_host));
  else if (l.offload_optimizer)
    fmt::print("  optimizer on disk       {:>8}  --offload optimizer: read and written once per step\n",
               gib(m.optimizer_offloaded));
  fmt::print(
      "  activations             {:>8}  {} layers x {:.2f} micro-batches in flight x {:.1f} MiB per layer "
      "(Korthikanti et al. 2022, s={} b={} {}), plus embedding masks / logits\n",
      gib(m.activations), m.layers_on_stage, m.in_flight, m.activation_per_layer / (1024.0 * 1024.0),
      seq / l.cp, l.micro_batch, plan::recompute_name(l.recompute));
  if (l.attention == plan::Attention::kFlash && l.recompute == plan::Recompute::kSelective)
    fmt::print(
        "  attention               flash (Dao et al. 2022), selective recompute: no score storage; the "
        "attention output (s b a hd/t elements) and fp32 log-sum-exp are not kept but recomputed by one more "
        "attention core forward (4 b s^2 h FLOPs per layer; one layer's worth held while it runs), besides "
        "the flash backward's Q K^T (2 b s^2 h)\n");
  else if (l.attention == plan::Attention::kFlash)
    fmt::print(
        "  attention               flash (Dao et al. 2022): no 5as/h score/softmax/dropout storage; 4 a s "
        "b/t "
        "bytes of fp32 log-sum-exp kept; Q K^T recomputed in the backward (2 b s^2 h FLOPs per layer)\n");
  else
    fmt::print(
        "  attention               standard: scores, softmax and dropout stored (5 a s^2 b/t bytes){}\n",
        l.recompute == plan::Recompute::kNone ? "" : ", dropped by recompute");
  if (l.pp > 1)
    fmt::print("  pipeline chunks         {} blocks (pp*vpp = {}; balanced_partition unless --pp-layers)\n",
               fmt::join(l.stage_layers, ","), l.pp * l.vpp);
  fmt::print("  total                   {:>8}  of {} usable ({} - {} reserved){}\n", gib(m.total),
             gib(e.capacity_bytes), gib(hw.memory_bytes), gib(hw.reserved_bytes),
             e.fits ? "" : fmt::format(": {} GiB short", gib(m.total - e.capacity_bytes)));
  fmt::print("time per step (s):\n");
  fmt::print(
      "  compute                 {:>8.3f}  slowest rank's products and attention at {:.3g} TFLOP/s x {} ({} "
      "layers{}); "
      "products of {:.0f} tokens per GPU at {:.0f}% of that rate ({:.2f} us per kernel){}\n",
      t.compute, hw.peak_flops / 1e12, hw.achievable_fraction, t.layers_on_stage,
      t.end_stage_extra > 0 ? " + output layer" : "", t.tokens_per_gpu, 100 * t.gemm_efficiency,
      hw.gemm_overhead * 1e6,
      std::string(l.attention == plan::Attention::kFlash ? "; causal flash: half the s x s FLOPs" : "") +
          (hw.attention_flops > 0
               ? fmt::format("; the attention core at {:.3g} TFLOP/s (the hardware's attention kernel)",
                             hw.attention_flops * hw.achievable_fraction / 1e12)
               : ""));
  fmt::print("  recompute               {:>8.3f}  recompute={}{}: its extra FLOPs at {:.3g} TFLOP/s{}\n",
             t.recompute, plan::recompute_name(l.recompute),
             l.attention == plan::Attention::kFlash ? " + flash attention's Q K^T in the backward" : "",
             rate / 1e12,
             hw.attention_flops > 0 ? fmt::format(" (the attention core's at {:.3g})",
                                                  hw.attention_flops * hw.achievable_fraction / 1e12)
                                    : "");
  const double logit_bytes = plan::loss_bytes_per_logit(pr, l.tp);
  const std::string loss =
      pr.fused_loss && l.tp == 1
          ? fmt::format("the loss ({:.0f} B per logit: {} logits, loss and gradient in one kernel)", logit_bytes,
                        pr.bf16_products ? "bf16" : "fp32")
          : fmt::format("the loss ({:.0f} B per fp32 logit)", logit_bytes);
  fmt::print("  memory-bound            {:>8.3f}  at {:.0f} GB/s HBM: {}\n", t.memory, hw.memory_bw / 1e9,
             hw.memory_bw <= 0 ? "not counted (no memory bandwidth)"
             : (l.attention == plan::Attention::kStandard ? "the s x s scores (28 B each), " : "") + loss +
                   ", the embedding" +
                   (pr.unfused_elementwise
                        ? fmt::format(", ndmesh's unfused element-wise passes ({:.0f} B per token and layer{}), "
                                      "the optimizer step",
                                      t.elementwise_bytes_per_token, pr.bf16_products ? ", with the bf16 products' operand casts" : "")
                        : std::string()));
  fmt::print("  tensor parallel         {:>8.3f}  {} all-reduces per layer and micro-batch, tp group {}\n",
             t.tp_comm, l.recompute == plan::Recompute::kFull ? 6 : 4,
             where_text(e.where.tp_in_node, t.tp_bw));
  fmt::print(
      "  context parallel        {:>8.3f}  exposed of {:.3f} ring traffic ({}), {}\n", t.cp_exposed,
      t.cp_comm, where_text(e.where.cp_in_node, t.cp_bw),
      l.cp == 1 ? std::string("no cp")
      : t.cp_exposed == 0
          ? std::string("hidden under attention")
          : fmt::format("{:.0f}% not hidden: each step's K/V block outlasts its {:.0f}-token attention",
                        100 * t.ring_exposed_fraction, t.tokens_per_gpu / l.micro_batch));
  fmt::print("  pipeline sends          {:>8.3f}  {}\n", t.pp_comm,
             l.pp == 1 ? "no pp" : where_text(e.where.pp_in_node, t.pp_bw));
  fmt::print("  bubble                  {:>8.3f}  {:.4f} x the above ({})\n", t.bubble, t.bubble_fraction,
             l.pp == 1                              ? "no pp"
             : l.schedule == Schedule::kInterleaved ? "(p-1)/(v m)"
             : l.schedule == Schedule::kZbH1        ? "(p-1)/(3 m)"
                                                    : "(p-1)/m");
  fmt::print(
      "  data parallel           {:>8.3f}  exposed of {:.3f} gradient{} traffic over dp x cp = {} ({}), "
      "overlapped with {:.3f} s of backward\n",
      t.dp_exposed, t.dp_comm, l.zero == 3 ? " and weight" : "", l.dp * l.cp,
      where_text(e.where.dp_in_node, t.dp_bw), t.dp_overlap);
  if (model.spec.experts > 0) {
    if (t.dp_expert_comm > 0)
      fmt::print("                          of it {:.3f} s the routed experts' over dp x cp / ep = {} ({})\n",
                 t.dp_expert_comm, l.dp * l.cp / l.ep, where_text(e.where.edp_in_node, t.edp_bw));
    fmt::print(
        "  expert parallel         {:>8.3f}  {}\n", t.ep_comm,
        l.ep == 1 ? std::string("ep 1: every rank runs every expert, no all-to-all")
                  : fmt::format("{} all-to-alls (dispatch, combine; forward, backward) per MoE layer and "
                                "micro-batch of {:.1f} MiB per GPU (top-{} copies of its tokens), expert group "
                                "of {} {}",
                                l.recompute == plan::Recompute::kFull ? 6 : 4, t.ep_bytes / (1024.0 * 1024.0),
                                model.spec.top_k, l.ep,
                                e.where.ep_in_node
                                    ? where_text(true, hw.intra_node_bw)
                                    : fmt::format("across nodes ({} per node: {:.0f} GB/s inside, {:.0f} GB/s "
                                                  "across)",
                                                  e.where.ep_per_node, hw.intra_node_bw / 1e9,
                                                  hw.inter_node_bw / 1e9)));
  }
  if (l.offload_optimizer && l.offload_to_host)
    fmt::print("  offload                 {:>8.3f}  {} GiB of gradients to the host and parameters back per GPU "
               "at {:.3g} GB/s to the host, {:.3g} GB/s back\n",
               t.offload, gib(t.offload_bytes), hw.device_to_host_bw / 1e9, hw.host_to_device_bw / 1e9);
  else if (l.offload_optimizer)
    fmt::print(
        "  offload                 {:>8.3f}  {} GiB of optimizer state read and written per GPU, {} GPUs "
        "sharing "
        "a node's disk at {:.3g} GB/s read, {:.3g} GB/s write\n",
        t.offload, gib(t.offload_bytes), std::min(l.gpus(), hw.gpus_per_node), hw.disk_read_bw / 1e9,
        hw.disk_write_bw / 1e9);
  fmt::print(
      "  total                   {:>8.3f}  {} tokens/s, MFU {:.1f}% (model FLOPs {:.3g} per step, {})\n",
      t.total, human(e.tokens_per_second), 100 * e.mfu, e.model_flops, model.spec.name);
  fmt::print(
      "assumptions: {}; the achievable fraction {} of peak and the {} GiB reserved per GPU are the "
      "planner's own (--efficiency, --reserved-gib); {}\n",
      hw.source, hw.achievable_fraction, gib(hw.reserved_bytes),
      pr.unfused_elementwise
          ? fmt::format("the optimizer step is counted as its memory traffic ({} B per parameter)",
                        plan::kOptimizerStepBytes + (l.zero >= 3 ? 0.0 : pr.weight_copy_bytes))
          : "the optimizer step's time is not counted");
}

// What separates each of the top layouts from the best, and what costs the best most
// beyond its compute: the terms by size, each with the layout's own numbers.
void print_separation(const std::vector<Estimate>& top) {
  if (top.empty()) return;
  const Estimate& best = top.front();
  fmt::print("\nwhat decides:\n");
  std::vector<plan::TermDelta> overheads;
  for (plan::Term t : {plan::Term::kRecompute, plan::Term::kMemory, plan::Term::kTensorParallel,
                       plan::Term::kContextParallel, plan::Term::kPipelineSends, plan::Term::kBubble,
                       plan::Term::kDataParallel, plan::Term::kExpertParallel})
    if (const double sec = plan::term_seconds(best.time, t); sec > 0) overheads.push_back({t, sec});
  std::sort(overheads.begin(), overheads.end(),
            [](const plan::TermDelta& a, const plan::TermDelta& b) { return a.seconds > b.seconds; });
  fmt::print("     1: {:.3f} s, {:.0f}% of it compute; largest other terms:", best.time.total,
             100 * best.time.compute / best.time.total);
  for (std::size_t i = 0; i < std::min<std::size_t>(overheads.size(), 2); ++i)
    fmt::print(" {} {:.3f} s ({}){}", plan::term_name(overheads[i].term), overheads[i].seconds,
               plan::term_reason(best, overheads[i].term),
               i + 1 < std::min<std::size_t>(overheads.size(), 2) ? ";" : "");
  fmt::print("\n");
  for (std::size_t i = 1; i < std::min<std::size_t>(top.size(), 5); ++i) {
    const auto deltas = plan::separating_terms(top[i], best);
    fmt::print("  {:>4}: +{:.3f} s vs 1", i + 1, top[i].time.total - best.time.total);
    if (deltas.empty()) fmt::print(": the same time by every term (it differs in memory only)");
    std::size_t shown = 0;
    for (const auto& d : deltas)
      if (d.seconds > 0 && shown < 2)
        fmt::print("{} {} +{:.3f} s ({})", shown++ == 0 ? ":" : ";", plan::term_name(d.term), d.seconds,
                   plan::term_reason(top[i], d.term));
    if (!deltas.empty() && deltas.back().seconds < 0)
      fmt::print("; less {} {:.3f} s ({})", plan::term_name(deltas.back().term), deltas.back().seconds,
                 plan::term_reason(top[i], deltas.back().term));
    fmt::print("\n");
  }
}

void print_header(const PlanModel& model, const Hardware& hw, std::int64_t gpus, std::int64_t seq,
                  std::int64_t global_batch) {
  fmt::print(
      "{}: {} parameters{}; {} x {} ({} GiB, {} usable; {:.3g} TFLOP/s x {} achievable; {} GPUs/node); "
      "seq {}, global batch {}\n",
      model.spec.name, human(plan::count_parameters(model).total()),
      model.spec.experts > 0
          ? fmt::format(" ({} active: top-{} of {} experts{})", human(plan::count_parameters(model).active()),
                        model.spec.top_k, model.spec.experts,
                        model.spec.shared_experts > 0 ? fmt::format(" + {} shared", model.spec.shared_experts)
                                                      : std::string())
          : std::string(),
      gpus, hw.name, gib(hw.memory_bytes),
      gib(hw.usable_bytes()), hw.peak_flops / 1e12, hw.achievable_fraction, hw.gpus_per_node, seq,
      global_batch);
}

struct PlanFlags {
  ModelHardwareFlags common;
  std::int64_t gpus = 0;
  std::int64_t top = 10;
  bool explain = false;
  // Constraints: each a size or a comma-separated list.
  std::string tp, cp, pp, dp, ep, vpp, micro_batch, schedules, recompute, pp_layers;
  int max_zero = 3;
  bool max_zero_given = false;
  bool no_sequence_parallel = false;
};

struct MemoryFlags {
  ModelHardwareFlags common;
  Layout layout;
  std::string schedule = "1f1b";
  std::string recompute = "none";
  std::string pp_layers;
  bool explain = false;
  bool recompute_given = false, zero_given = false;
};

plan::Constraints resolve_constraints(const PlanFlags& f, const PlanModel& model) {
  plan::Constraints c;
  c.tp = parse_sizes(f.tp, "--tp");
  c.cp = parse_sizes(f.cp, "--cp");
  c.pp = parse_sizes(f.pp, "--pp");
  c.dp = parse_sizes(f.dp, "--dp");
  c.ep = parse_sizes(f.ep, "--ep");
  for (std::int64_t ep : c.ep) {
    NDMESH_CHECK_CONFIG(ep == 1 || model.spec.experts > 0, "plan",
                        "--ep {} needs a mixture of experts (--experts N, or a MoE preset such as mixtral-8x7b); "
                        "{} is dense: drop --ep",
                        ep, model.spec.name);
    NDMESH_CHECK_CONFIG(model.spec.experts == 0 || model.spec.experts % ep == 0, "plan",
                        "--ep {} conflicts with the model: experts={} is not divisible by ep={}; use a divisor "
                        "of {}",
                        ep, model.spec.experts, ep, model.spec.experts);
  }
  c.vpp = parse_sizes(f.vpp, "--vpp");
  c.micro_batch = parse_sizes(f.micro_batch, "--micro-batch");
  NDMESH_CHECK_CONFIG(f.max_zero >= 0 && f.max_zero <= 3, "plan",
                      "--max-zero {} is not a ZeRO stage; use 0, 1, 2 or 3", f.max_zero);
  c.max_zero = f.max_zero;
  if (!f.schedules.empty())
    for (auto part : split_list(f.schedules, ",")) c.schedules.push_back(parse_schedule(part));
  if (!f.recompute.empty())
    for (auto part : split_list(f.recompute, ",")) c.recomputes.push_back(plan::parse_recompute(part));
  c.sequence_parallel = !f.no_sequence_parallel;
  c.dp_overlap = !f.common.no_dp_overlap;
  if (!f.pp_layers.empty()) {
    // The count is checked against pp*vpp per layout; entries and the sum here.
    const auto n = static_cast<std::int64_t>(split_list(f.pp_layers, ",").size());
    c.stage_layers = parse_partition(f.pp_layers, model.spec.layers, n, 1, "--pp-layers");
  }
  // Fixed dims that cannot fit the model at all: say which flag conflicts with what.
  for (std::int64_t tp : c.tp) {
    if (model.spec.heads % tp == 0) continue;
    if (c.tp.size() == 1)
      fail<ConfigError>("plan",
                        "--tp {} conflicts with the model: heads={} is not divisible by tp={}; use a "
                        "divisor of {}",
                        tp, model.spec.heads, tp, model.spec.heads);
  }
  for (std::int64_t pp : c.pp)
    if (c.pp.size() == 1 && pp > model.spec.layers)
      fail<ConfigError>("plan",
                        "--pp {} conflicts with the model: layers={} cannot give each of {} stages a "
                        "block; use --pp {} or less",
                        pp, model.spec.layers, pp, model.spec.layers);
  return c;
}

int run_search(const PlanFlags& f) {
  NDMESH_CHECK_CONFIG(f.gpus >= 1, "plan",
                      "--gpus {} is missing or below 1; give the number of GPUs, e.g. --gpus 512", f.gpus);
  NDMESH_CHECK_CONFIG(
      f.common.global_batch >= 1, "plan",
      "--global-batch {} is missing or below 1; give sequences per step, e.g. --global-batch 1024",
      f.common.global_batch);
  NDMESH_CHECK_CONFIG(f.top >= 1 && f.top <= static_cast<std::int64_t>(plan::kMaxTop), "plan",
                      "--top {} must be in 1..{}, e.g. --top 10", f.top, plan::kMaxTop);
  NDMESH_CHECK_CONFIG(f.gpus <= plan::kMaxSearchGpus, "plan",
                      "--gpus {} is above the planner's limit of {} GPUs; plan a smaller job, e.g. --gpus {}",
                      f.gpus, plan::kMaxSearchGpus, plan::kMaxSearchGpus);
  const PlanModel model = resolve_model(f.common);
  const Hardware hw = resolve_hardware(f.common);
  const plan::Workload w{.seq = model.spec.seq, .global_batch = f.common.global_batch};
  const plan::Precision precision = resolve_precision(f.common);
  plan::Constraints constraints = resolve_constraints(f, model);
  const auto strategy = resolve_memory(f.common);
  constraints.offload_optimizer = resolve_offload(f.common, strategy, hw);
  constraints.offload_to_host = constraints.offload_optimizer && f.common.offload_to == "host";
  if (strategy) {
    if (f.recompute.empty()) constraints.recomputes = {plan::parse_recompute(strategy->recompute)};
    if (!f.max_zero_given) constraints.max_zero = constraints.min_zero = strategy->zero;
  }
  const plan::Attention attention = plan::parse_attention(f.common.attention);
  const plan::SearchOptions options{.gpus = f.gpus,
                                    .workload = w,
                                    .top = static_cast<std::size_t>(f.top),
                                    .precision = precision,
                                    .constraints = constraints,
                                    .attention = attention};
  const plan::SearchResult r = plan::search(model, hw, options);

  if (f.common.json) {
    fmt::print("{}\n", plan::search_json(model, hw, options, r));
    return r.layouts.empty() ? 1 : 0;
  }

  print_header(model, hw, f.gpus, w.seq, w.global_batch);
  if (strategy)
    fmt::print(
        "memory: {} = --recompute {} --zero {}{} (flags given explicitly win)\n", strategy->name,
        constraints.recomputes.size() == 1 ? plan::recompute_name(constraints.recomputes.front()) : "any",
        constraints.min_zero == constraints.max_zero ? std::to_string(constraints.max_zero) : "any",
        constraints.offload_optimizer ? " --offload optimizer" : "");
  fmt::print("constraints: {}; attention: {}; precision: {}\n", constraints.text(),
             plan::attention_name(attention), f.common.precision);
  fmt::print("{} layouts considered: {} fail validation, {} do not fit, {} fit\n", r.considered, r.invalid,
             r.too_big, r.fitting);
  if (r.layouts.empty()) {
    if (r.smallest) {
      const Estimate& s = *r.smallest;
      fmt::print(
          "nothing fits in {} GiB per GPU: the smallest footprint is {} GiB ({}), {} GiB short; use more "
          "GPUs, a GPU with more memory, a shorter --seq or a smaller model\n",
          gib(s.capacity_bytes), gib(s.memory.total), layout_text(s.layout),
          gib(s.memory.total - s.capacity_bytes));
      if (f.explain) print_explain(model, hw, precision, s, w.seq, w.global_batch);
    } else {
      fmt::print("no layout of {} GPUs passes validation, e.g.:\n", f.gpus);
      for (const auto& p : r.sample_problems) fmt::print("  {}\n", p);
    }
    return 1;
  }
  // A mixture of experts' table has an ep column (folded into dp x cp) after dp.
  const bool moe = model.spec.experts > 0;
  fmt::print(
      "\n{:>4} {:>3} {:>3} {:>3} {:>4}{} {:>3} {:>3} {:<11} {:<9} {:>4} {:>7} {:>7} {:>7} {:>7} {:>7} {:>8} "
      "{:>9} {:>6}\n",
      "rank", "tp", "cp", "pp", "dp", moe ? fmt::format(" {:>3}", "ep") : std::string(), "vpp", "mb", "schedule", "recompute", "zero", "params", "grads",
      "optim", "activ", "total", "step s", "tokens/s", "MFU");
  fmt::print("{:>{}}{}\n", "", moe ? 71 : 67, "--------- GiB per GPU ---------");
  int rank = 1;
  for (const Estimate& e : r.layouts) {
    const Layout& l = e.layout;
    fmt::print(
        "{:>4} {:>3} {:>3} {:>3} {:>4}{} {:>3} {:>3} {:<11} {:<9} {:>4} {:>7} {:>7} {:>7} {:>7} {:>7} {:>8.3f} "
        "{:>9} {:>5.1f}%\n",
        rank++, l.tp, l.cp, l.pp, l.dp, moe ? fmt::format(" {:>3}", l.ep) : std::string(), l.vpp, l.micro_batch, schedule_name(l.schedule),
        plan::recompute_name(l.recompute), l.zero, gib(e.memory.params), gib(e.memory.grads),
        gib(e.memory.optimizer), gib(e.memory.activations), gib(e.memory.total), e.time.total,
        human(e.tokens_per_second), 100 * e.mfu);
  }
  // The commands that run the top layouts on the plan's hardware.
  const std::size_t shown = std::min<std::size_t>(r.layouts.size(), 3);
  const std::string device = device_flags(f.common, hw);
  fmt::print("\nto run (ndmesh train; --mlp swiglu models run as their GeLU twin):\n");
  if (moe)
    fmt::print(
        "      (a mixture of experts: ndmesh train runs it under every layout on CPUs, in fp32 or bf16; GPUs "
        "with experts are not supported yet)\n");
  for (std::size_t i = 0; i < shown; ++i) {
    const Estimate& e = r.layouts[i];
    const auto c = plan::train_commands(plan::train_flags(model, e.layout, w) + device, e.layout.gpus(),
                                        hw.gpus_per_node);
    fmt::print("{:>4}  this machine: {}\n      cluster:      {}\n                    {}\n", i + 1, c.local,
               c.srun, c.mpirun);
  }
  if (f.explain) {
    print_separation(r.layouts);
    fmt::print("\nbest ");
    print_explain(model, hw, precision, r.layouts.front(), w.seq, w.global_batch);
  }
  return 0;
}

int run_memory(MemoryFlags f) {
  Layout& l = f.layout;
  const auto strategy = resolve_memory(f.common);
  if (strategy) {
    if (!f.recompute_given) f.recompute = strategy->recompute;
    if (!f.zero_given) l.zero = strategy->zero;
  }
  l.schedule = parse_schedule(f.schedule);
  l.recompute = plan::parse_recompute(f.recompute);
  l.attention = plan::parse_attention(f.common.attention);
  l.dp_overlap = !f.common.no_dp_overlap;
  NDMESH_CHECK_CONFIG(l.zero >= 0 && l.zero <= 3, "plan", "--zero {} is not a ZeRO stage; use 0, 1, 2 or 3",
                      l.zero);
  NDMESH_CHECK_CONFIG(l.ep >= 1, "plan", "--ep {} must be at least 1 (1: no expert parallelism), e.g. --ep 8", l.ep);
  const PlanModel model = resolve_model(f.common);
  const Hardware hw = resolve_hardware(f.common);
  // Default batch: pp micro-batches per pipeline, the fewest 1F1B accepts.
  const std::int64_t global_batch = f.common.global_batch != 0
                                        ? f.common.global_batch
                                        : l.micro_batch * l.dp * std::max<std::int64_t>(l.pp, 1);
  const plan::Workload w{.seq = model.spec.seq, .global_batch = global_batch};
  const auto probs = problems(plan::parallel_config(l, w, hw.gpus_per_node), &model.spec);
  NDMESH_CHECK_CONFIG(probs.empty(), "plan", "invalid layout: {}", fmt::join(probs, "; "));
  const plan::Precision precision = resolve_precision(f.common);
  l.stage_layers = f.pp_layers.empty() ? plan::stage_chunks(model, l)
                                       : parse_partition(f.pp_layers, model.spec.layers, l.pp, l.vpp);
  l.offload_optimizer = resolve_offload(f.common, strategy, hw);
  l.offload_to_host = l.offload_optimizer && f.common.offload_to == "host";
  const Estimate e = plan::estimate(model, hw, l, w, precision);

  if (f.common.json) {
    fmt::print("{}\n", plan::memory_json(model, hw, w, e));
    return 0;
  }
  print_header(model, hw, l.gpus(), w.seq, w.global_batch);
  print_memory_choice(strategy, f.recompute, l.zero, l.offload_optimizer);
  print_explain(model, hw, precision, e, w.seq, w.global_batch);
  return 0;
}

Action setup(CLI::App& app) {
  auto pf = std::make_shared<PlanFlags>();
  auto mf = std::make_shared<MemoryFlags>();
  app.add_option("--gpus", pf->gpus, "Number of GPUs to plan for");
  add_model_hardware_flags(app, pf->common);
  app.add_option("--top", pf->top, "Layouts to print")->capture_default_str();
  app.add_option("--tp", pf->tp, "Constraint: tensor-parallel size, or a list (4,8)");
  app.add_option("--cp", pf->cp, "Constraint: context-parallel size or list");
  app.add_option("--pp", pf->pp, "Constraint: pipeline-parallel size or list");
  app.add_option("--dp", pf->dp, "Constraint: data-parallel size or list");
  app.add_option("--ep", pf->ep,
                 "Constraint: expert-parallel size or list of a mixture of experts, folded into dp x cp (it "
                 "divides dp x cp and the experts; default: every such size)");
  app.add_option("--vpp,--virtual-stages", pf->vpp,
                 "Constraint: virtual stages per rank or list (above 1: interleaved)");
  app.add_option("--micro-batch", pf->micro_batch,
                 "Constraint: sequences per micro-batch or list (default 1,2,4,8)");
  app.add_option("--max-zero", pf->max_zero, "Constraint: highest ZeRO stage tried")
      ->capture_default_str()
      ->each([pf](const std::string&) { pf->max_zero_given = true; });
  app.add_option("--schedules", pf->schedules, "Constraint: schedules tried, e.g. 1f1b,interleaved");
  app.add_option("--recompute", pf->recompute, "Constraint: recompute modes tried, e.g. none,selective");
  app.add_flag("--no-sequence-parallel", pf->no_sequence_parallel,
               "Constraint: never use sequence parallelism");
  app.add_option("--pp-layers", pf->pp_layers,
                 "Constraint: blocks per pipeline chunk, e.g. 3,3,2 (pp*vpp entries; default balanced)");
  app.add_flag("--explain", pf->explain, "Show every term of the best layout with its inputs");
  app.footer(
      "Ranks every layout (tp, cp, pp, dp, vpp, micro-batch, schedule, recompute, ZeRO stage) that passes "
      "config "
      "validation and fits in GPU memory by predicted time per step. Exit code 1 when nothing fits.\n"
      "Formulas: Narayanan et al. 2021 (parameters, FLOPs, bubbles), Korthikanti et al. 2022 (activations), "
      "Rajbhandari et al. 2020 (ZeRO). 'ndmesh plan memory --help' evaluates one layout.");

  CLI::App* mem = app.add_subcommand("memory", "Memory per GPU and time per step of one layout");
  add_model_hardware_flags(*mem, mf->common);
  mem->add_option("--tp", mf->layout.tp, "Tensor-parallel size")->capture_default_str();
  mem->add_option("--cp", mf->layout.cp, "Context-parallel size")->capture_default_str();
  mem->add_option("--pp", mf->layout.pp, "Pipeline-parallel size")->capture_default_str();
  mem->add_option("--dp", mf->layout.dp, "Data-parallel size")->capture_default_str();
  mem->add_option("--ep", mf->layout.ep,
                  "Expert-parallel size of a mixture of experts, folded into dp x cp (divides dp x cp and the "
                  "experts)")
      ->capture_default_str();
  mem->add_option("--vpp,--virtual-stages", mf->layout.vpp, "Virtual stages per rank (interleaved)")
      ->capture_default_str();
  mem->add_option("--micro-batch", mf->layout.micro_batch, "Sequences per micro-batch")
      ->capture_default_str();
  mem->add_option("--schedule", mf->schedule, "gpipe, 1f1b, interleaved or zb-h1")->capture_default_str();
  mem->add_option("--recompute", mf->recompute, "none, selective or full")
      ->capture_default_str()
      ->each([mf](const std::string&) { mf->recompute_given = true; });
  mem->add_flag("--sequence-parallel", mf->layout.sequence_parallel, "Sequence parallelism with tp");
  mem->add_option("--zero", mf->layout.zero, "ZeRO stage 0-3 over dp")
      ->capture_default_str()
      ->each([mf](const std::string&) { mf->zero_given = true; });
  mem->add_option(
      "--pp-layers", mf->pp_layers,
      "Blocks per pipeline chunk, e.g. 3,3,2 (pp*vpp entries, chunk k on rank k mod pp); default: "
      "the balanced partition the pipeline runs");
  mem->footer("--global-batch defaults to micro_batch x dp x pp (pp micro-batches per pipeline).");

  return [pf, mf, mem]() -> int { return mem->parsed() ? run_memory(*mf) : run_search(*pf); };
}

const Subcommand kPlan{"plan", "Rank layouts of a model on N GPUs by predicted step time and memory", setup};

}  // namespace
}  // namespace ndmesh::cli::plan_command
