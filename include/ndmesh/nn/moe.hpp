// Moe: a mixture-of-experts MLP, the feed-forward kind of a MoE block (ModelSpec::experts).
//
// A router (a [E, C] linear, no bias, in fp32) scores the E routed experts for every token;
// each token goes through its top-k experts (ties broken by the lower expert index), their
// outputs weighed, plus the shared experts that every token goes through:
//   out[t] = sum_{j < k, kept} w[t, j] * expert_{c[t, j]}(x[t]) + shared(x[t]).
// Routers (ModelSpec::router):
//  - softmax (Mixtral): p = softmax(logits); c = top-k of p; w = p[c] / sum p[c];
//  - sigmoid (DeepSeek-V3): s = sigmoid(logits); c = top-k of s + bias; w = s[c] / sum s[c].
//    The bias ("<name>.router.bias", a parameter without gradient, so that checkpoints keep
//    it) is used for the choice only; after each optimizer step it moves by
//    router_bias_rate toward an even load: bias[e] += rate * sign(mean load - load[e])
//    (update_router_bias, DeepSeek-V3 section 2.1.2).
// Each expert is an MLP of the model's kind (GELU Mlp or SwiGLU GatedMlp) of width
// expert_ffn, named "<name>.experts.<e>"; the shared experts are one MLP of width
// shared_experts * expert_ffn, "<name>.shared".
//
// The auxiliary load-balancing loss (Switch Transformer, Mixtral) of a micro-batch of N
// tokens: aux = coeff * E * sum_e f_e * P_e, with f_e the fraction of the N * k assignments
// routed to e (before capacity drops; no gradient) and P_e the mean over the tokens of the
// router's probability of e (softmax: p; sigmoid: s normalised over the experts). Its
// gradient enters the backward weighed by set_aux_weight() (the micro-batch's share of the
// step's loss).
//
// Capacity (capacity_factor F > 0): an expert takes at most ceil(F * N * k / E)
// assignments of a micro-batch; they are taken choice by choice (every token's first
// choice in token order, then every token's second, ...), the rest dropped: a dropped
// assignment adds nothing (its weight is not given to the others). Under context
// parallelism (EpComm::batch_ranks() > 1) the micro-batch's N tokens are on several ranks:
// each rank places its rows' choices in the micro-batch's token order (set_token_positions),
// the choices are summed over those ranks, and every rank applies the rule to the whole
// micro-batch, as the serial run does. F = 0: dropless.
//
// What the forward keeps (MlpActivations::pre, pre_width() = E + 3k per row, in T under bf16
// products too): the router's probabilities (softmax) or scores (sigmoid), the chosen
// experts, their weights, and whether each assignment was kept. The backward recomputes each
// expert's forward on its gathered rows (the experts' activations are not kept). CPU only: no
// CUDA twin yet (DecoderT refuses experts on a GPU).
//
// Under bf16 products (the store's matmul_precision()) the input rows come in bfloat16 (the
// norm's output, as a dense MLP's do) and each expert, and the shared MLP, runs its products
// exactly as the dense MLP of its kind does on those rows (bf16 operands, its activations in
// bf16, its backward's scratch in bf16). The router stays in fp32 (LinearOptions::
// fp32_products): it scores the fp32 values of the input rows (bf16 widened, exact), and
// routing, weights, capacity and the auxiliary loss are those of fp32 products on them.
// Under expert parallelism the rows travel widened to T (exact) and are narrowed back to
// bfloat16 before the expert runs: it sees the rows the serial run gives it.
//
// Expert parallelism (MoeOptions::ep, a group of P ranks; E divisible by P): routing,
// capacity and the auxiliary loss stay on the rank that holds the tokens (its micro-batch,
// as in the serial run); the kept assignments, grouped by expert and in token order inside
// an expert, go to the rank that runs their expert. Dispatch: an all-to-all of the per-expert
// row counts, then an all-to-all-v of the rows of x; each rank runs its E/P experts on the
// rows of all members (member by member, in order); combine: an all-to-all-v of the outputs
// back, weighed and summed on the token's rank. The backward sends [x, dout, weight] rows the
// same way (the expert recomputes its forward, as without ep) and gets [dx, d weight] back.
// With MoeOptions::shard_experts a rank declares only the E/P experts it runs, in the
// store's expert partition (ParamStore::begin_experts; names keep the global index), and the
// gradient synchronisation sums them over the expert-data-parallel group. Without it every
// rank stores every expert (the serial flat layout, what ZeRO-3 gathers): the experts it does
// not run get zero gradients, so the dp x cp reduction is each expert's sum over its
// expert-data-parallel ranks. With P = 1 it is the serial layer.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ndmesh/core/arch.hpp"
#include "ndmesh/nn/ep.hpp"
#include "ndmesh/nn/feed_forward.hpp"
#include "ndmesh/nn/linear.hpp"
#include "ndmesh/tensor/params.hpp"

namespace ndmesh::nn {

/// What makes an MLP a mixture of experts.
struct MoeOptions {
  std::int64_t experts = 0;         ///< E, routed experts
  std::int64_t top_k = 1;           ///< k, experts per token
  std::int64_t shared_experts = 0;  ///< S, experts every token goes through
  std::int64_t expert_ffn = 0;      ///< each expert's width
  MlpKind kind = MlpKind::kGelu;    ///< the experts' MLP kind
  RouterKind router = RouterKind::kSoftmax;
  double aux_loss = 0;         ///< the auxiliary loss's coefficient
  double capacity_factor = 0;  ///< 0: dropless
  double router_bias_rate = 0.001;
  /// The expert group (expert parallelism; default: the group of one). Member r runs
  /// experts [r * E/size, (r+1) * E/size) on the rows every member sends it.
  std::shared_ptr<EpComm> ep = std::make_shared<EpComm>();
  /// Declare only the experts this member runs, in the store's expert partition (with more
  /// than one member); otherwise every expert, like the serial layer.
  bool shard_experts = false;
};

/// One token's routing: the chosen experts in choice order and their weights.
struct Route {
  std::vector<std::int64_t> experts;
  std::vector<double> weights;
};

/// The router's choice for one token from its E probabilities or scores `p` (and the
/// sigmoid router's bias, nullptr for none): the k experts of the largest p[e] + bias[e]
/// (ties: the lower index first), weighed by p[e] normalised over the k.
Route route_token(const double* p, const double* bias, std::int64_t experts, std::int64_t top_k);

/// Which assignments a capacity keeps: chosen[t * k + j] is token t's j-th expert; returns
/// kept[t * k + j]. Choice by choice, tokens in order, each expert up to `capacity`
/// (capacity < 0: all).
std::vector<bool> capacity_keep(const std::vector<std::int64_t>& chosen, std::int64_t tokens,
                                std::int64_t top_k, std::int64_t experts, std::int64_t capacity);

/// The capacity of an expert for `tokens` tokens: ceil(factor * tokens * k / E), -1 for a
/// factor of 0 (dropless).
std::int64_t expert_capacity(double factor, std::int64_t tokens, std::int64_t top_k, std::int64_t experts);

/// A mixture-of-experts MLP.
template <typename T>
class Moe final : public FeedForwardPasses<Moe<T>, T> {
 public:
  /// Declares "<name>.router.weight" [E, C] (and "<name>.router.bias" [E] for a sigmoid
  /// router), the experts' and the shared MLP's parameters. options.ffn is ignored: the
  /// MoE's options().ffn is (k + S) * expert_ffn, the hidden width a token goes through.
  Moe(ParamStore<T>& store, MlpOptions options, MoeOptions moe);

  /// Per row: probabilities or scores [E], chosen experts [k], weights [k], kept [k].
  std::int64_t pre_width() const override { return moe_.experts + 3 * moe_.top_k; }
  std::int64_t scratch_width() const override { return 0; }
  std::int64_t hidden_width() const override { return 0; }
  /// The routing in `pre` (T) under either precision; nothing in `hidden`.
  void resize_activations(MlpActivations<T>& acts, std::int64_t rows) const override {
    acts.resize(rows, pre_width(), 0);
  }

  const MlpOptions& options() const override { return options_; }
  /// Expert 0's (what the interface asks: its precision, no bias).
  const Linear<T>& fc() const override { return experts_.front()->fc(); }
  const Linear<T>& proj() const override { return experts_.front()->proj(); }

  double aux_loss() const override { return aux_; }
  void set_aux_weight(double w) const override { aux_weight_ = w; }
  std::int64_t experts() const override { return moe_.experts; }
  const std::vector<double>& expert_load() const override { return load_; }
  void update_router_bias(const double* load) const override;
  void set_token_positions(const std::vector<std::int64_t>& positions, std::int64_t seq) const override {
    positions_ = positions;
    seq_ = seq;
  }

  const MoeOptions& moe() const { return moe_; }
  const Linear<T>& router() const { return router_; }
  /// The assignments the last forward dropped (capacity).
  std::int64_t dropped() const { return dropped_; }

 private:
  friend class FeedForwardPasses<Moe<T>, T>;
  template <typename In>
  void forward_from(const In* inp, T* out, MlpActivations<T>& acts, std::int64_t rows) const;
  template <typename In, typename S>
  void backward_from(const T* dout, const In* inp, const MlpActivations<T>& acts, T* dinp, S* scratch,
                     std::int64_t rows) const;
  // The passes on input rows of X: T, or bfloat16 under bf16 products.
  template <typename X>
  void forward_rows(const X* x, T* out, T* route, std::int64_t rows) const;
  template <typename X>
  void backward_rows(const T* dout, const X* x, const T* route, T* dinp, std::int64_t rows) const;
  // Which of the rows' choices (rows x top_k) the capacity keeps (all: dropless).
  std::vector<bool> capacity_rows(const std::vector<std::int64_t>& chosen, std::int64_t rows) const;

  // The experts this rank runs: [first_local_, first_local_ + local_).
  std::int64_t local_ = 0, first_local_ = 0;
  // The experts this rank declared (experts_): from first_held_ (0 unless sharded).
  std::int64_t first_held_ = 0;
  MlpOptions options_;
  MoeOptions moe_;
  ParamStore<T>* store_;
  Linear<T> router_;
  int bias_ = -1;  // the sigmoid router's balancing bias
  std::vector<std::unique_ptr<FeedForward<T>>> experts_;
  std::unique_ptr<FeedForward<T>> shared_;
  // Of the last forward (read by the model after it), and the backward's weight.
  mutable double aux_ = 0;
  mutable std::vector<double> load_;
  mutable std::int64_t dropped_ = 0;
  mutable double aux_weight_ = 0;
  // The rows' places in the sequence (set_token_positions; empty: 0, 1, ...) and its length.
  mutable std::vector<std::int64_t> positions_;
  mutable std::int64_t seq_ = 0;
};

}  // namespace ndmesh::nn
