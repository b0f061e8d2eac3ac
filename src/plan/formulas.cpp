// Closed forms of the planner: parameter counts, activations per layer, model states under
// ZeRO, FLOPs per step and pipeline bubbles. The sources are cited in formulas.hpp and next
// to each term below; everything is in doubles because counts of a trillion-parameter
// model times bytes overflow nothing in double and stay exact far beyond what we print.
#include "ndmesh/plan/formulas.hpp"

#include <algorithm>

#include "ndmesh/core/error.hpp"
#include "units.hpp"

namespace ndmesh::plan {
namespace {

using units::d;

double head_dim(const PlanModel& m) { return d(m.spec.head_dim_or_default()); }

// Key/value heads one tensor-parallel rank holds: split when there are at least tp of them,
// otherwise each rank keeps (a copy of) one, as Megatron does for GQA with tp > groups.
double kv_heads_per_rank(const PlanModel& m, std::int64_t tp) {
  const double kv = d(m.spec.kv_heads_or_heads());
  return std::max(kv / d(tp), 1.0);
}

double norm_parameters(const PlanModel& m) {
  // LayerNorm has a scale and a bias per channel, RMSNorm a scale only.
  return (m.spec.norm == NormKind::kLayerNorm ? 2.0 : 1.0) * d(m.spec.hidden);
}

}  // namespace

std::string_view attention_name(Attention a) { return a == Attention::kFlash ? "flash" : "standard"; }

Attention parse_attention(std::string_view name, std::string_view flag) {
  if (name == "flash") return Attention::kFlash;
  if (name == "standard") return Attention::kStandard;
  fail<ConfigError>("plan", "{} '{}' is not an attention kind; use flash or standard", flag, name);
}

Precision parse_precision(std::string_view name, std::string_view flag) {
  if (name == "mixed") return {};
  if (name == "mixed-fp32-grads") return {.grad_bytes = 4};
  const Precision fp32{.param_bytes = 4,
                       .grad_bytes = 4,
                       .optimizer_bytes = 8,
                       .activation_bytes = 4,
                       .bf16_products = false,
                       .logit_gradient_bytes = 0,
                       .unfused_elementwise = true,
                       .fused_loss = true};
  if (name == "fp32") return fp32;
  // What `ndmesh train --precision bf16` keeps today: fp32's weights, gradients, moments and
  // activations, a bf16 copy of the weights (the products' operand, written by the optimizer
  // step), bf16 operands only at the products; bf16 logits with the vocabulary on one
  // GPU, else fp32 ones and a bf16 copy of their gradient (written over the probabilities)
  // for the products (measured on an H200: docs/plan.md).
  if (name == "bf16") {
    Precision bf16 = fp32;
    bf16.bf16_products = true;
    bf16.logit_gradient_bytes = 2;
    bf16.weight_copy_bytes = 2;
    bf16.mlp_hidden_bytes = 2;
    bf16.mlp_pre_activation_bytes = 2;
    bf16.norm_output_bytes = 2;
    bf16.attention_output_bytes = 2;
    bf16.attention_input_bytes = 2;
    return bf16;
  }
  fail<ConfigError>(
      "plan",
      "{} '{}' is not a precision; use mixed (2 + 2 + 12 B per parameter), mixed-fp32-grads (2 + 4 + 12 B), "
      "bf16 (ndmesh's: 4 + 2 + 4 + 8 B, a bf16 weight copy, fp32 activations but bf16 norm outputs, "
      "attention input and output and MLP pre-activation and hidden, bf16 products) or fp32 (4 + 4 + 8 B)",
      flag, name);
}

double layer_matrix_parameters(const PlanModel& m) {
  const double h = d(m.spec.hidden);
  const double f = d(m.spec.ffn_or_default());
  const double kv_width = d(m.spec.kv_heads_or_heads()) * head_dim(m);
  // Attention: Q (h x h), K and V (h x kv_width each), output projection (h x h).
  const double attention = 2 * h * h + 2 * h * kv_width;
  // MLP: GeLU up and down (2 h f); SwiGLU gate, up and down (3 h f).
  const double mlp = (m.spec.mlp == Mlp::kGelu ? 2.0 : 3.0) * h * f;
  return attention + mlp;
}

MoeParameters moe_parameters(const ModelSpec& spec) {
  MoeParameters p;
  if (spec.experts <= 0) return p;
  const double h = d(spec.hidden), f = d(spec.expert_ffn_or_default());
  const double mats = spec.mlp == Mlp::kGelu ? 2.0 : 3.0;  // fc (gate and up for SwiGLU), proj
  p.router = d(spec.experts) * h + (spec.router == RouterKind::kSigmoid ? d(spec.experts) : 0.0);
  p.expert = mats * h * f;
  p.shared = d(spec.shared_experts) * p.expert;
  return p;
}

std::int64_t moe_layers_in(const ModelSpec& spec, std::int64_t first, std::int64_t count) {
  std::int64_t n = 0;
  for (std::int64_t i = first; i < first + count; ++i) n += spec.is_moe_layer(i) ? 1 : 0;
  return n;
}

PlanModel moe_block_view(const PlanModel& m) {
  PlanModel v = m;
  v.spec.expert_ffn = m.spec.expert_ffn_or_default();
  v.spec.ffn = (m.spec.top_k + m.spec.shared_experts) * v.spec.expert_ffn;
  return v;
}

MoeLayerShare moe_layer_parameters_per_rank(const PlanModel& m, std::int64_t tp, std::int64_t ep) {
  const PlanModel none = [&] {
    PlanModel v = m;
    v.spec.ffn = 1;  // the attention and norms of layer_parameters_per_rank, MLP taken off below
    return v;
  }();
  const double t = d(tp), h = d(m.spec.hidden);
  const double mats = m.spec.mlp == Mlp::kGelu ? 2.0 : 3.0;
  // layer_parameters_per_rank with ffn = 1: the MLP's mats h / t, and with biases its
  // (1 or 2) / t + h biases: take them off.
  double attention = layer_parameters_per_rank(none, tp) - mats * h / t;
  if (m.spec.biases) attention -= (m.spec.mlp == Mlp::kGelu ? 1.0 : 2.0) / t + h;
  const MoeParameters p = moe_parameters(m.spec);
  MoeLayerShare r;
  r.dense = attention + p.router + p.shared / t;
  r.experts = d(m.spec.experts) / d(std::max<std::int64_t>(ep, 1)) * p.expert / t;
  return r;
}

double all_to_all_seconds(double bytes, std::int64_t ep, std::int64_t in_node, double intra_bw, double inter_bw,
                          double latency) {
  if (ep <= 1) return 0;
  const double n = d(ep), local = d(std::clamp<std::int64_t>(in_node, 1, ep));
  const double intra = (local - 1) / n * bytes / intra_bw;
  const double inter = local < n ? (n - local) / n * bytes / inter_bw : 0.0;
  return (n - 1) * latency + std::max(intra, inter);
}

ParameterCount count_parameters(const PlanModel& m) {
  const double h = d(m.spec.hidden);
  const double f = d(m.spec.ffn_or_default());
  const double kv_width = d(m.spec.kv_heads_or_heads()) * head_dim(m);
  ParameterCount c;
  // Biases: QKV (h + 2 kv_width), output projection (h), MLP first layer(s) and second.
  double biases = 0;
  if (m.spec.biases) biases = (h + 2 * kv_width) + h + (m.spec.mlp == Mlp::kGelu ? f : 2 * f) + h;
  // For GPT (kv_width = h, f = 4h) this is 12h^2 + 13h per layer: Narayanan et al. 2021.
  c.per_layer = layer_matrix_parameters(m) + biases + 2 * norm_parameters(m);
  c.layers = c.per_layer * d(m.spec.layers);
  if (m.spec.experts > 0) {
    // A MoE layer: the attention (its biases too), the norms, the router, E routed experts and
    // the shared ones (nn::Moe: expert MLPs without biases).
    const double mlp = (m.spec.mlp == Mlp::kGelu ? 2.0 : 3.0) * h * f +
                       (m.spec.biases ? (m.spec.mlp == Mlp::kGelu ? f : 2 * f) + h : 0.0);
    const MoeParameters p = moe_parameters(m.spec);
    c.moe_per_layer = c.per_layer - mlp + p.router + d(m.spec.experts) * p.expert + p.shared;
    const double moe = d(moe_layers_in(m.spec, 0, m.spec.layers));
    c.layers = c.per_layer * (d(m.spec.layers) - moe) + c.moe_per_layer * moe;
    c.routed = moe * d(m.spec.experts) * p.expert;
    c.routed_active = moe * d(m.spec.top_k) * p.expert;
  }
  c.embedding = d(m.spec.vocab) * h + d(m.spec.position_rows()) * h;
  c.head = m.spec.tied_embeddings ? 0.0 : d(m.spec.vocab) * h;
  c.final_norm = norm_parameters(m);
  return c;
}

double layer_parameters_per_rank(const PlanModel& m, std::int64_t tp) {
  const double t = d(tp);
  const double h = d(m.spec.hidden);
  const double f = d(m.spec.ffn_or_default());
  const double kv_width = kv_heads_per_rank(m, tp) * head_dim(m);
  const double mlp_mats = m.spec.mlp == Mlp::kGelu ? 2.0 : 3.0;
  // Column-parallel (Q, K, V, MLP up/gate) and row-parallel (output projection, MLP down)
  // matrices are split over tp (Shoeybi et al. 2019); K and V by kv heads.
  double p = 2 * h * h / t + 2 * h * kv_width + mlp_mats * h * f / t;
  if (m.spec.biases) {
    // Column-parallel biases are split, row-parallel ones (added after the reduction) not.
    p += h / t + 2 * kv_width + (m.spec.mlp == Mlp::kGelu ? f : 2 * f) / t + 2 * h;
  }
  return p + 2 * norm_parameters(m);  // norms are replicated
}

double activation_bytes_per_layer(const PlanModel& m, double s, double b, const ActivationOptions& o) {
  const double h = d(m.spec.hidden);
  const double a = d(m.spec.heads);
  const double f = d(m.spec.ffn_or_default());
  const double t = d(o.tp);
  const double e = o.activation_bytes;  // bytes per stored element (2 in Korthikanti)
  const double sp = o.sequence_parallel ? t : 1.0;

  if (o.recompute == Recompute::kFull) {
    // Only the layer input is kept: 2sbh, split over tp by sequence parallelism.
    return e * s * b * h / sp;
  }

  // Korthikanti et al. 2022 section 4.1, term by term (16-bit elements, 1-byte masks):
  // Not split by tensor parallelism (split by sequence parallelism): the inputs of the two
  // norms, of the QKV projection and of the MLP (4 sbh elements: 8sbh bytes) and the two
  // dropout masks after attention and MLP (2sbh bytes): the "10".
  // ndmesh's bf16 stores the norms' outputs (the QKV and MLP inputs) in bf16
  // (Precision::norm_output_bytes), with sequence parallelism too (it gathers them in bf16).
  const double norm_out = o.norm_output_bytes > 0 ? o.norm_output_bytes : e;
  const double replicated = (2 * e + 2 * norm_out) * s * b * h + (m.dropout ? 2 * s * b * h : 0.0);
  // Split by tp: Q and the input of the output projection (sbh/t elements each), K and V
  // (sbh/t each for multi-head attention, scaled by kv_heads/heads for GQA): 8sbh/t bytes
  // for GPT. The MLP: GeLU keeps its input and output (2 sbf elements, 16sbh/t bytes for
  // f = 4h); SwiGLU keeps the fused gate/up output (2 sbf) and the product fed to the down
  // projection (sbf): 3 sbf elements.
  const double kv_per_rank = kv_heads_per_rank(m, o.tp) * head_dim(m);
  // ndmesh's bf16 stores the attention's input (Q, K, V) and output (the output projection's
  // input) in bf16 (Precision::attention_input_bytes, attention_output_bytes).
  const double attention_out = o.attention_output_bytes > 0 ? o.attention_output_bytes : e;
  const double attention_in = o.attention_input_bytes > 0 ? o.attention_input_bytes : e;
  const double attention_split =
      attention_in * (s * b * h / t + 2 * s * b * kv_per_rank) + attention_out * s * b * h / t;
  const double hidden = o.mlp_hidden_bytes > 0 ? o.mlp_hidden_bytes : e;  // the down projection's input
  const double pre = o.mlp_pre_activation_bytes > 0 ? o.mlp_pre_activation_bytes : e;  // fc's output
  const double mlp_split = (pre * (m.spec.mlp == Mlp::kGelu ? 1.0 : 2.0) + hidden) * s * b * f / t;
  // Attention scores: softmax output (2as^2b), dropout mask (as^2b) and dropout output
  // (2as^2b): 5as^2b, split by tp. Without dropout only the softmax output remains.
  // Selective recompute drops this term (recomputed in the backward pass).
  double scores = 0;
  if (o.attention == Attention::kFlash) {
    if (o.recompute == Recompute::kSelective) {
      // Flash has no scores to drop; selective recompute (as ndmesh defines it) drops the
      // attention core's output, the input of the output projection (s b a hd / t elements),
      // and its fp32 log-sum-exp: the backward re-runs the attention core from Q, K, V.
      return replicated / sp + attention_split - attention_out * s * b * a * head_dim(m) / t + mlp_split +
             (o.moe ? (2 * d(m.spec.top_k) * e * h + 4 * d(m.spec.experts)) * s * b / sp : 0.0);
    }
    scores = 4 * a * s * b / t;  // fp32 log-sum-exp per head and token (Dao et al. 2022)
  } else if (o.recompute == Recompute::kNone) {
    scores = (m.dropout ? (2 * e + 1) : e) * a * s * s * b / t;
  }
  // A mixture of experts' layer (m is moe_block_view's: mlp_split counts the top_k + shared
  // experts' activations of each token): the top_k dispatched copies of every token (the
  // experts' input rows) and the experts' outputs the weighted combine's backward reads, on
  // the rank's rows, and the router's fp32 probabilities.
  const double moe = o.moe ? (2 * d(m.spec.top_k) * e * h + 4 * d(m.spec.experts)) * s * b / sp : 0.0;
  return replicated / sp + attention_split + mlp_split + scores + moe;
}

ModelStates model_state_bytes(double params, int zero_stage, std::int64_t dp, const Precision& pr) {
  NDMESH_CHECK(zero_stage >= 0 && zero_stage <= 3, "plan", "ZeRO stage {} must be 0-3", zero_stage);
  const double n = d(dp);
  // Rajbhandari et al. 2020, Figure 1: stage 1 partitions the optimizer states, stage 2 the
  // gradients as well, stage 3 the parameters as well.
  ModelStates s;
  s.params = zero_stage >= 3 ? pr.param_bytes * params / n : (pr.param_bytes + pr.weight_copy_bytes) * params;
  s.grads = pr.grad_bytes * params / (zero_stage >= 2 ? n : 1.0);
  s.optimizer = pr.optimizer_bytes * params / (zero_stage >= 1 ? n : 1.0);
  return s;
}

double layer_flops_per_step(const PlanModel& m, double s, double batch) {
  const double h = d(m.spec.hidden);
  // Per token and layer: 2 FLOPs per weight (the 24h^2 of Narayanan for GPT) plus 4sh for
  // Q K^T and attention over V; forward + backward = 3x forward (Narayanan eq. 3).
  if (m.spec.experts <= 0) return 3.0 * batch * s * d(m.spec.layers) * (2 * layer_matrix_parameters(m) + 4 * s * h);
  // A mixture of experts: a MoE layer's weights a token meets are the attention's, the
  // router's and its top_k + shared experts' (moe_block_view).
  const double moe = d(moe_layers_in(m.spec, 0, m.spec.layers)), dense = d(m.spec.layers) - moe;
  const double moe_matrices = layer_matrix_parameters(moe_block_view(m)) + d(m.spec.experts) * h;
  return 3.0 * batch * s *
         (dense * (2 * layer_matrix_parameters(m) + 4 * s * h) + moe * (2 * moe_matrices + 4 * s * h));
}

double logit_flops_per_step(const PlanModel& m, double s, double batch) {
  // The output projection: 2hV per token forward, times 3.
  return 3.0 * batch * s * 2 * d(m.spec.hidden) * d(m.spec.vocab);
}

double model_flops_per_step(const PlanModel& m, double s, double batch) {
  return layer_flops_per_step(m, s, batch) + logit_flops_per_step(m, s, batch);
}

double recompute_flops_per_step(const PlanModel& m, double s, double batch, Recompute r,
                                Attention attention) {
  const double h = d(m.spec.hidden);
  // Flash attention's backward recomputes S = Q K^T block by block (Dao et al. 2022,
  // section 3.1 "Recomputation" and the backward pass of Appendix B): 2 b s^2 h per layer,
  // whatever else is recomputed.
  const double flash = attention == Attention::kFlash ? batch * 2 * s * s * h * d(m.spec.layers) : 0.0;
  // Selective with flash: the attention core forward once more (Q K^T and attention over V,
  // 4 b s^2 h per layer), to recompute the attention output and log-sum-exp it dropped.
  if (attention == Attention::kFlash && r == Recompute::kSelective)
    return flash + batch * 4 * s * s * h * d(m.spec.layers);
  if (attention == Attention::kFlash && r != Recompute::kFull) return flash;
  if (r == Recompute::kFull) return layer_flops_per_step(m, s, batch) / 3.0 + flash;
  switch (r) {
    case Recompute::kNone:
      return 0;
    // Korthikanti et al. 2022 section 5: selective recompute repeats Q K^T and attention
    // over V in the backward pass, 4 b s^2 h per layer.
    case Recompute::kSelective:
      return batch * 4 * s * s * h * d(m.spec.layers);
    // A second forward of every layer: 72 -> 96 in Narayanan's formula.
    case Recompute::kFull:
      return layer_flops_per_step(m, s, batch) / 3.0;
  }
  return 0;
}

double bubble_fraction(Schedule schedule, std::int64_t pp, std::int64_t microbatches, std::int64_t vpp) {
  if (pp <= 1) return 0;
  const double p = d(pp), m = d(microbatches);
  switch (schedule) {
    case Schedule::kGpipe:
    case Schedule::k1F1B:
      return (p - 1) / m;
    case Schedule::kInterleaved:
      return (p - 1) / (d(std::max<std::int64_t>(vpp, 1)) * m);
    case Schedule::kZbH1:
      return (p - 1) / (3 * m);
  }
  return (p - 1) / m;
}

double microbatches_in_flight(Schedule schedule, std::int64_t pp, std::int64_t microbatches, std::int64_t vpp,
                              std::int64_t stage) {
  const double m = d(microbatches);
  if (schedule == Schedule::kGpipe || pp <= 1) return schedule == Schedule::kGpipe ? m : 1.0;
  const double warm = std::min(m, d(pp - stage));
  if (schedule == Schedule::kInterleaved) {
    const double p = d(pp), v = d(std::max<std::int64_t>(vpp, 1));
    return warm * (1 + (p - 1) / (p * v));
  }
  return warm;
}

}  // namespace ndmesh::plan

namespace ndmesh::plan {

GemmFit fit_gemm(const std::vector<GemmPoint>& points, std::string_view what) {
  NDMESH_CHECK_CONFIG(points.size() >= 2, "plan", "{}: {} measured products; the fit needs at least 2", what,
                      points.size());
  // Weighted least squares of t = a F + b with weights 1/t^2 on the squared residuals.
  double sw = 0, sf = 0, sff = 0, st = 0, sft = 0;
  for (const GemmPoint& p : points) {
    NDMESH_CHECK_CONFIG(p.m > 0 && p.n > 0 && p.k > 0 && p.flops > 0, "plan",
                        "{}: the product m={} n={} k={} at {} FLOP/s is not positive; measure it again", what,
                        p.m, p.n, p.k, p.flops);
    const double f = 2 * p.m * p.n * p.k, t = f / p.flops, w = 1 / (t * t);
    sw += w, sf += w * f, sff += w * f * f, st += w * t, sft += w * f * t;
  }
  const double det = sff * sw - sf * sf;
  const double a = det != 0 ? (sft * sw - sf * st) / det : 0;
  const double b = det != 0 ? (sff * st - sf * sft) / det : 0;
  NDMESH_CHECK_CONFIG(a > 0, "plan",
                      "{}: the measured products do not fit t = F / rate + overhead with a positive rate; "
                      "measure products of different sizes",
                      what);
  return {.rate = 1 / a, .overhead_s = std::max(b, 0.0)};
}

double kernel_seconds(double flops, double rate, double overhead_s) { return flops / rate + overhead_s; }

LayerMatrices layer_matrices(const PlanModel& m, std::int64_t tp) {
  const double t = d(tp), h = d(m.spec.hidden), f = d(m.spec.ffn_or_default());
  const double hd = head_dim(m);
  LayerMatrices x;
  x.n[0] = h / t + 2 * kv_heads_per_rank(m, tp) * hd, x.k[0] = h;  // QKV, column parallel
  x.n[1] = h, x.k[1] = h / t;                                      // output projection, row parallel
  x.n[2] = (m.spec.mlp == Mlp::kGelu ? 1.0 : 2.0) * f / t, x.k[2] = h;  // MLP up (gate + up fused)
  x.n[3] = h, x.k[3] = f / t;                                      // MLP down, row parallel
  return x;
}

double elementwise_bytes_per_token(const PlanModel& m, const LayerShape& s) {
  if (!s.unfused_elementwise) return 0;
  const double t = d(s.tp), h = d(m.spec.hidden), f = d(m.spec.ffn_or_default());
  const double hd = head_dim(m);
  const double r = (d(m.spec.heads) + 2 * d(m.spec.kv_heads_or_heads())) * hd;  // qkv width
  const double rows = s.sequence_parallel ? 1 / t : 1.0;  // the layer norms' and residuals' share
  const double mlp = m.spec.mlp == Mlp::kGelu ? 1.0 : 2.0;  // SwiGLU: gate and up
  const double forward = 4 * (9 * h * rows + 2 * r / t + 4 * mlp * f / t);
  // The layer norms' backward add the residual path's gradient as they write theirs (no copies)
  // and sum it for the projections' deferred bias gradients in the same read.
  const double backward = 4 * (12 * h * rows + 2 * r / t + 4 * mlp * f / t);
  double bytes = forward + backward;
  if (s.recompute == Recompute::kFull) bytes += forward;
  if (s.bf16_products) {
    // cuBLASLt epilogues: the qkv and fc biases, GELU (its aux written beside C), GELU's
    // derivative (reading the aux) and the two bias gradients run inside the products.
    bytes -= 4 * (2 * r / t + 3 * mlp * f / t) + 4 * (r / t + 3 * mlp * f / t);
    bytes += 6 * (2 * h + h / t + mlp * f / t) + 6 * (3 * h + h / t + 2 * mlp * f / t + r / t);
    // But the MLP's hidden activation is stored in bf16, written by a GELU kernel: fc's product
    // fuses its bias only (4 x 2 f/t of the 4 x 3 f/t taken off above), GELU reads 4 bytes and
    // writes 2 (-2 f/t), and the two products that read the hidden take it as stored (no cast,
    // -6 f/t each): -10 f/t in all.
    bytes += 4 * 3 * mlp * f / t - (4 * 2 * mlp * f / t + 2 * f / t) - 2 * 6 * f / t;
    // And the pre-activation in bf16 too, written with the hidden by fc's product (the GELU
    // epilogue with its aux): the GELU kernel goes (-6 f/t), GELU's derivative in proj's input
    // gradient reads the aux in 2 bytes, not 4 (-2 f/t), and writes d pre in bf16, which fc's
    // two products read as it lies (its cast, -6 f/t).
    bytes -= 14 * mlp * f / t;
    // The norms' outputs are stored in bf16 too: each norm writes 2 bytes an element, not 4
    // (-2 h each, on its share of the rows), and the qkv and fc products read them as stored
    // (with sequence parallelism as gathered in bf16), forward and weight gradient (-6 h four
    // times).
    bytes -= 2 * 2 * h * rows + 4 * 6 * h;
    // cuDNN writes d qkv (widened from bf16): the zeroing of the fp32 pass above is skipped.
    if (s.attention == Attention::kFlash) bytes += 6 * (r / t + h / t) + 6 * (2 * r / t + 2 * h / t) - 4 * r / t;
    // The attention output is stored in bf16 as cuDNN writes it: proj's two products read it
    // as stored (-6 h/t each), and cuDNN's output is neither widened in the forward nor
    // rounded again for its backward (-6 h/t each).
    bytes -= 2 * 6 * h / t;
    if (s.attention == Attention::kFlash) bytes -= 2 * 6 * h / t;
    // And its input and gradients too (nn::BlockActivations::qkv16): qkv's product writes Q, K,
    // V in bf16 and proj's input gradient writes d out in bf16, which cuDNN reads as they are,
    // and qkv's backward reads cuDNN's d qkv as it is written. Of the casts above, cuDNN's of
    // qkv (forward and backward: -6 r/t each) and of d out (-6 h/t), the widening of d qkv
    // (-6 r/t) and the rounding of qkv's output gradient for its products (-6 r/t) are gone.
    if (s.attention == Attention::kFlash) bytes -= 6 * (4 * r / t + h / t);
  }
  return bytes;
}

LayerTime layer_time(const PlanModel& m, const LayerShape& s, double rate, double overhead,
                     double memory_bw, double attention_rate) {
  const double core_rate = attention_rate > 0 ? attention_rate : rate;
  const double t = d(s.tp), h = d(m.spec.hidden), a = d(m.spec.heads), e = s.activation_bytes;
  const double s_local = s.tokens / s.micro_batch;
  const bool flash = s.attention == Attention::kFlash;
  const LayerMatrices x = layer_matrices(m, s.tp);
  LayerTime r;
  double forward_gemm = 0;  // one forward of the products, with their overheads
  auto product = [&](double rows, double n, double k, double count) {
    const double f = 2 * rows * n * k;
    forward_gemm += count * kernel_seconds(f, rate, overhead);
    r.gemm_flops += count * 3 * f;
    r.kernels += static_cast<std::int64_t>(3 * count);
  };
  const bool moe = s.ep > 0 && m.spec.experts > 0;
  for (int i = 0; i < (moe ? 2 : 4); ++i) product(s.tokens, x.n[i], x.k[i], 1);
  if (moe) {
    // The router (replicated over tp), the shared experts on every token, and the E/ep local
    // experts, each on an even share of the tokens x top_k rows the ep group dispatches.
    const double fe = d(m.spec.expert_ffn_or_default()), up = m.spec.mlp == Mlp::kGelu ? 1.0 : 2.0;
    const double experts = d(m.spec.experts), local = experts / d(s.ep);
    const double rows = s.tokens * d(m.spec.top_k) * d(s.ep) / experts;
    product(s.tokens, experts, h, 1);
    if (m.spec.shared_experts > 0) {
      const double shared = d(m.spec.shared_experts) * fe;
      product(s.tokens, up * shared / t, h, 1);
      product(s.tokens, h, shared / t, 1);
    }
    product(rows, up * fe / t, h, local);
    product(rows, h, fe / t, local);
  }
  // The backward runs two products per matrix (input gradient, weight gradient) of the
  // forward's FLOPs each.
  r.gemm = 3 * forward_gemm;
  r.gemm_ideal = r.gemm_flops / rate;

  // Attention core, forward: Q K^T and attention over V, 4 b s_local s h / t model FLOPs.
  const double causal = flash ? 0.5 : 1.0;
  const double core_forward = 4 * s.micro_batch * s_local * s.seq * h / t;
  r.attention = kernel_seconds(causal * 3 * core_forward, core_rate, (flash ? 2 : 6) * overhead);
  const double scores = s.micro_batch * (a / t) * s_local * s.seq;  // score elements per GPU
  const double bw = memory_bw;
  if (!flash && bw > 0) r.memory = (13 * e + 2) * scores / bw;
  if (bw > 0) r.memory += elementwise_bytes_per_token(m, s) * s.tokens / bw;

  // Recompute: flash's backward rebuilds Q K^T (2 b s_local s h / t, causal half) whatever
  // the mode; selective re-runs the attention core forward, full the whole forward.
  if (flash) r.recompute += causal * 2 * s.micro_batch * s_local * s.seq * h / t / core_rate;
  const double core_again = kernel_seconds(causal * core_forward, core_rate, (flash ? 1 : 2) * overhead) +
                            (!flash && bw > 0 ? (6 * e + 1) * scores / bw : 0.0);
  if (s.recompute == Recompute::kSelective) r.recompute += core_again;
  if (s.recompute == Recompute::kFull) r.recompute += forward_gemm + core_again;
  return r;
}

double allreduce_seconds(double bytes, std::int64_t n, double bandwidth, double latency) {
  if (n <= 1) return 0;
  const double steps = 2 * (d(n) - 1);
  return steps * latency + steps / d(n) * bytes / bandwidth;
}

RingTime ring_attention_time(double block_bytes, std::int64_t cp, double step_compute, double bandwidth,
                             double latency, double backward_factor, double grad_block_bytes) {
  RingTime r;
  if (cp <= 1) return r;
  const double steps = d(cp) - 1;
  const double grad_bytes = grad_block_bytes < 0 ? block_bytes : grad_block_bytes;
  const double forward = latency + block_bytes / bandwidth;
  const double backward = latency + (block_bytes + grad_bytes) / bandwidth;  // K, V and dK, dV
  r.transfer = steps * (forward + backward);
  r.exposed = steps * (std::max(0.0, forward - step_compute) +
                       std::max(0.0, backward - backward_factor * step_compute));
  return r;
}

double loss_memory_seconds(double tokens, double vocab, std::int64_t tp, double memory_bw,
                           double bytes_per_logit) {
  return memory_bw > 0 ? bytes_per_logit * tokens * vocab / d(tp) / memory_bw : 0.0;
}

double loss_bytes_per_logit(const Precision& precision, std::int64_t tp) {
  if (precision.fused_loss && tp == 1) return 4 * (precision.bf16_products ? 2.0 : 4.0);
  return 20 + (precision.unfused_elementwise && precision.bf16_products ? 8 + 6 : 0.0);
}

double logit_bytes_held(const Precision& precision, std::int64_t tp) {
  if (precision.fused_loss && tp == 1) return precision.bf16_products ? 2.0 : 4.0;
  return 4 + precision.logit_gradient_bytes;
}

}  // namespace ndmesh::plan
