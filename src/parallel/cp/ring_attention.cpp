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
#if NDMESH_WITH_CUDA
#include "ndmesh/nn/cuda_ops.hpp"
#endif

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

constexpr int kTagKv = comm::tags::kRingKv, kTagPos = comm::tags::kRingPositions, kTagDkv = comm::tags::kRingDkv;
// Query rows per partial call: the transfers in flight are polled between calls (a
// multiple of the kernel's tile, so the tiling is that of one call).
constexpr std::int64_t kPollRows = 4 * nn::kAttentionTile;
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
void RingAttention<T>::pass_block(std::vector<comm::Work>& works, const Ring& g, int cur, bool device) const {
  const auto count = static_cast<std::size_t>(g.n * g.W);
  auto post = [&](const auto* send, auto* recv) {
    using E = std::remove_const_t<std::remove_pointer_t<decltype(send)>>;
    works.push_back(cp_.send_async(std::span<const E>(send, count), g.next, {.tag = kTagKv}));
    if (device) works.push_back(cp_.recv_async(std::span<E>(recv, count), g.prev, {.tag = kTagKv}));
    works.push_back(cp_.send_async(std::span<const std::int64_t>(pos_[cur]), g.next, {.tag = kTagPos}));
    if (!device) works.push_back(cp_.recv_async(std::span<E>(recv, count), g.prev, {.tag = kTagKv}));
    works.push_back(cp_.recv_async(std::span<std::int64_t>(pos_[1 - cur]), g.prev, {.tag = kTagPos}));
    stats_.kv.calls += 1;
    stats_.kv.bytes += static_cast<std::int64_t>(count * sizeof(E));
  };
  if (bf16_blocks_ && device)
    post(kv16_dev_[cur].data(), kv16_dev_[1 - cur].data());
  else if (bf16_blocks_)
    post(kv16_[cur].data(), kv16_[1 - cur].data());
  else if (device)
    post(kv_dev_[cur].data(), kv_dev_[1 - cur].data());
  else
    post(kv_[cur].data(), kv_[1 - cur].data());
}

template <typename T>
void RingAttention<T>::land_block(const Ring& g, int slot, bool device) const {
  if (!bf16_blocks_) return;
  const std::int64_t count = g.n * g.W;
  if constexpr (std::is_same_v<T, float>) {
    if (device)
      ops::cast(kv_dev_[slot].data(), kv16_dev_[slot].data(), count, device_);
    else
      ops::cast(kv_[slot].data(), kv16_[slot].data(), count, Device::kCpu);
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
    kv_[i].resize(static_cast<std::size_t>(g.n * g.W));
    pos_[i].resize(static_cast<std::size_t>(seq));
  }
  // The block in hand first: this rank's keys and values, at its own positions.
  for (std::int64_t i = 0; i < g.n; ++i) std::copy_n(qkv + i * g.R + o.heads * o.head_dim, g.W, kv_[0].data() + i * g.W);
  if constexpr (std::is_same_v<T, float>) {
    if (bf16_blocks_) {  // rounded for the journey: they are bf16 values already
      for (auto& b : kv16_) b.resize(kv_[0].size());
      ops::cast(kv16_[0].data(), kv_[0].data(), g.n * g.W, Device::kCpu);
    }
  }
  if (positions)
    std::copy(positions, positions + seq, pos_[0].begin());
  else
    std::iota(pos_[0].begin(), pos_[0].end(), std::int64_t{0});
  return g;
}

template <typename T>
void RingAttention<T>::forward(const nn::Attention<T>& attn, const T* qkv, T* out, T* lse, std::int64_t batch,
                               std::int64_t seq, const std::int64_t* positions) const {
  const int P = cp_.size();
  if (device_ != Device::kCpu) return forward_device(attn, qkv, out, lse, batch, seq, positions);
  if (P == 1) return attn.forward(qkv, out, lse, batch, seq, positions);
  const Ring ring = start(attn, qkv, batch, seq, positions);
  const std::vector<std::int64_t> own = pos_[0];  // pos_[0] is overwritten as blocks arrive
  const nn::AttentionOptions& o = attn.options();
  const std::int64_t H = o.heads, R = ring.R, O = ring.O, W = ring.W, n = ring.n;
  part_out_.resize(static_cast<std::size_t>(n * O));
  part_lse_.resize(static_cast<std::size_t>(batch * H * seq));
  int cur = 0;
  for (int s = 0; s < P; ++s) {
    std::vector<comm::Work> works;
    if (s + 1 < P) pass_block(works, ring, cur, false);
    const auto t0 = Clock::now();
    if (s == 0 || any_visible(own.data(), pos_[cur].data(), seq)) {
      ++stats_.blocks_computed;
      for (std::int64_t b = 0; b < batch; ++b) {
        const nn::AttentionRows<const T> kv{
            .data = kv_[cur].data() + b * seq * W, .ld = W, .pos = pos_[cur].data(), .rows = seq};
        // Query rows in tile-aligned chunks, polling the transfers in flight between them:
        // without a progress thread MPI moves large messages only inside MPI calls.
        T* dst_out = s == 0 ? out + b * seq * O : part_out_.data() + b * seq * O;
        T* dst_lse = s == 0 ? lse + b * H * seq : part_lse_.data() + b * H * seq;
        nn::AttentionTiles tiles;
        for (std::int64_t r0 = 0; r0 < seq; r0 += kPollRows) {
          const std::int64_t rows = std::min(kPollRows, seq - r0);
          chunk_lse_.resize(static_cast<std::size_t>(H * rows));
          const nn::AttentionRows<const T> qc{
              .data = qkv + (b * seq + r0) * R, .ld = R, .pos = own.data() + r0, .rows = rows};
          tiles.elements += nn::attention_partial_forward<T>(
                                o, qc, kv, {.out = dst_out + r0 * O, .ld = O, .lse = chunk_lse_.data()})
                                .elements;
          for (std::int64_t h = 0; h < H; ++h)
            std::copy_n(chunk_lse_.data() + h * rows, rows, dst_lse + h * seq + r0);
          for (comm::Work& w : works) w.test();
        }
        if (s > 0)
          nn::attention_merge<T>(o, seq, out + b * seq * O, O, lse + b * H * seq, part_out_.data() + b * seq * O, O,
                                 part_lse_.data() + b * H * seq);
        stats_.score_elements += tiles.elements * H;
      }
    } else {
      ++stats_.blocks_skipped;
    }
    stats_.compute_seconds += since(t0);
    const auto t1 = Clock::now();
    comm::wait_all(works);
    stats_.exposed_seconds += since(t1);
    if (s + 1 < P) land_block(ring, 1 - cur, false);
    cur = 1 - cur;
  }
}

template <typename T>
void RingAttention<T>::backward(const nn::Attention<T>& attn, const T* dout, const T* qkv, const T* out,
                                const T* lse, T* dqkv, std::int64_t batch, std::int64_t seq,
                                const std::int64_t* positions) const {
  const int P = cp_.size();
  if (device_ != Device::kCpu) return backward_device(attn, dout, qkv, out, lse, dqkv, batch, seq, positions);
  if (P == 1) return attn.backward(dout, qkv, out, lse, dqkv, batch, seq, positions);
  const Ring ring = start(attn, qkv, batch, seq, positions);
  const std::vector<std::int64_t> own = pos_[0];  // pos_[0] is overwritten as blocks arrive
  const nn::AttentionOptions& o = attn.options();
  const std::int64_t H = o.heads, hd = o.head_dim, R = ring.R, O = ring.O, W = ring.W, n = ring.n;
  const int prev = ring.prev;
  for (int i = 0; i < 2; ++i) dkv_[i].resize(static_cast<std::size_t>(n * W));
  delta_.resize(static_cast<std::size_t>(batch * H * seq));
  for (std::int64_t b = 0; b < batch; ++b)
    nn::attention_row_dot<T>(o, seq, out + b * seq * O, O, dout + b * seq * O, O, delta_.data() + b * H * seq);
  acc_in_.resize(static_cast<std::size_t>(n * W));
  int cur = 0;
  comm::Work recv_acc, send_acc[2];
  for (int s = 0; s < P; ++s) {
    // The next key/value block travels while this one is computed. The dK/dV accumulator
    // of the block in hand (what the ranks that held it before added) is received
    // meanwhile too: this rank computes its own part into a zeroed buffer, adds the
    // accumulator and passes the sum on, so only the add waits for the previous rank.
    std::vector<comm::Work> works;
    if (s + 1 < P) pass_block(works, ring, cur, false);
    if (s > 0) recv_acc = cp_.recv_async(std::span<T>(acc_in_), prev, {.tag = kTagDkv});
    std::vector<T>& local = dkv_[s % 2];
    auto t = Clock::now();
    send_acc[s % 2].wait();  // the send of this buffer two steps ago
    stats_.exposed_seconds += since(t);
    t = Clock::now();
    std::fill(local.begin(), local.end(), T(0));
    if (s == 0 || any_visible(own.data(), pos_[cur].data(), seq)) {
      for (std::int64_t b = 0; b < batch; ++b) {
        const nn::AttentionRows<const T> kv{
            .data = kv_[cur].data() + b * seq * W, .ld = W, .pos = pos_[cur].data(), .rows = seq};
        for (std::int64_t r0 = 0; r0 < seq; r0 += kPollRows) {
          const std::int64_t rows = std::min(kPollRows, seq - r0);
          chunk_lse_.resize(static_cast<std::size_t>(2 * H * rows));
          T* clse = chunk_lse_.data();
          T* cdelta = clse + H * rows;
          for (std::int64_t h = 0; h < H; ++h) {
            std::copy_n(lse + b * H * seq + h * seq + r0, rows, clse + h * rows);
            std::copy_n(delta_.data() + b * H * seq + h * seq + r0, rows, cdelta + h * rows);
          }
          const nn::AttentionRows<const T> qc{
              .data = qkv + (b * seq + r0) * R, .ld = R, .pos = own.data() + r0, .rows = rows};
          nn::attention_partial_backward<T>(o, qc, kv,
                                            {.dout = dout + (b * seq + r0) * O,
                                             .ld_dout = O,
                                             .lse = clse,
                                             .delta = cdelta,
                                             .dq = dqkv + (b * seq + r0) * R,
                                             .ld_dq = R,
                                             .dkv = local.data() + b * seq * W,
                                             .ld_dkv = W});
          for (comm::Work& w : works) w.test();
          if (s > 0) recv_acc.test();
          send_acc[1 - s % 2].test();
        }
      }
    }
    stats_.compute_seconds += since(t);
    if (s > 0) {
      t = Clock::now();
      recv_acc.wait();
      stats_.exposed_seconds += since(t);
      for (std::int64_t i = 0; i < n * W; ++i) local[i] += acc_in_[i];
    }
    send_acc[s % 2] = send_dkv(local.data(), ring);
    t = Clock::now();
    comm::wait_all(works);
    stats_.exposed_seconds += since(t);
    if (s + 1 < P) land_block(ring, 1 - cur, false);
    cur = 1 - cur;
  }
  // After cp hops this rank's own block comes back with every rank's part of its dK/dV.
  auto t = Clock::now();
  cp_.recv(std::span<T>(acc_in_), prev, {.tag = kTagDkv});
  send_acc[0].wait();
  send_acc[1].wait();
  stats_.exposed_seconds += since(t);
  for (std::int64_t i = 0; i < n; ++i) {
    const T* d = acc_in_.data() + i * W;
    T* g = dqkv + i * R + H * hd;
    for (std::int64_t j = 0; j < W; ++j) g[j] += d[j];
  }
}

// ------------------------------------------------------------------------------- device

namespace {
// Resizes a device tensor to n elements (zeroed) only when its size changes.
template <typename U>
void device_size(Tensor<U>& t, std::int64_t n, Device device) {
  if (t.device() != device) t.set_device(device);
  if (t.numel() != n) t.resize({n});
}
}  // namespace

template <typename T>
typename RingAttention<T>::Ring RingAttention<T>::start_device(const nn::Attention<T>& attn, const T* qkv,
                                                               std::int64_t batch, std::int64_t seq,
                                                               const std::int64_t* positions) const {
  const Ring g = ring_of(attn, batch, seq);
  for (int i = 0; i < 2; ++i) {
    device_size(kv_dev_[i], g.n * g.W, device_);
    pos_[i].resize(static_cast<std::size_t>(seq));
  }
  // positions is device memory (the model's staged copy); the host needs them for the skips:
  // the model's host copy when the ring was given it, else copied back (a wait for the GPU).
  if (positions && static_cast<std::int64_t>(host_positions_.size()) == seq)
    std::copy(host_positions_.begin(), host_positions_.end(), pos_[0].begin());
  else if (positions)
    cuda::copy_to_host(pos_[0].data(), positions, static_cast<std::size_t>(seq) * sizeof(std::int64_t));
  else
    std::iota(pos_[0].begin(), pos_[0].end(), std::int64_t{0});
  ops::stage(qpos_dev_, pos_[0].data(), seq, device_);
#if NDMESH_WITH_CUDA
  if constexpr (std::is_same_v<T, float>) {
    cuda::copy_rows(kv_dev_[0].data(), g.W, qkv + attn.options().heads * attn.options().head_dim, g.R, g.n, g.W,
                    false);
    if (bf16_blocks_) {  // rounded for the journey: they are bf16 values already
      for (auto& b : kv16_dev_) device_size(b, g.n * g.W, device_);
      ops::cast(kv16_dev_[0].data(), kv_dev_[0].data(), g.n * g.W, device_);
    }
  }
#else
  (void)qkv;
#endif
  return g;
}

template <typename T>
void RingAttention<T>::forward_device(const nn::Attention<T>& attn, const T* qkv, T* out, T* lse,
                                      std::int64_t batch, std::int64_t seq, const std::int64_t* positions) const {
  ops::check_device<T>(device_);
#if NDMESH_WITH_CUDA
  if constexpr (std::is_same_v<T, float>) {
    const nn::AttentionOptions& o = attn.options();
    const int P = cp_.size();
    if (P == 1)
      return cuda::attention_forward(out, lse, qkv, batch, seq, o.heads, o.kv_heads, o.head_dim, positions);
    const Ring ring = start_device(attn, qkv, batch, seq, positions);
    const std::vector<std::int64_t> own = pos_[0];  // pos_[0] is overwritten as blocks arrive
    const std::int64_t H = o.heads, R = ring.R, W = ring.W, n = ring.n;
    device_size(part_out_dev_, n * ring.O, device_);
    device_size(part_lse_dev_, batch * H * seq, device_);
    int cur = 0;
    for (int s = 0; s < P; ++s) {
      std::vector<comm::Work> works;
      // The device messages first (one order on every rank), then the host positions.
      if (s + 1 < P) pass_block(works, ring, cur, true);
      const auto t0 = Clock::now();
      if (s == 0 || any_visible(own.data(), pos_[cur].data(), seq)) {
        ++stats_.blocks_computed;
        stats_.score_elements +=
            nn::attention_tiles(own.data(), seq, pos_[cur].data(), seq).elements * H * batch;
        const std::int64_t* kpos =
            s == 0 ? qpos_dev_.data() : ops::stage(kpos_dev_[cur], pos_[cur].data(), seq, device_);
        T* dst_out = s == 0 ? out : part_out_dev_.data();
        T* dst_lse = s == 0 ? lse : part_lse_dev_.data();
        cuda::attention_partial_forward(dst_out, dst_lse, qkv, R, qpos_dev_.data(), kv_dev_[cur].data(), W, kpos,
                                        batch, seq, H, o.kv_heads, o.head_dim);
        if (s > 0)
          cuda::attention_merge(out, lse, part_out_dev_.data(), part_lse_dev_.data(), batch, seq, H, o.head_dim);
      } else {
        ++stats_.blocks_skipped;
      }
      stats_.compute_seconds += since(t0);
      const auto t1 = Clock::now();
      comm::wait_all(works);
      stats_.exposed_seconds += since(t1);
      if (s + 1 < P) land_block(ring, 1 - cur, true);
      cur = 1 - cur;
    }
    return;
  }
#endif
  (void)attn, (void)qkv, (void)out, (void)lse, (void)batch, (void)seq, (void)positions;
}

template <typename T>
void RingAttention<T>::backward_device(const nn::Attention<T>& attn, const T* dout, const T* qkv, const T* out,
                                       const T* lse, T* dqkv, std::int64_t batch, std::int64_t seq,
                                       const std::int64_t* positions) const {
  ops::check_device<T>(device_);
#if NDMESH_WITH_CUDA
  if constexpr (std::is_same_v<T, float>) {
    const nn::AttentionOptions& o = attn.options();
    const int P = cp_.size();
    if (P == 1)
      return cuda::attention_backward(dqkv, dout, qkv, out, lse, batch, seq, o.heads, o.kv_heads, o.head_dim,
                                      positions);
    const Ring ring = start_device(attn, qkv, batch, seq, positions);
    const std::vector<std::int64_t> own = pos_[0];
    const std::int64_t H = o.heads, hd = o.head_dim, R = ring.R, W = ring.W, n = ring.n;
    for (int i = 0; i < 2; ++i) device_size(dkv_dev_[i], n * W, device_);
    device_size(acc_in_dev_, n * W, device_);
    device_size(delta_dev_, batch * H * seq, device_);
    cuda::attention_row_dot(delta_dev_.data(), out, dout, batch, seq, H, hd);
    const auto count = static_cast<std::size_t>(n * W);  // elements of a block and of its dK/dV
    int cur = 0;
    comm::Work recv_acc, send_acc[2];
    for (int s = 0; s < P; ++s) {
      // Device messages in one order on every rank (NCCL matches them in order per peer):
      // the accumulator of the block in hand, then the next block; the accumulator sent at
      // the end of the previous step is issued with them.
      if (s > 0) recv_acc = cp_.recv_async(std::span<T>(acc_in_dev_.data(), count), ring.prev, {.tag = kTagDkv});
      std::vector<comm::Work> works;
      if (s + 1 < P) pass_block(works, ring, cur, true);
      Tensor<T>& local = dkv_dev_[s % 2];
      auto t = Clock::now();
      send_acc[s % 2].wait();  // the send of this buffer two steps ago
      stats_.exposed_seconds += since(t);
      t = Clock::now();
      local.zero();
      if (s == 0 || any_visible(own.data(), pos_[cur].data(), seq)) {
        const std::int64_t* kpos =
            s == 0 ? qpos_dev_.data() : ops::stage(kpos_dev_[cur], pos_[cur].data(), seq, device_);
        cuda::attention_partial_backward(dqkv, R, local.data(), W, dout, qkv, R, qpos_dev_.data(), kv_dev_[cur].data(),
                                         W, kpos, lse, delta_dev_.data(), batch, seq, H, o.kv_heads, hd);
      }
      stats_.compute_seconds += since(t);
      if (s > 0) {
        t = Clock::now();
        recv_acc.wait();
        stats_.exposed_seconds += since(t);
        cuda::add_inplace(local.data(), acc_in_dev_.data(), n * W);
      }
      send_acc[s % 2] = send_dkv(local.data(), ring);
      t = Clock::now();
      comm::wait_all(works);
      stats_.exposed_seconds += since(t);
      if (s + 1 < P) land_block(ring, 1 - cur, true);
      cur = 1 - cur;
    }
    // After cp hops this rank's own block comes back with every rank's part of its dK/dV
    // (the receive is issued with the last send).
    auto t = Clock::now();
    cp_.recv(std::span<T>(acc_in_dev_.data(), count), ring.prev, {.tag = kTagDkv});
    send_acc[0].wait();
    send_acc[1].wait();
    stats_.exposed_seconds += since(t);
    cuda::copy_rows(dqkv + H * hd, R, acc_in_dev_.data(), W, n, W, true);
    return;
  }
#endif
  (void)attn, (void)dout, (void)qkv, (void)out, (void)lse, (void)dqkv, (void)batch, (void)seq, (void)positions;
}

template class RingAttention<float>;
template class RingAttention<double>;

}  // namespace ndmesh::parallel
