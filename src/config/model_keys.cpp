// The keys of an architecture description (config.hpp: model_keys), one table for the TOML
// [model] section, checkpoint manifests and Python.
#include <cmath>
#include <functional>

#include <fmt/format.h>

#include "ndmesh/config/config.hpp"
#include "ndmesh/core/error.hpp"

namespace ndmesh {
namespace {

enum class Kind { kInt, kReal, kBool, kName };

struct Key {
  const char* name;
  Kind kind;
  std::function<void(ModelSpec&, const ModelValue&, std::string_view flag)> set;
  std::function<ModelValue(const ModelSpec&)> get;
};

std::int64_t as_int(const ModelValue& v) { return std::get<std::int64_t>(v); }
double as_real(const ModelValue& v) {
  return std::holds_alternative<std::int64_t>(v) ? static_cast<double>(std::get<std::int64_t>(v))
                                                 : std::get<double>(v);
}
bool as_bool(const ModelValue& v) { return std::get<bool>(v); }
const std::string& as_name(const ModelValue& v) { return std::get<std::string>(v); }

#define NDMESH_INT_KEY(field) \
  Key { #field, Kind::kInt, [](ModelSpec& m, const ModelValue& v, [[maybe_unused]] std::string_view flag) { m.field = as_int(v); }, \
        [](const ModelSpec& m) { return ModelValue{m.field}; } }
#define NDMESH_REAL_KEY(field) \
  Key { #field, Kind::kReal, [](ModelSpec& m, const ModelValue& v, [[maybe_unused]] std::string_view flag) { m.field = as_real(v); }, \
        [](const ModelSpec& m) { return ModelValue{m.field}; } }
#define NDMESH_BOOL_KEY(field) \
  Key { #field, Kind::kBool, [](ModelSpec& m, const ModelValue& v, [[maybe_unused]] std::string_view flag) { m.field = as_bool(v); }, \
        [](const ModelSpec& m) { return ModelValue{m.field}; } }

const std::vector<Key>& keys() {
  static const std::vector<Key> kKeys = {
      {"arch", Kind::kName, [](ModelSpec& m, const ModelValue& v, [[maybe_unused]] std::string_view flag) { m = with_arch(m, as_name(v), flag); },
       [](const ModelSpec& m) { return ModelValue{arch_name(m)}; }},
      {"name", Kind::kName, [](ModelSpec& m, const ModelValue& v, [[maybe_unused]] std::string_view flag) { m.name = as_name(v); },
       [](const ModelSpec& m) { return ModelValue{m.name}; }},
      NDMESH_INT_KEY(layers),
      NDMESH_INT_KEY(hidden),
      NDMESH_INT_KEY(heads),
      NDMESH_INT_KEY(kv_heads),
      NDMESH_INT_KEY(head_dim),
      NDMESH_INT_KEY(ffn),
      NDMESH_INT_KEY(seq),
      NDMESH_INT_KEY(max_positions),
      NDMESH_INT_KEY(vocab),
      NDMESH_INT_KEY(vocab_multiple),
      NDMESH_INT_KEY(experts),
      NDMESH_BOOL_KEY(tied_embeddings),
      {"norm", Kind::kName, [](ModelSpec& m, const ModelValue& v, [[maybe_unused]] std::string_view flag) { m.norm = parse_norm(as_name(v), flag); },
       [](const ModelSpec& m) { return ModelValue{std::string(norm_name(m.norm))}; }},
      NDMESH_REAL_KEY(norm_eps),
      {"mlp", Kind::kName, [](ModelSpec& m, const ModelValue& v, [[maybe_unused]] std::string_view flag) { m.mlp = parse_mlp_kind(as_name(v), flag); },
       [](const ModelSpec& m) { return ModelValue{std::string(mlp_name(m.mlp))}; }},
      {"positions", Kind::kName,
       [](ModelSpec& m, const ModelValue& v, [[maybe_unused]] std::string_view flag) { m.positions = parse_positions(as_name(v), flag); },
       [](const ModelSpec& m) { return ModelValue{std::string(positions_name(m.positions))}; }},
      NDMESH_REAL_KEY(rope_theta),
      {"rope_scaling_factor", Kind::kReal,
       [](ModelSpec& m, const ModelValue& v, [[maybe_unused]] std::string_view flag) { m.rope_scaling.factor = as_real(v); },
       [](const ModelSpec& m) { return ModelValue{m.rope_scaling.factor}; }},
      {"rope_low_freq_factor", Kind::kReal,
       [](ModelSpec& m, const ModelValue& v, [[maybe_unused]] std::string_view flag) { m.rope_scaling.low_freq_factor = as_real(v); },
       [](const ModelSpec& m) { return ModelValue{m.rope_scaling.low_freq_factor}; }},
      {"rope_high_freq_factor", Kind::kReal,
       [](ModelSpec& m, const ModelValue& v, [[maybe_unused]] std::string_view flag) { m.rope_scaling.high_freq_factor = as_real(v); },
       [](const ModelSpec& m) { return ModelValue{m.rope_scaling.high_freq_factor}; }},
      {"rope_original_positions", Kind::kInt,
       [](ModelSpec& m, const ModelValue& v, [[maybe_unused]] std::string_view flag) { m.rope_scaling.original_positions = as_int(v); },
       [](const ModelSpec& m) { return ModelValue{m.rope_scaling.original_positions}; }},
      NDMESH_BOOL_KEY(biases),
      NDMESH_REAL_KEY(init_std),
      // Mixture of experts (nn/moe.hpp); appended, so that older manifests read as before.
      NDMESH_INT_KEY(top_k),
      NDMESH_INT_KEY(shared_experts),
      NDMESH_INT_KEY(expert_ffn),
      NDMESH_INT_KEY(moe_every),
      NDMESH_INT_KEY(moe_first_dense),
      {"router", Kind::kName, [](ModelSpec& m, const ModelValue& v, [[maybe_unused]] std::string_view flag) { m.router = parse_router(as_name(v), flag); },
       [](const ModelSpec& m) { return ModelValue{std::string(router_name(m.router))}; }},
      NDMESH_REAL_KEY(aux_loss),
      NDMESH_REAL_KEY(capacity_factor),
      NDMESH_REAL_KEY(router_bias_rate),
  };
  return kKeys;
}

#undef NDMESH_INT_KEY
#undef NDMESH_REAL_KEY
#undef NDMESH_BOOL_KEY

const char* kind_example(Kind k) {
  switch (k) {
    case Kind::kInt: return "a whole number, e.g. 8";
    case Kind::kReal: return "a number, e.g. 1e-5";
    case Kind::kBool: return "true or false";
    case Kind::kName: return "a name in quotes";
  }
  return "";
}

bool fits(Kind k, const ModelValue& v) {
  switch (k) {
    case Kind::kInt: return std::holds_alternative<std::int64_t>(v);
    case Kind::kReal: return std::holds_alternative<double>(v) || std::holds_alternative<std::int64_t>(v);
    case Kind::kBool: return std::holds_alternative<bool>(v);
    case Kind::kName: return std::holds_alternative<std::string>(v);
  }
  return false;
}

std::string shown(const ModelValue& v) {
  return std::visit(
      [](const auto& x) -> std::string {
        using X = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<X, std::string>)
          return "\"" + x + "\"";
        else if constexpr (std::is_same_v<X, bool>)
          return x ? "true" : "false";
        else
          return fmt::format("{}", x);
      },
      v);
}

}  // namespace

const std::vector<std::string>& model_keys() {
  static const std::vector<std::string> kNames = [] {
    std::vector<std::string> out;
    for (const Key& k : keys()) out.emplace_back(k.name);
    return out;
  }();
  return kNames;
}

void set_model_keys(ModelSpec& m, const std::vector<std::pair<std::string, ModelValue>>& values,
                    std::string_view where) {
  auto find = [&](const std::string& name) -> const Key& {
    for (const Key& k : keys())
      if (name == k.name) return k;
    std::string all;
    for (const Key& k : keys()) all += (all.empty() ? "" : ", ") + std::string(k.name);
    fail<ConfigError>("config", "{}: unknown key '{}'; use {}", where, name, all);
  };
  auto set = [&](const std::string& name, const ModelValue& v) {
    const Key& k = find(name);
    NDMESH_CHECK_CONFIG(fits(k.kind, v), "config", "{}.{} = {} must be {}", where, name, shown(v),
                        kind_example(k.kind));
    k.set(m, v, fmt::format("{}.{}", where, name));
  };
  for (const auto& [name, v] : values)
    if (name == "arch") set(name, v);
  for (const auto& [name, v] : values)
    if (name != "arch") set(name, v);
}

std::vector<std::pair<std::string, ModelValue>> model_values(const ModelSpec& m) {
  std::vector<std::pair<std::string, ModelValue>> out;
  for (const Key& k : keys()) out.emplace_back(k.name, k.get(m));
  return out;
}

}  // namespace ndmesh
