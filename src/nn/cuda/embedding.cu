// nn::Embedding on the device (cuda_ops.hpp): token rows (of this rank's vocabulary shard)
// and position rows in the forward; the two table gradients in the backward.
// embedding_forward does both rows in one pass (whole vocabulary) into fp32 or bf16, and the
// backward also reads a bf16 d output (detail::load).
//
// The backward is deterministic and adds in the CPU's order. Every row r of dout goes to
// one row of a table (its token's, its position's), and the CPU adds the rows r in
// increasing order. Here the rows are grouped by table row with a stable counting rank:
// the slot of row r is the number of rows whose (key, row) pair sorts before (key[r], r),
// so `sorted` lists each table row's rows together, in increasing r. One block per slot
// and column chunk then acts only where a group starts and adds the group's rows in that
// order. No atomics: the same sums in the same order as the CPU, so the same bits.
//
// The rank counts over all rows (quadratic in rows = batch x seq, on integers, tiled
// through shared memory): about 0.3 G key comparisons for 16K rows, a few tens of
// microseconds on an H100. A radix sort (cub::DeviceRadixSort) scales better and is the
// step after this one if larger micro-batches need it.
#include <cuda_runtime.h>

#include <cstdint>

#include "ndmesh/nn/cuda_ops.hpp"
#include "tensor/cuda/common.cuh"

namespace ndmesh::cuda {

namespace {

using detail::bits;
using detail::check_launch;
using detail::compute_stream;
using detail::kThreads;
using detail::load;
using detail::store;

constexpr std::int64_t kNoRow = INT64_MAX;  // key of a row that adds to no table row
constexpr int kRankTile = 256;

unsigned column_blocks(std::int64_t channels) {
  return static_cast<unsigned>((channels + kThreads - 1) / kThreads);
}
unsigned capped(std::int64_t rows) { return static_cast<unsigned>(rows < 65535 ? rows : 65535); }

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
// add them (__fadd_rn), stored as S (float, or bfloat16 bits: one rounding).
template <typename S>
__global__ void fused_forward_kernel(S* out, const std::int32_t* tokens, const float* wte, const float* wpe,
                                     const std::int64_t* positions, std::int64_t rows, std::int64_t seq,
                                     std::int64_t channels) {
  const std::int64_t c = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  for (std::int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const float t = wte[std::int64_t{tokens[r]} * channels + c];  // without a position table: the token's row
    store(out + r * channels + c, wpe != nullptr ? __fadd_rn(t, wpe[positions[r % seq] * channels + c]) : t);
  }
}

// The table row each row of dout adds to: its token's row in the shard (kNoRow outside the
// shard) and its position's row.
__global__ void keys_kernel(std::int64_t* token_keys, std::int64_t* position_keys, const std::int32_t* tokens,
                            const std::int64_t* positions, std::int64_t rows, std::int64_t seq,
                            std::int64_t vocab_start, std::int64_t local_vocab) {
  const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
  for (std::int64_t r = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; r < rows; r += stride) {
    const std::int64_t local = tokens[r] - vocab_start;
    token_keys[r] = local >= 0 && local < local_vocab ? local : kNoRow;
    position_keys[r] = positions[r % seq];
  }
}

// sorted[slot(r)] = r, slot(r) = #{r' : (keys[r'], r') < (keys[r], r)}: a stable sort.
__global__ void stable_rank_kernel(std::int32_t* sorted, const std::int64_t* keys, std::int64_t rows) {
  __shared__ std::int64_t tile[kRankTile];
  const std::int64_t r = std::int64_t{blockIdx.x} * kRankTile + threadIdx.x;
  const std::int64_t key = r < rows ? keys[r] : 0;
  std::int64_t slot = 0;
  for (std::int64_t t0 = 0; t0 < rows; t0 += kRankTile) {
    __syncthreads();
    if (t0 + threadIdx.x < rows) tile[threadIdx.x] = keys[t0 + threadIdx.x];
    __syncthreads();
    const int count = rows - t0 < kRankTile ? static_cast<int>(rows - t0) : kRankTile;
    for (int j = 0; j < count; ++j) {
      const std::int64_t k = tile[j];
      slot += (k < key) | ((k == key) & (t0 + j < r));
    }
  }
  if (r < rows) sorted[slot] = static_cast<std::int32_t>(r);
}

// table[key, c] += dout[r, c] for the rows r of each group, in slot (= increasing r) order.
template <typename S>
__global__ void add_groups_kernel(float* table, const S* dout, const std::int64_t* keys,
                                  const std::int32_t* sorted, std::int64_t rows, std::int64_t channels) {
  const std::int64_t slot = blockIdx.x;
  const std::int64_t key = keys[sorted[slot]];
  if (key == kNoRow || (slot > 0 && keys[sorted[slot - 1]] == key)) return;  // not the start of a group
  const std::int64_t c = std::int64_t{blockIdx.y} * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  float acc = table[key * channels + c];
  for (std::int64_t s = slot; s < rows; ++s) {
    const std::int64_t r = sorted[s];
    if (keys[r] != key) break;
    acc = __fadd_rn(acc, load(dout + r * channels + c));
  }
  table[key * channels + c] = acc;
}

// table[keys[r], :] += dout[r, :] for every row, grouped as above (sorted: rows int32).
template <typename S>
void add_rows_by_key(float* table, const S* dout, const std::int64_t* keys, std::int32_t* sorted,
                     std::int64_t rows, std::int64_t channels, const char* what) {
  stable_rank_kernel<<<static_cast<unsigned>((rows + kRankTile - 1) / kRankTile), kRankTile, 0,
                       compute_stream()>>>(sorted, keys, rows);
  check_launch(what);
  add_groups_kernel<S><<<dim3(static_cast<unsigned>(rows), column_blocks(channels)), kThreads, 0,
                      compute_stream()>>>(table, dout, keys, sorted, rows, channels);
  check_launch(what);
}

template <typename S>
void backward(float* dwte, float* dwpe, const S* dout, const std::int32_t* tokens, const std::int64_t* positions,
              std::int64_t rows, std::int64_t seq, std::int64_t channels, std::int64_t vocab_start,
              std::int64_t local_vocab) {
  if (rows <= 0 || channels <= 0) return;
  if (rows > INT32_MAX)
    detail::fail_error("embedding_backward: " + std::to_string(rows) + " rows exceed int32");
  // [token keys | position keys] (int64), then the sorted slots (int32).
  DeviceBuffer scratch(static_cast<std::size_t>(rows) * (2 * sizeof(std::int64_t) + sizeof(std::int32_t)));
  auto* token_keys = static_cast<std::int64_t*>(scratch.data());
  std::int64_t* position_keys = token_keys + rows;
  auto* sorted = reinterpret_cast<std::int32_t*>(position_keys + rows);
  keys_kernel<<<detail::blocks_for(rows), kThreads, 0, compute_stream()>>>(
      token_keys, position_keys, tokens, positions, rows, seq, vocab_start, local_vocab);
  check_launch("embedding_backward (keys)");
  add_rows_by_key(dwte, dout, token_keys, sorted, rows, channels, "embedding_backward (token table)");
  if (dwpe != nullptr)  // a model with rotary positions has no position table
    add_rows_by_key(dwpe, dout, position_keys, sorted, rows, channels, "embedding_backward (position table)");
}

template <typename S>
void fused_forward(S* out, const std::int32_t* tokens, const float* wte, const float* wpe,
                   const std::int64_t* positions, std::int64_t rows, std::int64_t seq, std::int64_t channels) {
  if (rows <= 0 || channels <= 0) return;
  fused_forward_kernel<S><<<dim3(column_blocks(channels), capped(rows)), kThreads, 0, compute_stream()>>>(
      out, tokens, wte, wpe, positions, rows, seq, channels);
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
