// nn::Attention on the device (cuda_ops.hpp): causal, grouped-query attention over packed
// qkv rows, flash-style (FlashAttention-2's algorithm in fp32 on the CUDA cores): no
// seq x seq matrix is ever stored, only 64 x 64 tiles in shared memory.
//
// Tiles: a block of 256 threads works on 64 query rows x 64 key rows; thread (tx, ty) =
// (t % 16, t / 16) owns the score entries of rows ty + 16 r and columns tx + 16 c (r, c <
// 4), and of an output tile the rows ty + 16 r and head-dimension columns tx + 16 c (c <
// DC = ceil(hd / 16)). Rows of Q, K, V, dO are staged in shared memory with a stride of
// hd + 1 floats (and score tiles with 65), so that the strided reads of a warp fall in
// distinct banks. A key tile with no key visible to any query of the tile (by position)
// is skipped before it is loaded; the mask itself is by position, element by element, so
// any positions work (sorted runs skip most).
//
// Forward, per (batch, head, query tile), over its key tiles (online softmax, as the CPU):
//   S = Q Kᵀ / sqrt(hd) (masked: -inf), m' = max(m, rowmax S), P = exp(S - m'),
//   l = l exp(m - m') + rowsum P, acc = acc exp(m - m') + P V, m = m';
//   out = acc / l, lse = m + log l (a row that sees no key: out = 0, lse = -inf).
// Backward, with D = rowsum(dO ∘ out) from a first small kernel, P = exp(S - lse):
//   dS = P ∘ (dO Vᵀ - D) / sqrt(hd), dV += Pᵀ dO, dK += dSᵀ Q, dQ += dS K,
// in two kernels so that every output element has one writer and no atomics are needed
// (deterministic): one per (batch, kv head, key tile) accumulates dK and dV over the
// query tiles of every query head of its group; one per (batch, head, query tile)
// accumulates dQ over the key tiles. S and dO Vᵀ are computed in both (7 tile products
// instead of 5), the price of determinism without a dQ buffer per key tile.
//
// Head dimensions up to 128 (DC = 2, 4 or 8 instantiated). This is the clean tiled version:
// scalar shared-memory loads, fp32 FMA (TF32 off, as the whole fp32 path); the bf16 path
// with tensor cores is the next step.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "ndmesh/nn/cuda_ops.hpp"
#include "tensor/cuda/common.cuh"
#if NDMESH_WITH_CUDNN
#include "nn/cuda/attention_cudnn.hpp"
#endif

namespace ndmesh::cuda {

namespace {

using detail::check;
using detail::check_launch;
using detail::compute_stream;

constexpr int kTile = 64;      // query rows and key rows of a tile
constexpr int kThreads = 256;  // 16 x 16
constexpr int kScoreLd = kTile + 1;
constexpr std::int64_t kNoQuery = INT64_MIN;  // position of a padding query row: sees nothing
constexpr std::int64_t kNoKey = INT64_MAX;    // position of a padding key row: seen by nothing

// Queries and keys/values are addressed separately (the ring's partial calls): query row t
// of sequence b starts at q + (b seq + t) q_ld (head h at + h hd), key/value row t at
// kv + (b seq + t) kv_ld with [k heads | v heads] (k head g at + g hd, v head g at + (KV + g)
// hd); the gradients dq and dkv are addressed the same way with dq_ld and dkv_ld. The whole
// attention is q = qkv, kv = qkv + H hd, every stride the qkv width.
struct Shape {
  std::int64_t seq;
  int heads, kv_heads, head_dim;
  const std::int64_t* qpos;  // [seq] positions of the query rows; nullptr: 0..seq-1
  const std::int64_t* kpos;  // [seq] positions of the key rows; nullptr: 0..seq-1
  std::int64_t q_ld, kv_ld, dq_ld, dkv_ld;
  float scale;

  __device__ std::int64_t qposition(std::int64_t t) const { return qpos ? qpos[t] : t; }
  __device__ std::int64_t kposition(std::int64_t t) const { return kpos ? kpos[t] : t; }
  __device__ int tiles() const { return static_cast<int>((seq + kTile - 1) / kTile); }
};

// dst[r * ld + d] = src[(row0 + r) * src_ld + d] for r < 64, d < hd (zeros past seq).
__device__ void load_tile(float* dst, int ld, const float* src, std::int64_t src_ld, std::int64_t row0,
                          std::int64_t seq, int hd) {
  for (int idx = threadIdx.x; idx < kTile * hd; idx += kThreads) {
    const int r = idx / hd, d = idx - r * hd;
    dst[r * ld + d] = row0 + r < seq ? src[(row0 + r) * src_ld + d] : 0.0f;
  }
}

// acc[r][c] = sum_d a[(ty + 16 r) * ld + d] * b[(tx + 16 c) * ld + d]: a 64 x 64 tile of
// A Bᵀ for row tiles A, B of width hd.
__device__ void tile_dot(float (&acc)[4][4], const float* a, const float* b, int hd, int ld) {
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll
  for (int r = 0; r < 4; ++r)
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[r][c] = 0.0f;
#pragma unroll 4
  for (int d = 0; d < hd; ++d) {
    float av[4], bv[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) av[r] = a[(ty + 16 * r) * ld + d];
#pragma unroll
    for (int c = 0; c < 4; ++c) bv[c] = b[(tx + 16 * c) * ld + d];
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[r][c] += av[r] * bv[c];
  }
}

// acc[r][c] += sum_j p[(ty + 16 r) * kScoreLd + j] * v[j * ld + tx + 16 c] over the 64
// columns j of the score tile p and the rows of v (hd wide).
template <int DC>
__device__ void tile_mul_acc(float (&acc)[4][DC], const float* p, const float* v, int hd, int ld) {
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll 4
  for (int j = 0; j < kTile; ++j) {
    float pv[4], vv[DC];
#pragma unroll
    for (int r = 0; r < 4; ++r) pv[r] = p[(ty + 16 * r) * kScoreLd + j];
#pragma unroll
    for (int c = 0; c < DC; ++c) vv[c] = tx + 16 * c < hd ? v[j * ld + tx + 16 * c] : 0.0f;
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int c = 0; c < DC; ++c) acc[r][c] += pv[r] * vv[c];
  }
}

// Over the 16 lanes that share a row (tx = 0..15 of one ty; every lane must call).
__device__ float row_max16(float v) {
  for (int o = 8; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ float row_sum16(float v) {
  for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// ------------------------------------------------------------------------------ forward

std::size_t forward_smem(int hd) {
  return 2 * kTile * sizeof(std::int64_t) + (3 * kTile * (hd + 1) + kTile * kScoreLd) * sizeof(float);
}

template <int DC>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(float* out, float* lse, const float* q, const float* kv, Shape s) {
  extern __shared__ std::int64_t smem_forward[];
  const int hd = s.head_dim, ld = hd + 1, tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  std::int64_t* qpos = smem_forward;
  std::int64_t* kpos = qpos + kTile;
  float* qs = reinterpret_cast<float*>(kpos + kTile);
  float* ks = qs + kTile * ld;
  float* vs = ks + kTile * ld;
  float* ps = vs + kTile * ld;

  const int tiles = s.tiles();
  const std::int64_t q0 = std::int64_t{tiles - 1 - static_cast<int>(blockIdx.x)} * kTile;  // longest first
  const int h = blockIdx.y, g = h / (s.heads / s.kv_heads);
  const std::int64_t b = blockIdx.z;
  const float* qrows = q + b * s.seq * s.q_ld;
  const float* kvrows = kv + b * s.seq * s.kv_ld;

  if (threadIdx.x < kTile)
    qpos[threadIdx.x] = q0 + threadIdx.x < s.seq ? s.qposition(q0 + threadIdx.x) : kNoQuery;
  load_tile(qs, ld, qrows + h * hd, s.q_ld, q0, s.seq, hd);
  __syncthreads();
  std::int64_t qmax = kNoQuery;
  for (int i = 0; i < kTile; ++i) qmax = qpos[i] > qmax ? qpos[i] : qmax;

  float m[4], l[4], acc[4][DC];
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    m[r] = -INFINITY, l[r] = 0.0f;
#pragma unroll
    for (int c = 0; c < DC; ++c) acc[r][c] = 0.0f;
  }

  for (int kt = 0; kt < tiles; ++kt) {
    const std::int64_t k0 = std::int64_t{kt} * kTile;
    __syncthreads();  // the previous tile's K, V, P and positions are no longer read
    if (threadIdx.x < kTile)
      kpos[threadIdx.x] = k0 + threadIdx.x < s.seq ? s.kposition(k0 + threadIdx.x) : kNoKey;
    if (!__syncthreads_or(threadIdx.x < kTile && kpos[threadIdx.x] <= qmax)) continue;
    load_tile(ks, ld, kvrows + std::int64_t{g} * hd, s.kv_ld, k0, s.seq, hd);
    load_tile(vs, ld, kvrows + std::int64_t{s.kv_heads + g} * hd, s.kv_ld, k0, s.seq, hd);
    __syncthreads();

    float sc[4][4];
    tile_dot(sc, qs, ks, hd, ld);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int i = ty + 16 * r;
      const std::int64_t qp = qpos[i];
      float mx = -INFINITY;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        sc[r][c] = kpos[tx + 16 * c] <= qp ? sc[r][c] * s.scale : -INFINITY;
        mx = fmaxf(mx, sc[r][c]);
      }
      const float m_new = fmaxf(m[r], row_max16(mx));
      const bool none = m_new == -INFINITY;  // nothing visible to this row yet
      float sum = 0.0f;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const float p = none ? 0.0f : expf(sc[r][c] - m_new);
        ps[i * kScoreLd + tx + 16 * c] = p;
        sum += p;
      }
      sum = row_sum16(sum);
      const float alpha = none ? 1.0f : expf(m[r] - m_new);  // 0 while m was -inf
      l[r] = l[r] * alpha + sum;
#pragma unroll
      for (int c = 0; c < DC; ++c) acc[r][c] *= alpha;
      m[r] = m_new;
    }
    __syncthreads();
    tile_mul_acc<DC>(acc, ps, vs, hd, ld);
  }

  const std::int64_t out_width = std::int64_t{s.heads} * hd;
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const std::int64_t t = q0 + ty + 16 * r;
    if (t >= s.seq) continue;
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    float* o = out + (b * s.seq + t) * out_width + std::int64_t{h} * hd;
#pragma unroll
    for (int c = 0; c < DC; ++c)
      if (tx + 16 * c < hd) o[tx + 16 * c] = acc[r][c] * inv;
    if (tx == 0) lse[(b * s.heads + h) * s.seq + t] = l[r] > 0.0f ? m[r] + logf(l[r]) : -INFINITY;
  }
}

// ----------------------------------------------------------------------------- backward

// delta[b, h, t] = sum_d dout[b, t, h, d] out[b, t, h, d]: one warp per (row, head).
__global__ void attention_delta_kernel(float* delta, const float* dout, const float* out, std::int64_t batch,
                                       std::int64_t seq, int heads, int hd) {
  const std::int64_t warp = (std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= batch * seq * heads) return;
  const std::int64_t row = warp / heads;  // b * seq + t
  const int h = static_cast<int>(warp % heads);
  const std::int64_t at = row * heads * hd + std::int64_t{h} * hd;
  float dot = 0.0f;
  for (int d = lane; d < hd; d += 32) dot += dout[at + d] * out[at + d];
  dot = detail::warp_sum(dot);
  if (lane == 0) {
    const std::int64_t b = row / seq, t = row % seq;
    delta[(b * heads + h) * seq + t] = dot;
  }
}

// Positions, lse and delta of the query rows q0.. of head h (padding rows see nothing).
__device__ void load_query_stats(std::int64_t* qpos, float* lse_s, float* delta_s, const float* lse,
                                 const float* delta, const Shape& s, std::int64_t b, int h, std::int64_t q0) {
  if (threadIdx.x >= kTile) return;
  const std::int64_t t = q0 + threadIdx.x;
  const bool valid = t < s.seq;
  const std::int64_t at = (b * s.heads + h) * s.seq + t;
  qpos[threadIdx.x] = valid ? s.qposition(t) : kNoQuery;
  lse_s[threadIdx.x] = valid ? lse[at] : -INFINITY;
  delta_s[threadIdx.x] = valid ? delta[at] : 0.0f;
}

// P and dS of one score entry (the query at position qp, the key at kp) from its unscaled
// q·k (score) and dO·v (dpv).
__device__ void probabilities(float& p, float& ds, float score, float dpv, std::int64_t qp, std::int64_t kp,
                              float lse_i, float delta_i, float scale) {
  p = kp <= qp && lse_i != -INFINITY ? expf(score * scale - lse_i) : 0.0f;
  ds = p * (dpv - delta_i) * scale;
}

// The shared memory of a backward block: the positions, lse and delta of 64 query rows,
// the positions of 64 key rows, tiles of Q, dO, K and V (hd + 1 floats a row) and
// `score_tiles` tiles of 64 x 65 scores.
struct BackwardShared {
  std::int64_t *qpos, *kpos;
  float *lse, *delta, *q, *dout, *k, *v, *scores;

  __device__ BackwardShared(std::int64_t* base, int hd) {
    const int ld = hd + 1;
    qpos = base, kpos = qpos + kTile;
    lse = reinterpret_cast<float*>(kpos + kTile), delta = lse + kTile;
    q = delta + kTile, dout = q + kTile * ld, k = dout + kTile * ld, v = k + kTile * ld;
    scores = v + kTile * ld;
  }
  static std::size_t bytes(int hd, int score_tiles) {
    return 2 * kTile * sizeof(std::int64_t) + 2 * kTile * sizeof(float) +
           (4 * kTile * (hd + 1) + score_tiles * kTile * kScoreLd) * sizeof(float);
  }
};

// dK, dV of one key tile of kv head g: sums over the query tiles of the group's heads.
template <int DC>
__global__ void __launch_bounds__(kThreads)
    attention_dkv_kernel(float* dkv, const float* dout, const float* q, const float* kv, const float* lse,
                         const float* delta, Shape s) {
  extern __shared__ std::int64_t smem_dkv[];
  const int hd = s.head_dim, ld = hd + 1, tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const BackwardShared sm(smem_dkv, hd);
  std::int64_t *qpos = sm.qpos, *kpos = sm.kpos;
  float *lse_s = sm.lse, *delta_s = sm.delta, *qs = sm.q, *dos = sm.dout, *ks = sm.k, *vs = sm.v;
  float* pts = sm.scores;                // Pᵀ [key][query]
  float* dsts = pts + kTile * kScoreLd;  // dSᵀ

  const int tiles = s.tiles(), group = s.heads / s.kv_heads;
  const std::int64_t k0 = std::int64_t{blockIdx.x} * kTile;
  const int g = blockIdx.y;
  const std::int64_t b = blockIdx.z, out_width = std::int64_t{s.heads} * hd;
  const float* qrows = q + b * s.seq * s.q_ld;
  const float* kvrows = kv + b * s.seq * s.kv_ld;
  const float* drows = dout + b * s.seq * out_width;

  if (threadIdx.x < kTile)
    kpos[threadIdx.x] = k0 + threadIdx.x < s.seq ? s.kposition(k0 + threadIdx.x) : kNoKey;
  load_tile(ks, ld, kvrows + std::int64_t{g} * hd, s.kv_ld, k0, s.seq, hd);
  load_tile(vs, ld, kvrows + std::int64_t{s.kv_heads + g} * hd, s.kv_ld, k0, s.seq, hd);
  __syncthreads();
  std::int64_t kmin = kNoKey;
  for (int j = 0; j < kTile; ++j) kmin = kpos[j] < kmin ? kpos[j] : kmin;

  float dk[4][DC], dv[4][DC];
#pragma unroll
  for (int r = 0; r < 4; ++r)
#pragma unroll
    for (int c = 0; c < DC; ++c) dk[r][c] = 0.0f, dv[r][c] = 0.0f;

  for (int h = g * group; h < (g + 1) * group; ++h)
    for (int qt = 0; qt < tiles; ++qt) {
      const std::int64_t q0 = std::int64_t{qt} * kTile;
      __syncthreads();
      load_query_stats(qpos, lse_s, delta_s, lse, delta, s, b, h, q0);
      if (!__syncthreads_or(threadIdx.x < kTile && qpos[threadIdx.x] >= kmin)) continue;
      load_tile(qs, ld, qrows + std::int64_t{h} * hd, s.q_ld, q0, s.seq, hd);
      load_tile(dos, ld, drows + std::int64_t{h} * hd, out_width, q0, s.seq, hd);
      __syncthreads();

      float st[4][4], dpt[4][4];  // [key ty + 16 r][query tx + 16 c]
      tile_dot(st, ks, qs, hd, ld);
      tile_dot(dpt, vs, dos, hd, ld);
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int j = ty + 16 * r, i = tx + 16 * c;
          float p, ds;
          probabilities(p, ds, st[r][c], dpt[r][c], qpos[i], kpos[j], lse_s[i], delta_s[i], s.scale);
          pts[j * kScoreLd + i] = p;
          dsts[j * kScoreLd + i] = ds;
        }
      __syncthreads();
      tile_mul_acc<DC>(dv, pts, dos, hd, ld);
      tile_mul_acc<DC>(dk, dsts, qs, hd, ld);
    }

  float* drow = dkv + b * s.seq * s.dkv_ld;
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const std::int64_t t = k0 + ty + 16 * r;
    if (t >= s.seq) continue;
    float* dkr = drow + t * s.dkv_ld + std::int64_t{g} * hd;
    float* dvr = drow + t * s.dkv_ld + std::int64_t{s.kv_heads + g} * hd;
#pragma unroll
    for (int c = 0; c < DC; ++c)
      if (tx + 16 * c < hd) dkr[tx + 16 * c] += dk[r][c], dvr[tx + 16 * c] += dv[r][c];
  }
}

// dQ of one query tile of head h: sums over its key tiles.
template <int DC>
__global__ void __launch_bounds__(kThreads)
    attention_dq_kernel(float* dq_out, const float* dout, const float* q, const float* kv, const float* lse,
                        const float* delta, Shape s) {
  extern __shared__ std::int64_t smem_dq[];
  const int hd = s.head_dim, ld = hd + 1, tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const BackwardShared sm(smem_dq, hd);
  std::int64_t *qpos = sm.qpos, *kpos = sm.kpos;
  float *lse_s = sm.lse, *delta_s = sm.delta, *qs = sm.q, *dos = sm.dout, *ks = sm.k, *vs = sm.v;
  float* dss = sm.scores;  // dS [query][key]

  const int tiles = s.tiles();
  const std::int64_t q0 = std::int64_t{tiles - 1 - static_cast<int>(blockIdx.x)} * kTile;  // longest first
  const int h = blockIdx.y, g = h / (s.heads / s.kv_heads);
  const std::int64_t b = blockIdx.z, out_width = std::int64_t{s.heads} * hd;
  const float* qrows = q + b * s.seq * s.q_ld;
  const float* kvrows = kv + b * s.seq * s.kv_ld;

  load_query_stats(qpos, lse_s, delta_s, lse, delta, s, b, h, q0);
  load_tile(qs, ld, qrows + std::int64_t{h} * hd, s.q_ld, q0, s.seq, hd);
  load_tile(dos, ld, dout + b * s.seq * out_width + std::int64_t{h} * hd, out_width, q0, s.seq, hd);
  __syncthreads();
  std::int64_t qmax = kNoQuery;
  for (int i = 0; i < kTile; ++i) qmax = qpos[i] > qmax ? qpos[i] : qmax;

  float dq[4][DC];
#pragma unroll
  for (int r = 0; r < 4; ++r)
#pragma unroll
    for (int c = 0; c < DC; ++c) dq[r][c] = 0.0f;

  for (int kt = 0; kt < tiles; ++kt) {
    const std::int64_t k0 = std::int64_t{kt} * kTile;
    __syncthreads();
    if (threadIdx.x < kTile)
      kpos[threadIdx.x] = k0 + threadIdx.x < s.seq ? s.kposition(k0 + threadIdx.x) : kNoKey;
    if (!__syncthreads_or(threadIdx.x < kTile && kpos[threadIdx.x] <= qmax)) continue;
    load_tile(ks, ld, kvrows + std::int64_t{g} * hd, s.kv_ld, k0, s.seq, hd);
    load_tile(vs, ld, kvrows + std::int64_t{s.kv_heads + g} * hd, s.kv_ld, k0, s.seq, hd);
    __syncthreads();

    float sc[4][4], dp[4][4];  // [query ty + 16 r][key tx + 16 c]
    tile_dot(sc, qs, ks, hd, ld);
    tile_dot(dp, dos, vs, hd, ld);
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int i = ty + 16 * r, j = tx + 16 * c;
        float p, ds;
        probabilities(p, ds, sc[r][c], dp[r][c], qpos[i], kpos[j], lse_s[i], delta_s[i], s.scale);
        dss[i * kScoreLd + j] = ds;
      }
    __syncthreads();
    tile_mul_acc<DC>(dq, dss, ks, hd, ld);
  }

#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const std::int64_t t = q0 + ty + 16 * r;
    if (t >= s.seq) continue;
    float* dqr = dq_out + (b * s.seq + t) * s.dq_ld + std::int64_t{h} * hd;
#pragma unroll
    for (int c = 0; c < DC; ++c)
      if (tx + 16 * c < hd) dqr[tx + 16 * c] += dq[r][c];
  }
}

// ------------------------------------------------------------- ring attention helpers

// nn::attention_merge for every (b, t, h): one thread each, the CPU's formula in float.
__global__ void attention_merge_kernel(float* out, float* lse, const float* part_out, const float* part_lse,
                                       std::int64_t batch, std::int64_t seq, int heads, int hd) {
  const std::int64_t idx = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (idx >= batch * seq * heads) return;
  const std::int64_t row = idx / heads;  // b * seq + t
  const int h = static_cast<int>(idx % heads);
  const std::int64_t b = row / seq, t = row % seq, at = (b * heads + h) * seq + t;
  const float a = lse[at], p = part_lse[at];
  if (p == -INFINITY) return;  // the part saw no visible key: nothing to add
  float* oa = out + row * heads * hd + std::int64_t{h} * hd;
  const float* ob = part_out + row * heads * hd + std::int64_t{h} * hd;
  if (a == -INFINITY) {
    for (int d = 0; d < hd; ++d) oa[d] = ob[d];
    lse[at] = p;
    return;
  }
  const float mx = fmaxf(a, p);
  const float wa = expf(a - mx), wb = expf(p - mx), sum = wa + wb;
  const float ca = wa / sum, cb = wb / sum;
  for (int d = 0; d < hd; ++d) oa[d] = ca * oa[d] + cb * ob[d];
  lse[at] = mx + logf(sum);
}

// dst[r * ld_dst + c] (+)= src[r * ld_src + c] for r < rows, c < cols.
__global__ void copy_rows_kernel(float* dst, std::int64_t ld_dst, const float* src, std::int64_t ld_src,
                                 std::int64_t rows, std::int64_t cols, bool accumulate) {
  const std::int64_t idx = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (idx >= rows * cols) return;
  const std::int64_t r = idx / cols, c = idx % cols;
  float* d = dst + r * ld_dst + c;
  const float v = src[r * ld_src + c];
  *d = accumulate ? *d + v : v;
}

// ------------------------------------------------------------------------------ launch

constexpr int kMaxHeadDim = 128;

void check_heads(std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim, const char* what) {
  if (heads <= 0 || kv_heads <= 0 || head_dim <= 0 || heads % kv_heads != 0)
    detail::fail_error(std::string(what) + ": heads=" + std::to_string(heads) +
                       " kv_heads=" + std::to_string(kv_heads) + " head_dim=" + std::to_string(head_dim) +
                       " (all positive, kv_heads dividing heads)");
  if (head_dim > kMaxHeadDim)
    detail::fail_error(std::string(what) + ": head_dim " + std::to_string(head_dim) +
                       " is above the CUDA kernel's limit of " + std::to_string(kMaxHeadDim) +
                       "; use fewer channels per head or --device cpu");
}

// The shape of a call over separately addressed query and key/value rows.
Shape make_shape(std::int64_t seq, std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim,
                 const std::int64_t* qpos, const std::int64_t* kpos, std::int64_t q_ld, std::int64_t kv_ld,
                 std::int64_t dq_ld, std::int64_t dkv_ld, const char* what) {
  check_heads(heads, kv_heads, head_dim, what);
  return Shape{seq,
               static_cast<int>(heads),
               static_cast<int>(kv_heads),
               static_cast<int>(head_dim),
               qpos,
               kpos,
               q_ld,
               kv_ld,
               dq_ld,
               dkv_ld,
               1.0f / std::sqrt(static_cast<float>(head_dim))};
}

// The whole attention over packed qkv rows: every stride the qkv width.
Shape whole_shape(std::int64_t seq, std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim,
                  const std::int64_t* positions, const char* what) {
  const std::int64_t width = (heads + 2 * kv_heads) * head_dim;
  return make_shape(seq, heads, kv_heads, head_dim, positions, positions, width, width, width, width, what);
}

// Raises the kernel's dynamic shared memory limit to `bytes`, then launches it.
template <typename Kernel, typename... Args>
void launch(Kernel kernel, dim3 grid, std::size_t bytes, const char* what, Args... args) {
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
        what);
  kernel<<<grid, kThreads, bytes, compute_stream()>>>(args...);
  check_launch(what);
}

template <int DC>
void forward(float* out, float* lse, const float* q, const float* kv, std::int64_t batch, const Shape& s) {
  const dim3 grid(static_cast<unsigned>((s.seq + kTile - 1) / kTile), static_cast<unsigned>(s.heads),
                  static_cast<unsigned>(batch));
  launch(attention_forward_kernel<DC>, grid, forward_smem(s.head_dim), "attention_forward", out, lse, q, kv, s);
}

template <int DC>
void backward(float* dq, float* dkv, const float* dout, const float* q, const float* kv, const float* lse,
              const float* delta, std::int64_t batch, const Shape& s) {
  const unsigned tiles = static_cast<unsigned>((s.seq + kTile - 1) / kTile);
  launch(attention_dkv_kernel<DC>,
         dim3(tiles, static_cast<unsigned>(s.kv_heads), static_cast<unsigned>(batch)),
         BackwardShared::bytes(s.head_dim, 2), "attention_backward (dk, dv)", dkv, dout, q, kv, lse, delta, s);
  launch(attention_dq_kernel<DC>, dim3(tiles, static_cast<unsigned>(s.heads), static_cast<unsigned>(batch)),
         BackwardShared::bytes(s.head_dim, 1), "attention_backward (dq)", dq, dout, q, kv, lse, delta, s);
}

void forward_any(float* out, float* lse, const float* q, const float* kv, std::int64_t batch, const Shape& s) {
  if (batch <= 0 || s.seq <= 0) return;
  if (s.head_dim <= 32)
    forward<2>(out, lse, q, kv, batch, s);
  else if (s.head_dim <= 64)
    forward<4>(out, lse, q, kv, batch, s);
  else
    forward<8>(out, lse, q, kv, batch, s);
}

void backward_any(float* dq, float* dkv, const float* dout, const float* q, const float* kv, const float* lse,
                  const float* delta, std::int64_t batch, const Shape& s) {
  if (batch <= 0 || s.seq <= 0) return;
  if (s.head_dim <= 32)
    backward<2>(dq, dkv, dout, q, kv, lse, delta, batch, s);
  else if (s.head_dim <= 64)
    backward<4>(dq, dkv, dout, q, kv, lse, delta, batch, s);
  else
    backward<8>(dq, dkv, dout, q, kv, lse, delta, batch, s);
}

unsigned blocks_for(std::int64_t threads) { return static_cast<unsigned>((threads + kThreads - 1) / kThreads); }

}  // namespace

void attention_forward(float* out, float* lse, const float* qkv, std::int64_t batch, std::int64_t seq,
                       std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim,
                       const std::int64_t* positions) {
  const Shape s = whole_shape(seq, heads, kv_heads, head_dim, positions, "attention_forward");
  forward_any(out, lse, qkv, qkv + heads * head_dim, batch, s);
}

void attention_row_dot(float* delta, const float* out, const float* dout, std::int64_t batch, std::int64_t seq,
                       std::int64_t heads, std::int64_t head_dim) {
  if (batch <= 0 || seq <= 0) return;
  const std::int64_t warps = batch * seq * heads;
  attention_delta_kernel<<<blocks_for(warps * 32), kThreads, 0, compute_stream()>>>(
      delta, dout, out, batch, seq, static_cast<int>(heads), static_cast<int>(head_dim));
  check_launch("attention_row_dot");
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                        std::int64_t batch, std::int64_t seq, std::int64_t heads, std::int64_t kv_heads,
                        std::int64_t head_dim, const std::int64_t* positions) {
  const Shape s = whole_shape(seq, heads, kv_heads, head_dim, positions, "attention_backward");
  if (batch <= 0 || seq <= 0) return;
  DeviceBuffer delta_buffer(static_cast<std::size_t>(batch * heads * seq) * sizeof(float));
  auto* delta = static_cast<float*>(delta_buffer.data());
  attention_row_dot(delta, out, dout, batch, seq, heads, head_dim);
  const std::int64_t q_width = heads * head_dim;
  backward_any(dqkv, dqkv + q_width, dout, qkv, qkv + q_width, lse, delta, batch, s);
}

void attention_partial_forward(float* out, float* lse, const float* q, std::int64_t q_ld, const std::int64_t* q_pos,
                               const float* kv, std::int64_t kv_ld, const std::int64_t* kv_pos, std::int64_t batch,
                               std::int64_t seq, std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim) {
  const Shape s = make_shape(seq, heads, kv_heads, head_dim, q_pos, kv_pos, q_ld, kv_ld, 0, 0,
                             "attention_partial_forward");
  forward_any(out, lse, q, kv, batch, s);
}

void attention_merge(float* out, float* lse, const float* part_out, const float* part_lse, std::int64_t batch,
                     std::int64_t seq, std::int64_t heads, std::int64_t head_dim) {
  if (batch <= 0 || seq <= 0) return;
  attention_merge_kernel<<<blocks_for(batch * seq * heads), kThreads, 0, compute_stream()>>>(
      out, lse, part_out, part_lse, batch, seq, static_cast<int>(heads), static_cast<int>(head_dim));
  check_launch("attention_merge");
}

void attention_partial_backward(float* dq, std::int64_t dq_ld, float* dkv, std::int64_t dkv_ld, const float* dout,
                                const float* q, std::int64_t q_ld, const std::int64_t* q_pos, const float* kv,
                                std::int64_t kv_ld, const std::int64_t* kv_pos, const float* lse, const float* delta,
                                std::int64_t batch, std::int64_t seq, std::int64_t heads, std::int64_t kv_heads,
                                std::int64_t head_dim) {
  const Shape s = make_shape(seq, heads, kv_heads, head_dim, q_pos, kv_pos, q_ld, kv_ld, dq_ld, dkv_ld,
                             "attention_partial_backward");
  backward_any(dq, dkv, dout, q, kv, lse, delta, batch, s);
}

void copy_rows(float* dst, std::int64_t ld_dst, const float* src, std::int64_t ld_src, std::int64_t rows,
               std::int64_t cols, bool accumulate) {
  if (rows <= 0 || cols <= 0) return;
  copy_rows_kernel<<<blocks_for(rows * cols), kThreads, 0, compute_stream()>>>(dst, ld_dst, src, ld_src, rows, cols,
                                                                               accumulate);
  check_launch("copy_rows");
}

// cuDNN attention (attention_cudnn.cpp) where it is built; without it (a build without
// NDMESH_CUDNN, and the CUDA emulator's translation of this file) it is never available and the
// flash kernel runs.
#if NDMESH_WITH_CUDNN
bool attention_forward_cudnn(float* out, float* lse, const float* qkv, std::int64_t batch, std::int64_t seq,
                             std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim, bool required) {
  return detail::cudnn_forward(out, lse, qkv, batch, seq, heads, kv_heads, head_dim, required);
}

bool attention_backward_cudnn(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                              std::int64_t batch, std::int64_t seq, std::int64_t heads, std::int64_t kv_heads,
                              std::int64_t head_dim, bool required) {
  return detail::cudnn_backward(dqkv, dout, qkv, out, lse, batch, seq, heads, kv_heads, head_dim, required);
}

bool attention_forward_cudnn(BFloat16* out, float* lse, const BFloat16* qkv, std::int64_t batch, std::int64_t seq,
                             std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim, bool required) {
  return detail::cudnn_forward(out, lse, qkv, batch, seq, heads, kv_heads, head_dim, required);
}

bool attention_backward_cudnn(BFloat16* dqkv, const BFloat16* dout, const BFloat16* qkv, const BFloat16* out,
                              const float* lse, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                              std::int64_t kv_heads, std::int64_t head_dim, bool required) {
  return detail::cudnn_backward(dqkv, dout, qkv, out, lse, batch, seq, heads, kv_heads, head_dim, required);
}

std::string attention_cudnn_unavailable_reason() { return detail::cudnn_unavailable_reason(); }
#else
namespace {
const char* const kNoCudnn = "this build has no cuDNN attention (configure with -DNDMESH_CUDNN=ON; docs/gpu.md)";
bool no_cudnn(bool required, const char* what) {
  if (required) detail::fail_config(std::string(what) + " under NDMESH_ATTENTION=cudnn: " + kNoCudnn);
  return false;
}
}  // namespace

bool attention_forward_cudnn(float*, float*, const float*, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                             std::int64_t, bool required) {
  return no_cudnn(required, "attention_forward_cudnn");
}

bool attention_backward_cudnn(float*, const float*, const float*, const float*, const float*, std::int64_t,
                              std::int64_t, std::int64_t, std::int64_t, std::int64_t, bool required) {
  return no_cudnn(required, "attention_backward_cudnn");
}

bool attention_forward_cudnn(BFloat16*, float*, const BFloat16*, std::int64_t, std::int64_t, std::int64_t,
                             std::int64_t, std::int64_t, bool required) {
  return no_cudnn(required, "attention_forward_cudnn");
}

bool attention_backward_cudnn(BFloat16*, const BFloat16*, const BFloat16*, const BFloat16*, const float*, std::int64_t,
                              std::int64_t, std::int64_t, std::int64_t, std::int64_t, bool required) {
  return no_cudnn(required, "attention_backward_cudnn");
}

std::string attention_cudnn_unavailable_reason() { return kNoCudnn; }
#endif

}  // namespace ndmesh::cuda
