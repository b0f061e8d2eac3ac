// The model as the parallel strategies see it: an ordered list of units (the embedding, the
// blocks, the head), each with its forward and backward over its own range of one flat
// parameter buffer, built for a contiguous range of those units (the whole model, or one
// pipeline chunk).
//
// The strategies wrap the model from outside (docs/internals/models.md), as torchtitan's
// parallelize_* and pipeline split do: pipeline parallelism builds a chunk from a unit range;
// ZeRO-3 gathers and frees a unit's parameters around its UnitEvents; data parallelism
// reduces gradients as the backward reports them final; tensor parallelism is the TpContext
// every layer splits over (its TpShape says how); context parallelism sets the positions and
// the attention core. A weight two units read (a tied output layer) is marked on the
// parameter (ParamView::tied), never found by name. What storage the strategies need (ZeRO's
// padding, mappable memory) is a StoreOptions the model passes to its ParamStore unread, and
// what a micro-batch keeps for a later weight gradient (a split backward) is an option of its
// activations. The model itself knows no pipeline, ZeRO or schedule option, and parallel/
// includes this header, not the concrete model's.
//
// An architecture is data: a ModelSpec (config/config.hpp) names the norm, the MLP, the
// positions and the rest; build() makes the model it describes.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "ndmesh/config/config.hpp"
#include "ndmesh/core/recompute.hpp"
#include "ndmesh/nn/adamw.hpp"
#include "ndmesh/nn/attention.hpp"
#include "ndmesh/nn/ep.hpp"
#include "ndmesh/nn/tp.hpp"
#include "ndmesh/tensor/params.hpp"
#include "ndmesh/tensor/tensor.hpp"

namespace ndmesh::model {

/// The kinds of unit, in forward order.
enum class UnitKind { kEmbedding, kBlock, kHead };

/// A contiguous range [first, last) of the model's units: unit 0 is the embedding, units
/// 1..L the blocks, unit L + 1 the head. The default is the whole model.
struct UnitRange {
  std::int64_t first = 0;
  std::int64_t last = -1;  ///< -1: through the head

  /// The units of blocks [first_block, last_block) of a model of `layers` blocks, with the
  /// embedding when the range starts at block 0 and the head when it ends at the last block
  /// (a pipeline chunk).
  static UnitRange blocks(std::int64_t first_block, std::int64_t last_block, std::int64_t layers) {
    return {first_block == 0 ? 0 : first_block + 1, last_block == layers ? layers + 2 : last_block + 1};
  }
};

/// Units of a model of `layers` blocks: the embedding, the blocks, the head.
inline std::int64_t unit_count(std::int64_t layers) { return layers + 2; }

/// A unit of the built model: the parameters used (and, under ZeRO-3, gathered) together.
/// Each owns one contiguous range of the flat buffers (ModelT::unit_ranges()).
struct ParamUnit {
  std::string name;         ///< "embed", "block.3", "head"
  UnitKind kind = UnitKind::kBlock;
  /// Indices into ModelT::unit_ranges(): the first is the unit's own; a head whose output
  /// layer is the embedding's token table in the same store also reads the embedding's.
  std::vector<int> ranges;
  /// The unit's experts in the store's expert partition (a MoE block whose layer stores only
  /// its ep rank's experts): an index into ModelT::expert_ranges(); -1: none.
  int expert_range = -1;
};

/// What the model reports around each unit's use (ModelT::set_unit_hook).
enum class UnitEvent { kForwardBegin, kForwardEnd, kBackwardBegin, kBackwardEnd };

/// Run-time options of a model (its shape and initialisation come from the ModelSpec).
struct ModelOptions {
  std::uint64_t seed = 1;  ///< initialisation seed
  std::int64_t batch = 1;  ///< sequences per forward
  std::int64_t seq = 0;    ///< tokens per sequence (the rank's rows of it); 0: spec.seq
  /// What each block's forward keeps and its backward recomputes (Recompute): the
  /// losses and gradients are the same bit for bit in every mode.
  Recompute recompute = Recompute::kNone;
  /// Where the parameters, gradients and activations live (float only on CUDA). The model is
  /// initialised on the host and then placed; tokens, targets and positions are given on the
  /// host and copied.
  Device device = Device::kCpu;
  /// The operands of every matrix product of the linears and the LM head (ParamStore::
  /// set_matmul_precision): fp32, or rounded to bfloat16 with fp32 accumulation.
  MatmulPrecision matmul = MatmulPrecision::kFp32;
  /// A block's closing add (its MLP's bias and the residual) is done by the next norm in its
  /// own pass over the rows (nn::PendingAdd): one pass fewer. It reads the block's bias during
  /// the next unit's forward, so whoever gives a unit's parameters back after its own use
  /// (ZeRO 2/3's per-unit release) turns it off. The arithmetic is the same either way.
  bool fuse_closing_add = true;
  /// The expert group of the MoE layers (expert parallelism, nn::Moe); nullptr: the group of one.
  std::shared_ptr<nn::EpComm> ep;
  /// Each MoE layer stores only the experts its ep rank runs, in the store's expert partition
  /// (nn::MoeOptions::shard_experts); otherwise every rank stores every expert.
  bool shard_experts = false;
};

/// What one micro-batch's activations keep beyond what its own backward reads.
struct ActivationOptions {
  /// The weight half of the backward may run later (nn::DeferWeightGrads: the split backward
  /// of zero-bubble schedules), so every linear's input stays in the activations until then
  /// (under sequence parallelism the gathered norm outputs, otherwise gathered again), and
  /// the loss is not fused into the logits (its deferred weight gradient keeps the logits'
  /// gradient).
  bool deferred_weight_grads = false;
};

/// Everything one forward keeps for its backward (one micro-batch), made by the model that
/// runs it (ModelT::make_activations).
class Activations {
 public:
  virtual ~Activations() = default;
  /// Bytes allocated here.
  virtual std::int64_t bytes() const = 0;
};

/// A model, or a contiguous range of its units (a pipeline chunk): the interface the
/// strategies use. Make one with build().
template <typename T>
class ModelT {
 public:
  virtual ~ModelT() = default;
  ModelT() = default;
  ModelT(const ModelT&) = delete;
  ModelT& operator=(const ModelT&) = delete;

  // ------------------------------------------------------------------ what it is
  virtual const ModelSpec& spec() const = 0;
  /// The units of the full model it holds.
  virtual UnitRange range() const = 0;
  virtual bool has_embedding() const = 0;
  virtual bool has_head() const = 0;
  std::int64_t batch() const { return batch_; }
  std::int64_t seq() const { return seq_; }
  /// Where the parameters, gradients and activations live.
  virtual Device device() const = 0;
  virtual const nn::TpContext<T>& tp() const = 0;
  virtual ParamStore<T>& params() = 0;
  virtual const ParamStore<T>& params() const = 0;
  virtual Recompute recompute() const = 0;

  /// Its units (ParamUnit), in the order of their ranges in the flat buffer, which is the
  /// forward's order.
  const std::vector<ParamUnit>& units() const { return units_; }
  /// Contiguous ranges of the flat buffers, one per unit, ascending and covering them (the
  /// dense part [0, expert_offset()): an expert partition of the store is in no unit).
  const std::vector<nn::Segment>& unit_ranges() const { return unit_ranges_; }
  /// The expert partition [expert_offset(), size()) cut into the units' experts (each MoE
  /// block's, ParamUnit::expert_range), ascending and covering it; empty without one.
  const std::vector<nn::Segment>& expert_ranges() const { return expert_ranges_; }
  /// The units a backward reads parameters of, in its order: the head and the blocks in
  /// reverse (the embedding's backward reads no parameter, though it writes gradients).
  std::vector<int> backward_units() const;

  // ------------------------------------------------------------------ running
  /// Activations sized for this model's batch and seq.
  virtual std::unique_ptr<Activations> make_activations(ActivationOptions options = {}) const = 0;
  /// Forward into `acts`: a range with the embedding reads `tokens`, others read `input`
  /// [batch, seq, C] (the rank's rows under sequence parallelism). A range with the head adds
  /// the per-token losses of a forward with targets to its loss sum where they are
  /// (nn::LossSum: on CUDA nothing waits for the device), for take_loss_sum(); others leave
  /// output(acts).
  virtual void forward_summed(Activations& acts, const std::int32_t* tokens, const T* input,
                              const std::int32_t* targets) = 0;
  /// forward_summed(), then the mean loss of this forward when the range has the head and
  /// `targets` is given (reads the loss back: waits for the device on CUDA), else NaN.
  double forward(Activations& acts, const std::int32_t* tokens, const T* input, const std::int32_t* targets);
  /// Backward of the last forward into `acts`: a range with the head starts from its loss
  /// (`doutput` unused); others from doutput = d loss / d output(acts). Accumulates into
  /// params().grads(); a range without the embedding leaves d loss / d input in
  /// input_grad(). Under tp, a parameter replicated over tp whose inputs differ on each tp
  /// rank (ParamShard::grad_sum) gets only this rank's part: the gradient synchronisation
  /// completes it.
  virtual void backward(Activations& acts, const T* doutput) = 0;
  /// The sum of the per-token losses added since the last call, then 0; 0 without the head.
  virtual double take_loss_sum() = 0;
  /// take_loss_sum() into *result where the model is (device memory on CUDA: no wait).
  virtual void take_loss_sum_into(double* result) = 0;
  /// Mixture of experts (nn/moe.hpp): the auxiliary load-balancing losses of the forwards since
  /// the last call, each weighed as the LM loss is (loss_weight() * batch * seq: the micro-batch's
  /// share of the step), summed over the range's MoE blocks; then 0. 0 for a dense model.
  virtual double take_aux_loss_sum() { return 0; }
  /// The tokens per expert of the range's MoE blocks since the last call, then zeros, in the whole
  /// model's layout (MoE block by MoE block; other ranges' blocks 0); empty for a dense range.
  virtual std::vector<double> take_expert_loads() { return {}; }
  /// After an optimizer step: the sigmoid routers' balancing biases from the step's loads (as
  /// take_expert_loads() lays them out, summed over the ranks that share the step).
  virtual void update_router_biases(const std::vector<double>& /*loads*/) {}
  /// The hidden states leaving the range's last block, [batch, seq, C] (the rank's local
  /// rows under sequence parallelism); a range without the head does not keep them: valid
  /// until its next forward or backward (or one of a model sharing its workspace).
  virtual const T* output(const Activations& acts) const = 0;
  /// d loss / d input of the last backward of a range without the embedding, [N, C] (the
  /// rank's rows under sequence parallelism); overwritten by the next backward.
  virtual const Tensor<T>& input_grad() const = 0;

  /// Whole model: runs tokens[batch, seq] with its own activations; with targets returns
  /// the mean cross-entropy, otherwise NaN.
  double forward(const std::int32_t* tokens, const std::int32_t* targets);
  /// Whole model: the backward of the last forward(tokens, targets).
  void backward();

  // ------------------------------------------------------------------ what strategies set
  /// The weight of each token's loss in the gradient that backward() accumulates. The
  /// default, 1 / (batch * seq), is the gradient of the mean loss of one forward; a run that
  /// splits a global batch over micro-batches and ranks sets 1 / (global tokens).
  void set_loss_weight(double w) { loss_weight_ = w; }
  double loss_weight() const { return loss_weight_; }
  /// Global positions of this model's seq rows (the same for every sequence of a batch):
  /// 0..seq-1 by default; a context-parallel rank holds its chunks of a longer sequence
  /// (learned positions are read at these rows, rotary ones rotate by them, the causal mask
  /// compares them).
  virtual void set_positions(std::vector<std::int64_t> positions) = 0;
  virtual const std::vector<std::int64_t>& positions() const = 0;
  /// The attention core every block runs (nullptr: the local kernel on the local rows).
  virtual void set_attention_core(std::shared_ptr<const nn::AttentionCore<T>> core) = 0;
  /// Makes this model use `other`'s activation workspace (the local chunks of a pipeline
  /// rank run one forward or backward at a time and share one). Same kind of model, batch,
  /// seq and recompute mode.
  virtual void share_recompute_workspace(const ModelT& other) = 0;

  // ------------------------------------------------------------------ hooks
  /// Called during backward() whenever the gradients of a suffix of the flat buffer are
  /// final for this backward: `from` is the element offset from which every gradient is
  /// complete. Data parallelism starts reducing a bucket at that moment.
  using GradsFinalHook = std::function<void(std::int64_t from)>;
  void set_grads_final_hook(GradsFinalHook hook) { grads_final_ = std::move(hook); }
  /// Calls the grads-final hook: for work outside backward() that finalises gradients
  /// (the weight half of a split backward, nn::DeferredWeightGrads::run).
  void report_grads_final(std::int64_t from) const {
    if (grads_final_) grads_final_(from);
  }
  /// Called before work outside backward() writes gradients at flat offset `at` (the weight
  /// half of a split backward); backward() itself announces its writes with the unit events.
  using GradsWriteHook = std::function<void(std::int64_t at)>;
  void set_grads_write_hook(GradsWriteHook hook) { grads_write_ = std::move(hook); }
  void report_grads_write(std::int64_t at) const {
    if (grads_write_) grads_write_(at);
  }
  /// Called between the sub-layers of each block's backward and after each block's forward:
  /// where communication in flight is driven at a finer grain than per unit.
  void set_progress_hook(std::function<void()> hook) { progress_ = std::move(hook); }
  /// Called just before and just after each unit's parameters are read by the forward and
  /// by the backward (recompute included). The model reads a unit's parameters only between
  /// its Begin and End events, and writes a unit's gradients only between the BackwardBegin
  /// and BackwardEnd of a unit holding its range (the embedding's backward has them too).
  using UnitHook = std::function<void(UnitEvent, int unit)>;
  void set_unit_hook(UnitHook hook) { unit_hook_ = std::move(hook); }

  // ------------------------------------------------------------------ accounting
  /// Bytes of the workspace the backward recomputes into (shared by the micro-batches and
  /// by the models that share it): 0 without recompute.
  virtual std::int64_t recompute_workspace_bytes() const = 0;
  /// Bytes of the buffers in the same workspace that hold no activation kept for the
  /// backward (gathered norm outputs under sequence parallelism, a chunk's output before
  /// it is sent).
  virtual std::int64_t workspace_buffer_bytes() const = 0;
  /// Bytes of this model's own such buffers (a gathered final-norm output, input_grad()).
  virtual std::int64_t own_buffer_bytes() const = 0;
  /// Matrix-product floating point operations of one forward + backward over one batch, as
  /// computed (recompute included; under tp, this rank's share).
  virtual double flops_per_step() const = 0;

 protected:
  ModelT(std::int64_t batch, std::int64_t seq) : batch_(batch), seq_(seq) {}
  void unit_event(UnitEvent e, int unit) const {
    if (unit_hook_ && unit >= 0) unit_hook_(e, unit);
  }
  void progress() const {
    if (progress_) progress_();
  }
  const std::function<void()>* progress_hook() const { return progress_ ? &progress_ : nullptr; }
  // Declares a unit covering the flat buffer from `begin` to `end` (elements).
  int add_unit(std::string name, UnitKind kind, std::int64_t begin, std::int64_t end);

  std::int64_t batch_ = 1, seq_ = 1;
  double loss_weight_ = 1;
  std::vector<ParamUnit> units_;
  std::vector<nn::Segment> unit_ranges_;
  std::vector<nn::Segment> expert_ranges_;

 private:
  GradsFinalHook grads_final_;
  GradsWriteHook grads_write_;
  std::function<void()> progress_;
  UnitHook unit_hook_;
  std::unique_ptr<Activations> whole_;  // forward(tokens, targets)'s activations
};

/// The float model the strategies train.
using Model = ModelT<float>;

/// Every problem with a ModelSpec for the models build() makes, one line each (field,
/// value, fix).
std::vector<std::string> model_spec_problems(const ModelSpec& spec);

/// Elements a whole model allocates for one batch: parameters, gradients, the activations
/// kept for backward and the backward work space (an estimate within a few percent;
/// multiply by sizeof(T) for bytes). Lets callers refuse a size before allocating.
double model_memory_elements(const ModelSpec& spec, std::int64_t batch, std::int64_t seq);

/// The model `spec` describes, over units `range`, split over the tensor-parallel group `tp`
/// (default: of one), its flat buffers laid out and placed as `store` says. ConfigError
/// naming the problem when the spec, the options or the split are not usable. Parameters
/// keep the serial model's names and each rank holds the slice of the serial value, whatever
/// the range and the split (each parameter is drawn from (seed, name)).
template <typename T>
std::unique_ptr<ModelT<T>> build(const ModelSpec& spec, ModelOptions options = {}, UnitRange range = {},
                                 nn::TpContext<T> tp = {}, StoreOptions store = {});

}  // namespace ndmesh::model
