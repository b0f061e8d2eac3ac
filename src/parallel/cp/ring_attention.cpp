#include "ndmesh/parallel/cp/ring_attention.hpp"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <type_traits>

#include <fmt/format.h>

#include "ndmesh/comm/tags.hpp"
#include "ndmesh/config/training.hpp"
#include "ndmesh/core/error.hpp"
#include "ndmesh/tensor/ops.hpp"

namespace ndmesh::parallel {

CpLayout parse_cp_layout(const std::string& name) {
  if (name == "zigzag") return CpLayout::kZigzag;
  if (name == "contiguous") return CpLayout::kContiguous;
  fail<ConfigError>("train", "--cp-layout={}: use zigzag (balanced causal work, the default) or contiguous", name);
}

const char* to_string(CpLayout layout) { return layout == CpLayout::kZigzag ? "zigzag" : "contiguous"; }

std::vector<std::string> cp_problems(std::int64_t seq, std::int64_t cp, CpLayout layout) {
  return cp_chunk_problems(seq, cp, layout == CpLayout::kContiguous);  // config/training.hpp
}

std::vector<std::int64_t> cp_positions(std::int64_t seq, std::int64_t cp, std::int64_t rank, CpLayout layout) {
  std::vector<std::int64_t> pos;
  if (cp <= 1) {
    pos.resize(static_cast<std::size_t>(seq));
    std::iota(pos.begin(), pos.end(), std::int64_t{0});
    return pos;
  }
  auto add = [&](std::int64_t from, std::int64_t count) {
    for (std::int64_t i = 0; i < count; ++i) pos.push_back(from + i);
  };
  if (layout == CpLayout::kZigzag) {
    const std::int64_t c = seq / (2 * cp);
    add(rank * c, c);
    add((2 * cp - 1 - rank) * c, c);
  } else {
    const std::int64_t c = seq / cp;
    add(rank * c, c);
  }
  return pos;
}

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Whether some key at kpos is visible to some query at qpos (key <= query).
bool any_visible(const std::int64_t* qpos, const std::int64_t* kpos, std::int64_t n) {
  const std::int64_t qmax = *std::max_element(qpos, qpos + n);
  const std::int64_t kmin = *std::min_element(kpos, kpos + n);
  return kmin <= qmax;
}

// Resizes a buffer of the ring to n elements on `device` (zeroed) only when its size changes.
template <typename U>
void size_on(Tensor<U>& t, std::int64_t n, Device device) {
  if (t.device() != device) t.set_device(device);
  if (t.numel() != n) t.resize({n});
}

constexpr int kTagKv = comm::tags::kRingKv, kTagPos = comm::tags::kRingPositions, kTagDkv = comm::tags::kRingDkv;
}  // namespace

template <typename T>
typename RingAttention<T>::Ring RingAttention<T>::ring_of(const nn::Attention<T>& attn, std::int64_t batch,
                                                          std::int64_t seq) const {
  const int P = cp_.size();
  return {.R = attn.qkv_width(),
          .O = attn.out_width(),
          .W = 2 * attn.options().kv_heads * attn.options().head_dim,
          .n = batch * seq,
          .next = (cp_.rank() + 1) % P,
          .prev = (cp_.rank() + P - 1) % P};
}

template <typename T>
RingAttention<T>::RingAttention(const comm::Communicator& cp, Device device, std::vector<std::int64_t> positions,
                                bool bf16_blocks)
    : cp_(cp.dup()), device_(device), host_positions_(std::move(positions)), bf16_blocks_(bf16_blocks) {
  constexpr bool kFloat = std::is_same_v<T, float>;
  NDMESH_CHECK(!bf16_blocks || kFloat, "cp", "bf16 key/value blocks need a float ring");
}

template <typename T>
void RingAttention<T>::pass_block(std::vector<comm::Work>& works, const Ring& g, int cur) const {
  const auto count = static_cast<std::size_t>(g.n * g.W);
  auto post = [&](const auto* send, auto* recv) {
    using E = std::remove_const_t<std::remove_pointer_t<decltype(send)>>;
    works.push_back(cp_.send_async(std::span<const E>(send, count), g.next, {.tag = kTagKv}));
    works.push_back(cp_.recv_async(std::span<E>(recv, count), g.prev, {.tag = kTagKv}));
    works.push_back(cp_.send_async(std::span<const std::int64_t>(pos_[cur]), g.next, {.tag = kTagPos}));
    works.push_back(cp_.recv_async(std::span<std::int64_t>(pos_[1 - cur]), g.prev, {.tag = kTagPos}));
    stats_.kv.calls += 1;
    stats_.kv.bytes += static_cast<std::int64_t>(count * sizeof(E));
  };
  if (bf16_blocks_)
    post(kv16_[cur].data(), kv16_[1 - cur].data());
  else
    post(kv_[cur].data(), kv_[1 - cur].data());
}

template <typename T>
void RingAttention<T>::land_block(const Ring& g, int slot) const {
  if constexpr (std::is_same_v<T, float>) {
    if (bf16_blocks_) ops::cast(kv_[slot].data(), kv16_[slot].data(), g.n * g.W, device_);
  }
}

template <typename T>
comm::Work RingAttention<T>::send_dkv(const T* data, const Ring& g) const {
  const auto count = static_cast<std::size_t>(g.n * g.W);
  stats_.dkv.calls += 1;
  stats_.dkv.bytes += static_cast<std::int64_t>(count * sizeof(T));
  return cp_.send_async(std::span<const T>(data, count), g.next, {.tag = kTagDkv});
}

template <typename T>
typename RingAttention<T>::Ring RingAttention<T>::start(const nn::Attention<T>& attn, const T* qkv,
                                                        std::int64_t batch, std::int64_t seq,
                                                        const std::int64_t* positions) const {
  const nn::AttentionOptions& o = attn.options();
  const Ring g = ring_of(attn, batch, seq);
  for (int i = 0; i < 2; ++i) {
    size_on(kv_[i], g.n * g.W, device_);
    pos_[i].resize(static_cast<std::size_t>(seq));
  }
  // The block in hand first: this rank's keys and values, at its own positions.
  ops::copy_rows(kv_[0].data(), g.W, qkv + o.heads * o.head_dim, g.R, g.n, g.W, false, device_);
  if constexpr (std::is_same_v<T, float>) {
    if (bf16_blocks_) {  // rounded for the journey: they are bf16 values already
      for (auto& b : kv16_) size_on(b, g.n * g.W, device_);
      ops::cast(kv16_[0].data(), kv_[0].data(), g.n * g.W, device_);
    }
  }
  // On CUDA positions is device memory (the model's staged copy); the host needs them for the
  // skips: the model's host copy when the ring was given it, else copied back (a wait for the GPU).
  if (positions && device_ != Device::kCpu && static_cast<std::int64_t>(host_positions_.size()) == seq)
    std::copy(host_positions_.begin(), host_positions_.end(), pos_[0].begin());
  else if (positions)
    ops::copy_to_host(pos_[0].data(), positions, seq, device_);
  else
    std::iota(pos_[0].begin(), pos_[0].end(), std::int64_t{0});
  return g;
}

template <typename T>
void RingAttention<T>::forward(const nn::Attention<T>& attn, const T* qkv, T* out, T* lse, std::int64_t batch,
                               std::int64_t seq, const std::int64_t* positions) const {
  ops::check_device<T>(device_);
  const int P = cp_.size();
  if (P == 1) return attn.forward(qkv, out, lse, batch, seq, positions, device_);
  const Ring ring = start(attn, qkv, batch, seq, positions);
  const std::vector<std::int64_t> own = pos_[0];  // pos_[0] is overwritten as blocks arrive
  const std::int64_t* qpos = ops::stage(qpos_dev_, own.data(), seq, device_);  // where the kernels read them
  const nn::AttentionOptions& o = attn.options();
  size_on(part_out_, ring.n * ring.O, device_);
  size_on(part_lse_, batch * o.heads * seq, device_);
  int cur = 0;
  for (int s = 0; s < P; ++s) {
    std::vector<comm::Work> works;
    if (s + 1 < P) pass_block(works, ring, cur);
    const auto t0 = Clock::now();
    if (s == 0 || any_visible(own.data(), pos_[cur].data(), seq)) {
      ++stats_.blocks_computed;
      stats_.score_elements += nn::attention_tiles(own.data(), seq, pos_[cur].data(), seq).elements * o.heads * batch;
      const std::int64_t* kpos = s == 0 ? qpos : ops::stage(kpos_dev_[cur], pos_[cur].data(), seq, device_);
      const nn::AttentionBatch<T> x{.q = qkv, .q_ld = ring.R, .q_pos = qpos, .kv = kv_[cur].data(), .kv_ld = ring.W,
                                    .kv_pos = kpos, .batch = batch, .seq = seq};
      // The block in hand into (out, lse) at the first step, else into the part, merged.
      nn::attention_partial_forward<T>(o, x, s == 0 ? out : part_out_.data(), s == 0 ? lse : part_lse_.data(),
                                       device_, [&] {
                                         for (comm::Work& w : works) w.test();
                                       });
      if (s > 0) nn::attention_merge<T>(o, batch, seq, out, lse, part_out_.data(), part_lse_.data(), device_);
    } else {
      ++stats_.blocks_skipped;
    }
    stats_.compute_seconds += since(t0);
    const auto t1 = Clock::now();
    comm::wait_all(works);
    stats_.exposed_seconds += since(t1);
    if (s + 1 < P) land_block(ring, 1 - cur);
    cur = 1 - cur;
  }
}

template <typename T>
void RingAttention<T>::backward(const nn::Attention<T>& attn, const T* dout, const T* qkv, const T* out,
                                const T* lse, T* dqkv, std::int64_t batch, std::int64_t seq,
                                const std::int64_t* positions) const {
  ops::check_device<T>(device_);
  const int P = cp_.size();
  if (P == 1) return attn.backward(dout, qkv, out, lse, dqkv, batch, seq, positions, device_);
  const Ring ring = start(attn, qkv, batch, seq, positions);
  const std::vector<std::int64_t> own = pos_[0];  // pos_[0] is overwritten as blocks arrive
  const std::int64_t* qpos = ops::stage(qpos_dev_, own.data(), seq, device_);
  const nn::AttentionOptions& o = attn.options();
  const std::int64_t n = ring.n, W = ring.W;
  const auto count = static_cast<std::size_t>(n * W);  // elements of a block and of its dK/dV
  for (int i = 0; i < 2; ++i) size_on(dkv_[i], n * W, device_);
  size_on(acc_in_, n * W, device_);
  size_on(delta_, batch * o.heads * seq, device_);
  nn::attention_row_dot<T>(o, batch, seq, out, dout, delta_.data(), device_);
  int cur = 0;
  comm::Work recv_acc, send_acc[2];
  for (int s = 0; s < P; ++s) {
    // The next key/value block travels while this one is computed. The dK/dV accumulator
    // of the block in hand (what the ranks that held it before added) is received
    // meanwhile too: this rank computes its own part into a zeroed buffer, adds the
    // accumulator and passes the sum on, so only the add waits for the previous rank.
    // Messages in one order on every rank (NCCL has no tags and matches them in order per
    // peer): the accumulator's receive, then the block's send and receive; the accumulator
    // sent at the end of the previous step is issued with them.
    if (s > 0) recv_acc = cp_.recv_async(std::span<T>(acc_in_.data(), count), ring.prev, {.tag = kTagDkv});
    std::vector<comm::Work> works;
    if (s + 1 < P) pass_block(works, ring, cur);
    Tensor<T>& local = dkv_[s % 2];
    auto t = Clock::now();
    send_acc[s % 2].wait();  // the send of this buffer two steps ago
    stats_.exposed_seconds += since(t);
    t = Clock::now();
    local.zero();
    if (s == 0 || any_visible(own.data(), pos_[cur].data(), seq)) {
      const std::int64_t* kpos = s == 0 ? qpos : ops::stage(kpos_dev_[cur], pos_[cur].data(), seq, device_);
      const nn::AttentionBatch<T> x{.q = qkv, .q_ld = ring.R, .q_pos = qpos, .kv = kv_[cur].data(), .kv_ld = W,
                                    .kv_pos = kpos, .batch = batch, .seq = seq};
      nn::attention_partial_backward<T>(o, x, dout, lse, delta_.data(), dqkv, ring.R, local.data(), W, device_, [&] {
        for (comm::Work& w : works) w.test();
        if (s > 0) recv_acc.test();
        send_acc[1 - s % 2].test();
      });
    }
    stats_.compute_seconds += since(t);
    if (s > 0) {
      t = Clock::now();
      recv_acc.wait();
      stats_.exposed_seconds += since(t);
      ops::add(local.data(), acc_in_.data(), n * W, device_);
    }
    send_acc[s % 2] = send_dkv(local.data(), ring);
    t = Clock::now();
    comm::wait_all(works);
    stats_.exposed_seconds += since(t);
    if (s + 1 < P) land_block(ring, 1 - cur);
    cur = 1 - cur;
  }
  // After cp hops this rank's own block comes back with every rank's part of its dK/dV
  // (the receive is issued with the last send).
  auto t = Clock::now();
  cp_.recv(std::span<T>(acc_in_.data(), count), ring.prev, {.tag = kTagDkv});
  send_acc[0].wait();
  send_acc[1].wait();
  stats_.exposed_seconds += since(t);
  ops::copy_rows(dqkv + o.heads * o.head_dim, ring.R, acc_in_.data(), W, n, W, true, device_);
}

template class RingAttention<float>;
template class RingAttention<double>;

}  // namespace ndmesh::parallel
