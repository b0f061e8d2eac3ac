// TOML config files (toml++). Every key is checked: an unknown key or a value of the
// wrong type is a ConfigError naming the file, the key and what is expected, so a typo
// never silently falls back to a default.
#include <algorithm>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "ndmesh/config/config.hpp"
#include "ndmesh/config/training.hpp"
#include "ndmesh/core/error.hpp"

namespace ndmesh {
namespace {

class Reader {
 public:
  explicit Reader(const std::string& path) : path_(path) {}

  void section(const toml::table& root, std::string_view name, const std::vector<std::string_view>& keys) {
    current_ = nullptr;
    section_ = name;
    const toml::node* node = root.get(name);
    if (node == nullptr) return;
    const toml::table* table = node->as_table();
    NDMESH_CHECK_CONFIG(table != nullptr, "config", "{}: '{}' must be a table ([{}])", path_, name, name);
    for (const auto& [key, value] : *table) {
      (void)value;
      bool known = std::find(keys.begin(), keys.end(), key.str()) != keys.end();
      NDMESH_CHECK_CONFIG(known, "config", "{}: unknown key '{}.{}'; known keys in [{}]: {}", path_, name,
                          key.str(), name, join(keys));
    }
    current_ = table;
  }

  bool has(std::string_view key) const { return current_ != nullptr && current_->get(key) != nullptr; }

  std::int64_t integer(std::string_view key) {
    const toml::node* n = current_->get(key);
    auto v = n->value<std::int64_t>();
    NDMESH_CHECK_CONFIG(v.has_value() && n->is_integer(), "config",
                        "{}: {}.{} must be an integer, e.g. {} = 2", path_, section_, key, key);
    return *v;
  }

  std::string string(std::string_view key) {
    const toml::node* n = current_->get(key);
    NDMESH_CHECK_CONFIG(n->is_string(), "config", "{}: {}.{} must be a string, e.g. {} = \"...\"", path_,
                        section_, key, key);
    return std::string(*n->value<std::string_view>());
  }

  bool boolean(std::string_view key) {
    const toml::node* n = current_->get(key);
    NDMESH_CHECK_CONFIG(n->is_boolean(), "config", "{}: {}.{} must be true or false", path_, section_, key);
    return *n->value<bool>();
  }

  std::vector<std::string> strings(std::string_view key) {
    const toml::node* n = current_->get(key);
    std::vector<std::string> out;
    const toml::array* arr = n->as_array();
    NDMESH_CHECK_CONFIG(arr != nullptr, "config", "{}: {}.{} must be an array of strings, e.g. {} = [\"tp\"]",
                        path_, section_, key, key);
    for (const auto& item : *arr) {
      NDMESH_CHECK_CONFIG(item.is_string(), "config", "{}: {}.{} must hold strings only", path_, section_,
                          key);
      out.emplace_back(*item.value<std::string_view>());
    }
    return out;
  }

 private:
  static std::string join(const std::vector<std::string_view>& keys) {
    std::string s;
    for (auto k : keys) s += (s.empty() ? "" : ", ") + std::string(k);
    return s;
  }

  const std::string& path_;
  const toml::table* current_ = nullptr;
  std::string_view section_;
};

}  // namespace

ConfigFile load_config_file(const std::string& path) {
  // The path is user input (--config), so a path that is not a readable regular file is a
  // ConfigError: a character device (/dev/zero, /dev/null) would read as endless or empty.
  std::error_code ec;
  auto status = std::filesystem::status(path, ec);
  NDMESH_CHECK_CONFIG(!ec && std::filesystem::exists(status), "config",
                      "config file '{}' does not exist; check the path", path);
  NDMESH_CHECK_CONFIG(std::filesystem::is_regular_file(status), "config",
                      "config file '{}' is not a regular file (a directory or a device); give a .toml file",
                      path);
  NDMESH_CHECK_CONFIG(std::ifstream(path).good(), "config",
                      "config file '{}' cannot be read (permissions?); check the path and its mode", path);
  constexpr std::uintmax_t kMaxBytes = 16u << 20;
  const auto bytes = std::filesystem::file_size(path, ec);
  NDMESH_CHECK_CONFIG(!ec && bytes <= kMaxBytes, "config",
                      "config file '{}' has {} bytes, more than the limit of {}; a config is a few lines",
                      path, bytes, kMaxBytes);
  toml::table root;
  try {
    root = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    if (e.description().find("File could not be opened") != std::string_view::npos)
      fail<IoError>("config", "cannot read config file '{}'; check the path", path);
    fail<ConfigError>("config", "{}:{}:{}: {}", path, where.line, where.column, e.description());
  }
  ConfigFile out;
  Reader r(path);
  for (const auto& [key, value] : root) {
    (void)value;
    bool known = key == "parallel" || key == "model" || key == "training";
    NDMESH_CHECK_CONFIG(known, "config",
                        "{}: unknown section or key '{}'; use [parallel], [model], [training]", path,
                        key.str());
  }

  r.section(root, "parallel",
            {"tp", "pp", "dp", "cp", "ep", "order", "megatron_order", "dims", "world", "ranks_per_node",
             "heavy_dims", "schedule", "vpp", "sequence_parallel"});
  for (const auto& name : standard_dims())
    if (r.has(name)) out.layout.sizes[name] = r.integer(name);
  if (r.has("order")) out.layout.order = r.string("order");
  if (r.has("megatron_order")) out.layout.megatron_order = r.string("megatron_order");
  if (r.has("dims")) out.layout.dims = r.string("dims");
  if (r.has("world")) out.parallel.world = r.integer("world");
  if (r.has("ranks_per_node")) out.parallel.ranks_per_node = r.integer("ranks_per_node");
  if (r.has("heavy_dims")) out.parallel.heavy_dims = r.strings("heavy_dims");
  if (r.has("schedule")) out.parallel.schedule = parse_schedule(r.string("schedule"));
  if (r.has("vpp")) out.parallel.vpp = r.integer("vpp");
  if (r.has("sequence_parallel")) out.parallel.sequence_parallel = r.boolean("sequence_parallel");

  {
    const std::vector<std::string>& names = model_keys();
    r.section(root, "model", std::vector<std::string_view>(names.begin(), names.end()));
  }
  if (const toml::table* model = root.get("model") != nullptr ? root.get("model")->as_table() : nullptr) {
    // Every key of the description (config.hpp: model_keys), its value by its TOML type.
    std::vector<std::pair<std::string, ModelValue>> values;
    for (const auto& [key, node] : *model) {
      ModelValue v;
      if (node.is_integer())
        v = *node.value<std::int64_t>();
      else if (node.is_floating_point())
        v = *node.value<double>();
      else if (node.is_boolean())
        v = *node.value<bool>();
      else if (node.is_string())
        v = std::string(*node.value<std::string_view>());
      else
        fail<ConfigError>("config", "{}: model.{} must be a number, true or false, or a name in quotes", path,
                          key.str());
      values.emplace_back(std::string(key.str()), std::move(v));
    }
    ModelSpec m;
    set_model_keys(m, values, fmt::format("{}: model", path));
    out.model = m;
    out.model_values = std::move(values);
  }

  r.section(root, "training", {"micro_batch", "global_batch", "memory"});
  if (root.get("training") != nullptr) {
    if (r.has("micro_batch")) out.parallel.micro_batch = r.integer("micro_batch");
    if (r.has("global_batch")) out.parallel.global_batch = r.integer("global_batch");
    if (r.has("memory")) {
      out.parallel.memory = r.string("memory");
      memory_strategy(out.parallel.memory, fmt::format("{}: training.memory", path));  // a known name
    }
  }
  return out;
}

}  // namespace ndmesh
