// Model presets (config/presets.hpp). Shapes are typed in from their papers and model cards,
// cited per group.
#include "ndmesh/config/presets.hpp"

#include "ndmesh/core/error.hpp"

namespace ndmesh {
namespace {

// A GPT-2-shaped model: LayerNorm, a GELU MLP of 4 hidden, learned positions, biases, a tied
// output layer, as many key/value heads as heads.
ModelSpec gpt_shape(const std::string& name, std::int64_t layers, std::int64_t hidden, std::int64_t heads,
                    std::int64_t seq, std::int64_t vocab) {
  return with_arch({.name = name,
                    .layers = layers,
                    .hidden = hidden,
                    .heads = heads,
                    .kv_heads = heads,
                    .ffn = 4 * hidden,
                    .seq = seq,
                    .vocab = vocab},
                   "gpt2");
}

// A GPT model of Narayanan et al. 2021 Table 1: vocab 51200, seq 2048, dropout.
ModelPreset gpt(std::string name, std::int64_t heads, std::int64_t hidden, std::int64_t layers,
                std::string source) {
  ModelSpec m = gpt_shape(name, layers, hidden, heads, 2048, 51200);
  return {std::move(name), std::move(source), m, true};
}

// GPT-2 (Radford et al. 2019) as released: vocab 50257 (padded to 50304 inside ndmesh), 1024
// learned positions, LayerNorm eps 1e-5, no dropout counted.
ModelPreset gpt2(std::string name, std::int64_t layers, std::int64_t hidden, std::int64_t heads) {
  ModelSpec m = gpt_shape(name, layers, hidden, heads, 1024, 50257);
  m.max_positions = 1024;
  return {std::move(name), "Radford et al. 2019 (GPT-2), the Hugging Face gpt2 configs", m, false};
}

// A Llama model: RMSNorm, rotary positions, SwiGLU, no biases, untied output layer, no
// dropout.
ModelPreset llama(std::string name, std::int64_t layers, std::int64_t hidden, std::int64_t ffn,
                  std::int64_t heads, std::int64_t kv_heads, std::int64_t vocab, std::int64_t seq,
                  double theta, std::string source) {
  ModelSpec m{.name = name,
              .layers = layers,
              .hidden = hidden,
              .heads = heads,
              .kv_heads = kv_heads,
              .ffn = ffn,
              .seq = seq,
              .vocab = vocab,
              .experts = 0,
              .tied_embeddings = false};
  m = with_arch(m, "llama");
  m.rope_theta = theta;
  return {std::move(name), std::move(source), m, false};
}

// BLOOM 176B (BigScience 2022, arXiv:2211.05100, and the training script
// bigscience-workshop/bigscience train/tr11-176B-ml/tr11-176B-ml.slurm): a GPT layer (GeLU,
// biases, LayerNorm, dropout 0.1) with ALiBi instead of a position table, 70 layers, hidden
// 14336, 112 heads, vocabulary padded to 250880, tied embeddings, sequence 2048. (Its extra
// LayerNorm after the embedding, 2h parameters, is not counted; ALiBi is described as rotary
// positions, which like it hold no parameters.)
ModelPreset bloom() {
  ModelPreset p = gpt("bloom-176b", 112, 14336, 70,
                      "BigScience 2022 (BLOOM, arXiv:2211.05100), tr11-176B-ml.slurm of "
                      "bigscience-workshop/bigscience");
  p.spec.vocab = 250880;
  p.spec.positions = PositionsKind::kRope;
  return p;
}

}  // namespace

const std::vector<ModelPreset>& model_presets() {
  static const std::vector<ModelPreset> kPresets = [] {
    const std::string t1 = "Narayanan et al. 2021, Table 1";
    const std::string l2 = "Touvron et al. 2023 (Llama 2), Table 1 and model card";
    const std::string l3 = "Llama Team 2024 (The Llama 3 Herd of Models), Table 3";
    std::vector<ModelPreset> p{
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
        bloom(),
        llama("llama2-7b", 32, 4096, 11008, 32, 32, 32000, 4096, 10000, l2),
        llama("llama2-13b", 40, 5120, 13824, 40, 40, 32000, 4096, 10000, l2),
        llama("llama2-70b", 80, 8192, 28672, 64, 8, 32000, 4096, 10000, l2),
        llama("llama3-8b", 32, 4096, 14336, 32, 8, 128256, 8192, 500000, l3),
        llama("llama3-70b", 80, 8192, 28672, 64, 8, 128256, 8192, 500000, l3),
        llama("llama3-405b", 126, 16384, 53248, 128, 8, 128256, 8192, 500000, l3),
        gpt2("gpt2-124m", 12, 768, 12),
        gpt2("gpt2-350m", 24, 1024, 16),
        gpt2("gpt2-774m", 36, 1280, 20),
        gpt2("gpt2-1558m", 48, 1600, 25),
    };
    // Small models for tests and first runs (a byte-level vocabulary).
    ModelSpec tiny{.layers = 2, .hidden = 64, .heads = 4, .kv_heads = 4, .ffn = 256, .seq = 64, .vocab = 256};
    tiny.name = "gpt2-tiny";
    p.push_back({"gpt2-tiny", "", with_arch(tiny, "gpt2"), false});
    ModelSpec lt = with_arch(tiny, "llama");
    lt.name = "llama-tiny";
    lt.kv_heads = 2;
    lt.ffn = 160;
    p.push_back({"llama-tiny", "", lt, false});
    // A tiny mixture of experts (SwiGLU experts, softmax top-2 of 4, no biases): the MoE tests' model.
    ModelSpec mt = lt;
    mt.name = "moe-tiny";
    mt.experts = 4;
    mt.top_k = 2;
    mt.expert_ffn = 64;
    p.push_back({"moe-tiny", "", mt, false});
    // Mixtral 8x7B (Jiang et al. 2024, arXiv:2401.04088, Table 1, and its Hugging Face config):
    // 32 layers, hidden 4096, 32 heads, 8 key/value heads, 8 SwiGLU experts of 14336, top-2,
    // vocabulary 32000, context 32768, rope theta 1e6; every block is MoE.
    ModelPreset mixtral = llama("mixtral-8x7b", 32, 4096, 14336, 32, 8, 32000, 32768, 1e6,
                                "Jiang et al. 2024 (Mixtral of Experts, arXiv:2401.04088), Table 1");
    mixtral.spec.experts = 8;
    mixtral.spec.top_k = 2;
    mixtral.spec.aux_loss = 0.02;  // the Hugging Face config's router_aux_loss_coef
    p.push_back(mixtral);
    // DeepSeek-V3-shaped (DeepSeek-AI 2024, arXiv:2412.19437, section 4.2): 61 layers, hidden
    // 7168, 128 heads, the first 3 blocks dense (ffn 18432), the others 256 routed experts of
    // 2048 (top-8, sigmoid router with bias balancing) and 1 shared expert, vocabulary 129280,
    // sequence 4096. Shaped, not exact: its multi-head latent attention is described as plain
    // attention with 128 key/value heads of 128 (MLA's low-rank projections are not modelled),
    // and its multi-token prediction module is left out.
    ModelPreset dsv3 = llama("deepseek-v3", 61, 7168, 18432, 128, 128, 129280, 4096, 10000,
                             "DeepSeek-AI 2024 (DeepSeek-V3, arXiv:2412.19437), section 4.2 (shape only: no MLA, no MTP)");
    dsv3.spec.experts = 256;
    dsv3.spec.top_k = 8;
    dsv3.spec.shared_experts = 1;
    dsv3.spec.expert_ffn = 2048;
    dsv3.spec.moe_first_dense = 3;
    dsv3.spec.router = RouterKind::kSigmoid;
    dsv3.spec.aux_loss = 0.0001;  // its sequence-wise balance loss weight (alpha)
    p.push_back(dsv3);
    for (ModelPreset& x : p) x.spec.name = x.name;
    return p;
  }();
  return kPresets;
}

const ModelPreset& model_preset(std::string_view name, std::string_view flag) {
  for (const auto& p : model_presets())
    if (p.name == name) return p;
  fail<ConfigError>("model",
                    "{} '{}' is not a preset; use one of {}, or describe the model with --layers --hidden "
                    "--heads --vocab",
                    flag, name, model_preset_names());
}

std::string model_preset_names() {
  std::string out;
  for (const auto& p : model_presets()) {
    if (!out.empty()) out += ", ";
    out += p.name;
  }
  return out;
}

}  // namespace ndmesh
