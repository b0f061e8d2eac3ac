#include "ndmesh/model/decoder.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <type_traits>
#include <utility>

#include <fmt/core.h>
#include <fmt/format.h>

#include "ndmesh/config/training.hpp"
#include "ndmesh/core/error.hpp"
#include "ndmesh/tensor/ops.hpp"
#include "ndmesh/tensor/rng.hpp"

namespace ndmesh::model {

std::vector<std::string> model_spec_problems(const ModelSpec& s) {
  // The shape rules live in one place (config's model_problems, also the planner's); the
  // model adds what it cannot build.
  std::vector<std::string> out = model_problems(s);
  if (s.experts > 0 && s.biases)
    out.push_back(fmt::format("model experts={} with biases=true: MoE layers have no biases; use biases=false "
                              "(--no-bias, or a llama-family model)",
                              s.experts));
  return out;
}

double model_memory_elements(const ModelSpec& s, std::int64_t batch, std::int64_t seq) {
  const double n = static_cast<double>(batch) * static_cast<double>(seq);
  const double c = static_cast<double>(s.hidden), v = static_cast<double>(s.padded_vocab());
  const double f = static_cast<double>(s.ffn_or_default());
  const double hd = static_cast<double>(s.head_dim_or_default());
  const double r = (static_cast<double>(s.heads) + 2.0 * static_cast<double>(s.kv_heads_or_heads())) * hd;
  const double lse = n * static_cast<double>(s.heads);  // [B, H, T]: attention keeps no seq x seq matrix
  const bool gated = s.mlp == MlpKind::kSwiglu;
  const double up = gated ? 2 * f : f;  // fc's outputs: [gate | up], or the GELU MLP's F
  const double norm_params = s.norm == NormKind::kLayerNorm ? 2 * c : c;
  const double bias_params = s.biases ? r + c + up + c : 0.0;
  const double per_block_params = 2 * norm_params + c * r + static_cast<double>(s.heads) * hd * c + c * up +
                                  f * c + bias_params;
  const double params = static_cast<double>(s.layers) * per_block_params +
                        (v + static_cast<double>(s.position_rows())) * c + norm_params +
                        (s.tied_embeddings ? 0.0 : v * c);
  // Per block: ln1, res1, ln2, out, atty (5 NC), qkv (N r), the MLP's pre-activation and
  // hidden (N up + NF), lse.
  const double per_block_acts = 5 * n * c + n * r + up * n + n * f + lse;
  const double acts = static_cast<double>(s.layers) * per_block_acts + 2 * n * c + 2 * n * v;
  // Backward: block scratch (3 NC + N r + NF) and dlnf, two residual buffers (the logits'
  // gradient is written over the probabilities, the MLP's over one buffer). The attention's
  // own scratch is a few tiles (kAttentionTile^2) and the D rows (H T).
  const double scratch = 3 * n * c + n * r + (gated ? 3 : 1) * n * f + 3 * n * c;
  return 2 * params + acts + scratch;
}

namespace {
const ModelSpec& checked(const ModelSpec& spec) {
  auto problems = model_spec_problems(spec);
  if (!problems.empty()) fail<ConfigError>("model", "{}", fmt::join(problems, "; "));
  return spec;
}

std::uint64_t name_hash(const std::string& name) {
  std::uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}
}  // namespace

template <typename T>
DecoderT<T>::DecoderT(const ModelSpec& spec, ModelOptions options, UnitRange range, nn::TpContext<T> tp,
                      StoreOptions store)
    : ModelT<T>(options.batch, options.seq > 0 ? options.seq : spec.seq),
      spec_(checked(spec)),
      range_{range.first, range.last < 0 ? unit_count(spec.layers) : range.last},
      tp_([&] {
        tp.device = options.device;  // the layers' copies run where their buffers live
        return std::move(tp);
      }()),
      store_(store),
      recompute_(options.recompute),
      fuse_closing_add_(options.fuse_closing_add) {
  NDMESH_CHECK_CONFIG(batch_ > 0, "model", "batch={} must be positive", batch_);
  NDMESH_CHECK_CONFIG(seq_ <= spec.seq, "model", "sequence length {} exceeds the model's seq={}", seq_,
                      spec.seq);
  const std::int64_t units = unit_count(spec.layers);
  NDMESH_CHECK_CONFIG(0 <= range_.first && range_.first < range_.last && range_.last <= units, "model",
                      "units [{}, {}) are not a non-empty range of the model's {} units", range_.first,
                      range_.last, units);
  const bool with_embedding = range_.first == 0, with_head = range_.last == units;
  const std::int64_t first_b = first_block(), last_b = std::min(range_.last - 1, spec.layers);
  NDMESH_CHECK_CONFIG(first_b < last_b, "model",
                      "units [{}, {}) hold no block: a range holds at least one", range_.first, range_.last);
  NDMESH_CHECK_CONFIG(spec.experts == 0 || options.device == Device::kCpu, "model",
                      "--device {} with experts={}: MoE layers run on the CPU only for now (fp32 or bf16 "
                      "products); use --device cpu (or a dense model)",
                      device_name(options.device), spec.experts);
  if (auto problems = tp_problems(spec, tp_.size(), tp_.sequence_parallel, batch_ * seq_); !problems.empty())
    fail<ConfigError>("model", "{}", fmt::join(problems, "; "));
  const nn::TpShape tps = tp_.shape();
  // The vocabulary's rows padded to a multiple of vocab_multiple and of tp: the logical
  // tables stay [vocab, C] (checkpoints, the norm), the padding rows are zero storage.
  const std::int64_t padded = spec.padded_vocab(tp_.size());
  store_.set_matmul_precision(options.matmul);
  if (with_embedding)
    embed_.emplace(store_,
                   nn::EmbeddingOptions{.vocab = spec.vocab,
                                        .padded_vocab = padded,
                                        .channels = spec.hidden,
                                        .max_seq = spec.position_rows(),
                                        .name = "embed"},
                   tp_);
  std::optional<nn::RopeOptions> rope;
  if (spec.positions == PositionsKind::kRope)
    rope = nn::RopeOptions{.head_dim = spec.head_dim_or_default(), .theta = spec.rope_theta, .scaling = spec.rope_scaling};
  blocks_.reserve(static_cast<std::size_t>(last_b - first_b));
  for (std::int64_t l = first_b; l < last_b; ++l) {
    store_.begin_unit();
    block_offset_.push_back(store_.size());
    const std::size_t expert_units = store_.expert_unit_offsets().size();
    blocks_.emplace_back(
        store_,
        nn::BlockOptions{.channels = spec.hidden,
                         .heads = spec.heads,
                         .kv_heads = spec.kv_heads_or_heads(),
                         .head_dim = spec.head_dim_or_default(),
                         .ffn = spec.ffn_or_default(),
                         .name = fmt::format("block.{}", l),
                         .norm = spec.norm,
                         .norm_eps = spec.norm_eps,
                         .mlp = spec.mlp,
                         .bias = spec.biases,
                         .rope = rope,
                         .moe = spec.is_moe_layer(l)
                                    ? std::optional<nn::MoeOptions>(nn::MoeOptions{
                                          .experts = spec.experts,
                                          .top_k = spec.top_k,
                                          .shared_experts = spec.shared_experts,
                                          .expert_ffn = spec.expert_ffn_or_default(),
                                          .kind = spec.mlp,
                                          .router = spec.router,
                                          .aux_loss = spec.aux_loss,
                                          .capacity_factor = spec.capacity_factor,
                                          .router_bias_rate = spec.router_bias_rate,
                                          .ep = options.ep ? options.ep : std::make_shared<nn::EpComm>(),
                                          .shard_experts = options.shard_experts})
                                    : std::nullopt},
        tp_);
    // A MoE layer that stores only its ep rank's experts opened an expert unit.
    block_experts_.push_back(
        store_.expert_unit_offsets().size() > expert_units ? static_cast<int>(expert_units) : -1);
  }
  store_.begin_unit();
  head_offset_ = store_.size();
  if (with_head) {
    lnf_ = nn::make_norm<T>(spec.norm, store_,
                            {.channels = spec.hidden, .eps = spec.norm_eps, .name = "ln_f", .shard = tps.replicated()});
    int tied = -1;
    if (spec.tied_embeddings) {
      // A range without the embedding keeps its own copy of the token table under the same
      // name (same initial values), marked as the copy of a tied weight: keeping the copies
      // equal is the gradient synchronisation's job.
      if (embed_) {
        tied = embed_->token_weight_id();
      } else {
        tied = store_.add("embed.tokens", {padded / tps.size, spec.hidden}, true,
                          tps.rows({spec.vocab, spec.hidden}, {{0, padded}}));
        store_.set_tied(tied, Tied::kCopy);
      }
    }
    head_.emplace(store_, nn::LmHeadOptions{.vocab = spec.vocab,
                                            .padded_vocab = padded,
                                            .channels = spec.hidden,
                                            .tied_weight = tied,
                                            .name = "lm_head",
                                            .tp = tps});
  }
  // The embedding's table is the owner of a tied pair whose output layer is elsewhere.
  if (embed_ && spec.tied_embeddings && !head_) store_.set_tied(embed_->token_weight_id(), Tied::kOwner);
  store_.allocate();
  // The units: the embedding, each block, the head, in the order of the flat buffer.
  if (embed_) embed_unit_ = add_unit("embed", UnitKind::kEmbedding, 0, block_offset_.front());
  for (std::size_t l = 0; l < blocks_.size(); ++l) {
    add_unit(fmt::format("block.{}", first_b + static_cast<std::int64_t>(l)), UnitKind::kBlock,
             block_offset_[l], l + 1 < blocks_.size() ? block_offset_[l + 1] : head_offset_);
    units_.back().expert_range = block_experts_[l];
  }
  // The expert units: each MoE block's experts.
  for (const auto& e : store_.expert_unit_ranges()) expert_ranges_.push_back({e.offset, e.count});
  if (head_) {
    head_unit_ = add_unit("head", UnitKind::kHead, head_offset_, store_.expert_offset());
    if (spec.tied_embeddings && embed_) units_.back().ranges.push_back(embed_unit_);  // reads the token table
  } else {
    // The padding at the end of the dense part (the expert partition, if any, is in no unit).
    unit_ranges_.back().count = store_.expert_offset() - unit_ranges_.back().offset;
  }
  init(options.seed, spec.init_std);
  // Initialised on the host; then placed.
  device_ = options.device;
  store_.to(device_);
  loss_sum_ = nn::LossSum<T>(device_);
  for (Tensor<T>* t : {&dlnf_, &dlnf_full_, &dres_a_, &dres_b_, &lnf_full_, &input_grad_})
    t->set_device(device_);
  positions_device_.set_device(device_);
  loss_weight_ = 1.0 / static_cast<double>(batch_ * seq_);
  std::vector<std::int64_t> positions(static_cast<std::size_t>(seq_));
  std::iota(positions.begin(), positions.end(), std::int64_t{0});
  set_positions(std::move(positions));

  work_ = std::make_shared<nn::BlockActivations<T>>();
  size_workspace(true);  // the gathered norm outputs when activations that do not keep them ask
  const std::int64_t n = batch_ * seq_, c = spec.hidden, nl = tp_.local_rows(n);
  // The backward's scratch, shared by the blocks: sized by the block that needs the most (a
  // MoE block's MLP needs none, a dense one its width).
  const nn::Block<T>* widest = &blocks_.front();
  for (const auto& b : blocks_)
    if (b.mlp().scratch_width() > widest->mlp().scratch_width()) widest = &b;
  widest->resize(scratch_, batch_, seq_);
  if (head_) {
    dlnf_.resize({nl, c});
    dlnf_full_.resize({n, c});
  }
  dres_a_.resize({nl, c});
  dres_b_.resize({nl, c});
  if (!embed_) input_grad_.resize({nl, c});
}

template <typename T>
void DecoderT<T>::set_positions(std::vector<std::int64_t> positions) {
  NDMESH_CHECK(static_cast<std::int64_t>(positions.size()) == seq_, "model", "{} positions for seq={}",
               positions.size(), seq_);
  for (std::int64_t p : positions)
    NDMESH_CHECK(p >= 0 && p < spec_.seq, "model", "position {} is outside the model's seq={}", p, spec_.seq);
  positions_ = std::move(positions);
  ops::stage(positions_device_, positions_.data(), seq_, device_);
  for (const auto& b : blocks_) b.mlp().set_token_positions(positions_, spec_.seq);
}

template <typename T>
const std::int32_t* DecoderT<T>::upload_checked(Tensor<std::int32_t>& dst, const std::int32_t* src, std::int64_t n,
                                            std::int64_t limit, const char* what) const {
  for (std::int64_t i = 0; i < n; ++i)
    NDMESH_CHECK(src[i] >= 0 && src[i] < limit, "model", "{} {} at batch {} position {} is outside [0, {})", what,
                 src[i], i / seq_, positions_[static_cast<std::size_t>(i % seq_)], limit);
  return ops::stage(dst, src, n, device_);
}

template <typename T>
bool DecoderT<T>::in_workspace(std::size_t i, bool last, bool keeps_gathered) const {
  using A = nn::BlockActivations<T>;
  if (recompute_ == nn::Recompute::kFull) return i != A::kOut || (last && !head_);
  if (i == A::kAtty || i == A::kAtty16 || i == A::kLse) return recompute_ == nn::Recompute::kSelective;
  if (i == A::kLn1Full || i == A::kLn2Full || i == A::kLn1Full16 || i == A::kLn2Full16)
    return tp_.sequence_parallel && !keeps_gathered;
  // The range's output is sent at once (or read by the final norm with the head).
  return i == A::kOut && last && !head_;
}

template <typename T>
void DecoderT<T>::lend(nn::BlockActivations<T>& acts, std::size_t l, bool keeps_gathered) {
  const bool last = l + 1 == blocks_.size();
  acts.each_with(*work_, [&](std::size_t i, auto& mine, auto& work) {
    if (in_workspace(i, last, keeps_gathered)) std::swap(mine, work);
  });
}

template <typename T>
void DecoderT<T>::size_workspace(bool keeps_gathered) const {
  // Every block's sizes, the largest of each tensor (MoE and dense blocks keep different MLP
  // tensors); filled only where still empty or smaller.
  for (const auto& b : blocks_) {
    nn::BlockActivations<T> all;
    b.resize(all, batch_, seq_);
    work_->each_with(all, [&](std::size_t i, auto& to, auto& from) {
      if (to.numel() < from.numel() && (recompute_ == nn::Recompute::kFull || in_workspace(i, false, keeps_gathered) ||
                                        in_workspace(i, true, keeps_gathered)))
        std::swap(to, from);
    });
  }
}

template <typename T>
void DecoderT<T>::share_recompute_workspace(const ModelT<T>& other_model) {
  const auto* other = dynamic_cast<const DecoderT*>(&other_model);
  NDMESH_CHECK(other != nullptr && other->recompute_ == recompute_ && other->batch_ == batch_ &&
                   other->seq_ == seq_ && other->spec_.hidden == spec_.hidden &&
                   other->tp_.sequence_parallel == tp_.sequence_parallel,
               "model", "a workspace is shared only between models of the same kind, mode, shape, batch and seq");
  work_ = other->work_;
  size_workspace(true);  // what this model needs besides (e.g. the range's output)
}

template <typename T>
std::int64_t DecoderT<T>::recompute_workspace_bytes() const {
  return work_->bytes() - workspace_buffer_bytes();
}

template <typename T>
std::int64_t DecoderT<T>::workspace_buffer_bytes() const {
  using A = nn::BlockActivations<T>;
  auto t = work_->tensors();
  return (t[A::kLn1Full]->numel() + t[A::kLn2Full]->numel() + t[A::kOut]->numel()) *
             static_cast<std::int64_t>(sizeof(T)) +
         (work_->ln1_full16.numel() + work_->ln2_full16.numel()) * static_cast<std::int64_t>(sizeof(BFloat16));
}

template <typename T>
DecoderActivations<T>& DecoderT<T>::own(Activations& acts) const {
  auto* a = dynamic_cast<DecoderActivations<T>*>(&acts);
  NDMESH_CHECK(a != nullptr, "model", "activations made by another kind of model");
  return *a;
}

template <typename T>
const DecoderActivations<T>& DecoderT<T>::own(const Activations& acts) const {
  const auto* a = dynamic_cast<const DecoderActivations<T>*>(&acts);
  NDMESH_CHECK(a != nullptr, "model", "activations made by another kind of model");
  return *a;
}

template <typename T>
std::unique_ptr<Activations> DecoderT<T>::make_activations(ActivationOptions options) const {
  const std::int64_t n = batch_ * seq_, c = spec_.hidden, nl = tp_.local_rows(n);
  const bool keeps = options.deferred_weight_grads;
  size_workspace(keeps);
  auto out = std::make_unique<DecoderActivations<T>>();
  DecoderActivations<T>& a = *out;
  a.options = options;
  a.tokens.resize(static_cast<std::size_t>(n));
  a.targets.resize(static_cast<std::size_t>(n));
  for (Tensor<T>* t : {&a.input, &a.lnf, &a.lnf_mean, &a.lnf_rstd, &a.lnf_full}) t->set_device(device_);
  a.input.resize({nl, c});
  a.blocks.resize(blocks_.size());
  for (std::size_t l = 0; l < blocks_.size(); ++l) {
    blocks_[l].resize(a.blocks[l], batch_, seq_);
    // What lives in the shared workspace is not kept per micro-batch.
    a.blocks[l].each([&](std::size_t i, auto& t) {
      if (in_workspace(i, l + 1 == blocks_.size(), keeps)) t = std::decay_t<decltype(t)>{};
    });
  }
  if (head_) {
    a.lnf.resize({nl, c});
    if (lnf_->keeps_mean()) a.lnf_mean.resize({nl});
    a.lnf_rstd.resize({nl});
    // A deferred head weight gradient reads the gathered input later: kept per micro-batch.
    if (tp_.sequence_parallel && keeps) a.lnf_full.resize({n, c});
    if (tp_.sequence_parallel && !keeps && lnf_full_.numel() == 0) lnf_full_.resize({n, c});
    head_->resize(a.head, n, keeps);
  }
  return out;
}

template <typename T>
const T* DecoderT<T>::output(const Activations& acts) const {
  return head_ ? own(acts).blocks.back().out.data() : work_->out.data();
}

template <typename T>
void DecoderT<T>::init(std::uint64_t seed, double init_std) {
  const double residual_std = init_std / std::sqrt(2.0 * static_cast<double>(spec_.layers));
  // The store says which elements this rank keeps (ZeRO-3: its blocks of the units); only
  // those are written, the rest of the buffer stays untouched zero pages.
  std::vector<typename ParamStore<T>::Range> units;
  for (const nn::Segment& u : unit_ranges_) units.push_back({u.offset, u.count});
  store_.keep_blocks(units);
  const auto& kept = store_.kept();
  T* const params = store_.params().data();
  std::vector<T> full, local;  // one parameter at a time: the serial tensor, this rank's tp slice
  for (const auto& view : store_.views()) {
    Rng rng(seed ^ name_hash(view.name));
    // A tp shard, or a parameter of which the rank keeps part, draws the whole serial
    // parameter (the same random stream) and keeps its elements.
    const bool sharded = view.shard.sharded(), whole = kept.empty();
    // (Unsplit, a padded vocabulary's table has more local rows than the serial one: the
    // padding rows stay zero in the scratch too.)
    if (sharded || !whole)
      full.assign(static_cast<std::size_t>(std::max(view.full_numel(), view.numel)), T(0));
    T* p = sharded || !whole ? full.data() : params + view.offset;
    const std::int64_t numel = view.full_numel();
    const bool is_weight =
        view.name.ends_with(".weight") || view.name.ends_with(".tokens") || view.name.ends_with(".positions");
    const bool is_norm = view.name.find(".ln") != std::string::npos || view.name.starts_with("ln_f");
    if (is_norm) {
      std::fill(p, p + numel, view.name.ends_with(".weight") ? T(1) : T(0));
    } else if (is_weight) {
      const bool residual = view.name.ends_with(".proj.weight");
      const double std = residual ? residual_std : init_std;
      for (std::int64_t i = 0; i < numel; ++i) p[i] = static_cast<T>(std * rng.normal());
    }  // biases stay zero
    if (whole) {
      if (sharded) copy_shard(view.shard, view.shape, params + view.offset, full.data(), false);
      continue;
    }
    const T* src = full.data();
    if (sharded) {
      local.assign(static_cast<std::size_t>(view.numel), T(0));
      copy_shard(view.shard, view.shape, local.data(), full.data(), false);
      src = local.data();
    }
    for (const auto& k : kept) {
      const std::int64_t lo = std::max(k.offset, view.offset),
                         hi = std::min(k.offset + k.count, view.offset + view.numel);
      if (lo < hi) std::copy(src + (lo - view.offset), src + (hi - view.offset), params + lo);
    }
  }
}

template <typename T>
void DecoderT<T>::forward_summed(Activations& acts, const std::int32_t* tokens, const T* input,
                                 const std::int32_t* targets) {
  DecoderActivations<T>& a = own(acts);
  const bool keeps = a.options.deferred_weight_grads;
  const std::int64_t n = batch_ * seq_;
  store_.refresh_bf16();  // one cast after a write other than the optimizer step's; nothing otherwise
  if (embed_) {
    NDMESH_CHECK(tokens != nullptr, "model", "the first stage needs tokens");
    std::copy(tokens, tokens + n, a.tokens.begin());
    const std::int32_t* here = upload_checked(a.device_tokens, a.tokens.data(), n, spec_.vocab, "token");
    unit_event(UnitEvent::kForwardBegin, embed_unit_);
    embed_->forward_at(here, a.input.data(), batch_, seq_, positions_here());
    unit_event(UnitEvent::kForwardEnd, embed_unit_);
  } else {
    NDMESH_CHECK(input != nullptr, "model", "a range from block {} needs its input hidden states",
                 first_block());
    ops::copy(a.input.data(), input, tp_.local_rows(n) * spec_.hidden, device_);  // local rows under SP
  }
  const T* x = a.input.data();
  const std::int64_t out_elems = tp_.local_rows(n) * spec_.hidden;
  // A block's closing add (its MLP's bias and the residual) is left to the next norm on this
  // stage, which does it in its own pass over the rows (nn::PendingAdd); not under ZeRO 2/3,
  // whose units are gathered and released block by block (the next unit would read this
  // one's bias after its release), nor for the stage's last output when another stage gets it.
  std::optional<nn::PendingAdd<T>> pending;
  for (std::size_t l = 0; l < blocks_.size(); ++l) {
    nn::BlockActivations<T>& keep = a.blocks[l];
    const bool defer = fuse_closing_add_ && (l + 1 < blocks_.size() || head_);
    unit_event(UnitEvent::kForwardBegin, block_unit(l));
    const nn::PendingAdd<T>* p = pending ? &*pending : nullptr;
    if (recompute_ == nn::Recompute::kFull) {
      // The whole block runs in the workspace; only its output is kept.
      blocks_[l].forward(x, *work_, batch_, seq_, core_.get(), block_positions(), p, !defer);
      if (keep.out.numel() > 0) ops::copy(keep.out.data(), work_->out.data(), out_elems, device_);
    } else {
      // The tensors the workspace holds (recomputed or gathered again in the backward)
      // are lent to the block for its forward.
      lend(keep, l, keeps);
      blocks_[l].forward(x, keep, batch_, seq_, core_.get(), block_positions(), p, !defer);
      lend(keep, l, keeps);
    }
    unit_event(UnitEvent::kForwardEnd, block_unit(l));
    if (const nn::FeedForward<T>& mlp = blocks_[l].mlp(); mlp.experts() > 0) {
      // The auxiliary loss weighed as this micro-batch's LM loss is, in the loss and in the
      // gradient the backward adds; the routing's load for the report and the bias update.
      const double share = loss_weight_ * static_cast<double>(batch_ * seq_);
      aux_sum_ += share * mlp.aux_loss();
      mlp.set_aux_weight(share);
      record_load(l, mlp.expert_load());
    }
    T* out = keep.out.numel() > 0 ? keep.out.data() : work_->out.data();
    pending.reset();
    if (defer) {
      pending = blocks_[l].closing_add(recompute_ == nn::Recompute::kFull ? *work_ : keep);
      pending->x = out;  // the kept copy under full recompute
    }
    x = out;
    progress();  // e.g. a pipeline's transfers in flight move between blocks
  }
  a.have_targets = head_ && targets != nullptr;
  a.probs_consumed = false;
  if (!head_) return;
  const std::int64_t c = spec_.hidden;
  // A forward without targets (the loss unused): a throwaway target 0 is as good as any.
  if (a.have_targets)
    std::copy(targets, targets + n, a.targets.begin());
  else
    std::fill(a.targets.begin(), a.targets.end(), 0);
  const std::int32_t* targets_here = upload_checked(a.device_targets, a.targets.data(), n, spec_.vocab, "target");
  unit_event(UnitEvent::kForwardBegin, head_unit_);
  if (pending)  // the last block's closing add in the final norm's pass
    lnf_->forward_residual(pending->x, pending->residual, pending->x, a.lnf.data(), a.lnf_mean.data(),
                           a.lnf_rstd.data(), tp_.local_rows(n), pending->bias);
  else
    lnf_->forward(x, a.lnf.data(), a.lnf_mean.data(), a.lnf_rstd.data(), tp_.local_rows(n));
  T* lnf_full = a.lnf_full.numel() > 0 ? a.lnf_full.data() : lnf_full_.data();
  std::optional<nn::LossSum<T>> unused;  // the losses of a forward without targets
  if (!a.have_targets) unused.emplace(device_);
  head_->forward_loss(tp_.f_forward(a.lnf.data(), lnf_full, n, c), targets_here, a.head, n,
                      static_cast<T>(loss_weight_), *tp_.comm, unused ? *unused : loss_sum_);
  unit_event(UnitEvent::kForwardEnd, head_unit_);
}

template <typename T>
void DecoderT<T>::backward(Activations& acts_in, const T* doutput) {
  DecoderActivations<T>& a = own(acts_in);
  const bool keeps = a.options.deferred_weight_grads;
  const std::int64_t n = batch_ * seq_, c = spec_.hidden, nl = tp_.local_rows(n);
  if (head_) {
    NDMESH_CHECK(a.have_targets, "model", "backward() after a forward without targets");
    NDMESH_CHECK(!a.probs_consumed, "model",
                 "backward() twice after one forward: the first wrote the logits' gradient over the probabilities");
    a.probs_consumed = true;
    // Sequence parallelism: the head's input is gathered again (not kept per micro-batch).
    const T* lnf_in =
        a.lnf_full.numel() > 0 ? a.lnf_full.data() : tp_.f_forward(a.lnf.data(), lnf_full_.data(), n, c);
    unit_event(UnitEvent::kBackwardBegin, head_unit_);
    // The logits' gradient (over the probabilities, or written by a fused forward), then
    // the head's products: writes d lnf.
    // Without sequence parallelism d lnf is written where the final norm's backward reads it
    // (f's sum over tp in place: no copy).
    T* dlnf_full = tp_.sequence_parallel ? dlnf_full_.data() : dlnf_.data();
    head_->backward_loss(a.head, ops::staged(a.device_targets, a.targets.data(), device_), lnf_in, dlnf_full, n,
                         static_cast<T>(loss_weight_));
    tp_.f_backward(dlnf_full, dlnf_.data(), n, c);
    dres_a_.zero();
    lnf_->backward(dlnf_.data(), output(a), a.lnf_mean.data(), a.lnf_rstd.data(), dres_a_.data(), nl);
    unit_event(UnitEvent::kBackwardEnd, head_unit_);
    report_grads_final(head_offset_);
  } else {
    NDMESH_CHECK(doutput != nullptr, "model", "a range up to block {} needs the gradient of its output",
                 first_block() + static_cast<std::int64_t>(blocks_.size()));
    ops::copy(dres_a_.data(), doutput, nl * c, device_);
  }
  Tensor<T>* dout = &dres_a_;
  Tensor<T>* dinp = &dres_b_;
  for (std::size_t l = blocks_.size(); l-- > 0;) {
    const T* inp = l == 0 ? a.input.data() : a.blocks[l - 1].out.data();
    nn::BlockActivations<T>* acts = &a.blocks[l];
    unit_event(UnitEvent::kBackwardBegin, block_unit(l));
    if (recompute_ == nn::Recompute::kFull) {
      // Its input is complete (the forward's next norm finished it); its own output is not read.
      blocks_[l].forward(inp, *work_, batch_, seq_, core_.get(), block_positions(), nullptr, !fuse_closing_add_);
      acts = work_.get();
    } else {
      lend(*acts, l, keeps);
      if (in_workspace(nn::BlockActivations<T>::kLn1Full, false, keeps))
        blocks_[l].gather_norms(*acts, batch_, seq_);
      if (recompute_ == nn::Recompute::kSelective)
        blocks_[l].recompute_attention(*acts, batch_, seq_, core_.get(), block_positions());
    }
    blocks_[l].backward(dout->data(), inp, *acts, scratch_, dinp->data(), batch_, seq_,
                        progress_hook(), core_.get(), block_positions());
    if (recompute_ != nn::Recompute::kFull) lend(*acts, l, keeps);
    unit_event(UnitEvent::kBackwardEnd, block_unit(l));
    std::swap(dout, dinp);
    // With a tied head on this stage the token table (offset 0) is final only after the
    // embedding: block offsets are above it, so the watermark stays correct.
    report_grads_final(block_offset_[l]);
  }
  if (embed_) {
    // Reads no parameter (not in backward_units()), but writes the table's gradients.
    unit_event(UnitEvent::kBackwardBegin, embed_unit_);
    embed_->backward_at(dout->data(), ops::staged(a.device_tokens, a.tokens.data(), device_), batch_, seq_,
                        positions_here(), a.tokens.data(), positions_.data());  // and their host copies
    unit_event(UnitEvent::kBackwardEnd, embed_unit_);
  } else
    ops::copy(input_grad_.data(), dout->data(), nl * c, device_);
  report_grads_final(0);
}

namespace {
// Where global block g's experts start in the whole model's loads (every MoE block before it,
// experts each): a pipeline stage's ranges fill their own blocks' places, so that the loads of
// every stage sum into the serial run's layout.
std::size_t load_offset(const ModelSpec& spec, std::int64_t g) {
  std::size_t at = 0;
  for (std::int64_t b = 0; b < g; ++b)
    if (spec.is_moe_layer(b)) at += static_cast<std::size_t>(spec.experts);
  return at;
}
}  // namespace

template <typename T>
void DecoderT<T>::record_load(std::size_t l, const std::vector<double>& load) {
  const std::size_t at = load_offset(spec_, first_block() + static_cast<std::int64_t>(l));
  if (expert_loads_.size() < at + load.size()) expert_loads_.resize(at + load.size(), 0.0);
  for (std::size_t e = 0; e < load.size(); ++e) expert_loads_[at + e] += load[e];
}

template <typename T>
double DecoderT<T>::take_aux_loss_sum() {
  return std::exchange(aux_sum_, 0.0);
}

template <typename T>
std::vector<double> DecoderT<T>::take_expert_loads() {
  const std::size_t total = load_offset(spec_, spec_.layers);
  bool any = false;
  for (const auto& b : blocks_) any = any || b.mlp().experts() > 0;
  std::vector<double> out(any ? total : 0, 0.0);
  std::swap(out, expert_loads_);
  out.resize(any ? total : 0, 0.0);
  return out;
}

template <typename T>
void DecoderT<T>::update_router_biases(const std::vector<double>& loads) {
  for (std::size_t l = 0; l < blocks_.size(); ++l) {
    const auto e = static_cast<std::size_t>(blocks_[l].mlp().experts());
    if (e == 0) continue;
    const std::size_t at = load_offset(spec_, first_block() + static_cast<std::int64_t>(l));
    NDMESH_CHECK(at + e <= loads.size(), "model", "{} expert loads for the model's {} or more experts", loads.size(),
                 at + e);
    blocks_[l].mlp().update_router_bias(loads.data() + at);
  }
}

template <typename T>
double DecoderT<T>::flops_per_step() const {
  const double n = static_cast<double>(batch_ * seq_);
  const double c = static_cast<double>(spec_.hidden);
  const double h = static_cast<double>(spec_.heads), kv = static_cast<double>(spec_.kv_heads_or_heads());
  const double hd = static_cast<double>(spec_.head_dim_or_default()), f = static_cast<double>(spec_.ffn_or_default());
  const double v = static_cast<double>(spec_.padded_vocab(tp_.size()));  // the padding's logits are computed too
  const double mlp_matrices = spec_.mlp == MlpKind::kSwiglu ? 3 : 2;  // gate, up, down; or fc, proj
  const double per_block = 2 * n * c * (h + 2 * kv) * hd     // qkv
                           + 2 * n * h * hd * c              // proj
                           + mlp_matrices * 2 * n * c * f;  // the MLP's
  const double head = head_ ? 2 * n * c * v / static_cast<double>(tp_.size()) : 0.0;
  // The matrix products above cost twice as much again in the backward. Attention is
  // counted as computed: score elements of the tiles the causal mask does not skip (the
  // lower triangle of tiles, diagonal tiles whole), times 2 hd per product, times 7
  // products: Q Kᵀ and P V forward; Q Kᵀ again (the recomputed scores), Pᵀ dO, dO Vᵀ,
  // dS K and dSᵀ Q backward.
  // Queries at this model's positions; keys at every earlier position (all of them are
  // local in a serial run; a context-parallel rank gets the others around the ring).
  const std::int64_t keys = *std::max_element(positions_.begin(), positions_.end()) + 1;
  std::vector<std::int64_t> pos(static_cast<std::size_t>(keys));
  std::iota(pos.begin(), pos.end(), std::int64_t{0});
  const double scores =
      static_cast<double>(nn::attention_tiles(positions_.data(), seq_, pos.data(), keys).elements);
  double attention = 7 * 2 * hd * scores * static_cast<double>(batch_) * h;
  // Recompute: the attention core forward again (Q Kᵀ and P V, selective), or the whole
  // block forward again (full).
  double recomputed = 0;
  if (recompute_ == nn::Recompute::kSelective)
    attention += 2 * 2 * hd * scores * static_cast<double>(batch_) * h;
  if (recompute_ == nn::Recompute::kFull)
    recomputed = per_block + 2 * 2 * hd * scores * static_cast<double>(batch_) * h;
  // Under tp a rank computes 1 / tp of every product (its heads, its MLP and vocabulary slices).
  return static_cast<double>(blocks_.size()) * (3 * per_block + attention + recomputed) /
             static_cast<double>(tp_.size()) +
         3 * head;
}

template class DecoderT<float>;
template class DecoderT<double>;

}  // namespace ndmesh::model
