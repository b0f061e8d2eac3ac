// GPU speed without a GPU: one training step of a model on the CUDA emulator's account
// (tests/gpu/emulator/account.hpp, count-only mode), every kernel launch, product, cuDNN call,
// copy, host wait and allocation of the step, and a modelled step time at a hardware file's
// measured rates.
//
//   bench_gpu_model --model gpt2-124m --precision bf16 --batch 16 --seq 1024
//                   --hardware docs/hardware/h200-calibrated.toml [--json] [--table]
//
// It runs the real Trainer (--device cuda, one rank) through two steps: the first builds the
// plans and fills the caching allocator, the second is accounted. Per kernel class it prints
// the operations, the bytes they move and their modelled time:
//   - kernels: their distinct bytes (read + written, measured on a sample of blocks and
//     extrapolated: account.hpp) at the file's memory_gbps (a device copy's rate, counting the
//     bytes read and written), plus --launch-us per launch (2 us: back-to-back launches on an
//     H100; not in the file, the GPU check's profile step calibrates it);
//   - products: 2 m n k FLOPs at bf16_tflops (bf16 operands) or peak_tflops (fp32), or their
//     bytes at memory_gbps where that is longer, plus the file's gemm_overhead_us;
//   - cuDNN attention: its FLOPs as `ndmesh plan` counts them at the file's bf16 attention rate
//     (bf16_attention_tflops) or, where the file has none, at the bf16 product rate, as
//     `ndmesh plan` does (the output says which), plus gemm_overhead_us;
//   - copies: on the device at memory_gbps, to and from the host at the pinned links' rates.
// The modelled step is their sum (one stream: nothing overlaps), MFU is (6 N + 6 L T C) FLOPs a
// token over it and --peak-tflops (989: an H100's or H200's dense bf16, as the GPU check's
// PyTorch baseline counts it).
//
// It also flags what keeps a step from the GPU's speed: products whose rows (a leading
// dimension, or the contiguous extent of an operand) are not a multiple of 16 bytes or whose
// pointers are not 16-byte aligned (misaligned_products), kernels moving more than 1 MB on fewer
// blocks than an H200 has SMs (132: small_grid_kernels) or with more than a tenth of their
// bytes in accesses narrower than 16 bytes (narrow_access_kernels), host waits, and blocks the
// caching allocator takes from the driver after the first step (allocations_after_warmup).
//
//   --check FILE    compares with a baseline (tests/gpu/model_baselines/*.json): exit 1 with
//                   one line per regression (launches, bytes or host waits grew, or any flag
//                   above is not 0); the regression test of `make test` (gpu_model.*).
//   --write-baseline FILE --why TEXT   writes one (a commit that changes it says why).
//   --measured FILE  the last line of `ndmesh train --kernel-times --json` (the GPU check's
//                   profile step): measured against modelled time per kernel class.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ndmesh/core/error.hpp"

#if NDMESH_CUDA_EMULATED
#include <CLI/CLI.hpp>

#include "emulator/account.hpp"  // tests/gpu
#include "ndmesh/comm/inproc.hpp"
#include "ndmesh/comm/process_groups.hpp"
#include "ndmesh/model/data.hpp"
#include "ndmesh/parallel/trainer.hpp"
#include "ndmesh/plan/hardware_file.hpp"
#include "ndmesh/plan/presets.hpp"
#include "ndmesh/tensor/rng.hpp"

namespace {

using namespace ndmesh;
using cuda::emulator::Account;
using json = nlohmann::ordered_json;

constexpr int kH200Sms = 132;
constexpr double kBigBytes = 1e6;       // a kernel moving more than this must fill the GPU
constexpr double kNarrowShare = 0.10;   // of its accessed bytes in accesses under 16 bytes

// The models it knows. GPT-2 small's vocabulary is 50257, which the model pads to 50304 (a
// multiple of 64) as llm.c and nanoGPT do; the vocabulary of 50304 given here has the same
// products and kernels, and its data (ZipfSource) draws from all 50304 tokens, as the
// baseline in tests/gpu/model_baselines was measured.
struct ModelEntry {
  const char* name;
  ModelSpec spec;
};
const std::vector<ModelEntry>& models() {
  static const std::vector<ModelEntry> kModels = {
      {"gpt2-124m",
       {.name = "gpt2-124m", .layers = 12, .hidden = 768, .heads = 12, .seq = 1024, .vocab = 50304}},
      // A small model of the same kind (the account's own tests run it).
      {"gpt-tiny", {.name = "gpt-tiny", .layers = 2, .hidden = 128, .heads = 4, .seq = 256, .vocab = 512}},
  };
  return kModels;
}

// Tokens of a Zipf distribution (rank r has weight 1/(r + 1)^1.1, ranks shuffled over the
// vocabulary), like text: a few tokens make up much of a batch, which uniform tokens would hide
// (the embedding's backward groups rows by token).
class ZipfSource final : public model::DataSource {
 public:
  explicit ZipfSource(std::int64_t vocab) : DataSource(7), vocab_(vocab) {
    Rng rng(11);
    std::vector<std::int32_t> order(static_cast<std::size_t>(vocab));
    for (std::int64_t i = 0; i < vocab; ++i) order[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i);
    for (std::int64_t i = vocab - 1; i > 0; --i)
      std::swap(order[static_cast<std::size_t>(i)], order[rng.below(static_cast<std::uint64_t>(i + 1))]);
    token_ = order;
    double sum = 0;
    for (std::int64_t r = 0; r < vocab; ++r) cdf_.push_back(sum += std::pow(static_cast<double>(r + 1), -1.1));
    for (double& c : cdf_) c /= sum;
  }
  std::int64_t vocab() const override { return vocab_; }
  void sequence(std::uint64_t stream, std::int64_t step, std::int64_t index, std::int64_t seq, std::int32_t* tokens,
                std::int32_t* targets) const override {
    Rng rng = sequence_rng(stream, step, index);
    std::int32_t next = draw(rng);
    for (std::int64_t t = 0; t < seq; ++t) {
      tokens[t] = next;
      targets[t] = next = draw(rng);
    }
  }
  std::string describe() const override { return fmt::format("zipf(vocab={})", vocab_); }
  std::optional<double> entropy_rate() const override { return std::nullopt; }

 private:
  std::int32_t draw(Rng& rng) const {
    const double u = rng.uniform();
    const auto r = std::lower_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin();
    return token_[static_cast<std::size_t>(std::min<std::ptrdiff_t>(r, vocab_ - 1))];
  }
  std::int64_t vocab_;
  std::vector<std::int32_t> token_;
  std::vector<double> cdf_;
};

// The class of an operation, by the name the kernel times give it (shared by the account and a
// GPU's measured rows, so that the two are compared class by class).
std::string kernel_class(const std::string& name, std::int64_t vocab) {
  auto has = [&](const char* part) { return name.find(part) != std::string::npos; };
  if (name.rfind("gemm", 0) == 0) {
    const std::string v = std::to_string(vocab);
    return has((v + "x").c_str()) || has(("x" + v).c_str()) ? "matmul (lm head)" : "matmul (blocks)";
  }
  if (has("attention")) return "attention";
  if (has("layernorm")) return "layernorm";
  if (has("classifier") || has("cross_entropy")) return "classifier";
  if (has("embedding")) return "embedding";
  if (has("adamw")) return "adamw";
  if (name.rfind("square_sum", 0) == 0) return "grad norm";
  if (has("gelu")) return "gelu";
  if (has("bias_forward") || has("bias_backward") || has("add_inplace") || has("column sums")) return "bias & residual";
  if (has("cast") || has("round to bfloat16")) return "casts";
  if (name.rfind("sum", 0) == 0) return "loss sum";
  if (name.rfind("copy", 0) == 0 || name == "memset") return "copies";
  if (has("GPU idle")) return "idle";
  return "other";
}

struct Rates {
  plan::Hardware hw;
  double launch_s = 2e-6;
  double product_rate(bool bf16) const {
    const double peak = hw.peak_flops * (hw.achievable_fraction > 0 ? hw.achievable_fraction : 1.0);
    return bf16 && hw.bf16_flops > 0 ? hw.bf16_flops : peak;
  }
  double attention_rate(bool bf16) const {
    if (bf16) return hw.bf16_attention_flops > 0 ? hw.bf16_attention_flops : product_rate(true);
    return hw.attention_flops > 0 ? hw.attention_flops : product_rate(false);
  }
  std::string attention_rate_source(bool bf16) const {
    if (bf16)
      return hw.bf16_attention_flops > 0 ? "the file's bf16 attention rate (bf16_attention_tflops)"
                                         : "the bf16 product rate (the file has no bf16_attention_tflops), as ndmesh plan";
    return hw.attention_flops > 0 ? "the file's fp32 attention rate (attention_tflops)" : "the fp32 product rate";
  }
};

// One accounted operation with its modelled time.
struct Op {
  std::string name, cls;
  double bytes = 0, flops = 0, seconds = 0;
  bool kernel = false;  // a kernel launch (not a product, cuDNN call or copy)
  std::int64_t blocks = 0;
  double narrow = 0;
  std::string misaligned;
};

struct Model {
  std::vector<Op> ops;
  std::int64_t host_waits = 0;
  std::vector<cuda::emulator::AllocationRecord> allocations;
  std::string attention_source;
};

Model model_of(const Account& a, const Rates& r, std::int64_t vocab, bool bf16, const ModelSpec& spec,
               std::int64_t batch, std::int64_t seq) {
  Model m;
  m.host_waits = a.host_waits;
  m.allocations = a.allocations;
  m.attention_source = r.attention_rate_source(bf16);
  const double bw = r.hw.memory_bw > 0 ? r.hw.memory_bw : 1e12;
  // fp32 attention runs on the flash kernels: their time is their FLOPs' (forward 2 b s^2 H hd,
  // backward 5 b s^2 H hd over its kernels), not their bytes'.
  const double flash = static_cast<double>(batch) * static_cast<double>(seq) * static_cast<double>(seq) *
                       static_cast<double>(spec.hidden);
  for (const Account::Op& o : a.order) {
    Op op;
    switch (o.kind) {
      case Account::Kind::kLaunch: {
        const auto& l = a.launches[o.index];
        op.name = l.name.empty() ? "(unnamed kernel)" : l.name;
        op.bytes = l.bytes();
        op.seconds = op.bytes / bw + r.launch_s;
        op.kernel = true;
        op.blocks = l.blocks();
        op.narrow = l.narrow_share();
        if (op.name.rfind("attention_forward", 0) == 0 && op.name.find("cudnn") == std::string::npos)
          op.flops = 2 * flash, op.seconds = op.flops / r.attention_rate(false) + r.launch_s;
        if (op.name.rfind("attention_backward", 0) == 0 && op.name.find("cudnn") == std::string::npos)
          op.flops = 2.5 * flash, op.seconds = op.flops / r.attention_rate(false) + r.launch_s;  // two kernels
        break;
      }
      case Account::Kind::kProduct: {
        const auto& p = a.products[o.index];
        op.name = p.name;
        op.bytes = p.bytes();
        op.flops = p.flops();
        op.seconds = std::max(op.flops / r.product_rate(p.ab_bytes == 2), op.bytes / bw) + r.hw.gemm_overhead;
        op.misaligned = p.misalignment();
        break;
      }
      case Account::Kind::kCudnn: {
        const auto& c = a.cudnn[o.index];
        op.name = c.name;
        op.bytes = c.bytes();
        op.flops = c.flops();
        op.seconds = op.flops / r.attention_rate(c.element_bytes == 2) + r.hw.gemm_overhead;
        break;
      }
      case Account::Kind::kCopy: {
        const auto& c = a.copies[o.index];
        op.name = c.name;
        const double b = static_cast<double>(c.bytes);
        if (c.name == "copy on the device") op.bytes = 2 * b, op.seconds = 2 * b / bw + r.launch_s;
        else if (c.name == "memset") op.bytes = b, op.seconds = b / bw + r.launch_s;
        else if (c.name == "copy host to device")
          op.bytes = b, op.seconds = b / (r.hw.host_to_device_bw > 0 ? r.hw.host_to_device_bw : 25e9) + r.launch_s;
        else
          op.bytes = b, op.seconds = b / (r.hw.device_to_host_bw > 0 ? r.hw.device_to_host_bw : 25e9) + r.launch_s;
        break;
      }
    }
    op.cls = kernel_class(op.name, vocab);
    m.ops.push_back(std::move(op));
  }
  return m;
}

struct ClassRow {
  std::int64_t launches = 0;
  double bytes = 0, seconds = 0, flops = 0;
};

std::map<std::string, ClassRow> by_class(const Model& m) {
  std::map<std::string, ClassRow> rows;
  for (const Op& o : m.ops) {
    ClassRow& r = rows[o.cls];
    ++r.launches, r.bytes += o.bytes, r.seconds += o.seconds, r.flops += o.flops;
  }
  return rows;
}

// Kernels by name: what the flags list.
struct Flagged {
  std::string name;
  std::int64_t count = 0, blocks = 0;
  double bytes = 0, narrow = 0;
  std::string why;
};
std::vector<Flagged> flagged(const Model& m, const std::string& which) {
  std::map<std::string, Flagged> by;
  for (const Op& o : m.ops) {
    bool hit = false;
    std::string why;
    if (which == "small_grid") hit = o.kernel && o.bytes > kBigBytes && o.blocks < kH200Sms;
    if (which == "narrow") hit = o.kernel && o.bytes > kBigBytes && o.narrow > kNarrowShare;
    if (which == "misaligned") hit = !o.misaligned.empty(), why = o.misaligned;
    if (!hit) continue;
    Flagged& f = by[o.name];
    f.name = o.name, ++f.count, f.blocks = o.blocks, f.bytes = std::max(f.bytes, o.bytes), f.narrow = o.narrow;
    f.why = why;
  }
  std::vector<Flagged> out;
  for (auto& [name, f] : by) out.push_back(f);
  return out;
}

std::int64_t flagged_count(const Model& m, const std::string& which) {
  std::int64_t n = 0;
  for (const Flagged& f : flagged(m, which)) n += f.count;
  return n;
}

double parameters(const ModelSpec& s) {
  const double c = static_cast<double>(s.hidden), f = static_cast<double>(s.ffn_or_default());
  const double hd = c / static_cast<double>(s.heads);
  const double qkv = (static_cast<double>(s.heads) + 2.0 * static_cast<double>(s.kv_heads_or_heads())) * hd;
  const double block = 4 * c + c * qkv + qkv + c * c + c + 2 * c * f + f + c;
  return static_cast<double>(s.layers) * block + static_cast<double>(s.vocab + s.seq) * c + 2 * c +
         (s.tied_embeddings ? 0.0 : static_cast<double>(s.vocab) * c);
}

struct Options {
  std::string model = "gpt2-124m", precision = "bf16", hardware = "docs/hardware/h200-calibrated.toml";
  std::int64_t batch = 16, seq = 0, layers = 0, vocab = 0;
  int warmup = 1;
  bool json = false, table = false, trace = false;
  double peak_tflops = 989, launch_us = 2;
  std::string check, write_baseline, why, measured;
};

json summary_json(const Options& o, const ModelSpec& spec, const Model& m, const Rates& r, double step_s,
                  double mfu) {
  std::int64_t kernels = 0, products = 0, cudnn = 0, copies = 0;
  double bytes = 0;
  for (const Op& op : m.ops) {
    bytes += op.bytes;
    if (op.kernel) ++kernels;
    else if (op.name.rfind("gemm", 0) == 0) ++products;
    else if (op.cls == "attention") ++cudnn;
    else ++copies;
  }
  json j;
  j["model"] = o.model;
  j["precision"] = o.precision;
  j["batch"] = o.batch;
  j["seq"] = spec.seq;
  j["layers"] = spec.layers;
  j["vocab"] = spec.vocab;
  j["hardware"] = r.hw.name;
  j["modelled_step_ms"] = step_s * 1e3;
  j["launches"] = static_cast<std::int64_t>(m.ops.size());
  j["kernel_launches"] = kernels;
  j["products"] = products;
  j["cudnn_calls"] = cudnn;
  j["copies"] = copies;
  j["bytes"] = bytes;
  j["host_waits"] = m.host_waits;
  j["allocations_after_warmup"] = static_cast<std::int64_t>(m.allocations.size());
  j["misaligned_products"] = flagged_count(m, "misaligned");
  j["small_grid_kernels"] = flagged_count(m, "small_grid");
  j["narrow_access_kernels"] = flagged_count(m, "narrow");
  j["tokens_per_second"] = static_cast<double>(o.batch * spec.seq) / step_s;
  j["mfu"] = mfu;
  j["attention_rate"] = r.attention_rate_source(o.precision == "bf16");
  j["launch_overhead_us"] = r.launch_s * 1e6;
  json classes = json::array();
  for (const auto& [cls, row] : by_class(m))
    classes.push_back({{"class", cls}, {"launches", row.launches}, {"bytes", row.bytes}, {"ms", row.seconds * 1e3}});
  j["classes"] = classes;
  auto list = [&](const std::string& which) {
    json a = json::array();
    for (const Flagged& f : flagged(m, which))
      a.push_back({{"name", f.name}, {"count", f.count}, {"blocks", f.blocks}, {"bytes", f.bytes},
                   {"narrow_share", f.narrow}, {"why", f.why}});
    return a;
  };
  j["misaligned"] = list("misaligned");
  j["small_grid"] = list("small_grid");
  j["narrow"] = list("narrow");
  json allocs = json::array();
  for (const auto& a : m.allocations) allocs.push_back({{"bytes", a.bytes}, {"after", a.after}});
  j["allocations"] = allocs;
  return j;
}

void print_text(const json& j, const Model& m, bool table) {
  fmt::print("{} {} batch {} x seq {} (vocab {}) on {}: modelled step {:.2f} ms, {:.0f} tokens/s, MFU {:.1f}%\n",
             j["model"].get<std::string>(), j["precision"].get<std::string>(), j["batch"].get<std::int64_t>(),
             j["seq"].get<std::int64_t>(), j["vocab"].get<std::int64_t>(), j["hardware"].get<std::string>(),
             j["modelled_step_ms"].get<double>(), j["tokens_per_second"].get<double>(), 100 * j["mfu"].get<double>());
  fmt::print("  {} operations ({} kernels, {} products, {} cuDNN calls, {} copies), {:.2f} GB, {} host waits, "
             "{} allocations after the first step\n",
             j["launches"].get<std::int64_t>(), j["kernel_launches"].get<std::int64_t>(),
             j["products"].get<std::int64_t>(), j["cudnn_calls"].get<std::int64_t>(), j["copies"].get<std::int64_t>(),
             j["bytes"].get<double>() / 1e9, j["host_waits"].get<std::int64_t>(),
             j["allocations_after_warmup"].get<std::int64_t>());
  fmt::print("  attention at {}; kernels at memory_gbps + {} us a launch\n", j["attention_rate"].get<std::string>(),
             j["launch_overhead_us"].get<double>());
  fmt::print("  {:<18} {:>8} {:>10} {:>10} {:>7}\n", "class", "launches", "MB", "ms", "share");
  const double total = j["modelled_step_ms"].get<double>();
  for (const auto& c : j["classes"])
    fmt::print("  {:<18} {:>8} {:>10.1f} {:>10.3f} {:>6.1f}%\n", c["class"].get<std::string>(),
               c["launches"].get<std::int64_t>(), c["bytes"].get<double>() / 1e6, c["ms"].get<double>(),
               100 * c["ms"].get<double>() / total);
  for (const auto& f : j["misaligned"])
    fmt::print("  misaligned: {} x {}: {}\n", f["count"].get<std::int64_t>(), f["name"].get<std::string>(),
               f["why"].get<std::string>());
  for (const char* which : {"small_grid", "narrow"})
    for (const auto& f : j[which])
      fmt::print("  {}: {} x {} ({} blocks, {:.1f} MB, {:.0f}% in accesses under 16 B)\n", which,
                 f["count"].get<std::int64_t>(), f["name"].get<std::string>(), f["blocks"].get<std::int64_t>(),
                 f["bytes"].get<double>() / 1e6, 100 * f["narrow_share"].get<double>());
  for (const auto& a : j["allocations"])
    fmt::print("  allocation after the first step: {} B after {}\n", a["bytes"].get<std::size_t>(),
               a["after"].get<std::string>());
  if (!table) return;
  // Every operation by name: count, MB, modelled ms.
  std::map<std::string, ClassRow> names;
  for (const Op& o : m.ops) {
    ClassRow& r = names[o.name];
    ++r.launches, r.bytes += o.bytes, r.seconds += o.seconds;
  }
  std::vector<std::pair<std::string, ClassRow>> rows(names.begin(), names.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  fmt::print("  {:>10} {:>6} {:>10}  operation\n", "ms", "calls", "MB");
  for (const auto& [name, r] : rows)
    fmt::print("  {:>10.3f} {:>6} {:>10.1f}  {}\n", r.seconds * 1e3, r.launches, r.bytes / 1e6, name);
}

// Measured (a GPU's `ndmesh train --kernel-times --json`) against modelled, per class.
void print_measured(const std::string& path, const Model& m, std::int64_t vocab) {
  std::ifstream in(path);
  if (!in) fail<ConfigError>("bench_gpu_model", "--measured {}: cannot read the file", path);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty() && line[0] == '{') last = line;
  json j;
  try {
    j = json::parse(last);
  } catch (const std::exception& e) {
    fail<ConfigError>("bench_gpu_model", "--measured {}: no JSON line ({}); give ndmesh train --kernel-times --json's output",
                      path, e.what());
  }
  if (!j.contains("kernel_times"))
    fail<ConfigError>("bench_gpu_model", "--measured {}: the JSON has no kernel_times; run ndmesh train with --kernel-times",
                      path);
  const auto& kt = j["kernel_times"];
  const double steps = std::max(1.0, kt.value("steps", 1.0));
  std::map<std::string, std::pair<double, double>> rows;  // class -> (measured, modelled) seconds a step
  std::map<std::string, std::pair<double, double>> calls;
  for (const auto& r : kt["rows"]) {
    const std::string cls = kernel_class(r["name"].get<std::string>(), vocab);
    rows[cls].first += r["seconds"].get<double>() / steps;
    calls[cls].first += r["calls"].get<double>() / steps;
  }
  for (const Op& o : m.ops) rows[o.cls].second += o.seconds, calls[o.cls].second += 1;
  double measured = 0, modelled = 0;
  fmt::print("measured ({}, {} steps) against modelled, per step:\n", path, steps);
  fmt::print("  {:<18} {:>11} {:>11} {:>7} {:>9} {:>9}\n", "class", "measured ms", "modelled ms", "ratio", "calls", "modelled");
  for (const auto& [cls, t] : rows) {
    measured += t.first, modelled += t.second;
    fmt::print("  {:<18} {:>11.3f} {:>11.3f} {:>7} {:>9.1f} {:>9.0f}\n", cls, t.first * 1e3, t.second * 1e3,
               t.second > 0 ? fmt::format("{:.2f}", t.first / t.second) : "-", calls[cls].first, calls[cls].second);
  }
  fmt::print("  {:<18} {:>11.3f} {:>11.3f} {:>7.2f}\n", "step", measured * 1e3, modelled * 1e3,
             modelled > 0 ? measured / modelled : 0.0);
  fmt::print("  host waits a step: measured {:.1f}, modelled {}\n", kt.value("host_waits", 0.0) / steps, m.host_waits);
}

// The regression check against a baseline: one line per regression; true when none.
bool check(const json& now, const std::string& path) {
  std::ifstream in(path);
  if (!in) fail<ConfigError>("bench_gpu_model", "--check {}: cannot read the baseline", path);
  json base;
  try {
    base = json::parse(in);
  } catch (const std::exception& e) {
    fail<ConfigError>("bench_gpu_model", "--check {}: not JSON ({})", path, e.what());
  }
  std::vector<std::string> bad;
  // The run the baseline is of (the vocabulary is the model's: a model that pads it, or not, is
  // what the check is for).
  for (const char* key : {"model", "precision", "batch", "seq", "layers"})
    if (base["config"][key] != now[key])
      fail<ConfigError>("bench_gpu_model", "--check {}: the baseline is of {} {} and this run of {}; run with the "
                        "baseline's --model --precision --batch --seq", path, key, base["config"][key].dump(), now[key].dump());
  // Absolute: nothing of these in a step.
  for (const char* key : {"misaligned_products", "small_grid_kernels", "narrow_access_kernels", "allocations_after_warmup"})
    if (now[key].get<std::int64_t>() > 0) {
      std::string what;
      const char* list = std::string(key) == "misaligned_products" ? "misaligned"
                         : std::string(key) == "small_grid_kernels" ? "small_grid"
                         : std::string(key) == "narrow_access_kernels" ? "narrow" : "allocations";
      for (const auto& f : now[list])
        what += (what.empty() ? "" : "; ") +
                (f.contains("name") ? fmt::format("{} x {}{}", f["count"].get<std::int64_t>(), f["name"].get<std::string>(),
                                                  f["why"].get<std::string>().empty() ? "" : " (" + f["why"].get<std::string>() + ")")
                                    : fmt::format("{} B after {}", f["bytes"].get<std::size_t>(), f["after"].get<std::string>()));
      bad.push_back(fmt::format("{} = {} (must be 0): {}", key, now[key].get<std::int64_t>(), what));
    }
  // Relative to the baseline: no growth (bytes within 1% and 1 MB: the sampled extrapolation).
  const auto grew = [](double now_v, double base_v) { return now_v > base_v * 1.01 + 1e6; };
  if (now["launches"].get<std::int64_t>() > base["launches"].get<std::int64_t>())
    bad.push_back(fmt::format("launches grew: {} (baseline {})", now["launches"].get<std::int64_t>(),
                              base["launches"].get<std::int64_t>()));
  if (grew(now["bytes"].get<double>(), base["bytes"].get<double>()))
    bad.push_back(fmt::format("bytes grew: {:.1f} MB (baseline {:.1f} MB)", now["bytes"].get<double>() / 1e6,
                              base["bytes"].get<double>() / 1e6));
  if (now["host_waits"].get<std::int64_t>() > base["host_waits"].get<std::int64_t>())
    bad.push_back(fmt::format("host waits grew: {} (baseline {})", now["host_waits"].get<std::int64_t>(),
                              base["host_waits"].get<std::int64_t>()));
  std::map<std::string, json> base_classes;
  for (const auto& c : base["classes"]) base_classes[c["class"].get<std::string>()] = c;
  for (const auto& c : now["classes"]) {
    const std::string cls = c["class"].get<std::string>();
    const json b = base_classes.count(cls) ? base_classes[cls] : json{{"launches", 0}, {"bytes", 0.0}};
    if (c["launches"].get<std::int64_t>() > b["launches"].get<std::int64_t>())
      bad.push_back(fmt::format("{}: launches grew: {} (baseline {})", cls, c["launches"].get<std::int64_t>(),
                                b["launches"].get<std::int64_t>()));
    if (grew(c["bytes"].get<double>(), b["bytes"].get<double>()))
      bad.push_back(fmt::format("{}: bytes grew: {:.1f} MB (baseline {:.1f} MB)", cls, c["bytes"].get<double>() / 1e6,
                                b["bytes"].get<double>() / 1e6));
  }
  for (const std::string& line : bad) fmt::print("REGRESSION {}\n", line);
  if (bad.empty())
    fmt::print("PASS against {}: {} operations (baseline {}), {:.1f} MB (baseline {:.1f} MB), {} host waits\n", path,
               now["launches"].get<std::int64_t>(), base["launches"].get<std::int64_t>(), now["bytes"].get<double>() / 1e6,
               base["bytes"].get<double>() / 1e6, now["host_waits"].get<std::int64_t>());
  else
    fmt::print("FAIL against {} ({} regressions); a change that makes the step better rewrites the baseline with "
               "--write-baseline {} --why '...' in a commit that says why\n", path, bad.size(), path);
  return bad.empty();
}

int run(int argc, char** argv) {
  Options o;
  CLI::App app{"bench_gpu_model: a training step on the CUDA emulator's account, modelled at a hardware file's rates"};
  std::vector<std::string> names;
  for (const auto& m : models()) names.push_back(m.name);
  app.add_option("--model", o.model, "model: " + fmt::format("{}", fmt::join(names, ", ")))->capture_default_str();
  app.add_option("--precision", o.precision, "bf16 or fp32")->capture_default_str();
  app.add_option("--batch", o.batch, "sequences per step (one micro-batch)")->capture_default_str();
  app.add_option("--seq", o.seq, "sequence length (default the model's)");
  app.add_option("--layers", o.layers, "layers (default the model's)");
  app.add_option("--vocab", o.vocab, "vocabulary (default the model's)");
  app.add_option("--hardware", o.hardware, "hardware file or preset (ndmesh plan --hardware)")->capture_default_str();
  app.add_option("--peak-tflops", o.peak_tflops, "the MFU's peak")->capture_default_str();
  app.add_option("--launch-us", o.launch_us, "modelled microseconds per kernel launch")->capture_default_str();
  app.add_option("--warmup", o.warmup, "steps before the accounted one")->capture_default_str();
  app.add_flag("--json", o.json, "one JSON line");
  app.add_flag("--table", o.table, "every operation by name");
  app.add_flag("--trace", o.trace, "every operation of the step in order");
  app.add_option("--check", o.check, "compare with a baseline file: exit 1 on a regression");
  app.add_option("--write-baseline", o.write_baseline, "write a baseline file (with --why)");
  app.add_option("--why", o.why, "why the baseline changes (--write-baseline)");
  app.add_option("--measured", o.measured, "ndmesh train --kernel-times --json output of a GPU: measured against modelled");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  auto entry = std::find_if(models().begin(), models().end(), [&](const ModelEntry& m) { return o.model == m.name; });
  if (entry == models().end())
    fail<ConfigError>("bench_gpu_model", "--model {} is not a model here; use one of {}", o.model, fmt::join(names, ", "));
  if (o.precision != "bf16" && o.precision != "fp32")
    fail<ConfigError>("bench_gpu_model", "--precision {} is not bf16 or fp32", o.precision);
  if (o.batch <= 0) fail<ConfigError>("bench_gpu_model", "--batch {} must be positive, e.g. 16", o.batch);
  if (!o.write_baseline.empty() && o.why.empty())
    fail<ConfigError>("bench_gpu_model", "--write-baseline needs --why 'what changed and why'");
  ModelSpec spec = entry->spec;
  if (o.seq > 0) spec.seq = o.seq;
  if (o.layers > 0) spec.layers = o.layers;
  if (o.vocab > 0) spec.vocab = o.vocab;
  Rates rates{.hw = plan::hardware_by_name_or_file(o.hardware), .launch_s = o.launch_us * 1e-6};

  cuda::emulator::account_start(cuda::emulator::AccountMode::kCountOnly);
  parallel::TrainOptions t;
  t.model = spec;
  t.batch = o.batch;
  t.micro_batch = o.batch;
  t.steps = o.warmup + 3;
  t.device = Device::kCuda;
  t.precision = o.precision == "bf16" ? parallel::Precision::kBf16 : parallel::Precision::kFp32;
  Account account, warmup;
  comm::inproc::run(
      1,
      [&](const comm::Communicator& world) {
        ProcessGroups groups(Mesh::parse("dp=1"), world);
        parallel::Trainer trainer(t, std::make_unique<ZipfSource>(spec.vocab), groups);
        for (int i = 0; i < o.warmup; ++i) trainer.step();  // builds the plans, fills the caching allocator
        warmup = cuda::emulator::account_take();
        trainer.step();
        account = cuda::emulator::account_take();
      },
      {.timeout_s = 3600, .tagless = true});

  const bool bf16 = o.precision == "bf16";
  const Model m = model_of(account, rates, spec.vocab, bf16, spec, o.batch, spec.seq);
  double step_s = 0;
  for (const Op& op : m.ops) step_s += op.seconds;
  const double flops_per_token = 6 * parameters(spec) + 6.0 * static_cast<double>(spec.layers * spec.seq * spec.hidden);
  const double mfu = flops_per_token * static_cast<double>(o.batch * spec.seq) / step_s / (o.peak_tflops * 1e12);
  const json j = summary_json(o, spec, m, rates, step_s, mfu);
  if (o.json)
    fmt::print("{}\n", j.dump());
  else
    print_text(j, m, o.table);
  if (o.trace) {
    for (const auto& a : warmup.allocations)
      fmt::print("  first step: allocation of {} B after {}\n", a.bytes, a.after);
    fmt::print("  the accounted step, in order:\n");
  }
  if (o.trace)
    for (const Op& op : m.ops)
      fmt::print("  {:>9.1f} us {:>9.1f} MB  {}{}\n", op.seconds * 1e6, op.bytes / 1e6, op.name,
                 op.kernel ? fmt::format(" [{} blocks, {:.0f}% narrow]", op.blocks, 100 * op.narrow) : "");
  if (!o.measured.empty()) print_measured(o.measured, m, spec.vocab);
  if (!o.write_baseline.empty()) {
    json b;
    b["why"] = o.why;
    b["config"] = {{"model", o.model}, {"precision", o.precision}, {"batch", o.batch},
                   {"seq", spec.seq},  {"layers", spec.layers},    {"vocab", spec.vocab}};
    for (const char* key : {"launches", "bytes", "host_waits", "modelled_step_ms", "classes"}) b[key] = j[key];
    std::ofstream out(o.write_baseline);
    out << b.dump(2) << "\n";
    if (!out) fail<ConfigError>("bench_gpu_model", "--write-baseline {}: cannot write the file", o.write_baseline);
  }
  if (!o.check.empty() && !check(j, o.check)) return 1;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const ndmesh::ConfigError& e) {
    fmt::print(stderr, "{}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_gpu_model: {}\n", e.what());
    return 1;
  }
}

#else
int main() {
  fmt::print("bench_gpu_model: this build has no CUDA emulator (configure where the CUDA toolkit and Python 3 are "
             "found); nothing to account\n");
  return 0;
}
#endif
