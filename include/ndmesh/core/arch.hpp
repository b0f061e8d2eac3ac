// The kinds of layer an architecture description picks from (config's ModelSpec), shared by
// the description and the layers (nn) that implement them: one enum and one parser each.
#pragma once

#include <cstdint>
#include <string_view>

namespace ndmesh {

/// The normalisation of the blocks and before the output layer.
enum class NormKind {
  kLayerNorm,  ///< (x - mean) / sqrt(var + eps) * w + b (GPT-2)
  kRmsNorm,    ///< x / sqrt(mean(x^2) + eps) * w, no bias (Llama)
};

/// The feed-forward layer of a block.
enum class MlpKind {
  kGelu,    ///< down(gelu(up(x))): two matrices (GPT-2)
  kSwiglu,  ///< down(silu(gate(x)) * up(x)): three matrices, gate and up as one product (Llama)
};

/// How a mixture-of-experts layer scores the experts for a token (nn/moe.hpp).
enum class RouterKind {
  kSoftmax,  ///< softmax over the experts' logits, the top-k probabilities weigh their outputs (Mixtral)
  kSigmoid,  ///< sigmoid scores, top-k by score + a balancing bias, weights the chosen scores normalised (DeepSeek-V3)
};

/// How positions enter the model.
enum class PositionsKind {
  kLearned,  ///< a learned [max positions, C] table added to the token embedding (GPT-2)
  kRope,     ///< rotary embedding of queries and keys inside attention (Llama)
};

/// Llama 3's scaling of the rotary frequencies for long contexts (factor 0: none). A
/// wavelength longer than original_positions / low_freq_factor is divided by `factor`, one
/// shorter than original_positions / high_freq_factor is kept, and those between are blended.
struct RopeScaling {
  double factor = 0;
  double low_freq_factor = 1;
  double high_freq_factor = 4;
  std::int64_t original_positions = 8192;
  bool operator==(const RopeScaling&) const = default;
};

/// "layernorm", "rmsnorm".
std::string_view norm_name(NormKind k);
/// "gelu", "swiglu".
std::string_view mlp_name(MlpKind k);
/// "softmax", "sigmoid".
std::string_view router_name(RouterKind k);
/// "learned", "rope".
std::string_view positions_name(PositionsKind k);

/// Parse a name; ConfigError naming `flag`, the value and the valid names otherwise.
NormKind parse_norm(std::string_view name, std::string_view flag = "--norm");
MlpKind parse_mlp_kind(std::string_view name, std::string_view flag = "--mlp");
PositionsKind parse_positions(std::string_view name, std::string_view flag = "--positions");
RouterKind parse_router(std::string_view name, std::string_view flag = "--router");

}  // namespace ndmesh
