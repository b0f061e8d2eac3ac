// nn::Embedding on the device (cuda_ops.hpp): token rows (of this rank's vocabulary shard)
// and position rows in the forward; the two table gradients in the backward.
// embedding_forward does both rows in one pass (whole vocabulary) into fp32 or bf16, and the
// backward also reads a bf16 d output (detail::load).
//
// The backward is deterministic and adds in the CPU's order. Every row r of dout goes to one
// row of each table (its token's, its position's), and the CPU adds the rows r in increasing
// order. The tokens (and the positions) are on the host already (the model copied them up), so
// the rows are bucketed there, as llm.c does: one bucket per table row, its rows in increasing
// r (for the position table: every sequence of the batch in turn, and in it the positions
// that share the row), the buckets largest first (the longest run starts first). One block
// per bucket then adds the bucket's rows into the table row in that order, eight channels a
// thread with 16-byte accesses where the rows allow: the same sums in the same order as the
// CPU, so the same bits, and one read of dout per table. With the usual positions (all
// distinct) the position table's buckets are the batch's sums of each position.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "ndmesh/nn/cuda_ops.hpp"
#include "tensor/cuda/common.cuh"

namespace ndmesh::cuda {

namespace {

using detail::bits;
using detail::check_launch;
using detail::compute_stream;
using detail::is_aligned16;
using detail::kThreads;
using detail::load;
using detail::load8;
using detail::store;
using detail::store8;

unsigned column_blocks(std::int64_t channels) {
  return static_cast<unsigned>((channels + kThreads - 1) / kThreads);
}
unsigned capped(std::int64_t rows) { return static_cast<unsigned>(rows < 65535 ? rows : 65535); }

// Threads along a row when a thread moves eight channels: a whole number of warps, at most 128.
int lanes_for(std::int64_t channels) {
  const std::int64_t groups = (channels + 7) / 8;
  return static_cast<int>(groups < 128 ? (groups + 31) / 32 * 32 : 128);
}

__global__ void tokens_forward_kernel(float* out, const std::int32_t* tokens, const float* wte,
                                      std::int64_t rows, std::int64_t channels, std::int64_t vocab_start,
                                      std::int64_t local_vocab) {
  const std::int64_t c = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  for (std::int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const std::int64_t local = tokens[r] - vocab_start;
    out[r * channels + c] = local >= 0 && local < local_vocab ? wte[local * channels + c] : 0.0f;
  }
}

__global__ void positions_forward_kernel(float* out, const float* wpe, const std::int64_t* positions,
                                         std::int64_t first_row, std::int64_t rows, std::int64_t seq,
                                         std::int64_t channels) {
  const std::int64_t c = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  for (std::int64_t i = blockIdx.y; i < rows; i += gridDim.y) {
    float& o = out[i * channels + c];
    o = __fadd_rn(o, wpe[positions[(first_row + i) % seq] * channels + c]);
  }
}

// Tokens and positions in one pass (whole vocabulary): wte + wpe as the two kernels above
// add them (__fadd_rn), stored as S (float, or bfloat16 bits: one rounding). Block b takes
// rows 4 b .. 4 b + 3 (threadIdx.y), whose token and position one thread reads into shared
// memory; its lanes (threadIdx.x) take eight channels at a time, 16-byte accesses with kVec.
constexpr int kRowsPerBlock = 4;
template <typename S, bool kVec>
__global__ void fused_forward_kernel(S* out, const std::int32_t* tokens, const float* wte, const float* wpe,
                                     const std::int64_t* positions, std::int64_t rows, std::int64_t seq,
                                     std::int64_t channels) {
  __shared__ std::int64_t token_row[kRowsPerBlock], position_row[kRowsPerBlock];
  const std::int64_t r = std::int64_t{blockIdx.x} * kRowsPerBlock + threadIdx.y;
  if (threadIdx.x == 0 && r < rows) token_row[threadIdx.y] = tokens[r], position_row[threadIdx.y] = positions[r % seq];
  __syncthreads();
  if (r >= rows) return;
  const float* te = wte + token_row[threadIdx.y] * channels;
  // Without a position table (rotary positions) the token's row alone.
  const float* pe = wpe != nullptr ? wpe + position_row[threadIdx.y] * channels : nullptr;
  S* o = out + r * channels;
  for (std::int64_t j = threadIdx.x * 8; j < channels; j += blockDim.x * 8) {
    if constexpr (kVec) {
      float a[8], b[8];
      load8(te + j, a);
      if (pe != nullptr) {
        load8(pe + j, b);
        for (int k = 0; k < 8; ++k) a[k] = __fadd_rn(a[k], b[k]);
      }
      store8(o + j, a);
    } else {
      for (std::int64_t k = j; k < j + 8 && k < channels; ++k)
        store(o + k, pe != nullptr ? __fadd_rn(te[k], pe[k]) : te[k]);
    }
  }
}

// table[key, :] += dout[r, :] for the rows r of each bucket, in the bucket's order, starting from
// the table's value: bucket b is buckets[3 b .. 3 b + 2] = (key, first, count) over `rows`. The
// bucket and, a tile at a time, its row numbers are read once into shared memory for the
// block; a thread keeps its eight channels' sums in registers (channels <= 8 x 128 x kGroups).
constexpr int kRowTile = 128;
template <typename S, bool kVec, int kGroups>
__global__ void add_buckets_kernel(float* table, const S* dout, const std::int32_t* buckets,
                                   const std::int32_t* rows, std::int64_t channels) {
  __shared__ std::int64_t bucket[3];
  __shared__ std::int32_t tile[kRowTile];
  if (threadIdx.x < 3) bucket[threadIdx.x] = buckets[3 * std::int64_t{blockIdx.x} + threadIdx.x];
  __syncthreads();
  const std::int64_t key = bucket[0], first = bucket[1], count = bucket[2];
  float* t = table + key * channels;
  float acc[kGroups][8] = {};
  for (int g = 0; g < kGroups; ++g) {
    const std::int64_t j = (threadIdx.x + std::int64_t{g} * blockDim.x) * 8;
    if constexpr (kVec) {
      if (j < channels) load8(t + j, acc[g]);
    } else {
      for (int k = 0; k < 8; ++k) acc[g][k] = j + k < channels ? t[j + k] : 0.0f;
    }
  }
  for (std::int64_t i0 = 0; i0 < count; i0 += kRowTile) {
    const std::int64_t n = count - i0 < kRowTile ? count - i0 : kRowTile;
    __syncthreads();  // the last tile's rows are read
    for (std::int64_t k = threadIdx.x; k < n; k += blockDim.x) tile[k] = rows[first + i0 + k];
    __syncthreads();
    for (std::int64_t i = 0; i < n; ++i) {
      const S* d = dout + std::int64_t{tile[i]} * channels;
      for (int g = 0; g < kGroups; ++g) {
        const std::int64_t j = (threadIdx.x + std::int64_t{g} * blockDim.x) * 8;
        float v[8];
        if constexpr (kVec) {
          if (j >= channels) continue;
          load8(d + j, v);
        } else {
          for (int k = 0; k < 8; ++k) v[k] = j + k < channels ? load(d + j + k) : 0.0f;
        }
        for (int k = 0; k < 8; ++k) acc[g][k] = __fadd_rn(acc[g][k], v[k]);
      }
    }
  }
  for (int g = 0; g < kGroups; ++g) {
    const std::int64_t j = (threadIdx.x + std::int64_t{g} * blockDim.x) * 8;
    if constexpr (kVec) {
      if (j < channels) store8(t + j, acc[g]);
    } else {
      for (int k = 0; k < 8 && j + k < channels; ++k) t[j + k] = acc[g][k];
    }
  }
}

// Host: the buckets of (key, row) pairs, rows in the order given, largest bucket first (ties:
// the smaller key), appended to `table` ([key, first, count] each, `first` into `order`, which
// gets the rows).
void add_buckets(std::vector<std::pair<std::int64_t, std::int32_t>>& pairs, std::vector<std::int32_t>& table,
                 std::vector<std::int32_t>& order) {
  std::stable_sort(pairs.begin(), pairs.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  struct Bucket {
    std::int64_t key, first, count;
  };
  std::vector<Bucket> found;
  for (std::size_t i = 0; i < pairs.size();) {
    std::size_t j = i;
    while (j < pairs.size() && pairs[j].first == pairs[i].first) ++j;
    found.push_back({pairs[i].first, static_cast<std::int64_t>(i), static_cast<std::int64_t>(j - i)});
    i = j;
  }
  std::stable_sort(found.begin(), found.end(), [](const Bucket& a, const Bucket& b) { return a.count > b.count; });
  const auto base = static_cast<std::int64_t>(order.size());
  for (const auto& [key, row] : pairs) order.push_back(row);
  for (const Bucket& f : found) {
    table.push_back(static_cast<std::int32_t>(f.key));
    table.push_back(static_cast<std::int32_t>(base + f.first));
    table.push_back(static_cast<std::int32_t>(f.count));
  }
}

template <typename S>
void backward(float* dwte, float* dwpe, const S* dout, const std::int32_t* tokens, const std::int64_t* positions,
              std::int64_t rows, std::int64_t seq, std::int64_t channels, std::int64_t vocab_start,
              std::int64_t local_vocab) {
  if (rows <= 0 || channels <= 0) return;
  if (rows > INT32_MAX)
    detail::fail_error("embedding_backward: " + std::to_string(rows) + " rows exceed int32");
  // The buckets of both tables, rows in the CPU's order: the token table's by token (rows of
  // this rank's shard only), the position table's by position (sequence by sequence).
  std::vector<std::pair<std::int64_t, std::int32_t>> pairs;
  std::vector<std::int32_t> table, order;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t local = tokens[r] - vocab_start;
    if (local >= 0 && local < local_vocab) pairs.emplace_back(local, static_cast<std::int32_t>(r));
  }
  add_buckets(pairs, table, order);
  const std::int64_t token_buckets = static_cast<std::int64_t>(table.size()) / 3;
  pairs.clear();
  for (std::int64_t r = 0; r < rows; ++r) pairs.emplace_back(positions[r % seq], static_cast<std::int32_t>(r));
  add_buckets(pairs, table, order);
  const std::int64_t position_buckets = static_cast<std::int64_t>(table.size()) / 3 - token_buckets;
  // [table | order] on the device, through the upload ring (no host wait), in a buffer of the
  // most it can need for this shape (the same size class every step: the caching allocator
  // serves it from the step before, whatever the number of distinct tokens).
  const std::int64_t tables = 3 * ((rows < local_vocab ? rows : local_vocab) + seq), most = tables + 2 * rows;
  std::vector<std::int32_t> both(static_cast<std::size_t>(tables + static_cast<std::int64_t>(order.size())), -1);
  std::copy(table.begin(), table.end(), both.begin());
  std::copy(order.begin(), order.end(), both.begin() + tables);
  DeviceBuffer meta(static_cast<std::size_t>(most) * sizeof(std::int32_t));
  auto* t = static_cast<std::int32_t*>(meta.data());
  const std::int32_t* rows_of = t + tables;
  upload(t, both.data(), both.size() * sizeof(std::int32_t));
  const bool vec = channels % 8 == 0 && is_aligned16(dout) && is_aligned16(dwte) && is_aligned16(dwpe);  // null: aligned
  const int lanes = lanes_for(channels);
  const std::int64_t groups = (channels + 8 * lanes - 1) / (8 * lanes);
  if (groups > 4)
    detail::fail_error("embedding_backward: " + std::to_string(channels) + " channels exceed the 4096 it handles");
  auto launch = [&](float* dst, const std::int32_t* buckets, std::int64_t count, const char* what) {
    if (count == 0) return;
    const auto grid = static_cast<unsigned>(count);
#define NDMESH_BUCKETS(G)                                                                                          \
  if (vec)                                                                                                         \
    add_buckets_kernel<S, true, G><<<grid, lanes, 0, compute_stream()>>>(dst, dout, buckets, rows_of, channels);   \
  else                                                                                                             \
    add_buckets_kernel<S, false, G><<<grid, lanes, 0, compute_stream()>>>(dst, dout, buckets, rows_of, channels);
    if (groups <= 1) {
      NDMESH_BUCKETS(1)
    } else if (groups == 2) {
      NDMESH_BUCKETS(2)
    } else {
      NDMESH_BUCKETS(4)
    }
#undef NDMESH_BUCKETS
    check_launch(what);
  };
  launch(dwte, t, token_buckets, "embedding_backward (token table)");
  if (dwpe != nullptr)  // a model with rotary positions has no position table
    launch(dwpe, t + 3 * token_buckets, position_buckets, "embedding_backward (position table)");
}

template <typename S>
void fused_forward(S* out, const std::int32_t* tokens, const float* wte, const float* wpe,
                   const std::int64_t* positions, std::int64_t rows, std::int64_t seq, std::int64_t channels) {
  if (rows <= 0 || channels <= 0) return;
  const dim3 block(static_cast<unsigned>(lanes_for(channels)), kRowsPerBlock);
  const auto blocks = static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
  if (channels % 8 == 0 && is_aligned16(out) && is_aligned16(wte) && is_aligned16(wpe))
    fused_forward_kernel<S, true><<<blocks, block, 0, compute_stream()>>>(out, tokens, wte, wpe, positions, rows, seq,
                                                                          channels);
  else
    fused_forward_kernel<S, false><<<blocks, block, 0, compute_stream()>>>(out, tokens, wte, wpe, positions, rows,
                                                                           seq, channels);
  check_launch("embedding_forward");
}

}  // namespace

void embedding_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe,
                       const std::int64_t* positions, std::int64_t rows, std::int64_t seq, std::int64_t channels) {
  fused_forward(out, tokens, wte, wpe, positions, rows, seq, channels);
}

void embedding_forward(BFloat16* out, const std::int32_t* tokens, const float* wte, const float* wpe,
                       const std::int64_t* positions, std::int64_t rows, std::int64_t seq, std::int64_t channels) {
  fused_forward(bits(out), tokens, wte, wpe, positions, rows, seq, channels);
}

void embedding_backward(float* dwte, float* dwpe, const BFloat16* dout, const std::int32_t* tokens,
                        const std::int64_t* positions, std::int64_t rows, std::int64_t seq, std::int64_t channels) {
  backward(dwte, dwpe, bits(dout), tokens, positions, rows, seq, channels, 0, INT64_MAX);
}

void embedding_tokens_forward(float* out, const std::int32_t* tokens, const float* wte, std::int64_t rows,
                              std::int64_t channels, std::int64_t vocab_start, std::int64_t local_vocab) {
  if (rows <= 0 || channels <= 0) return;
  tokens_forward_kernel<<<dim3(column_blocks(channels), capped(rows)), kThreads, 0, compute_stream()>>>(
      out, tokens, wte, rows, channels, vocab_start, local_vocab);
  check_launch("embedding_tokens_forward");
}

void embedding_positions_forward(float* out, const float* wpe, const std::int64_t* positions,
                                 std::int64_t first_row, std::int64_t rows, std::int64_t seq,
                                 std::int64_t channels) {
  if (rows <= 0 || channels <= 0) return;
  positions_forward_kernel<<<dim3(column_blocks(channels), capped(rows)), kThreads, 0, compute_stream()>>>(
      out, wpe, positions, first_row, rows, seq, channels);
  check_launch("embedding_positions_forward");
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens,
                        const std::int64_t* positions, std::int64_t rows, std::int64_t seq,
                        std::int64_t channels, std::int64_t vocab_start, std::int64_t local_vocab) {
  backward(dwte, dwpe, dout, tokens, positions, rows, seq, channels, vocab_start, local_vocab);
}

}  // namespace ndmesh::cuda
