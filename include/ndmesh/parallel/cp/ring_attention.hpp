// Context parallelism: each rank of the cp group holds some chunks of every sequence and
// runs everything but attention on its own tokens. Attention needs every earlier key:
// RingAttention passes key/value blocks ([k | v] rows and their global positions) around
// the cp ring. Each step posts the send of the block in hand to the next rank and the
// receive of the next block from the previous one, then computes the partial attention
// of the local queries against the block in hand (overlapped with the transfer), and
// merges it into the running (out, lse). The backward sends the blocks around again
// with a dK/dV accumulator that follows its block: each rank computes its part of the
// block in hand into a zeroed buffer while the accumulator so far arrives, adds it and
// passes the sum on; after cp hops the sum is back at the owner. Blocks the causal mask
// empties are skipped.
//
// One loop serves both devices: the ring's buffers live where the model's do (Device), and
// the partial attention, the merge and the backward are nn/attention.hpp's batch functions,
// which run the CPU code or its CUDA twin (nn/cuda_ops.hpp). On CUDA the blocks of [k | v]
// rows, the partial outputs and the travelling dK/dV are device memory passed through the
// group's device communicator (NCCL, or staged through pinned host memory), and the positions
// travel as host vectors (the skip decisions are made on the host) with a device copy per
// block for the kernels. NCCL has no tags, so the messages are posted in one order on every
// rank (each step: the dK/dV accumulator's receive, then the block's send and receive) and
// every send is issued together with the next receives.
//
// Under bf16 products the keys and values are bf16 values (the block keeps q, k, v in bf16 and
// widens them for the ring's fp32 kernels), so the blocks travel in bf16, exactly: half the
// bytes of the forward's and the backward's block transfers. The dK/dV accumulators are fp32
// sums and travel so.
//
// Layouts: a sequence of seq tokens is cut into 2*cp chunks; zigzag gives rank i chunks
// i and 2cp-1-i (every rank gets the same amount of causal work), contiguous gives rank i
// the tokens [i*seq/cp, (i+1)*seq/cp) (the last rank does about 2x the mean).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ndmesh/comm/communicator.hpp"
#include "ndmesh/nn/attention.hpp"
#include "ndmesh/parallel/tp/tp_comm.hpp"
#include "ndmesh/tensor/tensor.hpp"

namespace ndmesh::parallel {

enum class CpLayout { kZigzag, kContiguous };

/// "zigzag" or "contiguous"; ConfigError naming --cp-layout otherwise.
CpLayout parse_cp_layout(const std::string& name);
const char* to_string(CpLayout layout);

/// Problems with cutting `seq` over `cp` ranks (one line each naming --seq and --cp and the fix).
std::vector<std::string> cp_problems(std::int64_t seq, std::int64_t cp, CpLayout layout);

/// The global positions rank `rank` of `cp` holds of a sequence of `seq`, ascending.
std::vector<std::int64_t> cp_positions(std::int64_t seq, std::int64_t cp, std::int64_t rank, CpLayout layout);

/// Counters of a RingAttention since construction (or reset()).
struct RingAttentionStats {
  std::int64_t score_elements = 0;  ///< forward: query x key score elements computed, summed over heads and batch
  std::int64_t blocks_computed = 0;  ///< forward: key/value blocks with some visible key
  std::int64_t blocks_skipped = 0;   ///< forward: blocks the causal mask empties
  double compute_seconds = 0;        ///< forward + backward: partial kernels and merges
  double exposed_seconds = 0;        ///< forward + backward: waiting for ring transfers (and the neighbours)
  CommCount kv;   ///< forward + backward: key/value blocks sent (with their positions' bytes not counted)
  CommCount dkv;  ///< backward: dK/dV accumulators sent
};

/// The attention core of a context-parallel rank (see above). Collective over `cp`: every
/// member constructs it (the ring sends on its own duplicate of `cp`, comm/tags.hpp) and
/// calls forward/backward with the same batch, seq and layer shape.
template <typename T>
class RingAttention final : public nn::AttentionCore<T> {
 public:
  /// `device`: where the attention's buffers live (the model's device). `positions`: this
  /// rank's positions of a sequence (cp_positions), what the model passes to every call; on
  /// CUDA the ring reads them here instead of copying the model's device copy back to the
  /// host (a wait for the GPU) in every layer's forward and backward. Empty: copied back.
  /// `bf16_blocks`: the keys and values given are bf16 values (a float ring under bf16
  /// products): the blocks travel rounded to bf16, which changes none of them.
  explicit RingAttention(const comm::Communicator& cp, Device device = Device::kCpu,
                         std::vector<std::int64_t> positions = {}, bool bf16_blocks = false);

  void forward(const nn::Attention<T>& attn, const T* qkv, T* out, T* lse, std::int64_t batch, std::int64_t seq,
               const std::int64_t* positions) const override;
  void backward(const nn::Attention<T>& attn, const T* dout, const T* qkv, const T* out, const T* lse, T* dqkv,
                std::int64_t batch, std::int64_t seq, const std::int64_t* positions) const override;

  const RingAttentionStats& stats() const { return stats_; }
  void reset() { stats_ = {}; }

 private:
  // Sizes of one call and the ring neighbours.
  struct Ring {
    std::int64_t R, O, W, n;  // qkv row width, output row width, k|v row width, rows
    int next, prev;
  };
  // The layer's row widths and this rank's ring neighbours in the cp group (host and device).
  Ring ring_of(const nn::Attention<T>& attn, std::int64_t batch, std::int64_t seq) const;
  // Sizes the ring buffers and puts this rank's keys, values and positions in slot 0 (the
  // positions on the host).
  Ring start(const nn::Attention<T>& attn, const T* qkv, std::int64_t batch, std::int64_t seq,
             const std::int64_t* positions) const;
  // Posts the send of the block in hand (slot `cur`) to the next rank and the receive of the
  // next block into slot 1 - cur, in bf16 (kv16_) or T (kv_); counted.
  void pass_block(std::vector<comm::Work>& works, const Ring& g, int cur) const;
  // After the transfers: the block received in `slot` widened into the kernels' T buffer (bf16
  // blocks only).
  void land_block(const Ring& g, int slot) const;
  // Sends the dK/dV accumulator `data` (n W elements of T) to the next rank, counted.
  comm::Work send_dkv(const T* data, const Ring& g) const;
  comm::Communicator cp_;
  Device device_ = Device::kCpu;
  std::vector<std::int64_t> host_positions_;  // the model's positions, on the host (may be empty)
  bool bf16_blocks_ = false;                  // blocks travel in bf16 (kv16_)
  mutable RingAttentionStats stats_;
  // Ring buffers on device_, reused between calls: [k | v] rows of the block in hand and the
  // next, the travelling dK/dV, partial results, D, and the positions where the kernels read
  // them (own queries; the block in hand: CUDA only, the CPU reads pos_).
  mutable Tensor<T> kv_[2], dkv_[2], acc_in_, part_out_, part_lse_, delta_;
  mutable Tensor<std::int64_t> qpos_dev_, kpos_dev_[2];
  // The positions of the block in hand and the next, on the host.
  mutable std::vector<std::int64_t> pos_[2];
  // The blocks as they travel under bf16_blocks_; kv_ then holds the block in hand widened for
  // the kernels.
  mutable Tensor<BFloat16> kv16_[2];
};

}  // namespace ndmesh::parallel
