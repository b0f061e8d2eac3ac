// ParallelConfig, ModelSpec and their validation.
//
// A ParallelConfig says how the world is split (named dim sizes and their order, the
// pipeline schedule, batch sizes, ranks per node); a ModelSpec says what is split. All
// checks run together: validate() throws one ConfigError listing every problem, each
// naming the field, the value and the nearest valid choice.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "ndmesh/core/arch.hpp"
#include "ndmesh/mesh/mesh.hpp"

namespace ndmesh {

/// Pipeline schedules.
enum class Schedule { kGpipe, k1F1B, kInterleaved, kZbH1 };

/// "gpipe", "1f1b", "interleaved", "zb-h1".
std::string_view schedule_name(Schedule s);
/// Parses a schedule name; ConfigError listing the valid names otherwise.
Schedule parse_schedule(std::string_view name);

/// The architecture of a decoder-only transformer: its sizes and the kinds of its layers,
/// one description for `ndmesh train`, `ndmesh plan`, checkpoints, the TOML [model] section
/// and Python (docs/models.md). The defaults are GPT-2's layers; Llama is a description too
/// (arch_defaults("llama")), and presets are names for descriptions (config/presets.hpp).
struct ModelSpec {
  std::string name;  ///< preset name, or empty
  std::int64_t layers = 0;
  std::int64_t hidden = 0;
  std::int64_t heads = 0;
  std::int64_t kv_heads = 0;  ///< 0: same as heads (no grouped-query attention)
  std::int64_t ffn = 0;       ///< 0: 4 * hidden
  std::int64_t seq = 0;       ///< sequence length
  std::int64_t vocab = 0;
  std::int64_t experts = 0;  ///< routed experts per MoE layer; 0: dense (nn/moe.hpp)
  std::int64_t top_k = 2;           ///< experts each token is routed to (1..experts)
  std::int64_t shared_experts = 0;  ///< experts every token goes through (DeepSeek's shared experts)
  std::int64_t expert_ffn = 0;      ///< each expert's MLP width; 0: ffn_or_default()
  std::int64_t moe_every = 1;       ///< after the first dense ones, every n-th block is MoE
  std::int64_t moe_first_dense = 0;  ///< the first k blocks stay dense (DeepSeek-V3: 3)
  RouterKind router = RouterKind::kSoftmax;
  /// Coefficient of the auxiliary load-balancing loss, coeff * E * sum_i f_i * P_i per layer
  /// and micro-batch (Switch Transformer, Mixtral); 0: none (DeepSeek-V3's sigmoid router
  /// balances with its bias instead).
  double aux_loss = 0.01;
  /// Tokens an expert takes per micro-batch: capacity_factor * tokens * top_k / experts
  /// (rounded up); the assignments past it are dropped in token order. 0: dropless.
  double capacity_factor = 0;
  /// The sigmoid router's balancing-bias step per optimizer step (DeepSeek-V3's gamma).
  double router_bias_rate = 0.001;
  bool tied_embeddings = true;
  /// Standard deviation of the initial matrices and tables (residual projections: init_std /
  /// sqrt(2 layers), GPT-2's scaling); norms start at 1, biases at 0.
  double init_std = 0.02;
  std::int64_t head_dim = 0;  ///< the size of each attention head; 0: hidden / heads
  NormKind norm = NormKind::kLayerNorm;
  double norm_eps = 1e-5;
  MlpKind mlp = MlpKind::kGelu;
  PositionsKind positions = PositionsKind::kLearned;
  /// Rows of a learned position table (the longest sequence it can run); 0: seq. A run's
  /// `seq` may be any length up to it (any length with rotary positions).
  std::int64_t max_positions = 0;
  double rope_theta = 10000;  ///< rotary base
  RopeScaling rope_scaling;   ///< Llama 3's frequency scaling (factor 0: none)
  bool biases = true;         ///< the linear layers carry biases (the norms' follow the norm kind)
  /// The vocabulary's rows (token table, output layer, logits) padded to a multiple of this
  /// and of tp; the padding rows are zero, never a target and never in the softmax. 1: none.
  std::int64_t vocab_multiple = 64;

  std::int64_t kv_heads_or_heads() const { return kv_heads > 0 ? kv_heads : heads; }
  /// The MLP width: ffn, or the family's default (GELU: 4 hidden; SwiGLU: Llama's 8/3 hidden
  /// rounded up to a multiple of 256).
  std::int64_t ffn_or_default() const {
    if (ffn > 0) return ffn;
    if (mlp == MlpKind::kSwiglu) return (8 * hidden / 3 + 255) / 256 * 256;
    return 4 * hidden;
  }
  /// Each expert's MLP width: expert_ffn, or ffn_or_default().
  std::int64_t expert_ffn_or_default() const { return expert_ffn > 0 ? expert_ffn : ffn_or_default(); }
  /// Whether block `layer` (0-based) has a mixture-of-experts MLP: experts > 0, past the first
  /// moe_first_dense blocks, and every moe_every-th after them.
  bool is_moe_layer(std::int64_t layer) const {
    return experts > 0 && layer >= moe_first_dense && moe_every > 0 && (layer - moe_first_dense) % moe_every == 0;
  }
  std::int64_t head_dim_or_default() const { return head_dim > 0 ? head_dim : (heads > 0 ? hidden / heads : 0); }
  /// Rows of the learned position table (0 with rotary positions).
  std::int64_t position_rows() const {
    return positions == PositionsKind::kLearned ? (max_positions > 0 ? max_positions : seq) : 0;
  }
  /// The vocabulary padded for a tensor-parallel group of `tp`: a multiple of vocab_multiple
  /// and of tp.
  std::int64_t padded_vocab(std::int64_t tp = 1) const;
};

/// A value of a [model] key: a whole number, a real number, true/false or a name.
using ModelValue = std::variant<std::int64_t, double, bool, std::string>;

/// The keys of an architecture description, as the TOML [model] section, checkpoint manifests
/// and Python spell them: arch (a family, applied first), name, layers, hidden, heads, kv_heads,
/// head_dim, ffn, seq, max_positions, vocab, vocab_multiple, experts, tied_embeddings, norm,
/// norm_eps, mlp, positions, rope_theta, rope_scaling_factor, rope_low_freq_factor,
/// rope_high_freq_factor, rope_original_positions, biases, init_std, top_k, shared_experts,
/// expert_ffn, moe_every, moe_first_dense, router, aux_loss, capacity_factor, router_bias_rate.
const std::vector<std::string>& model_keys();
/// Sets the keys of `values` on `m`, "arch" first (the family's layers, then the other keys
/// over them). ConfigError naming `where`.key, the value and the fix for an unknown key, a value
/// of the wrong kind or an unknown name (arch, norm, mlp, positions).
void set_model_keys(ModelSpec& m, const std::vector<std::pair<std::string, ModelValue>>& values,
                    std::string_view where);
/// Every key of `m` with its value (what a manifest stores).
std::vector<std::pair<std::string, ModelValue>> model_values(const ModelSpec& m);

/// The architecture of a family: "gpt2" (LayerNorm, learned positions, GELU, biases, tied
/// output layer) or "llama" (RMSNorm, rotary positions with theta 500000, SwiGLU, no biases,
/// untied), with the sizes of `base` kept. ConfigError naming `flag`, the value and the
/// families otherwise.
ModelSpec with_arch(ModelSpec base, std::string_view arch, std::string_view flag = "--arch");
/// "gpt2", "llama", or "custom" for a description that is neither family's layers.
std::string arch_name(const ModelSpec& spec);

/// The standard dims in the default order, outer to inner ("dp,pp,cp,tp"). When ep > 1
/// and no order is given, ep goes between pp and cp ("dp,pp,ep,cp,tp").
inline const std::vector<std::string>& default_order() {
  static const std::vector<std::string> kOrder = {"dp", "pp", "cp", "tp"};
  return kOrder;
}

/// The standard dim names ("dp", "pp", "cp", "tp", "ep").
const std::vector<std::string>& standard_dims();

/// How a user writes a layout: sizes of the standard dims with an order, or custom dims.
/// Exactly one of `order`, `megatron_order`, `dims` may be set; none means the default
/// order. Standard dims without a size are 1.
struct LayoutSpec {
  std::map<std::string, std::int64_t> sizes;  ///< "tp" -> 2; -1 = infer from the world
  std::string order;                          ///< outer to inner, "dp,pp,cp,tp"
  std::string megatron_order;                 ///< fastest first, "tp-cp-ep-dp-pp"
  std::string dims;                           ///< custom names outer to inner, "pipe=2,tensor=2,data=4"
};

/// The dims (outer to inner) a LayoutSpec describes; sizes may still be -1. ConfigError
/// naming the flag, the value and the fix for unknown, duplicate or missing dims and for
/// conflicting spellings.
std::vector<Dim> layout_dims(const LayoutSpec& spec);

/// How the world is split.
struct ParallelConfig {
  /// Dims outer to inner. One size may be -1: inferred from `world`.
  std::vector<Dim> dims = {{"dp", 1}, {"pp", 1}, {"cp", 1}, {"tp", 1}};
  /// Expert parallelism folded into dp x cp (MoE, as Megatron-core and torchtitan fold it):
  /// not a dim of the mesh; it divides dp*cp, and ep consecutive members of each dp-cp
  /// group exchange tokens (Mesh::fold_group). 1: none. A `ep` dim in `dims` is the other,
  /// standalone spelling (`ndmesh mesh --ep` without --fold-ep).
  std::int64_t folded_ep = 1;
  std::int64_t world = 0;                        ///< 0: the product of the sizes
  std::int64_t ranks_per_node = 0;               ///< 0: unknown (placement not checked)
  std::vector<std::string> heavy_dims = {"tp"};  ///< dims warned about when crossing nodes
  Schedule schedule = Schedule::k1F1B;
  std::int64_t vpp = 1;  ///< virtual stages per rank (interleaved)
  bool sequence_parallel = false;
  bool recompute = false;         ///< any activation recompute (zb-h1 cannot recompute yet)
  int zero = 0;                   ///< ZeRO stage over dp
  std::int64_t micro_batch = 1;   ///< sequences per micro-batch
  std::int64_t global_batch = 0;  ///< sequences per step; 0: micro_batch * dp
  std::string memory;             ///< a memory strategy ([training] memory; config/training.hpp); empty: none
  /// Layers need not divide pp*vpp: the blocks are split by balanced_partition()
  /// (config/partition.hpp), each of the pp*vpp chunks still needs one block. This is what
  /// `ndmesh train`'s pipeline runs; false also asks for layers divisible by pp*vpp.
  bool uneven_stages = true;

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
/// exceptions: the planner calls this in its search loop. Beyond the mesh (sizes, world,
/// dims), these are the rules of training_problems() (config/training.hpp): the ones
/// `ndmesh train` runs by.
std::vector<std::string> problems(const ParallelConfig& config, const ModelSpec* model = nullptr);

/// Throws one ConfigError holding every problem, or returns.
void validate(const ParallelConfig& config, const ModelSpec* model = nullptr);

/// How model_problems names a field: as a config key ("model heads=3 ...; use heads=2")
/// or as ndmesh train's flag ("--heads=3 ...; use --heads=2").
enum class ModelFieldNames { kConfig, kFlags };

/// Model checks on their own (layers, heads, hidden...) independent of parallelism.
/// The one place the model-shape rules live: the planner (plan_model_problems), the model
/// layer (model::model_spec_problems) and `ndmesh train`'s flag check (kFlags) call it.
std::vector<std::string> model_problems(const ModelSpec& model,
                                        ModelFieldNames names = ModelFieldNames::kConfig);

/// What a TOML config file holds. Sections [parallel], [model], [training]; unknown keys
/// are errors that name the key and the file.
///
///   [parallel]  tp pp dp cp ep (integers, one may be -1), order | megatron_order | dims,
///               world, ranks_per_node, heavy_dims, schedule, vpp, sequence_parallel
///   [model]     name layers hidden heads kv_heads ffn seq vocab experts tied_embeddings
///   [training]  micro_batch global_batch memory
struct ConfigFile {
  LayoutSpec layout;
  ParallelConfig parallel;  ///< non-layout fields (dims come from `layout`)
  std::optional<ModelSpec> model;  ///< the [model] keys over ModelSpec{}
  /// The [model] keys as written (arch first when applied: set_model_keys), for a caller with a
  /// base description of its own (`ndmesh train`'s defaults or a preset).
  std::vector<std::pair<std::string, ModelValue>> model_values;
};

/// Reads a TOML config file. IoError when unreadable; ConfigError naming the key, the
/// value and the file otherwise.
ConfigFile load_config_file(const std::string& path);

}  // namespace ndmesh
