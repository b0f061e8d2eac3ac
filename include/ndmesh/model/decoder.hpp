// DecoderT: the decoder-only transformer a ModelSpec describes, built from the nn layers
// as ordered units (model/model.hpp):
//   embedding:  tokens -> token table (+ learned positions)
//   blocks:     pre-norm transformer blocks (the spec's norm, attention and MLP)
//   head:       final norm -> output layer -> softmax cross-entropy
// GPT-2 and Llama are two descriptions of it, not two classes.
//
// All parameters live in one ParamStore (one flat buffer, named views), each unit in one
// contiguous range of it. Initialisation is deterministic and per parameter: each view
// draws from an Rng seeded with (seed, view name), so the values of a parameter do not
// depend on which other parameters exist (a pipeline chunk holding blocks 4..7 gets the same
// weights as the full model). DecoderT<double> exists for finite-difference checks.
//
// A DecoderT holds a contiguous range of units (UnitRange) and runs several micro-batches
// with separate DecoderActivations; the pipeline schedules themselves live in the parallel
// layer, which sees this class through ModelT only.
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
#include "ndmesh/model/model.hpp"
#include "ndmesh/nn/adamw.hpp"
#include "ndmesh/nn/block.hpp"
#include "ndmesh/nn/embedding.hpp"
#include "ndmesh/nn/norm.hpp"
#include "ndmesh/nn/lm_head.hpp"
#include "ndmesh/tensor/params.hpp"
#include "ndmesh/tensor/tensor.hpp"

namespace ndmesh::model {

/// Everything one forward of a DecoderT keeps for its backward (one micro-batch).
template <typename T>
struct DecoderActivations final : Activations {
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
  /// The options it was made with (ModelT::make_activations).
  ActivationOptions options;

  /// Bytes allocated here: every tensor, the tokens and the targets.
  std::int64_t bytes() const override {
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

/// The decoder a ModelSpec describes, or a contiguous range of its units.
template <typename T>
class DecoderT final : public ModelT<T> {
 public:
  /// ConfigError listing model_spec_problems(spec), or naming a bad option, when not
  /// usable. `tp`: the tensor-parallel group (default: of one); ConfigError when its size
  /// does not divide heads, kv_heads, ffn and the padded vocabulary (and batch * seq with
  /// sequence parallelism).
  DecoderT(const ModelSpec& spec, ModelOptions options = {}, UnitRange range = {}, nn::TpContext<T> tp = {},
           StoreOptions store = {});

  using ModelT<T>::forward;
  using ModelT<T>::backward;

  const ModelSpec& spec() const override { return spec_; }
  UnitRange range() const override { return range_; }
  bool has_embedding() const override { return embed_.has_value(); }
  bool has_head() const override { return head_.has_value(); }
  Device device() const override { return device_; }
  const nn::TpContext<T>& tp() const override { return tp_; }
  ParamStore<T>& params() override { return store_; }
  const ParamStore<T>& params() const override { return store_; }
  nn::Recompute recompute() const override { return recompute_; }

  std::unique_ptr<Activations> make_activations(ActivationOptions options = {}) const override;
  void forward_summed(Activations& acts, const std::int32_t* tokens, const T* input,
                      const std::int32_t* targets) override;
  void backward(Activations& acts, const T* doutput) override;
  double take_loss_sum() override { return loss_sum_.take(); }
  void take_loss_sum_into(double* result) override { loss_sum_.take_into(result); }
  double take_aux_loss_sum() override;
  std::vector<double> take_expert_loads() override;
  void update_router_biases(const std::vector<double>& loads) override;
  const T* output(const Activations& acts) const override;
  const Tensor<T>& input_grad() const override { return input_grad_; }

  void set_positions(std::vector<std::int64_t> positions) override;
  const std::vector<std::int64_t>& positions() const override { return positions_; }
  void set_attention_core(std::shared_ptr<const nn::AttentionCore<T>> core) override { core_ = std::move(core); }
  void share_recompute_workspace(const ModelT<T>& other) override;

  std::int64_t recompute_workspace_bytes() const override;
  std::int64_t workspace_buffer_bytes() const override;
  std::int64_t own_buffer_bytes() const override {
    return (lnf_full_.numel() + input_grad_.numel()) * static_cast<std::int64_t>(sizeof(T));
  }
  double flops_per_step() const override;

  /// Its blocks, in forward order (tests reach into them).
  const std::vector<nn::Block<T>>& blocks() const { return blocks_; }

 private:
  using ModelT<T>::batch_;
  using ModelT<T>::seq_;
  using ModelT<T>::loss_weight_;
  using ModelT<T>::unit_event;
  using ModelT<T>::progress;
  using ModelT<T>::progress_hook;
  using ModelT<T>::report_grads_final;
  using ModelT<T>::add_unit;
  using ModelT<T>::units_;
  using ModelT<T>::unit_ranges_;
  using ModelT<T>::expert_ranges_;

  void init(std::uint64_t seed, double init_std);
  // Adds block l's expert load (a MoE block's) to expert_loads_.
  void record_load(std::size_t l, const std::vector<double>& load);
  DecoderActivations<T>& own(Activations& acts) const;
  const DecoderActivations<T>& own(const Activations& acts) const;
  // Whether tensor i of the activations of a block (`last`: the range's last block) lives
  // in the shared workspace instead of each micro-batch's activations (`keeps_gathered`:
  // theirs keep the gathered norm outputs, ActivationOptions::deferred_weight_grads): under
  // full recompute all but the block outputs; otherwise attention output and lse
  // (selective), the gathered norm outputs (sequence parallelism: gathered again in the
  // backward) and the output of a range without the head (sent at once).
  bool in_workspace(std::size_t i, bool last, bool keeps_gathered) const;
  // Sizes the workspace tensors that activations keeping `keeps_gathered` need and that are
  // still empty.
  void size_workspace(bool keeps_gathered) const;
  // Swaps the workspace's tensors in (or back out of) block l's activations.
  void lend(nn::BlockActivations<T>& acts, std::size_t l, bool keeps_gathered);
  int block_unit(std::size_t l) const { return (embed_ ? 1 : 0) + static_cast<int>(l); }
  std::int64_t first_block() const { return range_.first == 0 ? 0 : range_.first - 1; }
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
  UnitRange range_;
  nn::TpContext<T> tp_;
  ParamStore<T> store_;
  std::optional<nn::Embedding<T>> embed_;
  std::vector<nn::Block<T>> blocks_;
  std::unique_ptr<nn::Norm<T>> lnf_;
  std::optional<nn::LmHead<T>> head_;

  nn::LossSum<T> loss_sum_;  // of the per-token losses, where they are (the head's range)
  double aux_sum_ = 0;               // take_aux_loss_sum()
  std::vector<double> expert_loads_;  // take_expert_loads(): the MoE blocks' loads, in block order
  std::vector<std::int64_t> positions_;
  Tensor<std::int64_t> positions_device_;  // CUDA: positions_ on the device
  Device device_ = Device::kCpu;
  std::shared_ptr<const nn::AttentionCore<T>> core_;
  std::vector<std::int64_t> block_offset_;  ///< flat offset of each block's first parameter
  std::vector<int> block_experts_;          ///< each block's expert unit in the store (-1: none)
  std::int64_t head_offset_ = 0;            ///< flat offset of the final norm's first parameter
  int embed_unit_ = -1, head_unit_ = -1;

  nn::Recompute recompute_ = nn::Recompute::kNone;
  bool fuse_closing_add_ = true;  // a block's closing add done by the next norm (forward_summed)
  // The activations no micro-batch keeps (see in_workspace), of the block running: one per
  // model (or shared by a rank's chunks), reused block by block.
  std::shared_ptr<nn::BlockActivations<T>> work_;
  // Backward work space, shared by every micro-batch (backwards run one at a time).
  nn::BlockScratch<T> scratch_;
  Tensor<T> dlnf_, dlnf_full_, dres_a_, dres_b_;
  mutable Tensor<T> lnf_full_;  // sequence parallel: the final norm's output gathered, [N, C] (made with
                                // the first activations that do not keep their own)
  Tensor<T> input_grad_;  // see input_grad()
};

/// The float decoder.
using Decoder = DecoderT<float>;

}  // namespace ndmesh::model
