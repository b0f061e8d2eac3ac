// ParamStore: every parameter and gradient of a model in ONE flat buffer each, with
// named views (name, offset, shape), on the CPU or a GPU (to()).
//
// Layers declare their parameters when they are constructed (add()), then the owner
// allocates both buffers once (allocate()). One flat buffer means the optimizer, the
// gradient clipping, checkpoints and (later) data-parallel gradient buckets all work on
// contiguous ranges without knowing about layers. Offsets are aligned to kParamAlign
// elements; the padding stays zero in both buffers.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ndmesh/core/dtype.hpp"
#include "ndmesh/tensor/device.hpp"
#include "ndmesh/tensor/tensor.hpp"

namespace ndmesh {

/// Offsets of parameters are multiples of this many elements (64 bytes of float).
inline constexpr std::int64_t kParamAlign = 16;

/// How a parameter is split over a tensor-parallel group: along dimension `dim` of the
/// full (serial) tensor, this rank holds the concatenation of `pieces`; piece i of tp
/// rank r is [start_i + r * length_i, start_i + (r + 1) * length_i). A piece may run past
/// the full tensor's end along `dim` (a padded vocabulary): the rows past it are padding,
/// zero and in no logical tensor (copy_shard and checkpoints leave them out). The column-parallel
/// linear holds one range of rows of W [out, in], the row-parallel one a range of
/// columns, the fused q|k|v projection three ranges of rows (its q, k and v heads).
struct ParamShard {
  int dim = -1;                          ///< -1: replicated (every tp rank holds all of it)
  std::vector<std::int64_t> full_shape;  ///< shape of the serial parameter
  struct Piece {
    std::int64_t start = 0, length = 0;
  };
  std::vector<Piece> pieces;  ///< along dim
  int rank = 0;               ///< this rank in the tp group
  int size = 1;               ///< ranks in the tp group
  /// Replicated, but each tp rank sees other inputs (sequence parallelism): the gradient
  /// is summed over the tp group.
  bool grad_sum = false;
  bool sharded() const { return dim >= 0 && size > 1; }
  /// Of `local_along` local rows along dim, those inside the full tensor (not padding).
  std::int64_t held_along(std::int64_t local_along) const;
};

/// Copies this rank's slice of the full (serial) tensor `full` into `local` (its padding
/// rows zeroed), or, with `to_full`, this rank's `local` into its place in `full` (rank `rank`
/// instead of the shard's own when rank >= 0).
template <typename T>
void copy_shard(const ParamShard& shard, const std::vector<std::int64_t>& local_shape, T* local, T* full,
                bool to_full, int rank = -1);

/// A weight that two layers read (the token table and a tied output layer). Where both
/// layers are in one store they share one view (kNone: nothing to keep equal); where they
/// are in two (pipeline stages), each store holds a copy: kOwner in the store of the layer
/// that owns it, kCopy in the other. The two copies get the sum of their gradients (the
/// gradient synchronisation's job, over the ranks that hold a copy); the copy is neither
/// counted in the gradient norm nor written to checkpoints.
enum class Tied : std::uint8_t { kNone, kOwner, kCopy };

/// Where one named parameter lives in the flat buffers.
struct ParamView {
  std::string name;                 ///< e.g. "block.3.attn.qkv.weight"
  std::int64_t offset = 0;          ///< elements from the start of the flat buffer
  std::vector<std::int64_t> shape;  ///< row-major
  std::int64_t numel = 0;           ///< product of shape
  bool decay = false;               ///< AdamW applies weight decay (matrices, not norms or biases)
  ParamShard shard;                 ///< tensor-parallel split (replicated by default)
  Tied tied = Tied::kNone;          ///< one of two copies of a tied weight (see Tied)
  /// In the store's expert partition (ParamStore::begin_experts): a routed expert's parameter
  /// that only the ranks running that expert hold (expert parallelism); its gradient is
  /// summed over the expert-data-parallel group, not the dp-cp group.
  bool expert = false;
  /// Elements of the full (serial) parameter.
  std::int64_t full_numel() const;
};

/// How a ParamStore lays out and places its flat buffers: what a strategy that cuts them
/// into shards or gives their pages back asks of the storage. The layers and the model that
/// declare the parameters pass it through without reading it.
struct StoreOptions {
  /// Both buffers padded to a multiple of this many elements (equal ZeRO shards).
  std::int64_t pad_to = 1;
  /// Each unit's range (ParamStore::begin_unit) padded to a multiple of pad_to as well, so
  /// that every unit splits into equal shards (ZeRO 2/3 reduce and gather unit by unit).
  bool pad_units = false;
  /// On CUDA: the parameters in mappable device memory (cuda::alloc_mappable), whose pages
  /// ZeRO-3 gives back and takes again in place.
  bool mappable_params = false;
  /// On CUDA: the gradients in mappable device memory (ZeRO 2/3's per-unit work space).
  bool mappable_grads = false;
  /// ZeRO-3: every unit's range (with pad_units) is cut into keep_parts equal blocks, of which
  /// this rank keeps block keep_part; the rest is freed once the model is built. The model
  /// writes its initial values into the kept blocks only, so the rest of the (zero-page)
  /// buffer is never resident. 1: every element is kept.
  std::int64_t keep_parts = 1;
  std::int64_t keep_part = 0;
  /// The expert partition (ParamStore::begin_experts) padded to a multiple of this many
  /// elements (equal ZeRO shards over the expert-data-parallel group); with pad_units each
  /// expert unit (one begin_experts() to the next) too.
  std::int64_t expert_pad_to = 1;
  /// ZeRO-3 of the expert partition: every expert unit is cut into expert_keep_parts equal
  /// blocks (the expert-data-parallel group), of which this rank keeps block expert_keep_part,
  /// as keep_parts does for the dense units. 1: the expert partition is kept whole.
  std::int64_t expert_keep_parts = 1;
  std::int64_t expert_keep_part = 0;
};

/// The flat parameter and gradient buffers of one model.
template <typename T>
class ParamStore {
 public:
  explicit ParamStore(StoreOptions options = {}) : options_(options) {}
  /// Declares a parameter and returns its id. Names must be unique; only before allocate().
  int add(std::string name, std::vector<std::int64_t> shape, bool decay, ParamShard shard = {});
  /// Marks a copy of a tied weight (ParamView::tied). Only before allocate().
  void set_tied(int id, Tied tied);
  /// The next parameter starts a unit (a range used together: ZeRO-3 gathers it): with
  /// StoreOptions::pad_units the buffer so far is padded to a multiple of pad_to.
  void begin_unit() {
    if (options_.pad_units) align_to(options_.pad_to);
  }
  /// The parameters declared from begin_experts() to end_experts() go into the expert
  /// partition (ParamView::expert): the end of both flat buffers, after every other
  /// parameter and its padding, [expert_offset(), size()). Their offsets are fixed by
  /// allocate(); nothing else moves (units, begin_unit, align_to see only the dense part).
  /// Expert parallelism puts the experts a rank runs there, so that the dense partition
  /// [0, expert_offset()) has the same layout on every rank of the dp-cp group and the
  /// expert partition the same on every rank of the expert-data-parallel group. Each
  /// begin_experts() starts an expert unit (a MoE layer's experts, gathered together under
  /// ZeRO-3): with StoreOptions::pad_units the expert partition so far is padded to a
  /// multiple of expert_pad_to first.
  void begin_experts();
  void end_experts();
  /// Allocates both buffers (zeroed), padded to a multiple of `multiple` elements (0: the
  /// options' pad_to; so that a ZeRO shard split of the buffer is even); with an expert
  /// partition, the dense part is padded so, and the expert partition after it to a
  /// multiple of the options' expert_pad_to. After this no parameter can be added.
  void allocate(std::int64_t multiple = 0);
  /// Where the expert partition starts (size() when there is none): the dense part's end.
  std::int64_t expert_offset() const { return expert_offset_; }
  /// Where each expert unit starts (in begin_experts() order; each runs to the next one's
  /// start, the last to size()): flat offsets once allocate() ran, offsets inside the expert
  /// partition before.
  std::vector<std::int64_t> expert_unit_offsets() const;
  /// The layout and placement options it was made with.
  const StoreOptions& options() const { return options_; }
  /// Pads the buffer so far to a multiple of `multiple` (and of kParamAlign): the next
  /// parameter starts a range whose length can be split evenly (a ZeRO-3 unit). Only
  /// before allocate().
  void align_to(std::int64_t multiple);
  /// True once allocate() ran (or when nothing was declared).
  bool allocated() const { return params_.numel() > 0 || views_.empty(); }
  /// Moves both buffers to `device`: the parameters are copied, the gradients zeroed (a
  /// model is initialised on the host, then placed). ConfigError when `device` cannot hold T.
  /// On CUDA the options' mappable_params put the parameters into mappable device memory
  /// (cuda::alloc_mappable: ZeRO-3), mappable_grads the gradients (ZeRO 2/3).
  /// With mappable_params only the kept ranges (keep_blocks) are backed and copied: a ZeRO-3
  /// model never holds its full parameters on the device (nor a full host copy), and the
  /// mappable gradients start with nothing backed (their owner backs a unit at a time).
  void to(Device device) { to(device, options_.mappable_params, options_.mappable_grads); }
  void to(Device device, bool mappable_params, bool mappable_grads);
  /// A range [offset, offset + count) of the flat buffers.
  struct Range {
    std::int64_t offset = 0, count = 0;
  };
  /// ZeRO-3 (StoreOptions::keep_parts > 1): given the model's units (the dense ranges that are
  /// used together, which cover [0, expert_offset())), the ranges this rank keeps: block
  /// keep_part of keep_parts equal blocks of every unit, and of the expert partition block
  /// expert_keep_part of every expert unit (expert_keep_parts > 1) or all of it. Error when a
  /// range does not split evenly (pad_units pads them so). Only after allocate().
  void keep_blocks(const std::vector<Range>& units);
  /// The expert units as flat ranges (after allocate()): each runs to the next one's start,
  /// the last to size().
  std::vector<Range> expert_unit_ranges() const;
  /// What keep_blocks() chose: the elements the model initialises and to() places; empty: all.
  const std::vector<Range>& kept() const { return kept_; }
  /// Where the buffers live.
  Device device() const { return params_.device(); }
  /// A copy of the parameters on the host (size() elements).
  std::vector<T> params_to_host() const { return params_.to_host(); }
  /// Overwrites the parameters with size() elements from the host.
  void params_from_host(const T* host);

  /// The parameter elements of a view, to read (what the layers do).
  const T* param(int id) const { return params_.data() + views_.at(static_cast<std::size_t>(id)).offset; }
  /// The same elements, to write (initialisation, tests): the bfloat16 copy becomes stale.
  T* mutable_param(int id) {
    bf16_current_ = false;
    return params_.data() + views_.at(static_cast<std::size_t>(id)).offset;
  }
  /// The gradient elements of a view.
  T* grad(int id) { return grads_.data() + views_.at(static_cast<std::size_t>(id)).offset; }
  const T* grad(int id) const { return grads_.data() + views_.at(static_cast<std::size_t>(id)).offset; }

  /// The whole flat buffers, padding included (device memory on CUDA: the span is an
  /// address and a size, not to be read on the host). The writable span of the parameters
  /// makes the bfloat16 copy stale (whoever asks for it may write through it).
  std::span<T> params() {
    bf16_current_ = false;
    return {params_.data(), static_cast<std::size_t>(params_.numel())};
  }
  std::span<const T> params() const { return {params_.data(), static_cast<std::size_t>(params_.numel())}; }
  std::span<T> grads() { return {grads_.data(), static_cast<std::size_t>(grads_.numel())}; }
  std::span<const T> grads() const { return {grads_.data(), static_cast<std::size_t>(grads_.numel())}; }

  /// Every declared parameter, in declaration order.
  const std::vector<ParamView>& views() const { return views_; }
  /// The view of parameter `id`.
  const ParamView& view(int id) const { return views_.at(static_cast<std::size_t>(id)); }
  /// The id of a named parameter, or -1.
  int find(std::string_view name) const;
  /// Elements in each flat buffer (padding included).
  std::int64_t size() const { return size_; }
  /// Parameters this store holds: every view's elements, a padded vocabulary's rows
  /// included (they are stored), the alignment between views not.
  std::int64_t parameter_count() const;
  /// Sets every gradient to zero.
  void zero_grad();
  /// The operands of the matrix products of the layers over this store (nn::Linear: forward,
  /// input and weight gradients): fp32, or rounded to bfloat16 with fp32 accumulation. The
  /// parameters, gradients and everything else stay T.
  void set_matmul_precision(MatmulPrecision p) { matmul_ = p; }
  MatmulPrecision matmul_precision() const { return matmul_; }

  /// A bfloat16 copy of the parameters kept beside them, for bf16 products on a GPU: the
  /// layers' products read their weights from it (param_bf16) instead of rounding each weight
  /// for each product, and the optimizer step writes it with the update (AdamW's kernel, then
  /// bf16_written()). Any other write (params(), mutable_param(), params_from_host(), to())
  /// makes it stale; refresh_bf16() brings it up to date with one cast of the whole buffer.
  /// Only after allocate(); a writer that keeps a pointer into the parameters and writes
  /// through it later (ZeRO-3's gathers) must not be combined with it.
  void keep_bf16_copy();
  bool keeps_bf16_copy() const { return params16_.numel() > 0; }
  /// The copy of parameter `id`; nullptr when there is no copy or it is stale (the caller then
  /// rounds the fp32 parameter itself: slower, the same values).
  const BFloat16* param_bf16(int id) const {
    return bf16_current_ ? params16_.data() + views_.at(static_cast<std::size_t>(id)).offset : nullptr;
  }
  /// Casts the parameters into the copy if it is stale (one kernel); nothing otherwise.
  void refresh_bf16();
  /// The whole copy, for a writer that writes it together with the parameters; then
  /// bf16_written() marks it current. nullptr without a copy.
  BFloat16* bf16_copy() { return keeps_bf16_copy() ? params16_.data() : nullptr; }
  void bf16_written() { bf16_current_ = keeps_bf16_copy(); }
  /// Casts refresh_bf16() made so far (the optimizer's writes are not counted).
  std::int64_t bf16_refreshes() const { return bf16_refreshes_; }
  /// Offsets of every view in the flat buffer of the full (serial) model with the same
  /// views (unpadded): what checkpoints store, whatever the tp layout; and its size.
  std::vector<std::int64_t> logical_offsets(std::int64_t* total = nullptr) const;

 private:
  std::vector<Range> kept_;
  StoreOptions options_;
  std::vector<ParamView> views_;
  std::int64_t size_ = 0;
  bool in_experts_ = false;         // between begin_experts() and end_experts()
  std::int64_t expert_size_ = 0;    // the expert partition so far (offsets relative to it until allocate)
  std::int64_t expert_offset_ = 0;  // after allocate(): where the expert partition starts
  std::vector<std::int64_t> expert_starts_;  // each expert unit's start inside the partition
  Tensor<T> params_;
  Tensor<T> grads_;
  MatmulPrecision matmul_ = MatmulPrecision::kFp32;
  Tensor<BFloat16> params16_;  // keep_bf16_copy(): size_ elements where params_ lives
  bool bf16_current_ = false;
  std::int64_t bf16_refreshes_ = 0;
};

}  // namespace ndmesh
