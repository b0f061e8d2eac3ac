#include "ndmesh/nn/moe.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <type_traits>

#include <fmt/format.h>

#include "feed_forward_passes.hpp"
#include "ndmesh/core/error.hpp"

namespace ndmesh::nn {

Route route_token(const double* p, const double* bias, std::int64_t experts, std::int64_t top_k) {
  std::vector<std::int64_t> order(static_cast<std::size_t>(experts));
  std::iota(order.begin(), order.end(), std::int64_t{0});
  auto key = [&](std::int64_t e) { return p[e] + (bias ? bias[e] : 0.0); };
  // Largest key first; equal keys keep the index order (the lower expert first).
  std::stable_sort(order.begin(), order.end(),
                   [&](std::int64_t a, std::int64_t b) { return key(a) > key(b); });
  Route r;
  r.experts.assign(order.begin(), order.begin() + top_k);
  double z = 0;
  for (std::int64_t e : r.experts) z += p[e];
  for (std::int64_t e : r.experts) r.weights.push_back(z > 0 ? p[e] / z : 1.0 / static_cast<double>(top_k));
  return r;
}

std::int64_t expert_capacity(double factor, std::int64_t tokens, std::int64_t top_k, std::int64_t experts) {
  if (factor <= 0) return -1;
  return static_cast<std::int64_t>(
      std::ceil(factor * static_cast<double>(tokens * top_k) / static_cast<double>(experts) - 1e-9));
}

std::vector<bool> capacity_keep(const std::vector<std::int64_t>& chosen, std::int64_t tokens,
                                std::int64_t top_k, std::int64_t experts, std::int64_t capacity) {
  std::vector<bool> kept(chosen.size(), true);
  if (capacity < 0) return kept;
  std::vector<std::int64_t> taken(static_cast<std::size_t>(experts), 0);
  for (std::int64_t j = 0; j < top_k; ++j)
    for (std::int64_t t = 0; t < tokens; ++t) {
      const auto i = static_cast<std::size_t>(t * top_k + j);
      auto& n = taken[static_cast<std::size_t>(chosen[i])];
      kept[i] = n < capacity;
      if (kept[i]) ++n;
    }
  return kept;
}

namespace {

// The offsets of the parts of a route row (Moe::pre_width()).
struct RouteRow {
  std::int64_t e, k;
  std::int64_t probs() const { return 0; }
  std::int64_t chosen() const { return e; }
  std::int64_t weights() const { return e + k; }
  std::int64_t kept() const { return e + 2 * k; }
  std::int64_t width() const { return e + 3 * k; }
};

// The rows of one expert: (token, choice) in token order.
struct Assignment {
  std::int64_t token, choice;
};

// The kept assignments of a micro-batch grouped by expert (token order inside an expert),
// and how many rows each member of the expert group sends this rank for each of its experts.
struct Dispatch {
  std::vector<std::vector<Assignment>> by_expert;  // [E]
  std::vector<std::int64_t> counts;                // [E]: rows this rank sends to each expert
  std::vector<std::int64_t> received;              // [P * L]: rows member i sends for local expert l
  std::int64_t members = 1, local = 0;

  // Elements per member of rows of `width` sent (by_member of counts) or received.
  std::vector<std::int64_t> send_elements(std::int64_t width) const { return per_member(counts, width); }
  std::vector<std::int64_t> recv_elements(std::int64_t width) const { return per_member(received, width); }
  std::int64_t sent_rows() const { return std::accumulate(counts.begin(), counts.end(), std::int64_t{0}); }
  std::int64_t received_rows() const {
    return std::accumulate(received.begin(), received.end(), std::int64_t{0});
  }
  // The rows of the receive buffer that local expert l runs, member by member.
  std::vector<std::int64_t> rows_of_local(std::int64_t l) const {
    std::vector<std::int64_t> rows;
    std::int64_t at = 0;
    for (std::int64_t i = 0; i < members; ++i)
      for (std::int64_t m = 0; m < local; ++m) {
        const std::int64_t n = received[static_cast<std::size_t>(i * local + m)];
        if (m == l)
          for (std::int64_t r = 0; r < n; ++r) rows.push_back(at + r);
        at += n;
      }
    return rows;
  }

 private:
  std::vector<std::int64_t> per_member(const std::vector<std::int64_t>& c, std::int64_t width) const {
    std::vector<std::int64_t> out(static_cast<std::size_t>(members), 0);
    for (std::size_t e = 0; e < c.size(); ++e) out[e / static_cast<std::size_t>(local)] += c[e] * width;
    return out;
  }
};

template <typename T>
Dispatch plan_dispatch(EpComm& ep, const T* route, RouteRow rr, std::int64_t n) {
  Dispatch d;
  d.members = ep.size();
  d.local = rr.e / d.members;
  d.by_expert.resize(static_cast<std::size_t>(rr.e));
  d.counts.assign(static_cast<std::size_t>(rr.e), 0);
  for (std::int64_t t = 0; t < n; ++t)
    for (std::int64_t j = 0; j < rr.k; ++j)
      if (route[t * rr.width() + rr.kept() + j] != T(0))
        d.by_expert[static_cast<std::size_t>(route[t * rr.width() + rr.chosen() + j])].push_back({t, j});
  for (std::int64_t e = 0; e < rr.e; ++e)
    d.counts[static_cast<std::size_t>(e)] =
        static_cast<std::int64_t>(d.by_expert[static_cast<std::size_t>(e)].size());
  d.received.assign(static_cast<std::size_t>(rr.e), 0);
  ep.all_to_all(d.counts.data(), d.received.data(), d.local);
  return d;
}

// n elements converted: T to T copied; bfloat16 widened to T, or T holding bfloat16 values
// narrowed back (both exact: the rows of bf16 products travel widened).
template <typename To, typename From>
void convert_elements(const From* from, std::int64_t n, To* to) {
  if constexpr (std::is_same_v<To, From>)
    std::copy_n(from, n, to);
  else if constexpr (std::is_same_v<To, BFloat16>)
    for (std::int64_t i = 0; i < n; ++i) to[i] = BFloat16(static_cast<float>(from[i]));
  else
    for (std::int64_t i = 0; i < n; ++i) to[i] = static_cast<To>(static_cast<float>(from[i]));
}

// One local expert's forward on the received rows `rows` of `got` (row stride `stride`; the
// input is each row's first c values): gathered into xe (X: T, or bfloat16 under bf16
// products, as a dense MLP takes its input), outputs in ye, activations in a.
template <typename T, typename X>
void gather_and_forward(const FeedForward<T>& ex, const std::vector<std::int64_t>& rows, const T* got,
                        std::int64_t stride, std::int64_t c, std::vector<X>& xe, std::vector<T>& ye,
                        MlpActivations<T>& a) {
  const auto ne = static_cast<std::int64_t>(rows.size());
  xe.resize(static_cast<std::size_t>(ne * c));
  ye.resize(static_cast<std::size_t>(ne * c));
  for (std::int64_t i = 0; i < ne; ++i) convert_elements(got + rows[i] * stride, c, xe.data() + i * c);
  ex.resize_activations(a, ne);
  ex.forward(xe.data(), ye.data(), a, ne);
}

// An MLP's backward (writes dx) with the scratch its products take: T under fp32 products,
// bfloat16 under bf16 (an input in bfloat16 is for bf16 products: the MLP refuses it else).
template <typename T, typename X>
void mlp_backward(const FeedForward<T>& ex, const T* dout, const X* x, const MlpActivations<T>& a, T* dx,
                  std::int64_t rows, std::vector<T>& scratch, std::vector<BFloat16>& scratch16) {
  if constexpr (std::is_same_v<X, T>) {
    if (!ex.hidden_in_bf16()) {
      scratch.resize(static_cast<std::size_t>(rows * ex.scratch_width()));
      ex.backward(dout, x, a, dx, scratch.data(), rows);
      return;
    }
  }
  scratch16.resize(static_cast<std::size_t>(rows * ex.scratch_width()));
  ex.backward(dout, x, a, dx, scratch16.data(), rows);
}

}  // namespace

template <typename T>
Moe<T>::Moe(ParamStore<T>& store, MlpOptions options, MoeOptions moe)
    : options_(std::move(options)),
      moe_(moe),
      store_(&store),
      router_(
          store,
          {.in = options_.channels,
           .out = moe_.experts,
           .bias = false,
           .name = options_.name + ".router",
           .fp32_products = true}) {
  NDMESH_CHECK(moe_.experts > 0 && moe_.top_k >= 1 && moe_.top_k <= moe_.experts && moe_.expert_ffn > 0 &&
                   moe_.shared_experts >= 0,
               "nn",
               "moe '{}': experts={}, top_k={}, expert_ffn={}, shared_experts={} do not make a MoE layer",
               options_.name, moe_.experts, moe_.top_k, moe_.expert_ffn, moe_.shared_experts);
  NDMESH_CHECK(!options_.bias, "nn", "moe '{}': a MoE layer has no biases", options_.name);
  NDMESH_CHECK_CONFIG(moe_.expert_ffn % options_.tp.size == 0, "nn",
                      "moe '{}': expert_ffn={} is not divisible by tp={} (each expert is split over tp)",
                      options_.name, moe_.expert_ffn, options_.tp.size);
  NDMESH_CHECK(moe_.ep && moe_.experts % moe_.ep->size() == 0, "nn",
               "moe '{}': experts={} are not divisible by the expert group of {} ranks", options_.name,
               moe_.experts, moe_.ep ? moe_.ep->size() : 0);
  local_ = moe_.experts / moe_.ep->size();
  first_local_ = local_ * moe_.ep->rank();
  if (moe_.router == RouterKind::kSigmoid)
    bias_ = store.add(options_.name + ".router.bias", {moe_.experts}, false);
  // Sharded: only this rank's experts, in the store's expert partition (the names keep the
  // global index, so checkpoints and initial values are the serial model's).
  const bool sharded = moe_.shard_experts && moe_.ep->size() > 1;
  first_held_ = sharded ? first_local_ : 0;
  if (sharded) store.begin_experts();
  for (std::int64_t e = first_held_; e < (sharded ? first_local_ + local_ : moe_.experts); ++e)
    experts_.push_back(make_feed_forward<T>(moe_.kind, store,
                                            {.channels = options_.channels,
                                             .ffn = moe_.expert_ffn,
                                             .name = fmt::format("{}.experts.{}", options_.name, e),
                                             .tp = options_.tp,
                                             .bias = false}));
  if (sharded) store.end_experts();
  if (moe_.shared_experts > 0)
    shared_ = make_feed_forward<T>(moe_.kind, store,
                                   {.channels = options_.channels,
                                    .ffn = moe_.shared_experts * moe_.expert_ffn,
                                    .name = options_.name + ".shared",
                                    .tp = options_.tp,
                                    .bias = false});
  options_.ffn = (moe_.top_k + moe_.shared_experts) * moe_.expert_ffn;
  load_.assign(static_cast<std::size_t>(moe_.experts), 0.0);
}

template <typename T>
template <typename In>
void Moe<T>::forward_from(const In* inp, T* out, MlpActivations<T>& acts, std::int64_t rows) const {
  NDMESH_CHECK(acts.pre.numel() >= rows * pre_width(), "nn", "moe '{}': the routing holds {} of {} elements",
               options_.name, acts.pre.numel(), rows * pre_width());
  forward_rows(inp, out, acts.pre.data(), rows);
}

template <typename T>
template <typename In, typename S>
void Moe<T>::backward_from(const T* dout, const In* inp, const MlpActivations<T>& acts, T* dinp,
                           [[maybe_unused]] S* scratch, std::int64_t rows) const {
  // The scratch is the block's (scratch_width() 0): each MLP's backward gets its own below.
  backward_rows(dout, inp, acts.pre.data(), dinp, rows);
}

template <typename T>
std::vector<bool> Moe<T>::capacity_rows(const std::vector<std::int64_t>& chosen, std::int64_t n) const {
  const std::int64_t e_count = moe_.experts, k = moe_.top_k;
  EpComm& ep = *moe_.ep;
  if (moe_.capacity_factor <= 0 || ep.batch_ranks() <= 1)
    return capacity_keep(chosen, n, k, e_count, expert_capacity(moe_.capacity_factor, n, k, e_count));
  // The micro-batch's tokens are spread over the batch ranks: row r stands at
  // (r / local) * seq + positions_[r % local] of the micro-batch's N tokens. Each rank writes
  // its rows' choices there as E + 1 + choice, in [E + 1, 2E]: summed over the ranks, a place
  // with one writer stays in that range, a gap is 0 and an overlap at least 2E + 2.
  const auto local = static_cast<std::int64_t>(positions_.size());
  const std::int64_t total = n * ep.batch_ranks();
  NDMESH_CHECK(local > 0 && n % local == 0 && (n / local) * seq_ == total, "nn",
               "moe '{}': {} rows of {} positions in a sequence of {} over {} ranks: the capacity's token "
               "order is unknown (set_token_positions)",
               options_.name, n, local, seq_, ep.batch_ranks());
  auto place = [&](std::int64_t r) { return (r / local) * seq_ + positions_[static_cast<std::size_t>(r % local)]; };
  std::vector<double> all(static_cast<std::size_t>(total * k), 0.0);
  for (std::int64_t r = 0; r < n; ++r)
    for (std::int64_t j = 0; j < k; ++j)
      all[static_cast<std::size_t>(place(r) * k + j)] =
          static_cast<double>(e_count + 1 + chosen[static_cast<std::size_t>(r * k + j)]);
  ep.sum_over_batch(all.data(), total * k);
  std::vector<std::int64_t> every(all.size());
  for (std::size_t i = 0; i < all.size(); ++i) {
    every[i] = static_cast<std::int64_t>(all[i]) - e_count - 1;
    NDMESH_CHECK(every[i] >= 0 && every[i] < e_count && all[i] == static_cast<double>(e_count + 1 + every[i]), "nn",
                 "moe '{}': token {} of the micro-batch has {} after the sum over its ranks (positions that "
                 "overlap or leave a gap: set_token_positions)",
                 options_.name, static_cast<std::int64_t>(i) / k,
                 all[i] == 0 ? "no rank's choice" : "several ranks' choices");
  }
  const std::vector<bool> kept_all =
      capacity_keep(every, total, k, e_count, expert_capacity(moe_.capacity_factor, total, k, e_count));
  std::vector<bool> kept(chosen.size());
  for (std::int64_t r = 0; r < n; ++r)
    for (std::int64_t j = 0; j < k; ++j)
      kept[static_cast<std::size_t>(r * k + j)] = kept_all[static_cast<std::size_t>(place(r) * k + j)];
  return kept;
}

template <typename T>
template <typename X>
void Moe<T>::forward_rows(const X* x, T* out, T* route, std::int64_t n) const {
  NDMESH_CHECK(router_.device() == Device::kCpu, "nn", "moe '{}': MoE layers run on the CPU only for now",
               options_.name);
  const std::int64_t e_count = moe_.experts, k = moe_.top_k, c = options_.channels;
  const RouteRow rr{e_count, k};
  // Router logits in the model's precision (fp32 or double, also under bf16 products: from
  // the input rows widened), probabilities in double.
  std::vector<T> logits(static_cast<std::size_t>(n * e_count));
  if constexpr (std::is_same_v<X, T>) {
    router_.forward(x, logits.data(), n);
  } else {
    std::vector<T> xw(static_cast<std::size_t>(n * c));
    convert_elements(x, n * c, xw.data());
    router_.forward(xw.data(), logits.data(), n);
  }
  std::vector<double> bias(static_cast<std::size_t>(e_count), 0.0);
  if (bias_ >= 0)
    for (std::int64_t e = 0; e < e_count; ++e) bias[static_cast<std::size_t>(e)] = store_->param(bias_)[e];
  std::vector<std::int64_t> chosen(static_cast<std::size_t>(n * k));
  std::vector<double> p(static_cast<std::size_t>(e_count)), mean_q(static_cast<std::size_t>(e_count), 0.0);
  std::fill(load_.begin(), load_.end(), 0.0);
  for (std::int64_t t = 0; t < n; ++t) {
    const T* l = logits.data() + t * e_count;
    T* row = route + t * rr.width();
    double sum = 0;
    if (moe_.router == RouterKind::kSoftmax) {
      double mx = -INFINITY;
      for (std::int64_t e = 0; e < e_count; ++e) mx = std::max(mx, static_cast<double>(l[e]));
      for (std::int64_t e = 0; e < e_count; ++e) sum += p[e] = std::exp(static_cast<double>(l[e]) - mx);
      for (std::int64_t e = 0; e < e_count; ++e) p[e] /= sum;
      sum = 1;
    } else {
      for (std::int64_t e = 0; e < e_count; ++e)
        sum += p[e] = 1.0 / (1.0 + std::exp(-static_cast<double>(l[e])));
    }
    for (std::int64_t e = 0; e < e_count; ++e) {
      row[rr.probs() + e] = static_cast<T>(p[e]);
      mean_q[static_cast<std::size_t>(e)] += p[e] / sum / static_cast<double>(n);
    }
    // The choice from the stored (rounded) values: what the backward reads.
    for (std::int64_t e = 0; e < e_count; ++e) p[e] = static_cast<double>(row[rr.probs() + e]);
    const Route r = route_token(p.data(), bias_ >= 0 ? bias.data() : nullptr, e_count, k);
    for (std::int64_t j = 0; j < k; ++j) {
      chosen[static_cast<std::size_t>(t * k + j)] = r.experts[static_cast<std::size_t>(j)];
      row[rr.chosen() + j] = static_cast<T>(r.experts[static_cast<std::size_t>(j)]);
      row[rr.weights() + j] = static_cast<T>(r.weights[static_cast<std::size_t>(j)]);
      load_[static_cast<std::size_t>(r.experts[static_cast<std::size_t>(j)])] += 1;
    }
  }
  const std::vector<bool> kept = capacity_rows(chosen, n);
  dropped_ = 0;
  for (std::int64_t i = 0; i < n * k; ++i) {
    route[(i / k) * rr.width() + rr.kept() + i % k] = kept[static_cast<std::size_t>(i)] ? T(1) : T(0);
    dropped_ += kept[static_cast<std::size_t>(i)] ? 0 : 1;
  }
  EpComm& ep = *moe_.ep;
  // The auxiliary loss is the micro-batch's: under context parallelism its tokens are spread
  // over the cp ranks (as many on each), whose counts and mean probabilities are summed.
  std::vector<double> counts = load_;
  std::int64_t tokens = n;
  if (ep.batch_ranks() > 1) {
    std::vector<double> sums(counts);
    sums.insert(sums.end(), mean_q.begin(), mean_q.end());
    ep.sum_over_batch(sums.data(), static_cast<std::int64_t>(sums.size()));
    for (std::int64_t e = 0; e < e_count; ++e) {
      counts[static_cast<std::size_t>(e)] = sums[static_cast<std::size_t>(e)];
      mean_q[static_cast<std::size_t>(e)] = sums[static_cast<std::size_t>(e_count + e)] / ep.batch_ranks();
    }
    tokens = n * ep.batch_ranks();
  }
  aux_ = 0;
  for (std::int64_t e = 0; e < e_count; ++e)
    aux_ += counts[static_cast<std::size_t>(e)] / static_cast<double>(tokens * k) *
            mean_q[static_cast<std::size_t>(e)];
  aux_ *= moe_.aux_loss * static_cast<double>(e_count);

  // Dispatch: the rows of x to the ranks of their experts.
  std::fill(out, out + n * c, T(0));
  const Dispatch d = plan_dispatch(ep, route, rr, n);
  std::vector<T> sent(static_cast<std::size_t>(d.sent_rows() * c)),
      got(static_cast<std::size_t>(d.received_rows() * c));
  std::int64_t at = 0;
  for (const auto& rows : d.by_expert)
    for (const Assignment& as : rows) convert_elements(x + as.token * c, c, sent.data() + (at++) * c);
  ep.all_to_all_v(sent.data(), d.send_elements(c).data(), got.data(), d.recv_elements(c).data());
  // This rank's experts on the rows of every member; their outputs in place of the inputs.
  std::vector<X> xe;
  std::vector<T> ye;
  MlpActivations<T> a;
  for (std::int64_t l = 0; l < local_; ++l) {
    const std::vector<std::int64_t> rows = d.rows_of_local(l);
    const auto ne = static_cast<std::int64_t>(rows.size());
    if (ne == 0) continue;
    const FeedForward<T>& ex = *experts_[static_cast<std::size_t>(first_local_ - first_held_ + l)];
    gather_and_forward(ex, rows, got.data(), c, c, xe, ye, a);
    for (std::int64_t i = 0; i < ne; ++i) std::copy_n(ye.data() + i * c, c, got.data() + rows[i] * c);
  }
  // Combine: the outputs back, weighed, expert by expert in token order.
  ep.all_to_all_v(got.data(), d.recv_elements(c).data(), sent.data(), d.send_elements(c).data());
  at = 0;
  for (const auto& rows : d.by_expert)
    for (const Assignment& as : rows) {
      const T w = route[as.token * rr.width() + rr.weights() + as.choice];
      const T* y = sent.data() + (at++) * c;
      T* o = out + as.token * c;
      for (std::int64_t ch = 0; ch < c; ++ch) o[ch] += w * y[ch];
    }
  if (shared_) {
    shared_->resize_activations(a, n);
    ye.resize(static_cast<std::size_t>(n * c));
    shared_->forward(x, ye.data(), a, n);
    for (std::int64_t i = 0; i < n * c; ++i) out[i] += ye[static_cast<std::size_t>(i)];
  }
}

template <typename T>
template <typename X>
void Moe<T>::backward_rows(const T* dout, const X* x, const T* route, T* dinp, std::int64_t n) const {
  const std::int64_t e_count = moe_.experts, k = moe_.top_k, c = options_.channels;
  const RouteRow rr{e_count, k};
  std::fill(dinp, dinp + n * c, T(0));
  std::vector<double> dw(static_cast<std::size_t>(n * k), 0.0);
  std::vector<double> count(static_cast<std::size_t>(e_count), 0.0);
  auto chosen = [&](std::int64_t t, std::int64_t j) {
    return static_cast<std::int64_t>(route[t * rr.width() + rr.chosen() + j]);
  };
  for (std::int64_t t = 0; t < n; ++t)
    for (std::int64_t j = 0; j < k; ++j) count[static_cast<std::size_t>(chosen(t, j))] += 1;
  EpComm& ep = *moe_.ep;
  if (ep.batch_ranks() > 1) {
    // The micro-batch's counts over its cp ranks, divided by them: with this rank's n tokens
    // below, f_e and the 1/N of the mean come out as the micro-batch's, and each cp rank's
    // share of the loss (its loss weight) times cp is the micro-batch's.
    ep.sum_over_batch(count.data(), e_count);
    for (double& v : count) v /= ep.batch_ranks();
  }

  // Each expert: the rows [x, dout, weight] to its rank, which runs its forward again on
  // them, then its backward from the weighed output gradient, and sends back [dx, d weight]
  // (the weight's gradient is dout . the expert's output).
  const Dispatch d = plan_dispatch(ep, route, rr, n);
  const std::int64_t out_w = 2 * c + 1, back_w = c + 1;
  std::vector<T> sent(static_cast<std::size_t>(d.sent_rows() * out_w)),
      got(static_cast<std::size_t>(d.received_rows() * out_w));
  std::int64_t at = 0;
  for (const auto& rows : d.by_expert)
    for (const Assignment& as : rows) {
      T* r = sent.data() + (at++) * out_w;
      convert_elements(x + as.token * c, c, r);
      std::copy_n(dout + as.token * c, c, r + c);
      r[2 * c] = route[as.token * rr.width() + rr.weights() + as.choice];
    }
  ep.all_to_all_v(sent.data(), d.send_elements(out_w).data(), got.data(), d.recv_elements(out_w).data());
  std::vector<T> back(static_cast<std::size_t>(d.received_rows() * back_w));
  std::vector<X> xe;
  std::vector<T> ye, dye, dxe, scratch;
  std::vector<BFloat16> scratch16;
  MlpActivations<T> a;
  // The experts' inputs and activations live in this function's buffers: their weight
  // gradients now, not in a zero-bubble schedule's later W pass (the router's may wait: its
  // input is the block's).
  std::optional<DeferWeightGrads<T>> now(std::in_place, nullptr);
  for (std::int64_t l = 0; l < local_; ++l) {
    const std::vector<std::int64_t> rows = d.rows_of_local(l);
    const auto ne = static_cast<std::int64_t>(rows.size());
    if (ne == 0) continue;
    const FeedForward<T>& ex = *experts_[static_cast<std::size_t>(first_local_ - first_held_ + l)];
    gather_and_forward(ex, rows, got.data(), out_w, c, xe, ye, a);
    dye.resize(static_cast<std::size_t>(ne * c));
    dxe.resize(static_cast<std::size_t>(ne * c));
    for (std::int64_t i = 0; i < ne; ++i) {
      const T* r = got.data() + rows[i] * out_w;
      const T* dr = r + c;
      const T w = r[2 * c];
      double dot = 0;
      for (std::int64_t ch = 0; ch < c; ++ch) {
        dye[static_cast<std::size_t>(i * c + ch)] = w * dr[ch];
        dot += static_cast<double>(dr[ch]) * static_cast<double>(ye[static_cast<std::size_t>(i * c + ch)]);
      }
      back[static_cast<std::size_t>(rows[i] * back_w + c)] = static_cast<T>(dot);
    }
    mlp_backward(ex, dye.data(), xe.data(), a, dxe.data(), ne, scratch, scratch16);
    for (std::int64_t i = 0; i < ne; ++i) std::copy_n(dxe.data() + i * c, c, back.data() + rows[i] * back_w);
  }
  std::vector<T> returned(static_cast<std::size_t>(d.sent_rows() * back_w));
  ep.all_to_all_v(back.data(), d.recv_elements(back_w).data(), returned.data(),
                  d.send_elements(back_w).data());
  at = 0;
  for (const auto& rows : d.by_expert)
    for (const Assignment& as : rows) {
      const T* r = returned.data() + (at++) * back_w;
      T* di = dinp + as.token * c;
      for (std::int64_t ch = 0; ch < c; ++ch) di[ch] += r[ch];
      dw[static_cast<std::size_t>(as.token * k + as.choice)] = static_cast<double>(r[c]);
    }
  if (shared_) {
    shared_->resize_activations(a, n);
    ye.resize(static_cast<std::size_t>(n * c));
    dxe.resize(static_cast<std::size_t>(n * c));
    shared_->forward(x, ye.data(), a, n);
    mlp_backward(*shared_, dout, x, a, dxe.data(), n, scratch, scratch16);
    for (std::int64_t i = 0; i < n * c; ++i) dinp[i] += dxe[static_cast<std::size_t>(i)];
  }

  now.reset();
  // Under tensor parallelism each rank holds a slice of every expert: its outputs, and so the
  // weights' gradients, are partial sums over tp (the dinp above is too: the block sums it).
  if (options_.tp.size > 1) ep.sum_over_tp(dw.data(), n * k);
  // The router: d weights (and the auxiliary loss) -> d probabilities or scores -> d logits.
  const bool softmax = moe_.router == RouterKind::kSoftmax;
  const double aux_scale =
      aux_weight_ * moe_.aux_loss * static_cast<double>(e_count) / static_cast<double>(n);
  std::vector<T> dlogits(static_cast<std::size_t>(n * e_count));
  std::vector<double> dp(static_cast<std::size_t>(e_count));
  for (std::int64_t t = 0; t < n; ++t) {
    const T* row = route + t * rr.width();
    auto p = [&](std::int64_t e) { return static_cast<double>(row[rr.probs() + e]); };
    std::fill(dp.begin(), dp.end(), 0.0);
    // w_j = p[c_j] / Z: d p[c_j] = (dw_j - sum_i dw_i w_i) / Z.
    double z = 0, sw = 0;
    for (std::int64_t j = 0; j < k; ++j) z += p(chosen(t, j));
    for (std::int64_t j = 0; j < k; ++j)
      sw += dw[static_cast<std::size_t>(t * k + j)] * static_cast<double>(row[rr.weights() + j]);
    for (std::int64_t j = 0; j < k; ++j)
      dp[static_cast<std::size_t>(chosen(t, j))] += (dw[static_cast<std::size_t>(t * k + j)] - sw) / z;
    if (aux_scale != 0) {
      // aux = coeff E sum_e f_e mean_t q[t, e]: d q[t, e] = coeff E f_e / N.
      if (softmax) {
        for (std::int64_t e = 0; e < e_count; ++e)
          dp[static_cast<std::size_t>(e)] +=
              aux_scale * count[static_cast<std::size_t>(e)] / static_cast<double>(n * k);
      } else {
        // q = s / sum s: d s_m = (g_m - sum_e g_e q_e) / sum s.
        double s_sum = 0, gq = 0;
        for (std::int64_t e = 0; e < e_count; ++e) s_sum += p(e);
        for (std::int64_t e = 0; e < e_count; ++e)
          gq += aux_scale * count[static_cast<std::size_t>(e)] / static_cast<double>(n * k) * p(e) / s_sum;
        for (std::int64_t e = 0; e < e_count; ++e)
          dp[static_cast<std::size_t>(e)] +=
              (aux_scale * count[static_cast<std::size_t>(e)] / static_cast<double>(n * k) - gq) / s_sum;
      }
    }
    T* dl = dlogits.data() + t * e_count;
    if (softmax) {
      double pd = 0;
      for (std::int64_t e = 0; e < e_count; ++e) pd += p(e) * dp[static_cast<std::size_t>(e)];
      for (std::int64_t e = 0; e < e_count; ++e)
        dl[e] = static_cast<T>(p(e) * (dp[static_cast<std::size_t>(e)] - pd));
    } else {
      for (std::int64_t e = 0; e < e_count; ++e)
        dl[e] = static_cast<T>(dp[static_cast<std::size_t>(e)] * p(e) * (1 - p(e)));
    }
  }
  // The router's fp32 products read the input rows as T: bf16 ones widened into a buffer of
  // this call, so their weight gradient is taken now (not in a zero-bubble W pass).
  std::vector<T> widened;
  const T* xr = nullptr;
  std::optional<DeferWeightGrads<T>> router_now;
  if constexpr (std::is_same_v<X, T>) {
    xr = x;
  } else {
    widened.resize(static_cast<std::size_t>(n * c));
    convert_elements(x, n * c, widened.data());
    xr = widened.data();
    router_now.emplace(nullptr);
  }
  if (options_.tp.rank == 0) {
    router_.backward(dlogits.data(), xr, dinp, n, GradInto::kAdd);
  } else {
    // The router is replicated over tp and sees the same rows: every rank takes its weight
    // gradient (the same), one adds its input gradient to the partial sums the block reduces.
    std::vector<T> unused(static_cast<std::size_t>(n * c));
    router_.backward(dlogits.data(), xr, unused.data(), n, GradInto::kSet);
  }
}

template <typename T>
void Moe<T>::update_router_bias(const double* load) const {
  if (bias_ < 0 || moe_.router_bias_rate == 0) return;
  double mean = 0;
  for (std::int64_t e = 0; e < moe_.experts; ++e) mean += load[e] / static_cast<double>(moe_.experts);
  T* b = store_->mutable_param(bias_);
  for (std::int64_t e = 0; e < moe_.experts; ++e) {
    const double d = mean - load[e];
    const double sign = d > 0 ? 1.0 : (d < 0 ? -1.0 : 0.0);
    b[e] = static_cast<T>(static_cast<double>(b[e]) + moe_.router_bias_rate * sign);
  }
}

template class Moe<float>;
template class Moe<double>;
// The passes of the interface (feed_forward_passes.hpp) over this MLP's templates.
template class FeedForwardPasses<Moe<float>, float>;
template class FeedForwardPasses<Moe<double>, double>;

}  // namespace ndmesh::nn
