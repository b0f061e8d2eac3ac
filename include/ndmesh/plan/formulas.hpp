// Closed-form counts the planner is built from, each from a published source.
//
// - Parameters: Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on
//   GPU Clusters Using Megatron-LM", section 5.1 / Table 1): a GPT layer holds 12h^2 + 13h
//   parameters and the model P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)). We count the
//   same tensors one by one, so GQA, SwiGLU, missing biases and RMSNorm (Llama) come out
//   right too.
// - Activations: Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
//   Transformer Models", section 4): s b h (34 + 5 a s / h) bytes per layer without
//   parallelism; s b h (10 + 24/t + 5 a s/(h t)) with tensor parallelism; s b h/t (34 +
//   5 a s/h) with sequence parallelism too; selective recompute drops the 5 a s/h term
//   (34 s b h/t with sequence parallelism); full recompute keeps the 2 s b h layer input.
//   16-bit activations, 1-byte dropout masks.
// - Flash attention: Dao et al. 2022 ("FlashAttention: Fast and Memory-Efficient Exact
//   Attention with IO-Awareness", section 3.1 and the backward pass in Appendix B): the s x s
//   scores, softmax output and dropout mask are never stored (Korthikanti's 5 a s^2 b term
//   is gone); the forward keeps the output (already counted as the input of the output
//   projection) and the fp32 softmax statistics (log-sum-exp, 4 a s b bytes), and the
//   backward recomputes the scores Q K^T from Q and K: 2 b s^2 h extra FLOPs per layer.
//   Selective recompute then has no scores to drop; ndmesh defines it (as its trainer's
//   --recompute selective does) as dropping the attention core's output (s b a hd / t
//   elements, the output projection's input) and its log-sum-exp, recomputed by one more
//   attention core forward (4 b s^2 h FLOPs per layer) in the backward pass.
// - Model states: Rajbhandari et al. 2020 ("ZeRO: Memory Optimizations Toward Training
//   Trillion Parameter Models", Figure 1): mixed-precision Adam keeps 2 + 2 + K bytes per
//   parameter, K = 12; stage 1 shards the K bytes over dp, stage 2 the gradients too,
//   stage 3 the parameters too: 16P, 4P + 12P/dp, 2P + 14P/dp, 16P/dp.
// - FLOPs: Narayanan et al. 2021 eq. (3): 72 B s l h^2 (1 + s/(6h) + V/(12 l h)) per step
//   without recompute, 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) with full recompute.
// - Pipeline bubble: Narayanan et al. 2021 sections 2.2.1-2.2.2: (p-1)/m for GPipe and
//   1F1B, (p-1)/(v m) interleaved; Qi et al. 2024 ("Zero Bubble Pipeline Parallelism",
//   section 3) for ZB-H1: (p-1)(T_F + T_B - T_W), a third of 1F1B's when T_F = T_B = T_W.
// - Matrix-product efficiency by shape: an alpha-beta model of one kernel, t = F / rate +
//   overhead, fitted (fit_gemm) to a measured table of bf16 products (OpenXLA's H100 table,
//   presets.cpp): a product of F FLOPs runs at F/rate / (F/rate + overhead) of the rate, so
//   narrow tp splits and short sequences (small F per kernel) run below it.
// - Attention core: causal flash attention skips the blocks above the diagonal (Dao 2023,
//   "FlashAttention-2", section 3.1.1: half the FLOPs of the full s x s product); standard
//   attention (Megatron-LM 2021) computes the full product, then masks, and moves the s x s
//   scores through memory: our count of its unfused passes (fused scale-mask-softmax as in
//   Megatron) is 6e + 1 bytes per score forward (QK^T write, softmax read + write, dropout
//   read + write + 1-byte mask, AV read) and 7e + 1 backward, at the HBM bandwidth.
// - Ring attention (Liu et al. 2023) per step: the K/V block of this rank's kv heads,
//   2 b (s/cp) kv_width e bytes, plus one message latency, against the compute of one block
//   pair (2 b (s/cp)^2 h / t FLOPs forward for causal zigzag chunks, half of the full pair);
//   the backward moves K, V, dK, dV (twice the bytes) against 2x (standard) or 2.5x (flash,
//   which recomputes Q K^T) the forward compute. Only the excess of each step counts.
// - Messages: latency + bytes / bandwidth (the alpha-beta model of Hockney 1994); a ring
//   all-reduce over n ranks is 2 (n-1) steps: 2 (n-1) latency + 2 (n-1)/n bytes / bandwidth
//   (Thakur et al. 2005, "Optimization of Collective Communication Operations in MPICH").
// - The loss: the logits of the micro-batch in fp32, s b V / t values per GPU, pass through
//   memory five times (written by the head's product, read for the max and for the sum of
//   exponentials, the gradient written, read by the two backward products): 20 bytes each.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "ndmesh/config/config.hpp"
#include "ndmesh/core/recompute.hpp"
#include "ndmesh/plan/presets.hpp"

namespace ndmesh::plan {

/// Activation recomputation (Korthikanti et al. 2022): kSelective drops the attention
/// core's activations (standard: the 5 a s/h term; flash: its output and log-sum-exp).
using ndmesh::parse_recompute;
using ndmesh::Recompute;  // core/recompute.hpp: the one enum and parser
using ndmesh::recompute_name;

/// How attention is computed.
enum class Attention {
  kStandard,  ///< scores, softmax and dropout stored (Korthikanti et al. 2022)
  kFlash,     ///< fused kernel: softmax statistics stored, scores recomputed (Dao et al. 2022)
};

/// "flash" or "standard".
std::string_view attention_name(Attention a);
/// Parses "flash" / "standard"; ConfigError naming `flag`, the value and the valid names.
Attention parse_attention(std::string_view name, std::string_view flag = "--attention");

/// Bytes per element of what training keeps. The default is mixed-precision Adam with
/// 16-bit activations (Rajbhandari et al.: 2 + 2 + 12); fp32 AdamW is {4, 4, 8, 4}.
struct Precision {
  double param_bytes = 2;       ///< working copy of the weights
  double grad_bytes = 2;        ///< gradients (also what data parallelism reduces)
  double optimizer_bytes = 12;  ///< fp32 master weights, momentum and variance
  double activation_bytes = 2;  ///< stored activations (dropout masks are 1 byte regardless)
  bool bf16_products = true;    ///< matrix products take bf16 operands (fp32: fp32 ones)
  /// Bytes per logit the last stage holds beside the fp32 logits while the loss's gradient
  /// goes through the output layer: 0 where the cross entropy writes its gradient over the
  /// logits (Megatron, and ndmesh under fp32); ndmesh's bf16 products take a bf16 copy of
  /// it (2).
  double logit_gradient_bytes = 0;
  /// ndmesh's own kernels (fp32 and bf16): an unfused element-wise pass per operation over
  /// fp32 activations (elementwise_bytes_per_token), the operand casts of its bf16 products,
  /// and an optimizer step that reads and writes every parameter (optimizer_step_bytes).
  /// Megatron's precisions fuse these into their kernels: none counted.
  bool unfused_elementwise = false;
  /// ndmesh's classifier with the whole vocabulary on a GPU (tp 1): the logits stored in the
  /// products' type (bf16: 2 B, fp32: 4 B) and the loss with its gradient written over them
  /// in one kernel, nothing held beside them (nn::LmHead). With the vocabulary split over tp,
  /// and in Megatron's precisions, fp32 logits and logit_gradient_bytes beside them.
  bool fused_loss = false;
  /// ndmesh's bf16: a bfloat16 copy of the weights beside the fp32 ones (2 B a parameter),
  /// written by the optimizer step and read by the products (ParamStore::keep_bf16_copy; not
  /// under ZeRO-3, which ndmesh runs on the CPU only).
  double weight_copy_bytes = 0;
  /// Bytes of the MLP's hidden activation (GELU's output, the down projection's input) where
  /// it is stored in another type than the other activations: ndmesh's bf16 keeps it in bf16
  /// (2; every product that reads it rounds it to bf16 anyway). 0: activation_bytes.
  double mlp_hidden_bytes = 0;
  /// Bytes of the MLP's pre-activation (fc's output, GELU's input; SwiGLU's gate and up) where
  /// it is stored in another type: ndmesh's bf16 keeps it in bf16 (2; fc's product writes it
  /// with the hidden, cuBLASLt's GELU epilogue with its aux). 0: activation_bytes.
  double mlp_pre_activation_bytes = 0;
  /// Bytes of the two layer norms' outputs (the qkv and fc products' inputs) where they are
  /// stored in another type: ndmesh's bf16 keeps them in bf16 (2; with sequence parallelism
  /// it gathers them so). 0: activation_bytes.
  double norm_output_bytes = 0;
  /// Bytes of the attention output (the output projection's input) where it is stored in
  /// another type: ndmesh's bf16 keeps it in bf16 (2; cuDNN writes it so). 0: activation_bytes.
  double attention_output_bytes = 0;
  /// Bytes of the attention's input (Q, K and V: the qkv product's output) where it is stored in
  /// another type: ndmesh's bf16 keeps it in bf16 (2; the product writes it rounded once and
  /// cuDNN reads it so). 0: activation_bytes.
  double attention_input_bytes = 0;
};

/// Bytes an optimizer step moves per parameter of the rank's shard on ndmesh's kernels: AdamW
/// reads the weight, gradient and two moments and writes the weight and moments (fp32, 28), the
/// gradient norm reads the gradient (4), the next step zeroes it (4); plus, under ndmesh's bf16,
/// the bfloat16 copy of the weight it writes (Precision::weight_copy_bytes).
constexpr double kOptimizerStepBytes = 36;

/// Parses a precision name: "mixed" (2 + 2 + 12 bytes per parameter, 16-bit activations),
/// "mixed-fp32-grads" (2 + 4 + 12: fp32 gradients, Megatron's bf16 default and DeepSpeed's
/// BF16_Optimizer), "bf16" (what `ndmesh train --precision bf16` keeps today: 4 + 4 + 8, fp32
/// activations, bf16 operands at the products) or "fp32" (4 + 4 + 8 AdamW, fp32 activations
/// and products); ConfigError naming `flag`, the value and the valid names.
Precision parse_precision(std::string_view name, std::string_view flag = "--precision");

/// Parameters of the whole model, by part.
struct ParameterCount {
  double per_layer = 0;   ///< one dense decoder layer
  double moe_per_layer = 0;  ///< one mixture-of-experts decoder layer (0 for a dense model)
  double layers = 0;      ///< all decoder layers
  double embedding = 0;   ///< token table V h, plus the s h position table when learned
  double head = 0;        ///< output projection V h when untied, 0 when tied
  double final_norm = 0;  ///< the norm after the last layer
  double routed = 0;      ///< the routed experts of every MoE layer (in `layers`)
  double routed_active = 0;  ///< the top_k of them each token goes through
  double total() const { return layers + embedding + head + final_norm; }
  /// What one token goes through: total less the routed experts it is not sent to.
  double active() const { return total() - routed + routed_active; }
};

/// Counts every tensor of the model (Narayanan et al. 2021 for GPT; GQA and SwiGLU counted
/// the same way). Positions use model.spec.seq.
ParameterCount count_parameters(const PlanModel& model);

/// Parameters of one layer that one tensor-parallel rank holds: matrices split by tp,
/// row-parallel biases and norms replicated; with fewer kv heads than tp each rank keeps
/// one kv head.
double layer_parameters_per_rank(const PlanModel& model, std::int64_t tp);

/// Weight-matrix parameters of one dense layer (what costs 2 FLOPs per token each); of
/// moe_block_view's model, the attention and the top_k + shared experts' matrices a token
/// goes through (the router's E h not included).
double layer_matrix_parameters(const PlanModel& model);

/// One mixture-of-experts layer's MLP parameters as nn::Moe declares them: the router [E, h]
/// (and the sigmoid router's balancing bias [E]), E routed experts and the shared experts, each
/// an MLP of expert_ffn without biases (GeLU: 2 h f, SwiGLU: 3 h f).
struct MoeParameters {
  double router = 0;  ///< router weight (and bias)
  double expert = 0;  ///< one routed expert
  double shared = 0;  ///< the shared experts together
};
MoeParameters moe_parameters(const ModelSpec& spec);

/// MoE layers among blocks [first, first + count) (ModelSpec::is_moe_layer).
std::int64_t moe_layers_in(const ModelSpec& spec, std::int64_t first, std::int64_t count);

/// A mixture of experts' layer as the dense formulas see it: the MLP one token goes through,
/// ffn = (top_k + shared) x expert_ffn wide (what nn::Moe reports as its width), for its
/// activations, element-wise passes and active matrix FLOPs; experts and expert_ffn kept.
PlanModel moe_block_view(const PlanModel& model);

/// Parameters of one MoE layer on one GPU under tensor parallelism `tp` and expert parallelism
/// `ep` (experts sharded over ep, each expert's matrices split over tp like the dense MLP's:
/// Megatron-core's default expert tensor parallelism): the attention, norms, router and shared
/// experts (`dense`, replicated over ep) and the E/ep routed experts the rank stores (`experts`).
struct MoeLayerShare {
  double dense = 0;
  double experts = 0;
  double total() const { return dense + experts; }
};
MoeLayerShare moe_layer_parameters_per_rank(const PlanModel& model, std::int64_t tp, std::int64_t ep);

/// One all-to-all over `ep` ranks in which every rank sends `bytes` in equal parts (its own
/// part stays): per peer a message, latency + part / bandwidth; the peers inside the node
/// (`in_node` of the ep ranks, itself included) at the intra-node rate, the others at the
/// inter-node rate, the two at once (NVLink and the NIC are separate links):
/// (ep - 1) latency + max((in_node - 1) / ep bytes / intra_bw, (ep - in_node) / ep bytes / inter_bw).
double all_to_all_seconds(double bytes, std::int64_t ep, std::int64_t in_node, double intra_bw, double inter_bw,
                          double latency);

/// How activations of one layer are split and kept.
struct ActivationOptions {
  std::int64_t tp = 1;
  bool sequence_parallel = false;
  Recompute recompute = Recompute::kNone;
  double activation_bytes = 2;
  Attention attention = Attention::kStandard;
  double mlp_hidden_bytes = 0;   ///< Precision::mlp_hidden_bytes (0: activation_bytes)
  double mlp_pre_activation_bytes = 0;  ///< Precision::mlp_pre_activation_bytes (0: activation_bytes)
  double norm_output_bytes = 0;  ///< Precision::norm_output_bytes (0: activation_bytes)
  double attention_output_bytes = 0;  ///< Precision::attention_output_bytes (0: activation_bytes)
  double attention_input_bytes = 0;   ///< Precision::attention_input_bytes (0: activation_bytes)
  /// A mixture of experts' layer (pass moe_block_view's model): besides the active experts'
  /// MLP activations, the top_k dispatched copies of each token (the experts' input rows) and
  /// their outputs (kept for the weighted combine's backward), and the router's fp32
  /// probabilities (E per token).
  bool moe = false;
};

/// Activation bytes one GPU keeps for one layer and one micro-batch of `micro_batch`
/// sequences of `seq` tokens (pass seq / cp under context parallelism): Korthikanti et al.
/// 2022 section 4, generalised to GQA (K and V scale with kv_heads/heads), SwiGLU (the
/// fused gate/up output 2 ffn wide and its product, 6 s b ffn bytes instead of GeLU's
/// 4 s b ffn) and models without dropout (no masks; softmax output 2 a s^2 b only). With
/// flash attention the 5 a s^2 b/t score term becomes the fp32 log-sum-exp, 4 a s b/t bytes;
/// selective recompute then drops that and the attention output (s b a hd / t elements),
/// which one more attention core forward recomputes.
double activation_bytes_per_layer(const PlanModel& model, double seq, double micro_batch,
                                  const ActivationOptions& options);

/// Bytes of parameters, gradients and optimizer states per GPU for `params` parameters
/// on the GPU (after tp and pp) under ZeRO stage 0-3 sharded over `dp`.
struct ModelStates {
  double params = 0;
  double grads = 0;
  double optimizer = 0;
  double total() const { return params + grads + optimizer; }
};
ModelStates model_state_bytes(double params, int zero_stage, std::int64_t dp,
                              const Precision& precision = {});

/// Model FLOPs of one training step (forward + backward, no recompute) over
/// `global_batch` sequences of `seq` tokens: 3 x (2 x matrix parameters per token + 4 s h
/// attention per layer per token + 2 h V logits per token); for GPT this is Narayanan's
/// 72 B s l h^2 (1 + s/(6h) + V/(12 l h)).
double model_flops_per_step(const PlanModel& model, double seq, double global_batch);
/// The FLOPs of the layers alone (no logits) and of the logits alone, per step.
double layer_flops_per_step(const PlanModel& model, double seq, double global_batch);
double logit_flops_per_step(const PlanModel& model, double seq, double global_batch);

/// Extra FLOPs that recomputation adds per step: the attention core forward (4 B s^2 h l)
/// for selective, one more forward of every layer for full (Narayanan's 96 vs 72). With
/// flash attention the backward recomputes Q K^T (2 B s^2 h l) in every mode, and selective
/// adds the attention core forward (4 B s^2 h l) that rebuilds the dropped output.
double recompute_flops_per_step(const PlanModel& model, double seq, double global_batch, Recompute r,
                                Attention attention = Attention::kStandard);

/// Idle time of the pipeline as a fraction of the ideal compute time: (p-1)/m for GPipe
/// and 1F1B, (p-1)/(v m) interleaved, (p-1)/(3m) for ZB-H1.
double bubble_fraction(Schedule schedule, std::int64_t pp, std::int64_t microbatches, std::int64_t vpp);

/// Micro-batches whose activations stage `stage` (0 = first) holds at its peak: GPipe all
/// m; 1F1B and ZB-H1 min(m, p - stage); interleaved that times 1 + (p-1)/(p v)
/// (Korthikanti et al. 2022 section 4.2.3).
double microbatches_in_flight(Schedule schedule, std::int64_t pp, std::int64_t microbatches, std::int64_t vpp,
                              std::int64_t stage);

/// The alpha-beta model of a matrix-product kernel: F FLOPs take F / rate + overhead_s.
struct GemmFit {
  double rate = 0;        ///< FLOP/s of large products
  double overhead_s = 0;  ///< fixed seconds per kernel
};

/// Least-squares fit of t = F / rate + overhead to measured products (F = 2 m n k, t = F /
/// flops), each point weighted by 1/t so that small and large kernels count alike (the fit
/// minimises the relative error of the time). ConfigError naming `what` when there are
/// fewer than two points, a point is not positive, or the fit has no positive rate.
GemmFit fit_gemm(const std::vector<GemmPoint>& points, std::string_view what = "gemm curve");

/// Seconds of one kernel of `flops` FLOPs at `rate` with `overhead_s` per kernel.
double kernel_seconds(double flops, double rate, double overhead_s);

/// The weight matrices of one layer as one tensor-parallel rank multiplies them: (n, k) of
/// each product with m = tokens rows: QKV (column parallel, kv heads as kept per rank),
/// output projection (row parallel), MLP up (gate and up fused for SwiGLU), MLP down.
struct LayerMatrices {
  double n[4] = {0, 0, 0, 0};
  double k[4] = {0, 0, 0, 0};
};
LayerMatrices layer_matrices(const PlanModel& model, std::int64_t tp);

/// What one layer costs one GPU for one micro-batch, by kind of work.
struct LayerTime {
  double gemm = 0;           ///< weight products, forward + backward (3 kernels per matrix)
  double attention = 0;      ///< attention core, forward + backward
  double memory = 0;         ///< memory-bound score traffic of standard attention, unfused element-wise passes
  double recompute = 0;      ///< what the recompute mode (and flash's Q K^T) adds
  double gemm_flops = 0;     ///< FLOPs of the weight products (forward + backward)
  double gemm_ideal = 0;     ///< those FLOPs at the rate without kernel overheads
  std::int64_t kernels = 0;  ///< weight-product kernels (forward + backward)
  double total() const { return gemm + attention + memory + recompute; }
};

/// The shape a layer runs at on one GPU.
struct LayerShape {
  double tokens = 0;  ///< rows of the weight products: micro_batch x seq / cp
  double seq = 0;     ///< keys every query attends to (the whole sequence)
  double micro_batch = 1;
  std::int64_t tp = 1;
  Recompute recompute = Recompute::kNone;
  Attention attention = Attention::kStandard;
  double activation_bytes = 2;
  bool unfused_elementwise = false;  ///< Precision::unfused_elementwise (ndmesh's kernels)
  bool bf16_products = false;        ///< with it: the products' operand casts, cuDNN's attention glue
  bool sequence_parallel = false;    ///< the layer norms and residuals on 1/tp of the rows
  /// A mixture of experts' layer (pass moe_block_view's model) under expert parallelism ep: the
  /// MLP's products are the router's (tokens x E x h), the shared experts' (tokens rows) and the
  /// E/ep local experts', each on tokens x top_k x ep / E rows (an even load). 0: a dense layer.
  std::int64_t ep = 0;
};

/// HBM bytes per token of one layer's unfused element-wise passes on one GPU, forward and
/// backward (ndmesh's kernels: nn/block.cpp, nn/mlp.cpp, nn/linear.cpp; counted there):
///   fp32 passes, 4 bytes an element: forward 9 h (two layer norms, two residual adds, the
///   projections' deferred biases: the first bias, residual add and the second norm one pass,
///   4 h; the second bias and residual add one pass, 3 h) on the rank's rows (1/t of them with sequence parallelism) plus
///   2 r/t + 4 f/t (qkv bias; fc bias and GELU), backward 12 h on the rank's rows (the layer
///   norms' two kernels, each adding the residual path's gradient as it writes and summing it
///   for the projection's deferred bias gradient as it reads)
///   plus 2 r/t + 4 f/t (the qkv gradient zeroed and its bias gradient; GELU's
///   backward in place and the fc bias gradient); full recompute repeats the forward;
///   with bf16 products the qkv and fc biases, GELU, its derivative and the two bias gradients
///   go into the products (cuBLASLt epilogues: -4 (2 r/t + 3 f/t) forward, GELU's aux written
///   beside C; -4 (r/t + 3 f/t) backward, its derivative reading the aux), and 6 bytes (read
///   fp32, write bf16) per element of each product's
///   activation operand: forward 2 h + h/t + f/t, backward 3 h + h/t + 2 f/t + r/t; and cuDNN's
///   attention takes bf16 q, k, v and gives bf16 back: 6 (r/t + h/t) forward, 6 (2 r/t +
///   2 h/t) backward, where its d q, k, v widened is written into the qkv gradient, which is
///   then not zeroed (-4 r/t); the MLP's hidden activation is stored in bf16 by a GELU
///   kernel, so fc fuses its bias only, GELU moves 6 bytes an element and the hidden's two
///   casts go: -10 f/t against the fused count; the norms' outputs are stored in bf16 too:
///   each norm writes 2 bytes, not 4, and their four casts go (-28 h); the attention output is
///   stored in bf16 as cuDNN writes it: proj's two casts go (-12 h/t) and, with cuDNN, its
///   widening and rounding again for the backward (-12 h/t); its input and gradients too
///   (-6 (4 r + h)/t with cuDNN); and the MLP's pre-activation, written with the hidden by
///   fc's product (-14 f/t) (r: the qkv width, h hidden, f ffn, t tp).
double elementwise_bytes_per_token(const PlanModel& model, const LayerShape& shape);

/// One layer for one micro-batch on one GPU. Weight products: 3 kernels per matrix (4 with
/// full recompute), each kernel_seconds(2 m n k / 1, rate, overhead) with FLOPs over tp as
/// the model counts them. Attention core: model FLOPs 3 x 4 b s_local s h / t at `rate`
/// (flash: half, causal) plus its kernels' overhead (flash 2, standard 6); standard
/// attention also moves (13 e + 2) b (a/t) s_local s bytes at `memory_bw` (0: not counted).
/// Recompute: selective re-runs the attention core forward, full the whole forward; flash
/// also recomputes Q K^T in its backward (2 b s_local s h / t FLOPs, causal half).
/// `attention_rate` (FLOP/s; 0: `rate`) is the attention core's rate where it runs in a kernel
/// of its own that is not a product (a calibrated GPU's fp32 attention kernel).
LayerTime layer_time(const PlanModel& model, const LayerShape& shape, double rate, double overhead_s,
                     double memory_bw, double attention_rate = 0);

/// A ring all-reduce over n ranks: 2 (n-1) latency + 2 (n-1)/n bytes / bandwidth.
double allreduce_seconds(double bytes, std::int64_t n, double bandwidth, double latency);

/// Ring attention for one layer and micro-batch on one GPU.
struct RingTime {
  double transfer = 0;  ///< all the K/V traffic, forward + backward
  double exposed = 0;   ///< the part the block computes do not hide
};
/// cp - 1 steps forward (one block of `block_bytes`, latency + bytes / bandwidth, against
/// `step_compute` seconds of attention) and cp - 1 backward (the block and its dK/dV
/// accumulator of `grad_block_bytes`, default (< 0) block_bytes, against `backward_factor` x
/// step_compute: 2 standard, 2.5 flash). ndmesh's bf16 moves the blocks in bf16 and the
/// accumulators in fp32.
RingTime ring_attention_time(double block_bytes, std::int64_t cp, double step_compute, double bandwidth,
                             double latency, double backward_factor, double grad_block_bytes = -1);

/// Seconds the loss over the vocabulary spends in memory for one micro-batch:
/// `bytes_per_logit` (loss_bytes_per_logit) for each of the tokens x vocab / tp logits, at
/// memory_bw (0: not counted).
double loss_memory_seconds(double tokens, double vocab, std::int64_t tp, double memory_bw,
                           double bytes_per_logit = 20);
/// Bytes the loss moves per logit: 20 for fp32 logits (written by the product; the cross
/// entropy reads and writes them, its gradient reads and writes them again); ndmesh's fused
/// loss (Precision::fused_loss, tp 1) 4 passes of the stored logit (written, read twice,
/// written); ndmesh's bf16 with the vocabulary split adds the rounding of the fp32 logits
/// to bf16 values (8) and the bf16 copy of their gradient for the products (6).
double loss_bytes_per_logit(const Precision& precision, std::int64_t tp);
/// Bytes per logit the last stage holds while the loss's gradient goes through the output
/// layer: the stored logit under the fused loss, else 4 (fp32) + logit_gradient_bytes.
double logit_bytes_held(const Precision& precision, std::int64_t tp);

}  // namespace ndmesh::plan
