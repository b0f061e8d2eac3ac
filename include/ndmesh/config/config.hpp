// ParallelConfig, ModelSpec and their validation.
//
// A ParallelConfig says how the world is split (named dim sizes and their order, the
// pipeline schedule, batch sizes, ranks per node); a ModelSpec says what is split. All
// checks run together: validate() throws one ConfigError listing every problem, each
// naming the field, the value and the nearest valid choice.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ndmesh/mesh/mesh.hpp"

namespace ndmesh {

/// Pipeline schedules.
enum class Schedule { kGpipe, k1F1B, kInterleaved, kZbH1 };

/// "gpipe", "1f1b", "interleaved", "zb-h1".
std::string_view schedule_name(Schedule s);
/// Parses a schedule name; ConfigError listing the valid names otherwise.
Schedule parse_schedule(std::string_view name);

/// The shape of a GPT-style decoder.
struct ModelSpec {
  std::string name;            ///< preset name, or empty
  std::int64_t layers = 0;
  std::int64_t hidden = 0;
  std::int64_t heads = 0;
  std::int64_t kv_heads = 0;   ///< 0: same as heads (no grouped-query attention)
  std::int64_t ffn = 0;        ///< 0: 4 * hidden
  std::int64_t seq = 0;        ///< sequence length
  std::int64_t vocab = 0;
  std::int64_t experts = 0;    ///< 0: dense
  bool tied_embeddings = true;

  std::int64_t kv_heads_or_heads() const { return kv_heads > 0 ? kv_heads : heads; }
  std::int64_t ffn_or_default() const { return ffn > 0 ? ffn : 4 * hidden; }
};

/// The standard dims in the default order, outer to inner.
inline const std::vector<std::string>& default_order() {
  static const std::vector<std::string> kOrder = {"dp", "pp", "cp", "tp"};
  return kOrder;
}

/// How the world is split.
struct ParallelConfig {
  /// Dims outer to inner. One size may be -1: inferred from `world`.
  std::vector<Dim> dims = {{"dp", 1}, {"pp", 1}, {"cp", 1}, {"tp", 1}};
  std::int64_t world = 0;           ///< 0: the product of the sizes
  std::int64_t ranks_per_node = 0;  ///< 0: unknown (placement not checked)
  std::vector<std::string> heavy_dims = {"tp"};  ///< dims warned about when crossing nodes
  Schedule schedule = Schedule::k1F1B;
  std::int64_t vpp = 1;             ///< virtual stages per rank (interleaved)
  bool sequence_parallel = false;
  std::int64_t micro_batch = 1;     ///< sequences per micro-batch
  std::int64_t global_batch = 0;    ///< sequences per step; 0: micro_batch * dp

  /// Size of a named dim (1 when absent).
  std::int64_t size(std::string_view name) const;
  /// Sets a named dim's size; ConfigError when the config has no such dim.
  void set_size(std::string_view name, std::int64_t size);
  /// Number of micro-batches per step per pipeline: global_batch / (micro_batch * dp).
  std::int64_t microbatches() const;
  /// The mesh of the resolved dims. Call resolve() first when a size is -1.
  Mesh mesh() const;
};

/// Fills in a -1 size from `world` (or config.world when world is 0) and world itself.
/// ConfigError when it cannot.
ParallelConfig resolve(ParallelConfig config, std::int64_t world = 0);

/// Every problem with the config (and the model, when given), one line each, each
/// naming the field, the value and the nearest valid choice. Empty when valid. No
/// exceptions: the planner calls this in its search loop.
std::vector<std::string> problems(const ParallelConfig& config, const ModelSpec* model = nullptr);

/// Throws one ConfigError holding every problem, or returns.
void validate(const ParallelConfig& config, const ModelSpec* model = nullptr);

/// Model checks on their own (layers, heads, hidden...) independent of parallelism.
std::vector<std::string> model_problems(const ModelSpec& model);

/// What a TOML config file holds. Sections [parallel], [model], [training]; unknown keys
/// are errors that name the key and the file.
struct ConfigFile {
  ParallelConfig parallel;
  std::optional<ModelSpec> model;
  std::vector<std::string> keys_set;  ///< "parallel.tp", ... (so flags can override)
};

/// Reads a TOML config file. IoError when unreadable; ConfigError naming the key, the
/// value and the file otherwise.
ConfigFile load_config_file(const std::string& path);

}  // namespace ndmesh
