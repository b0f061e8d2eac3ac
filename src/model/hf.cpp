#include "ndmesh/model/hf.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include <fmt/core.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "ndmesh/core/error.hpp"
#include "ndmesh/tensor/tensor.hpp"
#include "ndmesh/model/checkpoint_dir.hpp"
#include "ndmesh/model/safetensors.hpp"

namespace ndmesh::model {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace {

// The keys of a config.json, each with transformers' default when the file leaves it out
// (or writes null), each error naming the file and the key.
class ConfigKeys {
 public:
  ConfigKeys(std::string path, json j) : path_(std::move(path)), j_(std::move(j)) {}
  [[noreturn]] void bad(const std::string& key, const std::string& what) const {
    fail<ConfigError>("hf", "'{}': \"{}\" {}", path_, key, what);
  }
  bool has(const std::string& key) const { return j_.contains(key) && !j_[key].is_null(); }
  const json& raw(const std::string& key) const { return j_[key]; }
  std::int64_t integer(const std::string& key, std::int64_t fallback) const {
    if (!has(key)) return fallback;
    const json& v = j_[key];
    if (!v.is_number_integer() || v.get<std::int64_t>() < 0)
      bad(key, fmt::format("= {} is not a whole number", v.dump()));
    return v.get<std::int64_t>();
  }
  double real(const std::string& key, double fallback) const {
    if (!has(key)) return fallback;
    const json& v = j_[key];
    if (!v.is_number()) bad(key, fmt::format("= {} is not a number", v.dump()));
    return v.get<double>();
  }
  bool boolean(const std::string& key, bool fallback) const {
    if (!has(key)) return fallback;
    const json& v = j_[key];
    if (!v.is_boolean()) bad(key, fmt::format("= {} is not true or false", v.dump()));
    return v.get<bool>();
  }
  std::string string(const std::string& key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    const json& v = j_[key];
    if (!v.is_string()) bad(key, fmt::format("= {} is not a name", v.dump()));
    return v.get<std::string>();
  }
  // A feature ndmesh does not implement: refused when the file turns it on.
  void refuse_if(const std::string& key, bool on, const std::string& why) const {
    if (on) bad(key, fmt::format("= {}: {}", j_[key].dump(), why));
  }

 private:
  std::string path_;
  json j_;
};

ModelSpec gpt2_spec(const ConfigKeys& k) {
  ModelSpec m = with_arch(ModelSpec{}, "gpt2");
  // transformers' GPT2Config defaults.
  m.vocab = k.integer("vocab_size", 50257);
  m.seq = k.integer("n_positions", 1024);
  m.max_positions = m.seq;
  m.hidden = k.integer("n_embd", 768);
  m.layers = k.integer("n_layer", 12);
  m.heads = k.integer("n_head", 12);
  m.kv_heads = m.heads;
  m.ffn = k.integer("n_inner", 4 * m.hidden);
  m.norm_eps = k.real("layer_norm_epsilon", 1e-5);
  m.init_std = k.real("initializer_range", 0.02);
  m.tied_embeddings = k.boolean("tie_word_embeddings", true);
  const std::string act = k.string("activation_function", "gelu_new");
  k.refuse_if("activation_function", act != "gelu_new" && act != "gelu_pytorch_tanh",
              "ndmesh's GELU is the tanh approximation (gelu_new, gelu_pytorch_tanh)");
  k.refuse_if("scale_attn_weights", !k.boolean("scale_attn_weights", true),
              "ndmesh scales attention scores by 1/sqrt(head_dim)");
  k.refuse_if("scale_attn_by_inverse_layer_idx", k.boolean("scale_attn_by_inverse_layer_idx", false),
              "ndmesh does not scale attention by the layer index");
  k.refuse_if("add_cross_attention", k.boolean("add_cross_attention", false),
              "ndmesh has no cross-attention");
  return m;
}

ModelSpec llama_spec(const ConfigKeys& k) {
  ModelSpec m = with_arch(ModelSpec{}, "llama");
  // transformers' LlamaConfig defaults.
  m.vocab = k.integer("vocab_size", 32000);
  m.hidden = k.integer("hidden_size", 4096);
  m.ffn = k.integer("intermediate_size", 11008);
  m.layers = k.integer("num_hidden_layers", 32);
  m.heads = k.integer("num_attention_heads", 32);
  m.kv_heads = k.integer("num_key_value_heads", m.heads);
  m.seq = k.integer("max_position_embeddings", 2048);
  m.norm_eps = k.real("rms_norm_eps", 1e-6);
  m.init_std = k.real("initializer_range", 0.02);
  m.tied_embeddings = k.boolean("tie_word_embeddings", false);
  m.rope_theta = k.real("rope_theta", 10000.0);
  if (k.has("head_dim")) {
    const std::int64_t hd = k.integer("head_dim", 0);
    if (m.heads > 0 && hd != m.hidden / m.heads) m.head_dim = hd;
  }
  const std::string act = k.string("hidden_act", "silu");
  k.refuse_if("hidden_act", act != "silu", "ndmesh's gated MLP is SwiGLU (silu)");
  k.refuse_if("attention_bias", k.boolean("attention_bias", false), "ndmesh's Llama attention has no biases");
  k.refuse_if("mlp_bias", k.boolean("mlp_bias", false), "ndmesh's Llama MLP has no biases");
  k.refuse_if("pretraining_tp", k.integer("pretraining_tp", 1) != 1,
              "ndmesh implements pretraining_tp 1 only");
  if (k.has("rope_scaling")) {
    const json& r = k.raw("rope_scaling");
    if (!r.is_object()) k.bad("rope_scaling", fmt::format("= {} is not an object", r.dump()));
    std::string type = r.contains("rope_type") && r["rope_type"].is_string()
                           ? r["rope_type"].get<std::string>()
                       : r.contains("type") && r["type"].is_string() ? r["type"].get<std::string>()
                                                                     : "";
    if (type != "llama3")
      k.bad("rope_scaling",
            fmt::format("has type '{}'; ndmesh implements Llama 3's frequency scaling (llama3) only", type));
    auto num = [&](const char* key, double fallback) {
      if (!r.contains(key)) return fallback;
      if (!r[key].is_number())
        k.bad(fmt::format("rope_scaling.{}", key), fmt::format("= {} is not a number", r[key].dump()));
      return r[key].get<double>();
    };
    m.rope_scaling.factor = num("factor", 8.0);
    m.rope_scaling.low_freq_factor = num("low_freq_factor", 1.0);
    m.rope_scaling.high_freq_factor = num("high_freq_factor", 4.0);
    m.rope_scaling.original_positions =
        static_cast<std::int64_t>(num("original_max_position_embeddings", 8192));
  }
  return m;
}

// The family a description is, or ConfigError naming the field that is neither's.
std::string family_of(const ModelSpec& s) {
  const std::string arch = arch_name(s);
  auto need = [&](bool ok, const std::string& what) {
    if (!ok)
      fail<ConfigError>("hf", "the model is {} except {}; Hugging Face's {} has no such variant", arch, what,
                        arch == "gpt2" ? "GPT2LMHeadModel" : "LlamaForCausalLM");
  };
  if (arch == "gpt2") {
    need(s.biases, "for biases=false");
    need(s.kv_heads_or_heads() == s.heads,
         fmt::format("for kv_heads={} (GPT-2 has none)", s.kv_heads_or_heads()));
    need(s.head_dim_or_default() * s.heads == s.hidden,
         fmt::format("for head_dim={}", s.head_dim_or_default()));
  } else if (arch == "llama") {
    need(!s.biases, "for biases=true");
  } else {
    fail<ConfigError>("hf",
                      "the model's layers (norm {}, mlp {}, positions {}) are neither GPT-2's nor Llama's; "
                      "Hugging Face export knows gpt2 and llama",
                      norm_name(s.norm), mlp_name(s.mlp), positions_name(s.positions));
  }
  NDMESH_CHECK_CONFIG(s.experts == 0, "hf", "experts={}: Hugging Face export knows dense gpt2 and llama only",
                      s.experts);
  return arch;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail<ConfigError>("hf", "cannot read '{}'; check the path and its permissions", path);
  return {(std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()};
}

// A directory that appears only when complete: written as a hidden sibling, renamed at the end.
std::string sibling_temp(const std::string& dir, const char* what) {
  fs::path p(dir);
  while (!p.empty() && p.filename().empty()) p = p.parent_path();
  return (p.parent_path() / fmt::format(".{}.{}", p.filename().string(), what)).string();
}

void refuse_existing(const std::string& dir, bool force, const char* what) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !force)
    fail<ConfigError>("hf", "'{}' exists; pass --force to replace it, or choose another {}", dir, what);
}

// Puts the complete `tmp` at `dir` (the previous one, with force, removed after).
void put_in_place(const std::string& tmp, const std::string& dir) {
  std::error_code ec;
  const std::string aside = tmp + ".previous";
  fs::remove_all(aside, ec);
  const bool replace = fs::exists(dir, ec);
  if (replace) fs::rename(dir, aside, ec);
  if (ec) fail<IoError>("hf", "cannot move '{}' aside to replace it: {}", dir, ec.message());
  fs::rename(tmp, dir, ec);
  if (ec) fail<IoError>("hf", "cannot rename '{}' to '{}': {}", tmp, dir, ec.message());
  if (replace) fs::remove_all(aside, ec);
}

}  // namespace

ModelSpec hf_config_to_spec(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec))
    fail<ConfigError>(
        "hf", "'{}' is missing; a Hugging Face model folder holds config.json beside its safetensors", path);
  const json j = json::parse(read_text(path), nullptr, false);
  if (j.is_discarded() || !j.is_object()) fail<ConfigError>("hf", "'{}' is not a JSON object", path);
  const ConfigKeys keys(path, j);
  if (!keys.has("model_type")) keys.bad("model_type", "is missing; ndmesh reads gpt2 and llama");
  const std::string type = keys.string("model_type", "");
  ModelSpec m;
  if (type == "gpt2")
    m = gpt2_spec(keys);
  else if (type == "llama")
    m = llama_spec(keys);
  else
    keys.bad("model_type", fmt::format("= '{}' is not a model type ndmesh reads; use gpt2 or llama", type));
  if (auto problems = model_problems(m); !problems.empty())
    fail<ConfigError>("hf", "'{}' describes a model ndmesh cannot build: {}", path,
                      fmt::join(problems, "; "));
  return m;
}

std::string hf_config_json(const ModelSpec& s, const std::string& torch_dtype) {
  const std::string family = family_of(s);
  json j;
  if (family == "gpt2") {
    j["architectures"] = {"GPT2LMHeadModel"};
    j["model_type"] = "gpt2";
    j["vocab_size"] = s.vocab;
    j["n_positions"] = s.position_rows();
    j["n_ctx"] = s.position_rows();
    j["n_embd"] = s.hidden;
    j["n_layer"] = s.layers;
    j["n_head"] = s.heads;
    j["n_inner"] = s.ffn_or_default();
    j["activation_function"] = "gelu_new";
    j["layer_norm_epsilon"] = s.norm_eps;
    j["initializer_range"] = s.init_std;
    j["tie_word_embeddings"] = s.tied_embeddings;
  } else {
    j["architectures"] = {"LlamaForCausalLM"};
    j["model_type"] = "llama";
    j["vocab_size"] = s.vocab;
    j["hidden_size"] = s.hidden;
    j["intermediate_size"] = s.ffn_or_default();
    j["num_hidden_layers"] = s.layers;
    j["num_attention_heads"] = s.heads;
    j["num_key_value_heads"] = s.kv_heads_or_heads();
    j["head_dim"] = s.head_dim_or_default();
    j["hidden_act"] = "silu";
    j["max_position_embeddings"] = s.seq;
    j["rms_norm_eps"] = s.norm_eps;
    j["rope_theta"] = s.rope_theta;
    if (s.rope_scaling.factor > 0)
      j["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", s.rope_scaling.factor},
                           {"low_freq_factor", s.rope_scaling.low_freq_factor},
                           {"high_freq_factor", s.rope_scaling.high_freq_factor},
                           {"original_max_position_embeddings", s.rope_scaling.original_positions}};
    else
      j["rope_scaling"] = nullptr;
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
    j["initializer_range"] = s.init_std;
    j["tie_word_embeddings"] = s.tied_embeddings;
  }
  j["torch_dtype"] = torch_dtype;
  return j.dump(2) + "\n";
}

HfMapping hf_mapping(const ModelSpec& s) {
  const std::string family = family_of(s);
  const std::int64_t c = s.hidden, v = s.vocab, f = s.ffn_or_default(), hd = s.head_dim_or_default();
  const std::int64_t q = s.heads * hd, kv = s.kv_heads_or_heads() * hd;
  HfMapping m;
  auto nd = [&](std::string name, std::vector<std::int64_t> shape) {
    m.ndmesh.push_back({std::move(name), std::move(shape)});
  };
  auto hf = [&](std::string name, std::vector<std::int64_t> shape, std::string to, std::int64_t row = 0,
                bool transpose = false) {
    m.hf.push_back({std::move(name), std::move(shape), std::move(to), row, transpose});
  };
  if (family == "gpt2") {
    const std::string t = "transformer.";
    nd("embed.tokens", {v, c});
    hf(t + "wte.weight", {v, c}, "embed.tokens");
    nd("embed.positions", {s.position_rows(), c});
    hf(t + "wpe.weight", {s.position_rows(), c}, "embed.positions");
    for (std::int64_t l = 0; l < s.layers; ++l) {
      const std::string b = fmt::format("block.{}.", l), h = fmt::format("{}h.{}.", t, l);
      for (const char* p : {"weight", "bias"}) {
        nd(b + "ln1." + p, {c});
        hf(h + "ln_1." + p, {c}, b + "ln1." + p);
      }
      nd(b + "attn.qkv.weight", {3 * c, c});
      hf(h + "attn.c_attn.weight", {c, 3 * c}, b + "attn.qkv.weight", 0, true);
      nd(b + "attn.qkv.bias", {3 * c});
      hf(h + "attn.c_attn.bias", {3 * c}, b + "attn.qkv.bias");
      nd(b + "attn.proj.weight", {c, c});
      hf(h + "attn.c_proj.weight", {c, c}, b + "attn.proj.weight", 0, true);
      nd(b + "attn.proj.bias", {c});
      hf(h + "attn.c_proj.bias", {c}, b + "attn.proj.bias");
      for (const char* p : {"weight", "bias"}) {
        nd(b + "ln2." + p, {c});
        hf(h + "ln_2." + p, {c}, b + "ln2." + p);
      }
      nd(b + "mlp.fc.weight", {f, c});
      hf(h + "mlp.c_fc.weight", {c, f}, b + "mlp.fc.weight", 0, true);
      nd(b + "mlp.fc.bias", {f});
      hf(h + "mlp.c_fc.bias", {f}, b + "mlp.fc.bias");
      nd(b + "mlp.proj.weight", {c, f});
      hf(h + "mlp.c_proj.weight", {f, c}, b + "mlp.proj.weight", 0, true);
      nd(b + "mlp.proj.bias", {c});
      hf(h + "mlp.c_proj.bias", {c}, b + "mlp.proj.bias");
    }
    for (const char* p : {"weight", "bias"}) {
      nd(std::string("ln_f.") + p, {c});
      hf(t + "ln_f." + p, {c}, std::string("ln_f.") + p);
    }
  } else {
    nd("embed.tokens", {v, c});
    hf("model.embed_tokens.weight", {v, c}, "embed.tokens");
    for (std::int64_t l = 0; l < s.layers; ++l) {
      const std::string b = fmt::format("block.{}.", l), h = fmt::format("model.layers.{}.", l);
      nd(b + "ln1.weight", {c});
      hf(h + "input_layernorm.weight", {c}, b + "ln1.weight");
      nd(b + "attn.qkv.weight", {q + 2 * kv, c});
      hf(h + "self_attn.q_proj.weight", {q, c}, b + "attn.qkv.weight", 0);
      hf(h + "self_attn.k_proj.weight", {kv, c}, b + "attn.qkv.weight", q);
      hf(h + "self_attn.v_proj.weight", {kv, c}, b + "attn.qkv.weight", q + kv);
      nd(b + "attn.proj.weight", {c, q});
      hf(h + "self_attn.o_proj.weight", {c, q}, b + "attn.proj.weight");
      nd(b + "ln2.weight", {c});
      hf(h + "post_attention_layernorm.weight", {c}, b + "ln2.weight");
      nd(b + "mlp.fc.weight", {2 * f, c});
      hf(h + "mlp.gate_proj.weight", {f, c}, b + "mlp.fc.weight", 0);
      hf(h + "mlp.up_proj.weight", {f, c}, b + "mlp.fc.weight", f);
      nd(b + "mlp.proj.weight", {c, f});
      hf(h + "mlp.down_proj.weight", {c, f}, b + "mlp.proj.weight");
    }
    nd("ln_f.weight", {c});
    hf("model.norm.weight", {c}, "ln_f.weight");
  }
  if (!s.tied_embeddings) {
    nd("lm_head.weight", {v, c});
    hf("lm_head.weight", {v, c}, "lm_head.weight");
  }
  return m;
}

bool is_hf_dir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::is_regular_file(fs::path(path) / kHfConfigFile, ec) &&
         !is_checkpoint_dir(path);
}

HfFolder::HfFolder(const std::string& hf_dir) : dir_(hf_dir) {
  std::error_code ec;
  if (!fs::is_directory(hf_dir, ec))
    fail<ConfigError>("hf",
                      "'{}' is not a folder; pass the folder save_pretrained wrote (config.json, "
                      "model.safetensors)",
                      hf_dir);
  spec_ = hf_config_to_spec((fs::path(hf_dir) / kHfConfigFile).string());
  map_ = hf_mapping(spec_);
  try {
    folder_ = std::make_unique<SafetensorsFolder>(hf_dir);
  } catch (const IoError& e) {
    const std::string what = e.what();
    fail<ConfigError>("hf", "{}", what.substr(what.find("] ") + 2));
  }
}

HfFolder::~HfFolder() = default;

const NdTensor* HfFolder::find(const std::string& name) const {
  for (const NdTensor& t : map_.ndmesh)
    if (t.name == name) return &t;
  return nullptr;
}

void HfFolder::read(const NdTensor& t, float* values) {
  const std::int64_t n = shape_numel(t.shape), rows = t.shape[0], cols = n / rows;
  read_block(t, 0, rows, 0, cols, values, cols);
  for (const HfTensor& h : map_.hf)
    if (h.ndmesh == t.name) ++tensors_read_;
}

void HfFolder::read_block(const NdTensor& t, std::int64_t row, std::int64_t rows, std::int64_t col,
                          std::int64_t cols, float* out, std::int64_t ld) {
  // GPT-2 folders saved from GPT2Model (the hub's gpt2) have no "transformer." prefix.
  auto locate = [&](const std::string& name) {
    auto found = folder_->find(name);
    if (found.first == nullptr && name.starts_with("transformer.")) found = folder_->find(name.substr(12));
    return found;
  };
  const std::int64_t all_rows = t.shape[0], all_cols = shape_numel(t.shape) / all_rows;
  NDMESH_CHECK(row >= 0 && col >= 0 && rows >= 0 && cols >= 0 && row + rows <= all_rows &&
                   col + cols <= all_cols && ld >= cols,
               "hf", "block rows [{}, {}) cols [{}, {}) of '{}' [{} x {}]", row, row + rows, col, col + cols,
               t.name, all_rows, all_cols);
  for (std::int64_t r = 0; r < rows; ++r) std::fill(out + r * ld, out + r * ld + cols, 0.0f);
  for (const HfTensor& h : map_.hf) {
    if (h.ndmesh != t.name) continue;
    auto [st, file] = locate(h.name);
    if (st == nullptr)
      fail<ConfigError>("hf", "'{}' has no tensor '{}', which a {} model of this config.json needs", dir_,
                        h.name, arch_name(spec_));
    if (st->shape != h.shape)
      fail<ConfigError>("hf", "'{}': tensor '{}' has shape [{}] but config.json says [{}]", file->path(),
                        st->name, fmt::join(st->shape, ", "), fmt::join(h.shape, ", "));
    used_.push_back(st->name);
    // The rows of t this tensor holds ([out, in] rows; a Conv1D weight holds its columns).
    const std::int64_t held = h.transpose ? h.shape[1] : h.shape[0];
    const std::int64_t lo = std::max(row, h.row), hi = std::min(row + rows, h.row + held);
    if (lo >= hi || cols == 0) continue;
    float* dst = out + (lo - row) * ld;
    if (h.transpose) {  // rows [lo, hi) x cols of [out, in] = rows cols x columns [lo, hi) of [in, out]
      const std::int64_t nr = hi - lo;
      part_.resize(static_cast<std::size_t>(cols * nr));
      file->read_block(*st, col, cols, lo - h.row, nr, part_.data(), nr);
      for (std::int64_t i = 0; i < cols; ++i)
        for (std::int64_t o = 0; o < nr; ++o) dst[o * ld + i] = part_[static_cast<std::size_t>(i * nr + o)];
    } else {
      file->read_block(*st, lo - h.row, hi - lo, col, cols, dst, ld);
    }
  }
}

std::int64_t HfFolder::bytes_read() const {
  std::int64_t bytes = 0;
  for (const auto& f : folder_->files()) bytes += f->bytes_read();
  return bytes;
}

std::vector<std::string> HfFolder::unused() const {
  const std::set<std::string> used(used_.begin(), used_.end());
  std::vector<std::string> out;
  for (const std::string& name : folder_->names())
    if (!used.contains(name)) out.push_back(name);
  return out;
}

HfImportReport import_hf(const std::string& hf_dir, const std::string& ckpt_dir, bool force) {
  HfFolder folder(hf_dir);
  HfImportReport report;
  report.spec = folder.spec();
  refuse_existing(ckpt_dir, force, "checkpoint directory");
  const HfMapping& map = folder.mapping();
  const std::string tmp = checkpoint_temp_dir(ckpt_dir);
  prepare_checkpoint_temp_dir(tmp);
  try {
    Manifest manifest;
    manifest.spec = report.spec;
    manifest.layout = {.mesh = fmt::format("imported from Hugging Face folder {}", hf_dir),
                       .world = 1,
                       .partition = {report.spec.layers}};
    ShardFileWriter writer(tmp, "shard-pp000-tp000.bin");
    std::vector<float> values;
    // No optimizer state: zeros from calloc, whose untouched pages are the kernel's zero
    // page (no resident memory for a tensor's worth of zeros).
    std::int64_t largest = 1;
    for (const NdTensor& t : map.ndmesh) largest = std::max(largest, shape_numel(t.shape));
    const std::unique_ptr<float, decltype(&std::free)> zeros(
        static_cast<float*>(std::calloc(static_cast<std::size_t>(largest), sizeof(float))), &std::free);
    if (!zeros) fail<IoError>("hf", "cannot allocate {} zeros for the optimizer state", largest);
    for (const NdTensor& t : map.ndmesh) {
      values.resize(static_cast<std::size_t>(shape_numel(t.shape)));
      folder.read(t, values.data());
      TensorRecord r{t.name, t.shape, {}};
      if (auto slice = writer.append(ParamShard{}, t.shape, values.data(), zeros.get(), zeros.get()))
        r.slices.push_back(*slice);
      manifest.tensors.push_back(std::move(r));
      report.parameters += shape_numel(t.shape);
    }
    manifest.files.push_back(writer.close());
    write_manifest(tmp, manifest);
    read_manifest(tmp);
    commit_checkpoint_dir(tmp, ckpt_dir);
  } catch (...) {
    discard_checkpoint_temp_dir(tmp);
    throw;
  }
  report.tensors = folder.tensors_read();
  report.ignored = folder.unused();
  return report;
}

HfExportReport export_hf(const std::string& ckpt_dir, const std::string& hf_dir, const HfExportOptions& o) {
  NDMESH_CHECK_CONFIG(o.dtype == "fp32" || o.dtype == "bf16", "hf", "--dtype={} is not fp32 or bf16",
                      o.dtype);
  refuse_existing(hf_dir, o.force, "output folder");
  Manifest manifest;
  try {
    manifest = read_manifest(ckpt_dir);
  } catch (const IoError& e) {
    const std::string what = e.what();
    fail<ConfigError>("hf", "{}", what.substr(what.find("] ") + 2));
  }
  HfExportReport report;
  report.spec = manifest.spec;
  const HfMapping map = hf_mapping(manifest.spec);
  for (const NdTensor& t : map.ndmesh) {
    const TensorRecord* r = manifest.find(t.name);
    if (r == nullptr)
      fail<ConfigError>("hf",
                        "'{}' has no tensor '{}' although its model needs one; the checkpoint is corrupt",
                        ckpt_dir, t.name);
    if (r->shape != t.shape)
      fail<ConfigError>("hf",
                        "'{}': tensor '{}' has shape [{}] but its model says [{}]; the checkpoint is corrupt",
                        ckpt_dir, t.name, fmt::join(r->shape, ", "), fmt::join(t.shape, ", "));
  }
  const SafeDtype dtype = o.dtype == "bf16" ? SafeDtype::kBF16 : SafeDtype::kF32;
  const std::int64_t elem = safetensors_dtype_bytes(dtype);
  // The ndmesh tensor last read (q/k/v and gate/up read one tensor three and two times).
  struct Cache {
    std::string name;
    std::vector<float> params, m, v;
  };
  auto cache = std::make_shared<Cache>();
  auto read = [&manifest, &ckpt_dir, cache](const std::string& name) -> const std::vector<float>& {
    if (cache->name == name) return cache->params;
    const TensorRecord* r = manifest.find(name);
    ParamView view;
    view.name = name;
    view.shape = r->shape;
    view.numel = shape_numel(r->shape);
    for (auto* b : {&cache->params, &cache->m, &cache->v}) b->resize(static_cast<std::size_t>(view.numel));
    read_tensor(ckpt_dir, manifest, *r, view, cache->params.data(), cache->m.data(), cache->v.data());
    cache->name = name;
    return cache->params;
  };
  // The tensors grouped into files of at most max_shard_bytes (one file when they fit).
  std::vector<std::vector<SafeTensorOut>> shards(1);
  std::int64_t in_shard = 0;
  for (const HfTensor& h : map.hf) {
    const std::int64_t bytes = shape_numel(h.shape) * elem;
    if (in_shard > 0 && in_shard + bytes > o.max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    in_shard += bytes;
    report.bytes += bytes;
    shards.back().push_back({h.name, h.shape, [h, read, &map](float* out) {
                               std::vector<std::int64_t> shape;
                               for (const NdTensor& t : map.ndmesh)
                                 if (t.name == h.ndmesh) shape = t.shape;
                               const std::vector<float>& all = read(h.ndmesh);
                               const std::int64_t cols = shape_numel(shape) / shape[0];
                               const float* src = all.data() + h.row * cols;
                               if (h.transpose) {  // rows of [out, in] -> [in, out]
                                 const std::int64_t in = h.shape[0], n_out = h.shape[1];
                                 for (std::int64_t i = 0; i < in; ++i)
                                   for (std::int64_t k = 0; k < n_out; ++k)
                                     out[i * n_out + k] = src[k * in + i];
                               } else {
                                 std::copy(src, src + shape_numel(h.shape), out);
                               }
                             }});
  }
  const std::string tmp = sibling_temp(hf_dir, "exporting");
  std::error_code ec;
  fs::remove_all(tmp, ec);
  if (!fs::create_directories(tmp, ec))
    fail<IoError>("hf", "cannot create '{}': {}; check that the folder above exists and is writable", tmp,
                  ec ? ec.message() : "it exists");
  try {
    const std::map<std::string, std::string> meta = {{"format", "pt"}};
    if (shards.size() == 1) {
      write_safetensors((fs::path(tmp) / kSafetensorsFile).string(), shards[0], dtype, meta);
    } else {
      json index;
      index["metadata"] = {{"total_size", report.bytes}};
      json weight_map = json::object();
      for (std::size_t i = 0; i < shards.size(); ++i) {
        const std::string name = fmt::format("model-{:05}-of-{:05}.safetensors", i + 1, shards.size());
        write_safetensors((fs::path(tmp) / name).string(), shards[i], dtype, meta);
        for (const SafeTensorOut& t : shards[i]) weight_map[t.name] = name;
      }
      index["weight_map"] = weight_map;
      std::ofstream((fs::path(tmp) / kSafetensorsIndex).string()) << index.dump(2) << "\n";
    }
    report.files = static_cast<std::int64_t>(shards.size());
    std::ofstream config((fs::path(tmp) / kHfConfigFile).string());
    config << hf_config_json(manifest.spec, o.dtype == "bf16" ? "bfloat16" : "float32");
    config.close();
    if (!config) fail<IoError>("hf", "cannot write '{}/{}' (disk full?)", tmp, kHfConfigFile);
    put_in_place(tmp, hf_dir);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  return report;
}

}  // namespace ndmesh::model
