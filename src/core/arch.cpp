#include "ndmesh/core/arch.hpp"

#include "ndmesh/core/error.hpp"

namespace ndmesh {

std::string_view norm_name(NormKind k) { return k == NormKind::kLayerNorm ? "layernorm" : "rmsnorm"; }

std::string_view mlp_name(MlpKind k) { return k == MlpKind::kGelu ? "gelu" : "swiglu"; }

std::string_view positions_name(PositionsKind k) { return k == PositionsKind::kLearned ? "learned" : "rope"; }

std::string_view router_name(RouterKind k) { return k == RouterKind::kSoftmax ? "softmax" : "sigmoid"; }

RouterKind parse_router(std::string_view name, std::string_view flag) {
  if (name == "softmax") return RouterKind::kSoftmax;
  if (name == "sigmoid") return RouterKind::kSigmoid;
  fail<ConfigError>("model", "{}={} is not a router; use softmax (Mixtral) or sigmoid (DeepSeek-V3)", flag, name);
}

NormKind parse_norm(std::string_view name, std::string_view flag) {
  if (name == "layernorm") return NormKind::kLayerNorm;
  if (name == "rmsnorm") return NormKind::kRmsNorm;
  fail<ConfigError>("model", "{}={} is not a norm; use layernorm (GPT-2) or rmsnorm (Llama)", flag, name);
}

MlpKind parse_mlp_kind(std::string_view name, std::string_view flag) {
  if (name == "gelu") return MlpKind::kGelu;
  if (name == "swiglu") return MlpKind::kSwiglu;
  fail<ConfigError>("model", "{}={} is not an MLP kind; use gelu (GPT-2, 2 matrices) or swiglu (Llama, 3 matrices)",
                    flag, name);
}

PositionsKind parse_positions(std::string_view name, std::string_view flag) {
  if (name == "learned") return PositionsKind::kLearned;
  if (name == "rope") return PositionsKind::kRope;
  fail<ConfigError>("model", "{}={} is not a kind of positions; use learned (a table, GPT-2) or rope (rotary, Llama)",
                    flag, name);
}

}  // namespace ndmesh
