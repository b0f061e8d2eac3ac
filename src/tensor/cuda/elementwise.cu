// Element-wise helpers and reductions on the device (cuda_ops.hpp, "tensor"): add, fill,
// scale, the double-precision sums, the bfloat16 casts, and the second pass of the
// deterministic column sums.
//
// The maps and the casts run a grid-stride loop over 16-byte accesses when every pointer is
// 16-byte aligned (a float4, or eight bf16), scalar otherwise and for the tail. Adds and
// multiplies use the _rn intrinsics so that nvcc does not contract them into FMAs: the
// results are those of the CPU loops bit for bit.
//
// The sums are deterministic: x is cut into ranges of 16384 elements, one block each (a
// function of n alone: every block has the same work), whose threads sum their share in
// double (float4 loads where aligned), each block reduces its threads in a fixed tree, and one
// block then sums the block results in the same fixed tree. The order differs from the CPU's
// left-to-right sum, but both are double: they agree to about 1e-15 relative.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ndmesh/nn/cuda_ops.hpp"
#include "tensor/cuda/common.cuh"

namespace ndmesh::cuda {

namespace {

using detail::blocks_for;
using detail::check_launch;
using detail::fail_error;
using detail::compute_stream;
using detail::kThreads;

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

struct Fill {
  float value;
  __device__ float operator()(float) const { return value; }
};
struct Scale {
  float factor;
  __device__ float operator()(float x) const { return __fmul_rn(x, factor); }
};
struct Add {
  __device__ float operator()(float a, float b) const { return __fadd_rn(a, b); }
};
// x rounded to the nearest bfloat16 (even on a tie; NaN stays a quiet NaN), kept as float:
// ndmesh::BFloat16's rounding, the bits to_bf16_kernel stores, widened again.
struct RoundBf16 {
  __device__ float operator()(float x) const {
    std::uint32_t u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return __uint_as_float((u | 0x400000u) & 0xffff0000u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return __uint_as_float(u & 0xffff0000u);
  }
};

// x[i] = f(x[i]) (vec: as float4 over the first n / 4 * 4 elements, then the tail).
template <typename F>
__global__ void map_kernel(float* x, std::int64_t n, bool vec, F f) {
  const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
  std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  std::int64_t done = 0;
  if (vec) {
    float4* x4 = reinterpret_cast<float4*>(x);
    const std::int64_t n4 = n / 4;
    for (std::int64_t k = i; k < n4; k += stride) {
      float4 v = x4[k];
      v.x = f(v.x), v.y = f(v.y), v.z = f(v.z), v.w = f(v.w);
      x4[k] = v;
    }
    done = n4 * 4;
  }
  for (std::int64_t k = done + i; k < n; k += stride) x[k] = f(x[k]);
}

// x[i] = f(x[i], y[i]).
template <typename F>
__global__ void zip_kernel(float* x, const float* y, std::int64_t n, bool vec, F f) {
  const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
  std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  std::int64_t done = 0;
  if (vec) {
    float4* x4 = reinterpret_cast<float4*>(x);
    const float4* y4 = reinterpret_cast<const float4*>(y);
    const std::int64_t n4 = n / 4;
    for (std::int64_t k = i; k < n4; k += stride) {
      float4 a = x4[k];
      const float4 b = y4[k];
      a.x = f(a.x, b.x), a.y = f(a.y, b.y), a.z = f(a.z, b.z), a.w = f(a.w, b.w);
      x4[k] = a;
    }
    done = n4 * 4;
  }
  for (std::int64_t k = done + i; k < n; k += stride) x[k] = f(x[k], y[k]);
}

template <typename F>
void map(float* x, std::int64_t n, F f, const char* name) {
  if (n <= 0) return;
  const bool vec = aligned16(x);
  map_kernel<F><<<blocks_for(vec ? (n + 3) / 4 : n), kThreads, 0, compute_stream()>>>(x, n, vec, f);
  check_launch(name);
}

// The block's sum of v in double, in a fixed tree (every thread must call it; the result
// is valid in thread 0).
__device__ double block_sum(double v) {
  __shared__ double warp_sums[32];
  v = detail::warp_sum(v);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  v = threadIdx.x < blockDim.x / 32 ? warp_sums[threadIdx.x] : 0.0;
  if (warp == 0) v = detail::warp_sum(v);
  return v;
}

// The sums cut x into ranges of kReduceSpan elements, one block of kReduceThreads each (the
// same work in every block); a thread adds its share of the range, 16-byte loads where the
// range is aligned, then the block's tree; a second pass adds the blocks' results.
constexpr int kReduceThreads = 1024;
constexpr std::int64_t kReduceSpan = std::int64_t{16} * kReduceThreads;

std::int64_t reduce_blocks(std::int64_t n) { return (n + kReduceSpan - 1) / kReduceSpan; }

// Thread t's share of x[r0, r1) (r0 a multiple of kReduceSpan): with `vec` the float4s of the
// range and then its tail, else one element at a time.
template <bool kSquare>
__device__ double range_sum(const float* x, std::int64_t r0, std::int64_t r1, bool vec) {
  double acc = 0;
  std::int64_t i = r0 + threadIdx.x;
  if (vec) {
    const float4* x4 = reinterpret_cast<const float4*>(x);
    for (std::int64_t q = r0 / 4 + threadIdx.x; q < r1 / 4; q += blockDim.x) {
      const float4 v = x4[q];
      const double a = v.x, b = v.y, c = v.z, d = v.w;
      acc += kSquare ? a * a : a;
      acc += kSquare ? b * b : b;
      acc += kSquare ? c * c : c;
      acc += kSquare ? d * d : d;
    }
    i = r1 / 4 * 4 + threadIdx.x;
  }
  for (; i < r1; i += blockDim.x) {
    const double v = x[i];
    acc += kSquare ? v * v : v;
  }
  return acc;
}

template <bool kSquare>
__global__ void partial_sum_kernel(double* partials, const float* x, std::int64_t n, bool vec) {
  const std::int64_t r0 = std::int64_t{blockIdx.x} * kReduceSpan;
  const double acc = block_sum(range_sum<kSquare>(x, r0, r0 + kReduceSpan < n ? r0 + kReduceSpan : n, vec));
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// *result = the partials' sum (kAccumulate: *result += it); thread t adds partials t, t + 1024, ...
template <bool kAccumulate>
__global__ void final_sum_kernel(double* result, const double* partials, std::int64_t count) {
  double v = 0;
  for (std::int64_t i = threadIdx.x; i < count; i += blockDim.x) v += partials[i];
  v = block_sum(v);
  if (threadIdx.x == 0) *result = kAccumulate ? *result + v : v;
}

// The sum (of squares) of x[0..n) into *result on the device (or added to it), no wait.
template <bool kSquare, bool kAccumulate>
void reduce_into(double* result, const float* x, std::int64_t n) {
  if (n <= 0) return;
  const std::int64_t blocks = reduce_blocks(n);
  DeviceBuffer scratch(static_cast<std::size_t>(blocks) * sizeof(double));
  double* partials = static_cast<double*>(scratch.data());
  partial_sum_kernel<kSquare><<<static_cast<unsigned>(blocks), kReduceThreads, 0, compute_stream()>>>(
      partials, x, n, aligned16(x));
  check_launch(kSquare ? "square_sum" : "sum");
  final_sum_kernel<kAccumulate><<<1, kReduceThreads, 0, compute_stream()>>>(result, partials, blocks);
  check_launch(kSquare ? "square_sum (final pass)" : "sum (final pass)");
}

template <bool kSquare>
double reduce(const float* x, std::int64_t n) {
  if (n <= 0) return 0.0;
  DeviceBuffer out(sizeof(double));
  reduce_into<kSquare, false>(static_cast<double*>(out.data()), x, n);
  double result = 0;
  copy_to_host(&result, out.data(), sizeof result);
  return result;
}

// ndmesh::BFloat16::from_float on the device: round to nearest even, NaN stays a quiet NaN.
// With `vec` (both pointers 16-byte aligned) eight elements at a time (two float4 loads, one
// 16-byte store), then the tail one at a time.
__global__ void to_bf16_kernel(std::uint16_t* dst, const float* src, std::int64_t n, bool vec) {
  const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
  std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x, done = 0;
  if (vec) {
    float v[8];
    for (std::int64_t q = i; q < n / 8; q += stride) {
      detail::load8(src + 8 * q, v);
      detail::store8(dst + 8 * q, v);
    }
    done = n / 8 * 8;
  }
  for (std::int64_t k = done + i; k < n; k += stride) dst[k] = detail::to_bf16(src[k]);
}

__global__ void from_bf16_kernel(float* dst, const std::uint16_t* src, std::int64_t n, bool vec) {
  const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
  std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x, done = 0;
  if (vec) {
    float v[8];
    for (std::int64_t q = i; q < n / 8; q += stride) {
      detail::load8(src + 8 * q, v);
      detail::store8(dst + 8 * q, v);
    }
    done = n / 8 * 8;
  }
  for (std::int64_t k = done + i; k < n; k += stride) dst[k] = __uint_as_float(static_cast<std::uint32_t>(src[k]) << 16);
}

// detail::column_sums: a block sums 8 columns of the partials [chunks, count * cols] over the
// chunks, kLanes lanes of chunks each (lane y: chunks y, y + kLanes, ...), then the lanes' sums
// in order y = 0, 1, ...; kWidth columns a thread (4: float4 loads and stores). Narrow blocks,
// so that the few kilobytes of columns of a LayerNorm still make a grid that fills the GPU.
constexpr int kSumColumns = 8;
template <int kWidth>
__global__ void column_sums_kernel(float* d0, float* d1, float* d2, const float* partials, std::int64_t chunks,
                                   std::int64_t cols, int count) {
  constexpr int kLanes = kWidth == 4 ? 64 : 16;
  __shared__ float sums[kLanes][kSumColumns + 1];
  const std::int64_t width = cols * count;
  const std::int64_t j = std::int64_t{blockIdx.x} * kSumColumns + threadIdx.x * kWidth;
  float acc[kWidth] = {};
  if (j < width)
    for (std::int64_t c = threadIdx.y; c < chunks; c += kLanes) {
      if constexpr (kWidth == 4) {
        const float4 v = *reinterpret_cast<const float4*>(partials + c * width + j);
        acc[0] = __fadd_rn(acc[0], v.x), acc[1] = __fadd_rn(acc[1], v.y);
        acc[2] = __fadd_rn(acc[2], v.z), acc[3] = __fadd_rn(acc[3], v.w);
      } else {
        acc[0] = __fadd_rn(acc[0], partials[c * width + j]);
      }
    }
  for (int k = 0; k < kWidth; ++k) sums[threadIdx.y][threadIdx.x * kWidth + k] = acc[k];
  __syncthreads();
  if (threadIdx.y != 0 || j >= width) return;
  float total[kWidth];
  for (int k = 0; k < kWidth; ++k) {
    total[k] = sums[0][threadIdx.x * kWidth + k];
    for (int y = 1; y < kLanes; ++y) total[k] = __fadd_rn(total[k], sums[y][threadIdx.x * kWidth + k]);
  }
  const std::int64_t q = j / cols, i = j % cols;  // a float4 never straddles two quantities (cols % 4 == 0)
  float* dst = (q == 0 ? d0 : q == 1 ? d1 : d2) + i;
  if constexpr (kWidth == 4) {
    float4 v = *reinterpret_cast<float4*>(dst);
    v.x = __fadd_rn(v.x, total[0]), v.y = __fadd_rn(v.y, total[1]);
    v.z = __fadd_rn(v.z, total[2]), v.w = __fadd_rn(v.w, total[3]);
    *reinterpret_cast<float4*>(dst) = v;
  } else {
    *dst = __fadd_rn(*dst, total[0]);
  }
}

}  // namespace

void add_inplace(float* dst, const float* src, std::int64_t n) {
  if (n <= 0) return;
  const bool vec = aligned16(dst) && aligned16(src);
  zip_kernel<Add>
      <<<blocks_for(vec ? (n + 3) / 4 : n), kThreads, 0, compute_stream()>>>(dst, src, n, vec, Add{});
  check_launch("add_inplace");
}

void fill(float* dst, float value, std::int64_t n) { map(dst, n, Fill{value}, "fill"); }

void scale(float* x, float factor, std::int64_t n) { map(x, n, Scale{factor}, "scale"); }

double square_sum(const float* x, std::int64_t n) { return reduce<true>(x, n); }

namespace {
// sums[0..count) added in order, as the host adds the pieces' results.
__global__ void ordered_sum_kernel(double* result, const double* sums, int count) {
  double acc = 0;
  for (int i = 0; i < count; ++i) acc += sums[i];
  *result = acc;
}

// Every piece's partial square sums in one launch. Block b belongs to the piece p with
// first[p] <= b < first[p + 1] and works as block b - first[p] of partial_sum_kernel<true> over
// that piece: the same partials, bit for bit.
__global__ void partial_square_sums_kernel(double* partials, const float* const* xs, const std::int64_t* ns,
                                           const std::int64_t* first, int count) {
  __shared__ const float* piece_x;
  __shared__ std::int64_t piece_n, piece_r0;
  const std::int64_t b = blockIdx.x;
  if (threadIdx.x == 0) {  // the block's piece, found once for all its threads
    int lo = 0, hi = count;  // first[lo] <= b < first[hi]
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (first[mid] <= b)
        lo = mid;
      else
        hi = mid;
    }
    piece_x = xs[lo], piece_n = ns[lo], piece_r0 = (b - first[lo]) * kReduceSpan;
  }
  __syncthreads();
  const std::int64_t n = piece_n, r0 = piece_r0;
  const float* x = piece_x;
  const bool vec = reinterpret_cast<std::uintptr_t>(x) % 16 == 0;
  const double acc = block_sum(range_sum<true>(x, r0, r0 + kReduceSpan < n ? r0 + kReduceSpan : n, vec));
  if (threadIdx.x == 0) partials[b] = acc;
}

// One block per piece: its partials summed as final_sum_kernel sums them (0 for an empty piece).
__global__ void piece_sums_kernel(double* sums, const double* partials, const std::int64_t* first) {
  const std::int64_t p = blockIdx.x, count = first[p + 1] - first[p];
  double v = 0;
  for (std::int64_t i = threadIdx.x; i < count; i += blockDim.x) v += partials[first[p] + i];
  v = block_sum(v);
  if (threadIdx.x == 0) sums[p] = v;
}
}  // namespace

void square_sum_many_into(double* result, const float* const* xs, const std::int64_t* ns, int count) {
  if (count <= 0) {
    memset_zero(result, sizeof(double));
    return;
  }
  // Three launches whatever the count: every piece's partials (reduce<true>'s blocks), each
  // piece's sum, the pieces' sums in order into *result. The table goes up with the
  // pointers: [xs | ns | first], first[p] the first block of piece p (count + 1 entries).
  std::vector<std::int64_t> table(static_cast<std::size_t>(3 * count + 1));
  std::int64_t blocks = 0;
  for (int i = 0; i < count; ++i) {
    table[static_cast<std::size_t>(i)] = static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(xs[i]));
    table[static_cast<std::size_t>(count + i)] = ns[i];
    table[static_cast<std::size_t>(2 * count + i)] = blocks;
    if (ns[i] > 0) blocks += reduce_blocks(ns[i]);
  }
  table[static_cast<std::size_t>(3 * count)] = blocks;
  DeviceBuffer meta(table.size() * sizeof(std::int64_t));
  upload(meta.data(), table.data(), table.size() * sizeof(std::int64_t));
  const auto* t = static_cast<const std::int64_t*>(meta.data());
  DeviceBuffer scratch((static_cast<std::size_t>(blocks) + static_cast<std::size_t>(count)) * sizeof(double));
  double* partials = static_cast<double*>(scratch.data());
  double* sums = partials + blocks;
  if (blocks > 0) {
    partial_square_sums_kernel<<<static_cast<unsigned>(blocks), kReduceThreads, 0, compute_stream()>>>(
        partials, reinterpret_cast<const float* const*>(t), t + count, t + 2 * count, count);
    check_launch("square_sum_many");
  }
  piece_sums_kernel<<<static_cast<unsigned>(count), kReduceThreads, 0, compute_stream()>>>(sums, partials,
                                                                                          t + 2 * count);
  check_launch("square_sum_many (piece sums)");
  ordered_sum_kernel<<<1, 1, 0, compute_stream()>>>(result, sums, count);
  check_launch("square_sum_many (pieces)");
}

double square_sum_many(const float* const* xs, const std::int64_t* ns, int count) {
  if (count <= 0) return 0.0;
  DeviceBuffer result(sizeof(double));
  square_sum_many_into(static_cast<double*>(result.data()), xs, ns, count);
  double host = 0;
  copy_to_host(&host, result.data(), sizeof host);
  return host;
}

double sum(const float* x, std::int64_t n) { return reduce<false>(x, n); }

void sum_into(double* acc, const float* x, std::int64_t n, bool accumulate) {
  if (accumulate)
    reduce_into<false, true>(acc, x, n);
  else if (n > 0)
    reduce_into<false, false>(acc, x, n);
  else
    memset_zero(acc, sizeof(double));
}

void round_to_bf16(float* x, std::int64_t n) { map(x, n, RoundBf16{}, "round to bfloat16"); }

void cast(BFloat16* dst, const float* src, std::int64_t n) {
  if (n <= 0) return;
  const bool vec = aligned16(dst) && aligned16(src);
  to_bf16_kernel<<<blocks_for(vec ? (n + 7) / 8 : n), kThreads, 0, compute_stream()>>>(
      reinterpret_cast<std::uint16_t*>(dst), src, n, vec);
  check_launch("cast to bfloat16");
}

void cast(float* dst, const BFloat16* src, std::int64_t n) {
  if (n <= 0) return;
  const bool vec = aligned16(dst) && aligned16(src);
  from_bf16_kernel<<<blocks_for(vec ? (n + 7) / 8 : n), kThreads, 0, compute_stream()>>>(
      dst, reinterpret_cast<const std::uint16_t*>(src), n, vec);
  check_launch("cast from bfloat16");
}

namespace detail {

void column_sums(float* const* dst, int count, const float* partials, std::int64_t chunks, std::int64_t cols) {
  if (cols <= 0 || count <= 0) return;
  if (count > 3) fail_error("column_sums takes at most 3 quantities, got " + std::to_string(count));
  bool vec = cols % 4 == 0 && aligned16(partials);
  for (int q = 0; q < count; ++q) vec = vec && aligned16(dst[q]);
  float* d[3] = {dst[0], count > 1 ? dst[1] : nullptr, count > 2 ? dst[2] : nullptr};
  const auto blocks = static_cast<unsigned>((cols * count + kSumColumns - 1) / kSumColumns);
  if (vec)
    column_sums_kernel<4><<<blocks, dim3(kSumColumns / 4, 64), 0, compute_stream()>>>(d[0], d[1], d[2], partials,
                                                                                      chunks, cols, count);
  else
    column_sums_kernel<1><<<blocks, dim3(kSumColumns, 16), 0, compute_stream()>>>(d[0], d[1], d[2], partials, chunks,
                                                                                  cols, count);
  check_launch("column sums");
}

}  // namespace detail

}  // namespace ndmesh::cuda
