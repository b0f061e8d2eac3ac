// Layout spelling and validation. Every check appends one line to a list rather than
// throwing, so a user sees all problems at once and the planner can call problems() in
// its search loop. Each line names the field, the value and the nearest valid choice.
#include "ndmesh/config/config.hpp"

#include "ndmesh/config/training.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/core/strings.hpp"
#include "suggest.hpp"

namespace ndmesh {
using detail::nearest_divisors;
using detail::nearest_multiples;
namespace {

std::vector<std::string> split_names(std::string_view s, std::string_view sep) {
  std::vector<std::string> out;
  for (auto part : split_list(s, sep)) out.emplace_back(part);
  return out;
}

bool is_standard(std::string_view name) {
  const auto& s = standard_dims();
  return std::find(s.begin(), s.end(), name) != s.end();
}

std::string product_text(const std::vector<Dim>& dims) {
  std::vector<std::string> names, sizes;
  for (const auto& d : dims) {
    names.push_back(d.name);
    sizes.push_back(std::to_string(d.size));
  }
  return fmt::format("{} = {}", fmt::join(names, "*"), fmt::join(sizes, "*"));
}

}  // namespace

const std::vector<std::string>& standard_dims() {
  static const std::vector<std::string> kDims = {"dp", "pp", "cp", "tp", "ep"};
  return kDims;
}

std::string_view schedule_name(Schedule s) {
  switch (s) {
    case Schedule::kGpipe:
      return "gpipe";
    case Schedule::k1F1B:
      return "1f1b";
    case Schedule::kInterleaved:
      return "interleaved";
    case Schedule::kZbH1:
      return "zb-h1";
  }
  return "?";
}

Schedule parse_schedule(std::string_view name) {
  for (Schedule s : {Schedule::kGpipe, Schedule::k1F1B, Schedule::kInterleaved, Schedule::kZbH1})
    if (schedule_name(s) == name) return s;
  fail<ConfigError>("config", "schedule '{}' is unknown; use one of gpipe, 1f1b, interleaved, zb-h1", name);
}

// ------------------------------------------------------------------------------ layout

std::vector<Dim> layout_dims(const LayoutSpec& spec) {
  int spellings = !spec.order.empty() + !spec.megatron_order.empty() + !spec.dims.empty();
  NDMESH_CHECK_CONFIG(
      spellings <= 1, "config",
      "give the layout once: --order '{}', --megatron-order '{}' and --dims '{}' conflict; keep one",
      spec.order, spec.megatron_order, spec.dims);
  for (const auto& [name, size] : spec.sizes) {
    NDMESH_CHECK_CONFIG(is_standard(name), "config",
                        "unknown dim '{}'; the size flags are dp, pp, cp, tp, ep", name);
    NDMESH_CHECK_CONFIG(size >= 1 || size == -1, "config",
                        "{}={} is not a valid size; use a positive size, or -1 to infer it from the world",
                        name, size);
  }

  if (!spec.dims.empty()) {
    for (const auto& [name, size] : spec.sizes)
      NDMESH_CHECK_CONFIG(false, "config",
                          "--{} {} cannot be combined with --dims '{}'; put {}={} into --dims", name, size,
                          spec.dims, name, size);
    return Mesh::parse(spec.dims).dims();  // custom names; sizes must be positive
  }

  auto size_of = [&](const std::string& name) {
    auto it = spec.sizes.find(name);
    return it == spec.sizes.end() ? std::int64_t{1} : it->second;
  };

  std::vector<std::string> order;  // outer to inner
  std::string flag, text;
  if (!spec.megatron_order.empty()) {
    flag = "--megatron-order", text = spec.megatron_order;
    order = split_names(spec.megatron_order, "-");
    std::reverse(order.begin(), order.end());
  } else if (!spec.order.empty()) {
    flag = "--order", text = spec.order;
    order = split_names(spec.order, ",");
  } else {
    order = default_order();
    if (size_of("ep") != 1) order.insert(order.begin() + 2, "ep");
    flag = "--order", text = fmt::format("{}", fmt::join(order, ","));
  }

  std::vector<Dim> dims;
  std::set<std::string> seen;
  for (const auto& name : order) {
    NDMESH_CHECK_CONFIG(!name.empty(), "config", "{} '{}' has an empty name; e.g. {}", flag, text,
                        flag == "--order" ? "dp,pp,cp,tp" : "tp-cp-dp-pp");
    NDMESH_CHECK_CONFIG(is_standard(name), "config",
                        "{} '{}' names unknown dim '{}'; use dp, pp, cp, tp, ep (or --dims for custom names)",
                        flag, text, name);
    NDMESH_CHECK_CONFIG(seen.insert(name).second, "config", "{} '{}' names '{}' twice; name each dim once",
                        flag, text, name);
    dims.push_back({name, size_of(name)});
  }
  for (const auto& name : standard_dims()) {
    if (seen.count(name) || size_of(name) == 1) continue;
    fail<ConfigError>("config", "{}={} but {} '{}' does not name {}; add {} to the order", name,
                      size_of(name), flag, text, name, name);
  }
  return dims;
}

// ------------------------------------------------------------------------ ParallelConfig

std::int64_t ParallelConfig::size(std::string_view name) const {
  for (const auto& d : dims)
    if (d.name == name) return d.size;
  return 1;
}

void ParallelConfig::set_size(std::string_view name, std::int64_t new_size) {
  for (auto& d : dims)
    if (d.name == name) {
      d.size = new_size;
      return;
    }
  fail<ConfigError>("config", "no dim '{}' in this layout; it has {}", name, Mesh(dims).to_string());
}

std::int64_t ParallelConfig::microbatches() const {
  std::int64_t per_step = micro_batch * size("dp");
  std::int64_t global = global_batch > 0 ? global_batch : per_step;
  return per_step > 0 ? global / per_step : 0;
}

Mesh ParallelConfig::mesh() const { return Mesh(dims); }

ParallelConfig resolve(ParallelConfig config, std::int64_t world) {
  if (world == 0) world = config.world;
  int inferred = -1;
  std::int64_t known = 1;
  for (int i = 0; i < static_cast<int>(config.dims.size()); ++i) {
    const Dim& d = config.dims[i];
    if (d.size == -1) {
      NDMESH_CHECK_CONFIG(inferred < 0, "config",
                          "{} and {} are both -1; only one size can be inferred from the world",
                          config.dims[inferred].name, d.name);
      inferred = i;
    } else {
      NDMESH_CHECK_CONFIG(d.size >= 1, "config", "{}={} is not a valid size; use a positive size or -1",
                          d.name, d.size);
      known *= d.size;
    }
  }
  if (inferred >= 0) {
    const std::string& name = config.dims[inferred].name;
    NDMESH_CHECK_CONFIG(world > 0, "config",
                        "{}=-1 needs the world size; give --world N or launch under mpirun", name);
    NDMESH_CHECK_CONFIG(
        world % known == 0, "config",
        "{}=-1 cannot be inferred: the world of {} ranks is not divisible by the other sizes' "
        "product {}; use a world that is a multiple of {}",
        name, world, known, known);
    config.dims[inferred].size = world / known;
  }
  config.world = world > 0 ? world : Mesh(config.dims).world_size();
  return config;
}

// ---------------------------------------------------------------------------- checks

std::int64_t ModelSpec::padded_vocab(std::int64_t tp) const {
  const std::int64_t multiple = std::lcm(std::max<std::int64_t>(vocab_multiple, 1), std::max<std::int64_t>(tp, 1));
  return (vocab + multiple - 1) / multiple * multiple;
}

ModelSpec with_arch(ModelSpec m, std::string_view arch, std::string_view flag) {
  if (arch == "gpt2") {
    m.norm = NormKind::kLayerNorm;
    m.positions = PositionsKind::kLearned;
    m.mlp = MlpKind::kGelu;
    m.biases = true;
    m.tied_embeddings = true;
    m.norm_eps = 1e-5;
  } else if (arch == "llama") {
    m.norm = NormKind::kRmsNorm;
    m.positions = PositionsKind::kRope;
    m.rope_theta = 500000;
    m.mlp = MlpKind::kSwiglu;
    m.biases = false;
    m.tied_embeddings = false;
    m.norm_eps = 1e-5;
  } else {
    fail<ConfigError>("model", "{}={} is not a model family; use gpt2 or llama (or --model NAME for a preset)", flag,
                      arch);
  }
  return m;
}

std::string arch_name(const ModelSpec& m) {
  if (m.norm == NormKind::kLayerNorm && m.positions == PositionsKind::kLearned && m.mlp == MlpKind::kGelu)
    return "gpt2";
  if (m.norm == NormKind::kRmsNorm && m.positions == PositionsKind::kRope && m.mlp == MlpKind::kSwiglu)
    return "llama";
  return "custom";
}

std::vector<std::string> model_problems(const ModelSpec& m, ModelFieldNames names) {
  // A field as the user wrote it: "model heads" / "heads" in a config, "--heads" as a flag.
  const bool flags = names == ModelFieldNames::kFlags;
  auto key = [&](std::string_view field) {
    if (!flags) return std::string(field);
    std::string k = "--" + std::string(field);
    std::replace(k.begin(), k.end(), '_', '-');
    return k;
  };
  auto label = [&](std::string_view field) { return flags ? key(field) : "model " + key(field); };
  std::vector<std::string> out;
  auto positive = [&](std::string_view field, std::int64_t v) {
    if (v < 1) out.push_back(fmt::format("{}={} must be positive; e.g. {}=1", label(field), v, key(field)));
  };
  positive("layers", m.layers);
  positive("hidden", m.hidden);
  positive("heads", m.heads);
  positive("seq", m.seq);
  // A vocabulary of one token has nothing to predict (the loss is 0 and the gradient
  // too); the model layer needs at least 2.
  if (m.vocab < 2)
    out.push_back(
        fmt::format("{}={} must be at least 2; e.g. {}=50304", label("vocab"), m.vocab, key("vocab")));
  if (m.kv_heads < 0)
    out.push_back(fmt::format("{}={} must be positive, or 0 for heads", label("kv_heads"), m.kv_heads));
  if (m.ffn < 0) out.push_back(fmt::format("{}={} must be positive, or 0 for 4*hidden", label("ffn"), m.ffn));
  if (m.experts < 0)
    out.push_back(fmt::format("{}={} must be positive, or 0 for dense", label("experts"), m.experts));
  if (m.experts > 0) {
    if (m.top_k < 1 || m.top_k > m.experts)
      out.push_back(fmt::format("{}={} must be between 1 and {}={}; e.g. {}=2", label("top_k"), m.top_k,
                                key("experts"), m.experts, key("top_k")));
    if (m.shared_experts < 0)
      out.push_back(fmt::format("{}={} must be 0 or more", label("shared_experts"), m.shared_experts));
    if (m.expert_ffn < 0)
      out.push_back(fmt::format("{}={} must be positive, or 0 for the MLP width", label("expert_ffn"), m.expert_ffn));
    if (m.moe_every < 1)
      out.push_back(fmt::format("{}={} must be at least 1 (1: every block after the dense ones)", label("moe_every"),
                                m.moe_every));
    if (m.moe_first_dense < 0 || (m.layers > 0 && m.moe_first_dense >= m.layers))
      out.push_back(fmt::format("{}={} must be between 0 and {}={} - 1 (a MoE model needs one MoE block)",
                                label("moe_first_dense"), m.moe_first_dense, key("layers"), m.layers));
    if (!(m.aux_loss >= 0) || !std::isfinite(m.aux_loss))
      out.push_back(fmt::format("{}={} must be 0 or a positive number; e.g. {}=0.01", label("aux_loss"), m.aux_loss,
                                key("aux_loss")));
    if (!(m.capacity_factor >= 0) || !std::isfinite(m.capacity_factor))
      out.push_back(fmt::format("{}={} must be 0 (dropless) or a positive number; e.g. {}=1.25",
                                label("capacity_factor"), m.capacity_factor, key("capacity_factor")));
    if (!(m.router_bias_rate >= 0) || !std::isfinite(m.router_bias_rate))
      out.push_back(fmt::format("{}={} must be 0 or a positive number; e.g. {}=0.001", label("router_bias_rate"),
                                m.router_bias_rate, key("router_bias_rate")));
  }
  if (m.head_dim < 0)
    out.push_back(fmt::format("{}={} must be positive, or 0 for hidden / heads", label("head_dim"), m.head_dim));
  if (!(m.norm_eps > 0) || !std::isfinite(m.norm_eps))
    out.push_back(fmt::format("{}={} must be a positive number; e.g. {}=1e-5", label("norm_eps"), m.norm_eps,
                              key("norm_eps")));
  if (!(m.init_std > 0) || !std::isfinite(m.init_std))
    out.push_back(fmt::format("{}={} must be a positive number; e.g. {}=0.02", label("init_std"), m.init_std,
                              key("init_std")));
  if (m.vocab_multiple < 1)
    out.push_back(fmt::format("{}={} must be at least 1 (1: no padding); e.g. {}=64", label("vocab_multiple"),
                              m.vocab_multiple, key("vocab_multiple")));
  if (m.max_positions < 0)
    out.push_back(fmt::format("{}={} must be positive, or 0 for seq", label("max_positions"), m.max_positions));
  if (m.positions == PositionsKind::kRope && (!(m.rope_theta > 0) || !std::isfinite(m.rope_theta)))
    out.push_back(fmt::format("{}={} must be positive; e.g. {}=10000 (Llama 2) or 500000 (Llama 3)",
                              label("rope_theta"), m.rope_theta, key("rope_theta")));
  if (!out.empty()) return out;
  if (m.positions == PositionsKind::kLearned && m.max_positions > 0 && m.seq > m.max_positions)
    out.push_back(fmt::format("{}={} is longer than the learned position table ({}={}); use {} {} or less, or "
                              "rotary positions",
                              label("seq"), m.seq, key("max_positions"), m.max_positions, key("seq"),
                              m.max_positions));
  if (m.head_dim == 0 && m.hidden % m.heads != 0)
    out.push_back(fmt::format("{}={} is not divisible by {}={}; use {}", label("hidden"), m.hidden,
                              key("heads"), m.heads, nearest_divisors(m.hidden, m.heads, key("heads"))));
  std::int64_t kv = m.kv_heads_or_heads();
  if (m.heads % kv != 0)
    out.push_back(fmt::format("{}={} is not a multiple of {}={}; use {}", label("heads"), m.heads,
                              key("kv_heads"), kv, nearest_divisors(m.heads, kv, key("kv_heads"))));
  if (m.positions == PositionsKind::kRope && m.head_dim_or_default() % 2 != 0)
    out.push_back(fmt::format("rotary positions need an even head size, but {} / {} = {}; use --positions learned, or "
                              "a hidden, heads or head_dim that gives an even head size",
                              key("hidden"), key("heads"), m.head_dim_or_default()));
  return out;
}

std::vector<std::string> problems(const ParallelConfig& c, const ModelSpec* model) {
  std::vector<std::string> out;
  // Sizes and world.
  std::int64_t product = 1;
  bool sizes_ok = true;
  for (const auto& d : c.dims) {
    if (d.size == -1) {
      out.push_back(
          fmt::format("{}=-1 is not resolved; give the world size (--world N or a launcher)", d.name));
      sizes_ok = false;
    } else if (d.size < 1) {
      out.push_back(
          fmt::format("{}={} is not a valid size; use a positive size or -1 to infer it", d.name, d.size));
      sizes_ok = false;
    } else {
      product *= d.size;
    }
  }
  {
    std::set<std::string> seen;
    for (const auto& d : c.dims)
      if (!seen.insert(d.name).second) {
        out.push_back(fmt::format("dim '{}' appears twice; name each dim once", d.name));
        sizes_ok = false;
      }
  }
  if (sizes_ok && c.world > 0 && product != c.world) {
    std::string hint;
    for (const auto& d : c.dims) {
      std::int64_t others = product / d.size;
      if (d.size > 1 && c.world % others == 0) {
        hint = fmt::format("; use {}={} or {}=-1", d.name, c.world / others, d.name);
        break;
      }
    }
    if (hint.empty()) hint = fmt::format("; use --world {} or sizes whose product is {}", product, c.world);
    out.push_back(
        fmt::format("{} = {} but the world has {} ranks{}", product_text(c.dims), product, c.world, hint));
  }
  if (c.ranks_per_node < 0)
    out.push_back(fmt::format("ranks_per_node={} must be positive (or 0 for unknown)", c.ranks_per_node));

  // Batches, schedule and the model on the layout: the rules `ndmesh train` runs by
  // (training.hpp), so a config `ndmesh mesh --config` accepts is one `ndmesh train` runs.
  const std::int64_t pp = c.size("pp"), ep = c.size("ep") * c.folded_ep;
  if (sizes_ok && c.folded_ep != 1) {
    const std::int64_t dp_cp = c.size("dp") * c.size("cp");
    if (c.folded_ep < 1 || dp_cp % c.folded_ep != 0)
      out.push_back(fmt::format("ep={} must divide dp*cp = {}*{} = {} (ep folds into dp x cp); use {}", c.folded_ep,
                                c.size("dp"), c.size("cp"), dp_cp, nearest_divisors(dp_cp, std::max<std::int64_t>(c.folded_ep, 1), "ep")));
  }
  if (c.micro_batch < 1)
    out.push_back(fmt::format("micro_batch={} must be at least 1; e.g. micro_batch=1", c.micro_batch));
  if (c.global_batch < 0)
    out.push_back(fmt::format("global_batch={} must be positive (or 0 for micro_batch*dp)", c.global_batch));
  if (!sizes_ok) {
    if (model != nullptr)
      for (auto& p : model_problems(*model)) out.push_back(std::move(p));
    return out;
  }
  const bool model_ok = model != nullptr && model_problems(*model).empty();
  if (model != nullptr)
    for (auto& p : model_problems(*model)) out.push_back(std::move(p));
  if (c.micro_batch >= 1 && c.global_batch >= 0)
    for (auto& p : training_problems(training_run(c), model_ok ? model : nullptr))
      out.push_back(std::move(p));
  if (!model_ok) return out;

  const ModelSpec& m = *model;
  // Even stages only when asked (uneven_stages = false); the executor runs any partition.
  const std::int64_t stages = pp * std::max<std::int64_t>(c.vpp, 1);
  if (!c.uneven_stages && m.layers >= stages && m.layers % stages != 0) {
    if (c.vpp > 1)
      out.push_back(fmt::format("layers={} is not divisible by pp*vpp = {}*{} = {}; use {}", m.layers, pp,
                                c.vpp, stages, nearest_multiples(m.layers, stages, "layers")));
    else
      out.push_back(fmt::format("layers={} is not divisible by pp={}; use {}, or {}", m.layers, pp,
                                nearest_divisors(m.layers, pp, "pp"),
                                nearest_multiples(m.layers, pp, "layers")));
  }
  if (m.experts > 0 && ep >= 1 && m.experts % ep != 0)
    out.push_back(fmt::format("experts={} is not divisible by ep={}; use {}", m.experts, ep,
                              nearest_divisors(m.experts, ep, "ep")));
  if (m.experts == 0 && ep > 1)
    out.push_back(fmt::format("ep={} but the model is dense (experts=0); use ep=1 or set experts", ep));
  return out;
}

void validate(const ParallelConfig& config, const ModelSpec* model) {
  auto list = problems(config, model);
  if (list.empty()) return;
  if (list.size() == 1) throw ConfigError("config", list.front());
  std::string text = fmt::format("{} problems:", list.size());
  for (const auto& p : list) text += "\n  - " + p;
  throw ConfigError("config", text);
}

}  // namespace ndmesh
