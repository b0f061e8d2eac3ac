// Element-wise helpers and reductions on the device (cuda_ops.hpp, "tensor"): add, fill,
// scale, the double-precision sums, the bfloat16 casts, and the second pass of the
// deterministic column sums.
//
// The maps run a grid-stride loop over float4 when every pointer is 16-byte aligned (one
// 16-byte access per thread and step), scalar otherwise and for the tail. Adds and
// multiplies use the _rn intrinsics so that nvcc does not contract them into FMAs: the
// results are those of the CPU loops bit for bit.
//
// The sums are deterministic: a fixed grid (a function of n alone) of threads sums its
// grid-stride share in double, each block reduces its threads in a fixed tree, and one
// block then sums the block results in the same fixed tree. The order differs from the
// CPU's left-to-right sum, but both are double: they agree to about 1e-15 relative.
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "ndmesh/nn/cuda_ops.hpp"
#include "tensor/cuda/common.cuh"

namespace ndmesh::cuda {

namespace {

using detail::blocks_for;
using detail::check_launch;
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

constexpr int kReduceThreads = 1024;  // the final pass sums at most this many block results
constexpr std::int64_t kReduceBlocks = kReduceThreads;

template <bool kSquare>
__global__ void partial_sum_kernel(double* partials, const float* x, std::int64_t n) {
  const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
  double acc = 0;
  for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    const double v = x[i];
    acc += kSquare ? v * v : v;
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// *result = the partials' sum (kAccumulate: *result += it).
template <bool kAccumulate>
__global__ void final_sum_kernel(double* result, const double* partials, int count) {
  double v = static_cast<int>(threadIdx.x) < count ? partials[threadIdx.x] : 0.0;
  v = block_sum(v);
  if (threadIdx.x == 0) *result = kAccumulate ? *result + v : v;
}

// The sum (of squares) of x[0..n) into *result on the device (or added to it), no wait.
template <bool kSquare, bool kAccumulate>
void reduce_into(double* result, const float* x, std::int64_t n) {
  if (n <= 0) return;
  const unsigned blocks = blocks_for(n, kReduceThreads, kReduceBlocks);
  DeviceBuffer scratch(blocks * sizeof(double));
  double* partials = static_cast<double*>(scratch.data());
  partial_sum_kernel<kSquare><<<blocks, kReduceThreads, 0, compute_stream()>>>(partials, x, n);
  check_launch(kSquare ? "square_sum" : "sum");
  final_sum_kernel<kAccumulate><<<1, kReduceThreads, 0, compute_stream()>>>(result, partials,
                                                                            static_cast<int>(blocks));
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
__global__ void to_bf16_kernel(std::uint16_t* dst, const float* src, std::int64_t n) {
  const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
  for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    std::uint32_t u = __float_as_uint(src[i]);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      dst[i] = static_cast<std::uint16_t>((u >> 16) | 0x40u);
    } else {
      u += 0x7fffu + ((u >> 16) & 1u);
      dst[i] = static_cast<std::uint16_t>(u >> 16);
    }
  }
}

__global__ void from_bf16_kernel(float* dst, const std::uint16_t* src, std::int64_t n) {
  const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
  for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = __uint_as_float(static_cast<std::uint32_t>(src[i]) << 16);
}

__global__ void add_column_partials_kernel(float* dst, const float* partials, std::int64_t chunks,
                                           std::int64_t cols) {
  const std::int64_t j = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  float acc = 0;
  for (std::int64_t c = 0; c < chunks; ++c) acc = __fadd_rn(acc, partials[c * cols + j]);
  dst[j] = __fadd_rn(dst[j], acc);
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
// first[p] <= b < first[p + 1] and works as block b - first[p] of a grid of that piece's
// first[p + 1] - first[p] blocks: partial_sum_kernel<true>'s partition of the piece, so the
// same partials, bit for bit.
__global__ void partial_square_sums_kernel(double* partials, const float* const* xs, const std::int64_t* ns,
                                           const std::int64_t* first, int count) {
  const std::int64_t b = blockIdx.x;
  int lo = 0, hi = count;  // first[lo] <= b < first[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (first[mid] <= b)
      lo = mid;
    else
      hi = mid;
  }
  const std::int64_t blocks = first[lo + 1] - first[lo], n = ns[lo];
  const float* x = xs[lo];
  const std::int64_t stride = blocks * blockDim.x;
  double acc = 0;
  for (std::int64_t i = (b - first[lo]) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const double v = x[i];
    acc += v * v;
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) partials[b] = acc;
}

// One block per piece: its partials summed as final_sum_kernel sums them (0 for an empty piece).
__global__ void piece_sums_kernel(double* sums, const double* partials, const std::int64_t* first) {
  const std::int64_t p = blockIdx.x, count = first[p + 1] - first[p];
  double v = static_cast<std::int64_t>(threadIdx.x) < count ? partials[first[p] + threadIdx.x] : 0.0;
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
    if (ns[i] > 0) blocks += blocks_for(ns[i], kReduceThreads, kReduceBlocks);
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
  to_bf16_kernel<<<blocks_for(n), kThreads, 0, compute_stream()>>>(reinterpret_cast<std::uint16_t*>(dst), src,
                                                                   n);
  check_launch("cast to bfloat16");
}

void cast(float* dst, const BFloat16* src, std::int64_t n) {
  if (n <= 0) return;
  from_bf16_kernel<<<blocks_for(n), kThreads, 0, compute_stream()>>>(
      dst, reinterpret_cast<const std::uint16_t*>(src), n);
  check_launch("cast from bfloat16");
}

namespace detail {

void add_column_partials(float* dst, const float* partials, std::int64_t chunks, std::int64_t cols) {
  if (cols <= 0) return;
  add_column_partials_kernel<<<static_cast<unsigned>((cols + kThreads - 1) / kThreads), kThreads, 0,
                               compute_stream()>>>(dst, partials, chunks, cols);
  check_launch("column sums (second pass)");
}

}  // namespace detail

}  // namespace ndmesh::cuda
