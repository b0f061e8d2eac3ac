// Gpt: a GPT-2 style decoder built from the nn layers:
//   tokens -> Embedding -> Block x L -> LayerNorm -> LmHead -> softmax cross-entropy.
//
// All parameters live in one ParamStore (one flat buffer, named views). Initialisation
// is deterministic and per parameter: each view draws from an Rng seeded with
// (seed, view name), so the values of a parameter do not depend on which other
// parameters exist (a pipeline stage holding blocks 4..7 gets the same weights as the
// full model). GptT<double> exists for finite-difference checks; Gpt is float.
//
// The model can also be one pipeline stage (a contiguous range of blocks, with the
// embedding only on the first and the final norm and head only on the last) and can run
// several micro-batches with separate GptActivations; the pipeline schedules themselves
// live in the parallel layer.
//
// Tensor parallelism (a TpContext over the tp group) splits every block, the vocabulary
// of the embedding and the head, and the cross-entropy (see nn/tp.hpp and nn/block.hpp).
// Parameters keep the serial names and each rank holds the slice of the serial value (the
// full tensor is drawn, then sliced), so the tp ranks together are the serial model. The
// default TpContext is the group of one: the serial model is the same code.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ndmesh/config/config.hpp"
#include "ndmesh/nn/adamw.hpp"
#include "ndmesh/nn/block.hpp"
#include "ndmesh/nn/embedding.hpp"
#include "ndmesh/nn/layernorm.hpp"
#include "ndmesh/nn/lm_head.hpp"
#include "ndmesh/tensor/params.hpp"
#include "ndmesh/tensor/tensor.hpp"

namespace ndmesh::model {

/// Run-time options of a Gpt (the shape comes from the ModelSpec).
struct GptOptions {
  std::uint64_t seed = 1;  ///< initialisation seed
  std::int64_t batch = 1;  ///< sequences per forward
  std::int64_t seq = 0;    ///< tokens per sequence; 0: spec.seq
  double init_std = 0.02;  ///< std of the matrices; residual projections get init_std / sqrt(2 L)
  /// A pipeline stage holds blocks [first_block, last_block) of the full model; the
  /// embedding lives with block 0 and the final norm and head with the last block.
  /// Parameter names (and so initial values) are those of the full model.
  std::int64_t first_block = 0;
  std::int64_t last_block = -1;  ///< -1: spec.layers
  /// The flat buffers are padded to a multiple of this many elements (ZeRO shards).
  std::int64_t pad_to = 1;
  /// ZeRO-3: every unit's range of the flat buffers (see ParamUnit) is padded to a multiple
  /// of pad_to as well, so that each unit splits into equal shards.
  bool pad_units = false;
  /// What each block's forward keeps and its backward recomputes (nn::Recompute): the
  /// losses and gradients are the same bit for bit in every mode.
  nn::Recompute recompute = nn::Recompute::kNone;
  /// The backward may run split (nn::DeferWeightGrads, zero-bubble schedules): the deferred
  /// weight gradients read the linears' inputs later, so under sequence parallelism the
  /// gathered norm outputs are kept per micro-batch instead of gathered again.
  bool split_backward = false;
  /// Where the parameters, gradients and activations live (float only on CUDA). The model is
  /// initialised on the host and then placed; tokens, targets and positions are given on the
  /// host and copied. ConfigError when the device cannot run here, or on CUDA with tensor
  /// parallelism (not yet available on GPUs).
  Device device = Device::kCpu;
  /// On CUDA: the parameters in mappable device memory (cuda::alloc_mappable), whose pages
  /// ZeRO-3 gives back and takes again in place (parallel::ParamGatherer).
  bool mappable_params = false;
  /// On CUDA: the gradients there too (ZeRO 2/3's per-unit work space:
  /// parallel::GradReducer::own_workspace).
  bool mappable_grads = false;
  /// The operands of every matrix product of the linears and the LM head (ParamStore::
  /// set_matmul_precision): fp32, or rounded to bfloat16 with fp32 accumulation. The
  /// attention core's products (QK^T, PV) stay fp32.
  MatmulPrecision matmul = MatmulPrecision::kFp32;
};

/// A unit of fully sharded data parallelism (ZeRO-3): the parameters gathered together
/// before use. The embedding, each block and the head (final norm and output layer) are
/// units of their own; each owns one contiguous range of the flat buffers. A head whose
/// weight is the embedding's token table on the same model also reads the embedding's
/// range (tied parameters are gathered together).
struct ParamUnit {
  std::string name;         ///< "embed", "block.3", "head"
  std::vector<int> ranges;  ///< indices into GptT::unit_ranges(); the first is the unit's own
};

/// What the model reports around each unit's use (GptT::set_unit_hook).
enum class UnitEvent { kForwardBegin, kForwardEnd, kBackwardBegin, kBackwardEnd };

/// Every problem with a ModelSpec for this model, one line each (field, value, fix).
std::vector<std::string> gpt_problems(const ModelSpec& spec);

/// Elements a whole-model GptT allocates for one batch: parameters, gradients, the
/// activations kept for backward and the backward work space (an estimate within a few
/// percent; multiply by sizeof(T) for bytes). Lets callers refuse a size before allocating.
double gpt_memory_elements(const ModelSpec& spec, std::int64_t batch, std::int64_t seq);

/// Everything one forward keeps for its backward (one micro-batch). A Gpt owns one; a
/// pipeline schedule with several micro-batches in flight makes more with
/// make_activations().
template <typename T>
struct GptActivations {
  std::vector<std::int32_t> tokens, targets;
  Tensor<T> input;                              ///< [N, C] embedding output, or the stage's received input
  std::vector<nn::BlockActivations<T>> blocks;  ///< one per block of the stage
  Tensor<T> lnf, lnf_mean, lnf_rstd;            ///< final norm (last stage; local rows)
  Tensor<T> lnf_full;    ///< sequence parallel with a split backward only: lnf gathered, [N, C]
  nn::ClassifierActivations<T> head;  ///< the logits and per-token losses (last stage; nn::LmHead)
  /// On CUDA: the tokens and targets in device memory (the kernels read them there).
  Tensor<std::int32_t> device_tokens, device_targets;
  bool have_targets = false;
  /// The backward ran: it may have written the logits' gradient over the probabilities, so
  /// the next backward needs a forward first.
  bool probs_consumed = false;

  /// Bytes allocated here: every tensor, the tokens and the targets.
  std::int64_t bytes() const {
    std::int64_t n = 0;
    for (const auto& b : blocks) n += b.bytes();
    for (const Tensor<T>* t : {&input, &lnf, &lnf_mean, &lnf_rstd, &lnf_full})
      n += t->numel() * static_cast<std::int64_t>(sizeof(T));
    n += head.bytes();
    const std::int64_t ints = static_cast<std::int64_t>(tokens.size() + targets.size()) + device_tokens.numel() +
                              device_targets.numel();
    return n + ints * static_cast<std::int64_t>(sizeof(std::int32_t));
  }
};

/// A GPT-style decoder, or a contiguous pipeline stage of one.
template <typename T>
class GptT {
 public:
  /// ConfigError listing gpt_problems(spec), or naming a bad option, when not usable.
  /// `tp`: the tensor-parallel group (default: of one); ConfigError when its size does
  /// not divide heads, kv_heads, ffn and vocab (and batch * seq with sequence parallelism).
  GptT(const ModelSpec& spec, GptOptions options = {}, nn::TpContext<T> tp = {});
  GptT(const GptT&) = delete;
  GptT& operator=(const GptT&) = delete;

  /// Whole model: runs tokens[batch, seq]; with targets (same shape) returns the mean
  /// cross-entropy, otherwise NaN. Keeps what backward() needs.
  double forward(const std::int32_t* tokens, const std::int32_t* targets);
  /// Whole model: accumulates into params().grads() the gradient of the mean loss of the
  /// last forward (which must have had targets). Call params().zero_grad() between steps.
  /// Under tp, a parameter replicated over tp whose inputs differ on each tp rank
  /// (ParamShard::grad_sum) gets only this rank's part: parallel::sum_replicated_over_tp
  /// (the gradient rule, in gradient sync) completes it.
  void backward() { backward(acts_, nullptr); }

  /// Stage forward into `acts`: a stage with the embedding reads `tokens`, others read
  /// `input` [batch, seq, C]. A stage with the head returns the mean loss when `targets`
  /// is given (NaN otherwise); other stages return NaN and leave output(acts). Reads the
  /// loss back (take_loss_sum(): waits for the device on CUDA).
  double forward(GptActivations<T>& acts, const std::int32_t* tokens, const T* input,
                 const std::int32_t* targets);
  /// forward() without reading the loss: a stage with the head adds the per-token losses of
  /// a forward with targets to its loss sum where they are (nn::LossSum: on CUDA nothing
  /// waits for the device), for take_loss_sum().
  void forward_summed(GptActivations<T>& acts, const std::int32_t* tokens, const T* input,
                      const std::int32_t* targets);
  /// The sum of the per-token losses added since the last call (by forward_summed(), or
  /// forward(), which takes it), then 0; 0 on a stage without the head.
  double take_loss_sum() { return loss_sum_.take(); }
  /// take_loss_sum() into *result where the model is (device memory on CUDA: no wait).
  void take_loss_sum_into(double* result) { loss_sum_.take_into(result); }
  /// Stage backward: a stage with the head starts from its loss (`doutput` unused);
  /// others from doutput = d loss / d output(acts). Stages without the embedding leave
  /// d loss / d input in input_grad().
  void backward(GptActivations<T>& acts, const T* doutput);
  /// The weight of each token's loss in the gradient that backward() accumulates. The
  /// default, 1 / (batch * seq), is the gradient of the mean loss of one forward; a run
  /// that splits a global batch over micro-batches and ranks sets 1 / (global tokens), so
  /// the gradients summed over them are those of the mean over the whole batch.
  void set_loss_weight(double w) { loss_weight_ = w; }
  const nn::TpContext<T>& tp() const { return tp_; }
  double loss_weight() const { return loss_weight_; }
  /// Where the parameters, gradients and activations live.
  Device device() const { return device_; }

  /// Called during backward() whenever the gradients of a suffix of the flat buffer are
  /// final for this backward: `from` is the element offset from which every gradient is
  /// complete (the head and final norm first, then each block from the last, then the
  /// embedding at offset 0). Data parallelism starts reducing a bucket at that moment;
  /// the hook is also the place to drive outstanding communication between layers.
  using GradsFinalHook = std::function<void(std::int64_t from)>;
  void set_grads_final_hook(GradsFinalHook hook) { grads_final_ = std::move(hook); }
  /// Calls the grads-final hook: for work outside backward() that finalises gradients
  /// (the weight half of a split backward, nn::DeferredWeightGrads::run).
  void report_grads_final(std::int64_t from) const {
    if (grads_final_) grads_final_(from);
  }
  /// Called before work outside backward() writes gradients at flat offset `at` (the weight
  /// half of a split backward): backward() itself announces its writes with the unit events.
  /// Where ZeRO's per-unit gradient work space is backed on a GPU (GradReducer::writes_at).
  using GradsWriteHook = std::function<void(std::int64_t at)>;
  void set_grads_write_hook(GradsWriteHook hook) { grads_write_ = std::move(hook); }
  void report_grads_write(std::int64_t at) const {
    if (grads_write_) grads_write_(at);
  }
  /// Called between the sub-layers of each block's backward (no gradient is final
  /// there) and after each block's forward: where communication in flight is driven at a
  /// finer grain than per block.
  void set_progress_hook(std::function<void()> hook) { progress_ = std::move(hook); }

  /// The units of this model (ParamUnit), in the order of their ranges in the flat buffer,
  /// which is the forward's order. The backward uses them in reverse, except the embedding,
  /// whose backward reads no parameter (backward_units()).
  const std::vector<ParamUnit>& units() const { return units_; }
  /// Contiguous ranges of the flat buffers, one per unit, ascending and covering them.
  const std::vector<nn::Segment>& unit_ranges() const { return unit_ranges_; }
  /// The units a backward uses, in its order.
  std::vector<int> backward_units() const;
  /// Called just before and just after each unit's parameters are read by the forward and
  /// by the backward (recompute included): where ZeRO-3 gathers and frees them. The model
  /// reads a unit's parameters only between its Begin and End events, and writes a unit's
  /// gradients only between the BackwardBegin and BackwardEnd of a unit holding its range
  /// (the embedding's backward has them too, though it reads no parameter).
  using UnitHook = std::function<void(UnitEvent, int unit)>;
  void set_unit_hook(UnitHook hook) { unit_hook_ = std::move(hook); }

  /// Global positions of this model's seq rows (the same for every sequence of a batch):
  /// 0..seq-1 by default; a context-parallel rank holds its chunks of a longer sequence
  /// (the embedding reads wpe at these rows, the causal mask compares them).
  void set_positions(std::vector<std::int64_t> positions);
  const std::vector<std::int64_t>& positions() const { return positions_; }
  /// The attention core every block runs (nullptr: the local kernel on the local rows).
  void set_attention_core(std::shared_ptr<const nn::AttentionCore<T>> core) { core_ = std::move(core); }

  /// Activations sized for this model's batch and seq (what the forward keeps under the
  /// model's recompute mode).
  GptActivations<T> make_activations() const;
  nn::Recompute recompute() const { return recompute_; }
  /// Makes this model use `other`'s activation workspace (the local chunks of a pipeline
  /// rank run one forward or backward at a time and share one). Same batch, seq and mode.
  void share_recompute_workspace(const GptT& other);
  /// d loss / d input of the last backward() of a stage without the embedding, [N, C] (the
  /// rank's rows under sequence parallelism); overwritten by the next backward.
  const Tensor<T>& input_grad() const { return input_grad_; }
  /// Bytes of the workspace the backward recomputes into (shared by the micro-batches and
  /// by the models that share it): 0 without recompute.
  std::int64_t recompute_workspace_bytes() const;
  /// Bytes of the buffers in the same workspace that hold no activation kept for the
  /// backward: the all-gathered norm outputs under sequence parallelism (gathered again in
  /// the backward) and the stage's output before it is sent (full recompute: the output of
  /// the block being recomputed).
  std::int64_t workspace_buffer_bytes() const;
  /// Bytes of this model's own such buffers: the gathered final-norm output (sequence
  /// parallelism) and input_grad().
  std::int64_t own_buffer_bytes() const {
    return (lnf_full_.numel() + input_grad_.numel()) * static_cast<std::int64_t>(sizeof(T));
  }
  /// The hidden states leaving the stage's last block, [batch, seq, C] (the rank's local
  /// rows under sequence parallelism). A stage without the head does not keep them: valid
  /// until its next forward or backward (or one of a model sharing its workspace).
  const T* output(const GptActivations<T>& acts) const;

  ParamStore<T>& params() { return store_; }
  const ParamStore<T>& params() const { return store_; }
  const ModelSpec& spec() const { return spec_; }
  std::int64_t batch() const { return batch_; }
  std::int64_t seq() const { return seq_; }
  bool has_embedding() const { return embed_.has_value(); }
  bool has_head() const { return head_.has_value(); }
  /// Matrix-product floating point operations of one forward + backward of this stage
  /// over one batch, as computed: 3x the forward for the linears and the head; attention
  /// over the tiles the causal mask does not skip (about half the seq x seq square plus the
  /// diagonal tiles), 2 products forward and 5 backward (the scores are recomputed). With
  /// recompute, plus what the backward runs again: the attention core's 2 products
  /// (selective) or each block's whole forward (full).
  double flops_per_step() const;

  const std::vector<nn::Block<T>>& blocks() const { return blocks_; }

 private:
  void init(std::uint64_t seed, double init_std);
  // Whether tensor i of the activations of a block (`last`: the stage's last block) lives
  // in the shared workspace instead of each micro-batch's activations: under full
  // recompute all but the block outputs; otherwise attention output and lse (selective),
  // the gathered norm outputs (sequence parallelism: gathered again in the backward) and
  // the output of a stage without the head (sent at once).
  bool in_workspace(std::size_t i, bool last) const;
  // Sizes the workspace tensors this model needs that are still empty.
  void size_workspace();
  // Swaps the workspace's tensors in (or back out of) block l's activations.
  void lend(nn::BlockActivations<T>& acts, std::size_t l);
  void unit_event(UnitEvent e, int unit) const {
    if (unit_hook_ && unit >= 0) unit_hook_(e, unit);
  }
  int block_unit(std::size_t l) const { return (embed_ ? 1 : 0) + static_cast<int>(l); }
  // The positions where the kernels read them (device memory on CUDA).
  const std::int64_t* positions_here() const {
    return ops::staged(positions_device_, positions_.data(), device_);
  }
  // The positions the blocks' attention reads: nullptr (the kernels' 0..seq-1, the same mask)
  // when they are 0..seq-1 and no ring runs it, which lets bf16 attention run on cuDNN (its
  // causal mask is by index), else positions_here().
  const std::int64_t* block_positions() const {
    if (core_) return positions_here();
    for (std::size_t i = 0; i < positions_.size(); ++i)
      if (positions_[i] != static_cast<std::int64_t>(i)) return positions_here();
    return nullptr;
  }
  // Checks n host integers against [0, limit) (Error naming `what` for one outside: the
  // kernels do not check) and returns where the kernels read them (ops::stage into `dst`).
  const std::int32_t* upload_checked(Tensor<std::int32_t>& dst, const std::int32_t* src, std::int64_t n,
                                     std::int64_t limit, const char* what) const;

  ModelSpec spec_;
  nn::TpContext<T> tp_;
  std::int64_t batch_, seq_;
  std::int64_t first_block_, last_block_;
  ParamStore<T> store_;
  std::optional<nn::Embedding<T>> embed_;
  std::vector<nn::Block<T>> blocks_;
  std::optional<nn::LayerNorm<T>> lnf_;
  std::optional<nn::LmHead<T>> head_;

  double loss_weight_;
  nn::LossSum<T> loss_sum_;  // of the per-token losses, where they are (the head's stage)
  GradsFinalHook grads_final_;
  GradsWriteHook grads_write_;
  std::function<void()> progress_;
  std::vector<std::int64_t> positions_;
  Tensor<std::int64_t> positions_device_;  // CUDA: positions_ on the device
  Device device_ = Device::kCpu;
  std::shared_ptr<const nn::AttentionCore<T>> core_;
  std::vector<std::int64_t> block_offset_;  ///< flat offset of each block's first parameter
  std::int64_t head_offset_ = 0;            ///< flat offset of the final norm's first parameter
  std::vector<ParamUnit> units_;
  std::vector<nn::Segment> unit_ranges_;
  int embed_unit_ = -1, head_unit_ = -1;
  UnitHook unit_hook_;

  nn::Recompute recompute_ = nn::Recompute::kNone;
  bool split_backward_ = false;
  bool fuse_closing_add_ = true;  // a block's closing add done by the next norm (forward_summed)
  // The activations no micro-batch keeps (see in_workspace), of the block running: one per
  // model (or shared by a rank's chunks), reused block by block.
  std::shared_ptr<nn::BlockActivations<T>> work_;
  GptActivations<T> acts_;  ///< of the whole-model forward()/backward(), made by the first forward()
  // Backward work space, shared by every micro-batch (backwards run one at a time).
  nn::BlockScratch<T> scratch_;
  Tensor<T> dlnf_, dlnf_full_, dres_a_, dres_b_;
  Tensor<T> lnf_full_;    // sequence parallel: the final norm's output gathered, [N, C]
  Tensor<T> input_grad_;  // see input_grad()
};

/// The float model used for training.
using Gpt = GptT<float>;

}  // namespace ndmesh::model
