// Blockwise attention (FlashAttention-2 style) over tiles of kAttentionTile queries x
// kAttentionTile keys, with the tile products as gemm calls addressed inside the packed
// rows (leading dimension = row width), so no head is ever copied out.
//
// Tiles: a tile pair whose smallest key position exceeds its largest query position is
// skipped; one whose largest key position is at most its smallest query position is fully
// visible and needs no mask; only the pairs in between are masked element-wise.
//
// Forward, per head and query tile, over its key tiles (online softmax): with the running
// row max m and sum l and the accumulator acc,
//   S = Q Kᵀ / sqrt(hd), m' = max(m, rowmax S), P = exp(S - m'),
//   l = l exp(m - m') + rowsum P, acc = acc exp(m - m') + P V, m = m';
// finally out = acc / l and lse = m + log l.
//
// Backward, per head and key tile, over its query tiles, with D = rowsum(dO ∘ out):
//   P = exp(S - lse), dV += Pᵀ dO, dP = dO Vᵀ, dS = P ∘ (dP - D) / sqrt(hd),
//   dQ += dS K, dK += dSᵀ Q.
#include "ndmesh/nn/attention.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "ndmesh/core/env.hpp"
#include "ndmesh/core/error.hpp"
#include "ndmesh/tensor/blas.hpp"
#include "tensor/cuda_twin.hpp"

namespace ndmesh::nn {

namespace {

constexpr std::int64_t kTile = kAttentionTile;

void check_options(const AttentionOptions& o) {
  NDMESH_CHECK(o.heads > 0 && o.kv_heads > 0 && o.head_dim > 0, "nn",
               "attention has heads={} kv_heads={} head_dim={}; all must be positive", o.heads, o.kv_heads,
               o.head_dim);
  NDMESH_CHECK(o.heads % o.kv_heads == 0, "nn", "kv_heads={} does not divide heads={}", o.kv_heads, o.heads);
}

// Row strides must at least span the heads they address; positions must be given.
template <typename T>
void check_rows(const AttentionOptions& o, const AttentionRows<const T>& q, const AttentionRows<const T>& kv,
                std::int64_t ld_q_side) {
  const std::int64_t qw = o.heads * o.head_dim, kvw = 2 * o.kv_heads * o.head_dim;
  NDMESH_CHECK(q.rows >= 0 && kv.rows >= 0, "nn", "attention has {} query rows and {} key rows", q.rows,
               kv.rows);
  NDMESH_CHECK(q.ld >= qw && ld_q_side >= qw, "nn",
               "attention query-side row strides {} and {} are below H*hd = {}", q.ld, ld_q_side, qw);
  NDMESH_CHECK(kv.ld >= kvw, "nn", "attention key/value row stride {} is below 2*KV*hd = {}", kv.ld, kvw);
  NDMESH_CHECK((q.rows == 0 || q.pos != nullptr) && (kv.rows == 0 || kv.pos != nullptr), "nn",
               "attention rows need their positions (pos is null)");
}

/// Smallest and largest position of each tile of rows.
struct TileSpan {
  std::int64_t begin, rows, min_pos, max_pos;
};

std::vector<TileSpan> tile_spans(const std::int64_t* pos, std::int64_t n) {
  std::vector<TileSpan> spans;
  spans.reserve(static_cast<std::size_t>((n + kTile - 1) / kTile));
  for (std::int64_t b = 0; b < n; b += kTile) {
    const std::int64_t rows = std::min(kTile, n - b);
    const auto [lo, hi] = std::minmax_element(pos + b, pos + b + rows);
    spans.push_back({b, rows, *lo, *hi});
  }
  return spans;
}

enum class Visibility { kNone, kFull, kMasked };

Visibility visibility(const TileSpan& q, const TileSpan& k) {
  if (k.min_pos > q.max_pos) return Visibility::kNone;
  if (k.max_pos <= q.min_pos) return Visibility::kFull;
  return Visibility::kMasked;
}

AttentionTiles count_tiles(const std::vector<TileSpan>& qs, const std::vector<TileSpan>& ks) {
  AttentionTiles t;
  for (const auto& q : qs)
    for (const auto& k : ks) {
      const Visibility v = visibility(q, k);
      if (v == Visibility::kNone) {
        ++t.skipped;
        continue;
      }
      ++t.computed;
      if (v == Visibility::kMasked) ++t.masked;
      t.elements += q.rows * k.rows;
    }
  return t;
}

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// exp for the score tiles. double keeps the libm exp (the tests compare to 1e-10). float
// uses a Cephes-style polynomial (about 1 ulp, exp(x) = 0 below the smallest normal, so
// exp(-inf) = 0) written without calls or branches, so that the loops over a tile row
// vectorise; libm's expf is a call per element.
inline double tile_exp(double x) { return std::exp(x); }

inline float tile_exp(float x) {
  constexpr float kMax = 88.3762626647949f, kMin = -87.3365447504019f;
  float xc = x > kMax ? kMax : x;
  xc = xc < kMin ? kMin : xc;
  // n = round(x / ln 2) by the 1.5 * 2^23 trick, r = x - n ln 2 in two parts.
  const float t = xc * 1.44269504088896341f + 12582912.0f;
  const float n = t - 12582912.0f;
  const float r = xc - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const float scale = std::bit_cast<float>((static_cast<std::int32_t>(n) + 127) << 23);
  return x < kMin ? 0.0f : p * scale;
}

// The largest of init and x[0..n), with 8 independent lanes so that it vectorises.
template <typename T>
T row_max(const T* x, std::int64_t n, T init) {
  T lane[8] = {init, init, init, init, init, init, init, init};
  std::int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int k = 0; k < 8; ++k) lane[k] = x[j + k] > lane[k] ? x[j + k] : lane[k];
  for (; j < n; ++j) lane[0] = x[j] > lane[0] ? x[j] : lane[0];
  T mx = lane[0];
  for (int k = 1; k < 8; ++k) mx = lane[k] > mx ? lane[k] : mx;
  return mx;
}

// x[j] = exp(x[j] - shift) for j < n.
inline void exp_shifted(double* x, std::int64_t n, double shift) {
  for (std::int64_t j = 0; j < n; ++j) x[j] = tile_exp(x[j] - shift);
}

// The float loop is the hottest element-wise loop of the layer: on x86-64 it is built for
// AVX2 too and picked at load time (the same operations per element, no FMA, so the same
// bits either way). Not under ThreadSanitizer: the ifunc resolver runs during relocation,
// before the TSan runtime exists, and crashes the program at load.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
__attribute__((target_clones("avx2", "default")))
#endif
void exp_shifted(float* x, std::int64_t n, float shift) {
  for (std::int64_t j = 0; j < n; ++j) x[j] = tile_exp(x[j] - shift);
}

// x[j] = exp(x[j] - shift) for j < n; returns the sum (8 lanes, a fixed order).
template <typename T>
T exp_shifted_sum(T* x, std::int64_t n, T shift) {
  exp_shifted(x, n, shift);
  T lane[8] = {};
  std::int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int k = 0; k < 8; ++k) lane[k] += x[j + k];
  for (; j < n; ++j) lane[0] += x[j];
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

}  // namespace

AttentionTiles attention_tiles(const std::int64_t* q_pos, std::int64_t nq, const std::int64_t* k_pos,
                               std::int64_t nk) {
  return count_tiles(tile_spans(q_pos, nq), tile_spans(k_pos, nk));
}

template <typename T>
AttentionTiles attention_partial_forward(const AttentionOptions& o, AttentionRows<const T> q,
                                         AttentionRows<const T> kv, AttentionOutputs<T> res) {
  check_options(o);
  check_rows(o, q, kv, res.ld);
  const std::int64_t H = o.heads, KV = o.kv_heads, hd = o.head_dim, group = H / KV;
  const std::int64_t nq = q.rows;
  const T scale = T(1) / std::sqrt(static_cast<T>(hd));
  const T neg_inf = static_cast<T>(kNegInf);
  const auto qs = tile_spans(q.pos, q.rows), ks = tile_spans(kv.pos, kv.rows);
  const AttentionTiles tiles = count_tiles(qs, ks);
  std::vector<T> s(static_cast<std::size_t>(kTile * kTile)), acc(static_cast<std::size_t>(kTile * hd));
  std::vector<T> m(static_cast<std::size_t>(kTile)), l(static_cast<std::size_t>(kTile));
  for (std::int64_t h = 0; h < H; ++h) {
    const std::int64_t g = h / group;
    for (const auto& qt : qs) {
      const std::int64_t ni = qt.rows;
      std::fill(m.begin(), m.end(), neg_inf);
      std::fill(l.begin(), l.end(), T(0));
      std::fill(acc.begin(), acc.end(), T(0));
      const T* qtile = q.data + qt.begin * q.ld + h * hd;
      for (const auto& kt : ks) {
        const Visibility vis = visibility(qt, kt);
        if (vis == Visibility::kNone) continue;
        const std::int64_t nj = kt.rows;
        const T* ktile = kv.data + kt.begin * kv.ld + g * hd;
        const T* vtile = kv.data + kt.begin * kv.ld + (KV + g) * hd;
        gemm<T>(false, true, ni, nj, hd, scale, qtile, q.ld, ktile, kv.ld, T(0), s.data(), nj);
        if (vis == Visibility::kMasked) {
          for (std::int64_t i = 0; i < ni; ++i) {
            const std::int64_t qp = q.pos[qt.begin + i];
            T* si = s.data() + i * nj;
            const std::int64_t* kp = kv.pos + kt.begin;
            for (std::int64_t j = 0; j < nj; ++j)
              if (kp[j] > qp) si[j] = neg_inf;
          }
        }
        for (std::int64_t i = 0; i < ni; ++i) {
          T* si = s.data() + i * nj;
          const T mx = row_max(si, nj, m[i]);
          if (mx == neg_inf) {  // nothing visible to this row yet
            std::fill(si, si + nj, T(0));
            continue;
          }
          const T sum = exp_shifted_sum(si, nj, mx);
          if (mx != m[i]) {
            const T alpha = std::exp(m[i] - mx);  // 0 when m was -inf
            l[i] *= alpha;
            T* ai = acc.data() + i * hd;
            for (std::int64_t d = 0; d < hd; ++d) ai[d] *= alpha;
            m[i] = mx;
          }
          l[i] += sum;
        }
        gemm<T>(false, false, ni, hd, nj, T(1), s.data(), nj, vtile, kv.ld, T(1), acc.data(), hd);
      }
      for (std::int64_t i = 0; i < ni; ++i) {
        T* oi = res.out + (qt.begin + i) * res.ld + h * hd;
        const T* ai = acc.data() + i * hd;
        T* lse = res.lse + h * nq + qt.begin + i;
        if (l[i] > T(0)) {
          const T inv = T(1) / l[i];
          for (std::int64_t d = 0; d < hd; ++d) oi[d] = ai[d] * inv;
          *lse = m[i] + std::log(l[i]);
        } else {
          std::fill(oi, oi + hd, T(0));
          *lse = neg_inf;
        }
      }
    }
  }
  return tiles;
}

template <typename T>
void attention_merge(const AttentionOptions& o, std::int64_t rows, T* out, std::int64_t ld, T* lse,
                     const T* part_out, std::int64_t ld_part, const T* part_lse) {
  check_options(o);
  const std::int64_t H = o.heads, hd = o.head_dim;
  const T neg_inf = static_cast<T>(kNegInf);
  for (std::int64_t h = 0; h < H; ++h)
    for (std::int64_t i = 0; i < rows; ++i) {
      T& a = lse[h * rows + i];
      const T b = part_lse[h * rows + i];
      if (b == neg_inf) continue;  // the part saw no visible key: nothing to add
      T* oa = out + i * ld + h * hd;
      const T* ob = part_out + i * ld_part + h * hd;
      if (a == neg_inf) {
        std::copy(ob, ob + hd, oa);
        a = b;
        continue;
      }
      const T mx = std::max(a, b);
      const T wa = std::exp(a - mx), wb = std::exp(b - mx), sum = wa + wb;
      const T ca = wa / sum, cb = wb / sum;
      for (std::int64_t d = 0; d < hd; ++d) oa[d] = ca * oa[d] + cb * ob[d];
      a = mx + std::log(sum);
    }
}

template <typename T>
void attention_row_dot(const AttentionOptions& o, std::int64_t rows, const T* out, std::int64_t ld_out,
                       const T* dout, std::int64_t ld_dout, T* delta) {
  check_options(o);
  const std::int64_t H = o.heads, hd = o.head_dim;
  for (std::int64_t h = 0; h < H; ++h)
    for (std::int64_t i = 0; i < rows; ++i) {
      const T* oi = out + i * ld_out + h * hd;
      const T* di = dout + i * ld_dout + h * hd;
      T dot = 0;
      for (std::int64_t d = 0; d < hd; ++d) dot += oi[d] * di[d];
      delta[h * rows + i] = dot;
    }
}

template <typename T>
AttentionTiles attention_partial_backward(const AttentionOptions& o, AttentionRows<const T> q,
                                          AttentionRows<const T> kv, const AttentionGrads<T>& g) {
  check_options(o);
  check_rows(o, q, kv, std::min(g.ld_dout, g.ld_dq));
  NDMESH_CHECK(g.ld_dkv >= 2 * o.kv_heads * o.head_dim, "nn",
               "attention key/value gradient row stride {} is below 2*KV*hd = {}", g.ld_dkv,
               2 * o.kv_heads * o.head_dim);
  const std::int64_t H = o.heads, KV = o.kv_heads, hd = o.head_dim, group = H / KV;
  const std::int64_t nq = q.rows;
  const T scale = T(1) / std::sqrt(static_cast<T>(hd));
  const T neg_inf = static_cast<T>(kNegInf);
  const auto qs = tile_spans(q.pos, q.rows), ks = tile_spans(kv.pos, kv.rows);
  const AttentionTiles tiles = count_tiles(qs, ks);
  std::vector<T> p(static_cast<std::size_t>(kTile * kTile)), dp(static_cast<std::size_t>(kTile * kTile));
  for (std::int64_t h = 0; h < H; ++h) {
    const std::int64_t kvh = h / group;
    for (const auto& kt : ks) {
      const std::int64_t nj = kt.rows;
      const T* ktile = kv.data + kt.begin * kv.ld + kvh * hd;
      const T* vtile = kv.data + kt.begin * kv.ld + (KV + kvh) * hd;
      T* dktile = g.dkv + kt.begin * g.ld_dkv + kvh * hd;
      T* dvtile = g.dkv + kt.begin * g.ld_dkv + (KV + kvh) * hd;
      for (const auto& qt : qs) {
        const Visibility vis = visibility(qt, kt);
        if (vis == Visibility::kNone) continue;
        const std::int64_t ni = qt.rows;
        const T* qtile = q.data + qt.begin * q.ld + h * hd;
        const T* dotile = g.dout + qt.begin * g.ld_dout + h * hd;
        T* dqtile = g.dq + qt.begin * g.ld_dq + h * hd;
        const T* lse = g.lse + h * nq + qt.begin;
        const T* delta = g.delta + h * nq + qt.begin;
        gemm<T>(false, true, ni, nj, hd, scale, qtile, q.ld, ktile, kv.ld, T(0), p.data(), nj);
        for (std::int64_t i = 0; i < ni; ++i) {
          T* pi = p.data() + i * nj;
          const T li = lse[i];
          if (li == neg_inf) {  // no visible key anywhere: no gradient through this row
            std::fill(pi, pi + nj, T(0));
            continue;
          }
          exp_shifted(pi, nj, li);
          if (vis == Visibility::kMasked) {
            const std::int64_t qp = q.pos[qt.begin + i];
            const std::int64_t* kp = kv.pos + kt.begin;
            for (std::int64_t j = 0; j < nj; ++j)
              if (kp[j] > qp) pi[j] = T(0);
          }
        }
        gemm<T>(true, false, nj, hd, ni, T(1), p.data(), nj, dotile, g.ld_dout, T(1), dvtile, g.ld_dkv);
        gemm<T>(false, true, ni, nj, hd, T(1), dotile, g.ld_dout, vtile, kv.ld, T(0), dp.data(), nj);
        for (std::int64_t i = 0; i < ni; ++i) {
          const T* pi = p.data() + i * nj;
          T* di = dp.data() + i * nj;
          const T dl = delta[i];
          for (std::int64_t j = 0; j < nj; ++j) di[j] = pi[j] * (di[j] - dl) * scale;
        }
        gemm<T>(false, false, ni, hd, nj, T(1), dp.data(), nj, ktile, kv.ld, T(1), dqtile, g.ld_dq);
        gemm<T>(true, false, nj, hd, ni, T(1), dp.data(), nj, qtile, q.ld, T(1), dktile, g.ld_dkv);
      }
    }
  }
  return tiles;
}

namespace {
// Query rows per piece between two polls of a batch call on the CPU: a tile multiple.
constexpr std::int64_t kPollRows = 4 * kTile;

// Calls piece(b, r0, rows) for every piece of query rows of every sequence, then poll.
template <typename Piece>
void for_pieces(std::int64_t batch, std::int64_t seq, const std::function<void()>& poll, Piece piece) {
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t r0 = 0; r0 < seq; r0 += kPollRows) {
      piece(b, r0, std::min(kPollRows, seq - r0));
      if (poll) poll();
    }
}
}  // namespace

template <typename T>
void attention_partial_forward(const AttentionOptions& o, const AttentionBatch<T>& x, T* out, T* lse,
                               Device device, const std::function<void()>& poll) {
  NDMESH_CUDA_TWIN(device, cuda::attention_partial_forward(out, lse, x.q, x.q_ld, x.q_pos, x.kv, x.kv_ld, x.kv_pos,
                                                           x.batch, x.seq, o.heads, o.kv_heads, o.head_dim))
  const std::int64_t H = o.heads, O = H * o.head_dim, seq = x.seq;
  std::vector<T> piece_lse;  // [H, rows]: the piece's lse, then into lse's [H, seq] rows
  for_pieces(x.batch, seq, poll, [&](std::int64_t b, std::int64_t r0, std::int64_t rows) {
    piece_lse.resize(static_cast<std::size_t>(H * rows));
    attention_partial_forward<T>(
        o, {.data = x.q + (b * seq + r0) * x.q_ld, .ld = x.q_ld, .pos = x.q_pos + r0, .rows = rows},
        {.data = x.kv + b * seq * x.kv_ld, .ld = x.kv_ld, .pos = x.kv_pos, .rows = seq},
        {.out = out + (b * seq + r0) * O, .ld = O, .lse = piece_lse.data()});
    for (std::int64_t h = 0; h < H; ++h)
      std::copy_n(piece_lse.data() + h * rows, rows, lse + (b * H + h) * seq + r0);
  });
}

template <typename T>
void attention_merge(const AttentionOptions& o, std::int64_t batch, std::int64_t seq, T* out, T* lse,
                     const T* part_out, const T* part_lse, Device device) {
  NDMESH_CUDA_TWIN(device, cuda::attention_merge(out, lse, part_out, part_lse, batch, seq, o.heads, o.head_dim))
  const std::int64_t H = o.heads, O = H * o.head_dim;
  for (std::int64_t b = 0; b < batch; ++b)
    attention_merge<T>(o, seq, out + b * seq * O, O, lse + b * H * seq, part_out + b * seq * O, O,
                       part_lse + b * H * seq);
}

template <typename T>
void attention_row_dot(const AttentionOptions& o, std::int64_t batch, std::int64_t seq, const T* out,
                       const T* dout, T* delta, Device device) {
  NDMESH_CUDA_TWIN(device, cuda::attention_row_dot(delta, out, dout, batch, seq, o.heads, o.head_dim))
  const std::int64_t H = o.heads, O = H * o.head_dim;
  for (std::int64_t b = 0; b < batch; ++b)
    attention_row_dot<T>(o, seq, out + b * seq * O, O, dout + b * seq * O, O, delta + b * H * seq);
}

template <typename T>
void attention_partial_backward(const AttentionOptions& o, const AttentionBatch<T>& x, const T* dout,
                                const T* lse, const T* delta, T* dq, std::int64_t dq_ld, T* dkv,
                                std::int64_t dkv_ld, Device device, const std::function<void()>& poll) {
  NDMESH_CUDA_TWIN(device, cuda::attention_partial_backward(dq, dq_ld, dkv, dkv_ld, dout, x.q, x.q_ld, x.q_pos, x.kv,
                                                            x.kv_ld, x.kv_pos, lse, delta, x.batch, x.seq, o.heads,
                                                            o.kv_heads, o.head_dim))
  const std::int64_t H = o.heads, O = H * o.head_dim, seq = x.seq;
  std::vector<T> piece;  // [H, rows] of lse, then [H, rows] of delta
  for_pieces(x.batch, seq, poll, [&](std::int64_t b, std::int64_t r0, std::int64_t rows) {
    piece.resize(static_cast<std::size_t>(2 * H * rows));
    T* plse = piece.data();
    T* pdelta = plse + H * rows;
    for (std::int64_t h = 0; h < H; ++h) {
      std::copy_n(lse + (b * H + h) * seq + r0, rows, plse + h * rows);
      std::copy_n(delta + (b * H + h) * seq + r0, rows, pdelta + h * rows);
    }
    attention_partial_backward<T>(
        o, {.data = x.q + (b * seq + r0) * x.q_ld, .ld = x.q_ld, .pos = x.q_pos + r0, .rows = rows},
        {.data = x.kv + b * seq * x.kv_ld, .ld = x.kv_ld, .pos = x.kv_pos, .rows = seq},
        {.dout = dout + (b * seq + r0) * O,
         .ld_dout = O,
         .lse = plse,
         .delta = pdelta,
         .dq = dq + (b * seq + r0) * dq_ld,
         .ld_dq = dq_ld,
         .dkv = dkv + b * seq * dkv_ld,
         .ld_dkv = dkv_ld});
  });
}

AttentionKernel attention_kernel(MatmulPrecision precision, bool positioned) {
  if (precision != MatmulPrecision::kBf16 || positioned) return AttentionKernel::kFlash;
  const std::string kernel = env::string("NDMESH_ATTENTION", "auto");
  return kernel == "flash"   ? AttentionKernel::kFlash
         : kernel == "cudnn" ? AttentionKernel::kCudnnRequired
                             : AttentionKernel::kCudnn;
}

template <typename T>
Attention<T>::Attention(AttentionOptions options) : options_(options) {
  check_options(options_);
}

template <typename T>
void Attention<T>::forward(const T* qkv, T* out, T* lse, std::int64_t batch, std::int64_t seq,
                           const std::int64_t* positions, Device device) const {
  NDMESH_CUDA_TWIN(device, cuda::attention_forward(out, lse, qkv, batch, seq, options_.heads, options_.kv_heads,
                                                   options_.head_dim, positions))
  const std::int64_t H = options_.heads, hd = options_.head_dim, R = qkv_width(), O = out_width();
  std::vector<std::int64_t> pos(static_cast<std::size_t>(seq));
  if (positions)
    std::copy(positions, positions + seq, pos.begin());
  else
    std::iota(pos.begin(), pos.end(), std::int64_t{0});
  for (std::int64_t b = 0; b < batch; ++b) {
    const T* rows = qkv + b * seq * R;
    attention_partial_forward<T>(options_, {.data = rows, .ld = R, .pos = pos.data(), .rows = seq},
                                 {.data = rows + H * hd, .ld = R, .pos = pos.data(), .rows = seq},
                                 {.out = out + b * seq * O, .ld = O, .lse = lse + b * H * seq});
  }
}

template <typename T>
void Attention<T>::backward(const T* dout, const T* qkv, const T* out, const T* lse, T* dqkv,
                            std::int64_t batch, std::int64_t seq, const std::int64_t* positions,
                            Device device) const {
  NDMESH_CUDA_TWIN(device, cuda::attention_backward(dqkv, dout, qkv, out, lse, batch, seq, options_.heads,
                                                    options_.kv_heads, options_.head_dim, positions))
  const std::int64_t H = options_.heads, hd = options_.head_dim, R = qkv_width(), O = out_width();
  std::vector<std::int64_t> pos(static_cast<std::size_t>(seq));
  if (positions)
    std::copy(positions, positions + seq, pos.begin());
  else
    std::iota(pos.begin(), pos.end(), std::int64_t{0});
  std::vector<T> delta(static_cast<std::size_t>(H * seq));
  for (std::int64_t b = 0; b < batch; ++b) {
    const T* rows = qkv + b * seq * R;
    T* drows = dqkv + b * seq * R;
    const T* dy = dout + b * seq * O;
    attention_row_dot<T>(options_, seq, out + b * seq * O, O, dy, O, delta.data());
    attention_partial_backward<T>(options_, {.data = rows, .ld = R, .pos = pos.data(), .rows = seq},
                                  {.data = rows + H * hd, .ld = R, .pos = pos.data(), .rows = seq},
                                  {.dout = dy,
                                   .ld_dout = O,
                                   .lse = lse + b * H * seq,
                                   .delta = delta.data(),
                                   .dq = drows,
                                   .ld_dq = R,
                                   .dkv = drows + H * hd,
                                   .ld_dkv = R});
  }
}

#define NDMESH_ATTENTION_INSTANTIATE(T)                                                                    \
  template AttentionTiles attention_partial_forward<T>(const AttentionOptions&, AttentionRows<const T>,    \
                                                       AttentionRows<const T>, AttentionOutputs<T>);       \
  template void attention_merge<T>(const AttentionOptions&, std::int64_t, T*, std::int64_t, T*, const T*,  \
                                   std::int64_t, const T*);                                                \
  template void attention_row_dot<T>(const AttentionOptions&, std::int64_t, const T*, std::int64_t,        \
                                     const T*, std::int64_t, T*);                                          \
  template AttentionTiles attention_partial_backward<T>(const AttentionOptions&, AttentionRows<const T>,   \
                                                        AttentionRows<const T>, const AttentionGrads<T>&); \
  template void attention_partial_forward<T>(const AttentionOptions&, const AttentionBatch<T>&, T*, T*,     \
                                             Device, const std::function<void()>&);                       \
  template void attention_merge<T>(const AttentionOptions&, std::int64_t, std::int64_t, T*, T*, const T*,  \
                                   const T*, Device);                                                      \
  template void attention_row_dot<T>(const AttentionOptions&, std::int64_t, std::int64_t, const T*,        \
                                     const T*, T*, Device);                                                \
  template void attention_partial_backward<T>(const AttentionOptions&, const AttentionBatch<T>&, const T*, \
                                              const T*, const T*, T*, std::int64_t, T*, std::int64_t,      \
                                              Device, const std::function<void()>&);                       \
  template class Attention<T>;

NDMESH_ATTENTION_INSTANTIATE(float)
NDMESH_ATTENTION_INSTANTIATE(double)
#undef NDMESH_ATTENTION_INSTANTIATE

}  // namespace ndmesh::nn
