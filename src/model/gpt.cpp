#include "ndmesh/model/gpt.hpp"

#include <cmath>
#include <limits>

#include <fmt/core.h>
#include <fmt/format.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/nn/cross_entropy.hpp"
#include "ndmesh/tensor/rng.hpp"

namespace ndmesh::model {

std::vector<std::string> gpt_problems(const ModelSpec& s) {
  std::vector<std::string> out;
  auto need_positive = [&](const char* field, std::int64_t v, const char* example) {
    if (v <= 0) out.push_back(fmt::format("{}={} must be positive (e.g. {})", field, v, example));
  };
  need_positive("layers", s.layers, "--layers 2");
  need_positive("hidden", s.hidden, "--hidden 64");
  need_positive("heads", s.heads, "--heads 4");
  need_positive("seq", s.seq, "--seq 64");
  if (s.vocab < 2) out.push_back(fmt::format("vocab={} must be at least 2", s.vocab));
  if (s.kv_heads < 0)
    out.push_back(fmt::format("kv_heads={} must be >= 0 (0 means same as heads)", s.kv_heads));
  if (s.ffn < 0) out.push_back(fmt::format("ffn={} must be >= 0 (0 means 4 * hidden)", s.ffn));
  if (s.experts != 0)
    out.push_back(fmt::format("experts={}: mixture-of-experts is not implemented; use experts=0", s.experts));
  if (s.heads > 0 && s.hidden > 0 && s.hidden % s.heads != 0)
    out.push_back(fmt::format("heads={} does not divide hidden={}; use a divisor of {} such as {}", s.heads,
                              s.hidden, s.hidden, std::gcd(s.hidden, s.heads)));
  if (s.heads > 0 && s.kv_heads > 0 && s.heads % s.kv_heads != 0)
    out.push_back(fmt::format("kv_heads={} does not divide heads={}; use a divisor of {} such as {}",
                              s.kv_heads, s.heads, s.heads, std::gcd(s.heads, s.kv_heads)));
  return out;
}

namespace {
const ModelSpec& checked(const ModelSpec& spec) {
  auto problems = gpt_problems(spec);
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
GptT<T>::GptT(const ModelSpec& spec, GptOptions options)
    : spec_(checked(spec)),
      batch_(options.batch),
      seq_(options.seq > 0 ? options.seq : spec.seq),
      embed_(store_, {.vocab = spec.vocab, .channels = spec.hidden, .max_seq = spec.seq, .name = "embed"}),
      lnf_(store_, {.channels = spec.hidden, .name = "ln_f"}),
      head_(store_, {.vocab = spec.vocab,
                     .channels = spec.hidden,
                     .tied_weight = spec.tied_embeddings ? embed_.token_weight_id() : -1,
                     .name = "lm_head"}) {
  NDMESH_CHECK_CONFIG(batch_ > 0, "model", "batch={} must be positive", batch_);
  NDMESH_CHECK_CONFIG(seq_ <= spec.seq, "model", "sequence length {} exceeds the model's seq={}", seq_,
                      spec.seq);
  blocks_.reserve(static_cast<std::size_t>(spec.layers));
  for (std::int64_t l = 0; l < spec.layers; ++l)
    blocks_.emplace_back(store_, nn::BlockOptions{.channels = spec.hidden,
                                                  .heads = spec.heads,
                                                  .kv_heads = spec.kv_heads_or_heads(),
                                                  .ffn = spec.ffn_or_default(),
                                                  .name = fmt::format("block.{}", l)});
  store_.allocate();
  init(options.seed, options.init_std);

  const std::int64_t n = batch_ * seq_, c = spec.hidden, v = spec.vocab;
  tokens_.resize(static_cast<std::size_t>(n));
  targets_.resize(static_cast<std::size_t>(n));
  encoded_.resize({n, c});
  acts_.resize(blocks_.size());
  for (std::size_t l = 0; l < blocks_.size(); ++l) blocks_[l].resize(acts_[l], batch_, seq_);
  blocks_.front().resize(scratch_, batch_, seq_);
  lnf_out_.resize({n, c});
  lnf_mean_.resize({n});
  lnf_rstd_.resize({n});
  probs_.resize({n, v});
  losses_.resize({n});
  dlogits_.resize({n, v});
  dlnf_.resize({n, c});
  dres_a_.resize({n, c});
  dres_b_.resize({n, c});
}

template <typename T>
void GptT<T>::init(std::uint64_t seed, double init_std) {
  const double residual_std = init_std / std::sqrt(2.0 * static_cast<double>(spec_.layers));
  for (const auto& view : store_.views()) {
    Rng rng(seed ^ name_hash(view.name));
    T* p = store_.params().data() + view.offset;
    const bool is_weight =
        view.name.ends_with(".weight") || view.name.ends_with(".tokens") || view.name.ends_with(".positions");
    const bool is_norm = view.name.find(".ln") != std::string::npos || view.name.starts_with("ln_f");
    if (is_norm) {
      std::fill(p, p + view.numel, view.name.ends_with(".weight") ? T(1) : T(0));
    } else if (is_weight) {
      const bool residual = view.name.ends_with(".proj.weight");
      const double std = residual ? residual_std : init_std;
      for (std::int64_t i = 0; i < view.numel; ++i) p[i] = static_cast<T>(std * rng.normal());
    }  // biases stay zero
  }
}

template <typename T>
double GptT<T>::forward(const std::int32_t* tokens, const std::int32_t* targets) {
  const std::int64_t n = batch_ * seq_;
  std::copy(tokens, tokens + n, tokens_.begin());
  have_targets_ = targets != nullptr;
  if (have_targets_) std::copy(targets, targets + n, targets_.begin());

  embed_.forward(tokens_.data(), encoded_.data(), batch_, seq_);
  const T* x = encoded_.data();
  for (std::size_t l = 0; l < blocks_.size(); ++l) {
    blocks_[l].forward(x, acts_[l], batch_, seq_);
    x = acts_[l].out.data();
  }
  lnf_.forward(x, lnf_out_.data(), lnf_mean_.data(), lnf_rstd_.data(), n);
  head_.forward(lnf_out_.data(), probs_.data(), n);
  if (!have_targets_) {
    // Probabilities without a loss: a throwaway target row 0 is as good as any.
    std::vector<std::int32_t> zeros(static_cast<std::size_t>(n), 0);
    nn::CrossEntropy<T>::forward(probs_.data(), zeros.data(), probs_.data(), losses_.data(), n, spec_.vocab);
    return std::numeric_limits<double>::quiet_NaN();
  }
  return nn::CrossEntropy<T>::forward(probs_.data(), targets_.data(), probs_.data(), losses_.data(), n,
                                      spec_.vocab);
}

template <typename T>
void GptT<T>::backward() {
  NDMESH_CHECK(have_targets_, "model", "backward() after a forward without targets");
  const std::int64_t n = batch_ * seq_;
  dlogits_.zero();
  nn::CrossEntropy<T>::backward(probs_.data(), targets_.data(), dlogits_.data(), n, spec_.vocab,
                                T(1) / static_cast<T>(n));
  dlnf_.zero();
  head_.backward(dlogits_.data(), lnf_out_.data(), dlnf_.data(), n);
  dres_a_.zero();
  const T* last = blocks_.empty() ? encoded_.data() : acts_.back().out.data();
  lnf_.backward(dlnf_.data(), last, lnf_mean_.data(), lnf_rstd_.data(), dres_a_.data(), n);
  Tensor<T>* dout = &dres_a_;
  Tensor<T>* dinp = &dres_b_;
  for (std::size_t l = blocks_.size(); l-- > 0;) {
    const T* inp = l == 0 ? encoded_.data() : acts_[l - 1].out.data();
    dinp->zero();
    blocks_[l].backward(dout->data(), inp, acts_[l], scratch_, dinp->data(), batch_, seq_);
    std::swap(dout, dinp);
  }
  embed_.backward(dout->data(), tokens_.data(), batch_, seq_);
}

template <typename T>
double GptT<T>::flops_per_step() const {
  const double n = static_cast<double>(batch_ * seq_);
  const double c = static_cast<double>(spec_.hidden);
  const double h = static_cast<double>(spec_.heads), kv = static_cast<double>(spec_.kv_heads_or_heads());
  const double hd = c / h, f = static_cast<double>(spec_.ffn_or_default());
  const double t = static_cast<double>(seq_), v = static_cast<double>(spec_.vocab);
  const double per_block = 2 * n * c * (h + 2 * kv) * hd  // qkv
                           + 2 * n * h * hd * c           // proj
                           + 2 * 2 * n * c * f            // fc and mlp proj
                           + 2 * 2 * n * t * h * hd;      // QKᵀ and PV over the full square
  const double forward = static_cast<double>(spec_.layers) * per_block + 2 * n * c * v;
  return 3 * forward;
}

template class GptT<float>;
template class GptT<double>;

}  // namespace ndmesh::model
