// Hugging Face folders (model/hf.hpp) without transformers: config.json's defaults are
// transformers' per model type and unsupported features are refused naming the key; the
// mapping's ndmesh side is exactly the model's parameters; an import puts each value where
// the layouts say (a Conv1D weight transposed, q/k/v and gate/up stacked by rows), export
// gives the file back bit for bit; bad input names the file and the tensor and writes
// nothing. The comparison with transformers itself is tests/python/hf_interop.sh.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "ndmesh/config/presets.hpp"
#include "ndmesh/core/error.hpp"
#include "ndmesh/model/checkpoint.hpp"
#include "ndmesh/model/checkpoint_dir.hpp"
#include "ndmesh/model/decoder.hpp"
#include "ndmesh/model/hf.hpp"
#include "ndmesh/model/safetensors.hpp"
#include "support/error_of.hpp"
#include "support/temp_dir.hpp"

namespace ndmesh::model {
namespace {

namespace fs = std::filesystem;
using testing_support::error_of;

struct TempDir : testing_support::TempDir {
  TempDir() : testing_support::TempDir("ndmesh_hf") {}
};

std::string config_error(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  return error_of<ConfigError>([&] { hf_config_to_spec(path); });
}

ModelSpec gpt2_small() {
  ModelSpec s = with_arch(ModelSpec{}, "gpt2");
  s.layers = 2, s.hidden = 8, s.heads = 2, s.seq = 6, s.vocab = 10;
  return s;
}

ModelSpec llama_small(bool tied) {
  ModelSpec s = with_arch(ModelSpec{}, "llama");
  s.layers = 2, s.hidden = 8, s.heads = 4, s.kv_heads = 2, s.ffn = 12, s.seq = 6, s.vocab = 10;
  s.tied_embeddings = tied;
  return s;
}

// A value that names its tensor and position: tensor k's element i is k * 1000 + i.
float tagged(std::size_t k, std::int64_t i) {
  return static_cast<float>(k * 1000 + static_cast<std::size_t>(i));
}

// An HF folder of `spec` with tagged values (config.json from hf_config_json).
void write_folder(const fs::path& dir, const ModelSpec& spec, SafeDtype dtype = SafeDtype::kF32) {
  fs::create_directories(dir);
  std::ofstream(dir / kHfConfigFile) << hf_config_json(spec);
  const HfMapping map = hf_mapping(spec);
  std::vector<SafeTensorOut> out;
  for (std::size_t k = 0; k < map.hf.size(); ++k)
    out.push_back({map.hf[k].name, map.hf[k].shape, [k, shape = map.hf[k].shape](float* p) {
                     std::int64_t n = 1;
                     for (auto d : shape) n *= d;
                     for (std::int64_t i = 0; i < n; ++i) p[i] = tagged(k, i);
                   }});
  write_safetensors((dir / kSafetensorsFile).string(), out, dtype, {{"format", "pt"}});
}

std::vector<float> read_param(const std::string& dir, const std::string& name) {
  const Manifest m = read_manifest(dir);
  const TensorRecord* r = m.find(name);
  EXPECT_NE(r, nullptr) << name;
  ParamView v;
  v.name = name;
  v.shape = r->shape;
  v.numel = 1;
  for (auto d : r->shape) v.numel *= d;
  std::vector<float> p(static_cast<std::size_t>(v.numel)), mo(p.size()), ve(p.size());
  read_tensor(dir, m, *r, v, p.data(), mo.data(), ve.data());
  for (float x : mo) EXPECT_EQ(x, 0.0f);  // weights only: no optimizer state
  return p;
}

TEST(Hf, MappingIsTheModelsParameters) {
  ModelSpec gpt2_untied = model_preset("gpt2-tiny").spec;
  gpt2_untied.tied_embeddings = false;
  for (const ModelSpec& spec : {model_preset("gpt2-tiny").spec, model_preset("llama-tiny").spec, gpt2_untied,
                                llama_small(true), llama_small(false)}) {
    const Decoder model(spec, ModelOptions{.batch = 1});
    const HfMapping map = hf_mapping(spec);
    const auto& views = model.params().views();
    ASSERT_EQ(map.ndmesh.size(), views.size()) << arch_name(spec);
    for (std::size_t i = 0; i < views.size(); ++i) {
      EXPECT_EQ(map.ndmesh[i].name, views[i].name);
      EXPECT_EQ(map.ndmesh[i].shape, views[i].shard.dim >= 0 ? views[i].shard.full_shape : views[i].shape)
          << views[i].name;
    }
    // Every ndmesh tensor is exactly covered by the rows of its HF tensors.
    for (const NdTensor& t : map.ndmesh) {
      std::int64_t rows = 0;
      for (const HfTensor& h : map.hf)
        if (h.ndmesh == t.name) {
          EXPECT_EQ(h.row, rows) << h.name;
          rows += h.transpose ? h.shape[1] : h.shape[0];
        }
      EXPECT_EQ(rows, t.shape[0]) << t.name;
    }
  }
}

TEST(Hf, ConfigDefaultsAreTransformers) {
  TempDir dir;
  const std::string path = (dir.path / "config.json").string();
  std::ofstream(path) << R"({"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 32,
                           "vocab_size": 100, "n_inner": null})";
  ModelSpec g = hf_config_to_spec(path);
  EXPECT_TRUE(g.tied_embeddings);
  EXPECT_EQ(g.ffn_or_default(), 256);
  EXPECT_EQ(g.norm_eps, 1e-5);
  EXPECT_EQ(g.position_rows(), 32);
  EXPECT_EQ(arch_name(g), "gpt2");
  std::ofstream(path) << R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 160,
                           "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 64,
                           "vocab_size": 100})";
  ModelSpec l = hf_config_to_spec(path);
  EXPECT_FALSE(l.tied_embeddings);
  EXPECT_EQ(l.kv_heads_or_heads(), 4);
  EXPECT_EQ(l.norm_eps, 1e-6);
  EXPECT_EQ(l.rope_theta, 10000.0);
  EXPECT_EQ(l.rope_scaling.factor, 0.0);
  EXPECT_FALSE(l.biases);
  EXPECT_EQ(arch_name(l), "llama");
  // Llama 3's frequency scaling is read.
  std::ofstream(path) << R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 160,
                           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                           "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                           "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})";
  l = hf_config_to_spec(path);
  EXPECT_EQ(l.rope_scaling.factor, 8.0);
  EXPECT_EQ(l.rope_scaling.original_positions, 8192);
  EXPECT_EQ(l.kv_heads, 2);
  EXPECT_EQ(l.vocab, 32000);  // LlamaConfig's default
}

TEST(Hf, UnsupportedConfigsNameTheFileAndTheKey) {
  TempDir dir;
  const std::string path = (dir.path / "config.json").string();
  const std::string llama = R"({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, )";
  const std::map<std::string, std::string> cases = {
      {R"({"model_type": "bert"})", "model_type"},
      {R"({"n_embd": 64})", "model_type"},
      {llama + R"("attention_bias": true})", "attention_bias"},
      {llama + R"("mlp_bias": true})", "mlp_bias"},
      {llama + R"("hidden_act": "gelu"})", "hidden_act"},
      {llama + R"("rope_scaling": {"type": "linear", "factor": 2.0}})", "rope_scaling"},
      {llama + R"("num_hidden_layers": "two"})", "num_hidden_layers"},
      {R"({"model_type": "gpt2", "activation_function": "relu"})", "activation_function"},
      {R"({"model_type": "gpt2", "scale_attn_by_inverse_layer_idx": true})",
       "scale_attn_by_inverse_layer_idx"},
      {"{not json", "not a JSON object"},
  };
  for (const auto& [text, key] : cases) {
    const std::string e = config_error(path, text);
    EXPECT_NE(e.find(path), std::string::npos) << text << " -> " << e;
    EXPECT_NE(e.find(key), std::string::npos) << text << " -> " << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
  const std::string e = error_of<ConfigError>([&] { hf_config_to_spec((dir.path / "none.json").string()); });
  EXPECT_NE(e.find("none.json"), std::string::npos) << e;
}

TEST(Hf, ImportPlacesEveryValueAndExportGivesTheFileBack) {
  TempDir dir;
  for (const ModelSpec& spec : {gpt2_small(), llama_small(false)}) {
    const fs::path hf = dir.path / (arch_name(spec) + "-hf"), ck = dir.path / (arch_name(spec) + ".ckpt"),
                   out = dir.path / (arch_name(spec) + "-out");
    write_folder(hf, spec);
    const HfImportReport r = import_hf(hf.string(), ck.string());
    const Manifest m = read_manifest(ck.string());
    EXPECT_TRUE(m.weights_only());
    EXPECT_EQ(m.step, 0);
    EXPECT_TRUE(spec_differences(m.spec, spec).empty());
    const HfMapping map = hf_mapping(spec);
    EXPECT_EQ(r.tensors, static_cast<std::int64_t>(map.hf.size()));
    // Where the layouts say, by hand for the fused tensors of block 1.
    const std::int64_t c = spec.hidden;
    if (arch_name(spec) == "gpt2") {
      std::size_t k = 0;  // c_attn [C, 3C]: element [i, o] is qkv [o, i]
      while (map.hf[k].name != "transformer.h.1.attn.c_attn.weight") ++k;
      const std::vector<float> qkv = read_param(ck.string(), "block.1.attn.qkv.weight");
      for (std::int64_t i = 0; i < c; ++i)
        for (std::int64_t o = 0; o < 3 * c; ++o)
          ASSERT_EQ(qkv[static_cast<std::size_t>(o * c + i)], tagged(k, i * 3 * c + o)) << i << "," << o;
    } else {
      std::size_t q = 0;
      while (map.hf[q].name != "model.layers.1.self_attn.q_proj.weight") ++q;
      const std::vector<float> qkv = read_param(ck.string(), "block.1.attn.qkv.weight");
      const std::int64_t nq = 4 * 2 * c, nkv = 2 * 2 * c;  // heads * head_dim * C, kv_heads * head_dim * C
      EXPECT_EQ(qkv[0], tagged(q, 0));
      EXPECT_EQ(qkv[static_cast<std::size_t>(nq)], tagged(q + 1, 0));  // k_proj's first row
      EXPECT_EQ(qkv[static_cast<std::size_t>(nq + nkv - 1)], tagged(q + 1, nkv - 1));
      EXPECT_EQ(qkv[static_cast<std::size_t>(nq + nkv)], tagged(q + 2, 0));  // v_proj's first row
      std::size_t g = 0;
      while (map.hf[g].name != "model.layers.1.mlp.gate_proj.weight") ++g;
      const std::vector<float> fc = read_param(ck.string(), "block.1.mlp.fc.weight");
      EXPECT_EQ(fc[0], tagged(g, 0));
      EXPECT_EQ(fc[static_cast<std::size_t>(12 * c)], tagged(g + 1, 0));  // up_proj after gate_proj's F rows
    }
    // Export: the same tensors, bit for bit, and the config it was read from.
    export_hf(ck.string(), out.string(), {});
    SafetensorsFile a((hf / kSafetensorsFile).string()), b((out / kSafetensorsFile).string());
    ASSERT_EQ(a.tensors().size(), b.tensors().size());
    EXPECT_EQ(b.metadata().at("format"), "pt");
    for (const SafeTensor& t : a.tensors()) {
      const SafeTensor* u = b.find(t.name);
      ASSERT_NE(u, nullptr) << t.name;
      EXPECT_EQ(u->shape, t.shape);
      std::vector<float> x(static_cast<std::size_t>(t.numel())), y(x.size());
      a.read(t, x.data());
      b.read(*u, y.data());
      EXPECT_EQ(x, y) << t.name;
    }
    EXPECT_TRUE(spec_differences(hf_config_to_spec((out / kHfConfigFile).string()), spec).empty());
    // An existing output is refused without force, replaced with it.
    EXPECT_NE(error_of<ConfigError>([&] { export_hf(ck.string(), out.string(), {}); }).find("--force"),
              std::string::npos);
    EXPECT_NE(error_of<ConfigError>([&] { import_hf(hf.string(), ck.string()); }).find("--force"),
              std::string::npos);
    export_hf(ck.string(), out.string(), {.force = true});
    import_hf(hf.string(), ck.string(), true);
  }
}

TEST(Hf, ExportShardsWithAnIndexAndBf16) {
  TempDir dir;
  const ModelSpec spec = llama_small(true);
  write_folder(dir.path / "hf", spec);
  import_hf((dir.path / "hf").string(), (dir.path / "ck").string());
  export_hf((dir.path / "ck").string(), (dir.path / "sharded").string(), {.max_shard_bytes = 1000});
  EXPECT_FALSE(fs::exists(dir.path / "sharded" / kSafetensorsFile));
  SafetensorsFolder folder((dir.path / "sharded").string());
  EXPECT_GT(folder.files().size(), 2u);
  EXPECT_EQ(folder.names().size(), hf_mapping(spec).hf.size());
  // Re-import of the shards: the same checkpoint values.
  import_hf((dir.path / "sharded").string(), (dir.path / "ck2").string());
  EXPECT_EQ(read_param((dir.path / "ck").string(), "block.1.mlp.fc.weight"),
            read_param((dir.path / "ck2").string(), "block.1.mlp.fc.weight"));
  // bf16: the values rounded once (the tagged values below 256 are exact in bf16).
  export_hf((dir.path / "ck").string(), (dir.path / "bf16").string(), {.dtype = "bf16"});
  SafetensorsFile b((dir.path / "bf16" / kSafetensorsFile).string());
  const SafeTensor* t = b.find("model.norm.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, SafeDtype::kBF16);
  std::vector<float> v(static_cast<std::size_t>(t->numel()));
  b.read(*t, v.data());
  const std::vector<float> want = read_param((dir.path / "ck").string(), "ln_f.weight");
  for (std::size_t i = 0; i < v.size(); ++i) EXPECT_EQ(v[i], bf16_to_float(float_to_bf16(want[i])));
}

TEST(Hf, BadFoldersNameTheFileAndTheTensorAndWriteNothing) {
  TempDir dir;
  const ModelSpec spec = gpt2_small();
  const fs::path hf = dir.path / "hf", ck = dir.path / "ck";
  auto expect = [&](const std::string& what, std::initializer_list<std::string> parts) {
    const std::string e = error_of<ConfigError>([&] { import_hf(hf.string(), ck.string()); });
    for (const std::string& p : parts) EXPECT_NE(e.find(p), std::string::npos) << what << ": " << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
    EXPECT_FALSE(fs::exists(ck)) << what;
    EXPECT_FALSE(fs::exists(checkpoint_temp_dir(ck.string()))) << what;
  };
  expect("no folder", {hf.string()});
  write_folder(hf, spec);
  fs::remove(hf / kHfConfigFile);
  expect("no config.json", {"config.json", "missing"});
  // A tensor missing: another model's config (3 layers) over the 2-layer file.
  ModelSpec deeper = spec;
  deeper.layers = 3;
  std::ofstream(hf / kHfConfigFile) << hf_config_json(deeper);
  expect("missing tensor", {hf.string(), "transformer.h.2.ln_1.weight"});
  // A tensor of the wrong shape: a wider vocabulary.
  ModelSpec wider = spec;
  wider.vocab = 12;
  std::ofstream(hf / kHfConfigFile) << hf_config_json(wider);
  expect("wrong shape", {"model.safetensors", "transformer.wte.weight", "[10, 8]", "[12, 8]"});
  // A truncated file.
  std::ofstream(hf / kHfConfigFile) << hf_config_json(spec);
  fs::resize_file(hf / kSafetensorsFile, fs::file_size(hf / kSafetensorsFile) - 4);
  expect("truncated", {"model.safetensors", "past the end", "truncated"});
  // An index naming a missing shard.
  fs::remove(hf / kSafetensorsFile);
  std::ofstream(hf / kSafetensorsIndex)
      << R"({"weight_map": {"transformer.wte.weight": "model-00001-of-00002.safetensors"}})";
  expect("missing shard", {kSafetensorsIndex, "model-00001-of-00002.safetensors", "transformer.wte.weight"});
}

}  // namespace
}  // namespace ndmesh::model
