// Element-wise helpers that run where the elements live: the CPU loop, or its CUDA twin
// (nn/cuda_ops.hpp). The layers call these instead of std::copy / std::fill / a loop, so the
// same layer code serves both devices. CUDA holds float (and bfloat16, copied, zeroed and
// cast here); double (the finite-difference checks) is CPU only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "ndmesh/core/dtype.hpp"

#include "ndmesh/tensor/device.hpp"
#include "ndmesh/tensor/tensor.hpp"

namespace ndmesh::ops {

/// dst[i] = src[i], i < n.
template <typename T>
void copy(T* dst, const T* src, std::int64_t n, Device device);
/// host_dst[i] = src[i], i < n, src where `device` says (waits for the device).
template <typename T>
void copy_to_host(T* host_dst, const T* src, std::int64_t n, Device device);
/// The same for positions (integers: a byte copy on CUDA).
void copy_to_host(std::int64_t* host_dst, const std::int64_t* src, std::int64_t n, Device device);
/// dst[i] = host_src[i], i < n, dst where `device` says (ordered on the compute stream).
template <typename T>
void copy_from_host(T* dst, const T* host_src, std::int64_t n, Device device);
/// dst[i] = 0, i < n.
template <typename T>
void zero(T* dst, std::int64_t n, Device device);
/// dst[i] = value, i < n.
template <typename T>
void fill(T* dst, T value, std::int64_t n, Device device);
/// x[r, j] = value for j in [from, width), r < rows (rows `width` apart): the padding
/// columns of a padded vocabulary's logits (-inf: out of the softmax).
template <typename T>
void fill_columns(T* x, std::int64_t rows, std::int64_t width, std::int64_t from, T value, Device device);
/// dst[i] += src[i], i < n.
template <typename T>
void add(T* dst, const T* src, std::int64_t n, Device device);
/// dst[r ld_dst + c] = src[r ld_src + c] (+= with `accumulate`), r < rows, c < cols: columns
/// of packed rows gathered or added back (the key/value columns of qkv rows in a ring block).
template <typename T>
void copy_rows(T* dst, std::int64_t ld_dst, const T* src, std::int64_t ld_src, std::int64_t rows, std::int64_t cols,
               bool accumulate, Device device);
/// Sum of x[i]^2, i < n, in double (waits for the device).
template <typename T>
double square_sum(const T* x, std::int64_t n, Device device);
/// Sum over the pieces (x, n), in their order, of square_sum(x, n): on CUDA one read back for
/// all of them (cuda::square_sum_many), the same arithmetic.
template <typename T>
double square_sum_many(std::span<const std::pair<const T*, std::int64_t>> pieces, Device device);
/// square_sum_many's sum written into *result where the pieces are (host memory on the CPU,
/// device memory on CUDA: enqueued on the stream, nothing waits).
template <typename T>
void square_sum_many_into(double* result, std::span<const std::pair<const T*, std::int64_t>> pieces,
                          Device device);
/// dst[i] = src[i] rounded to bfloat16 (nearest even, NaN stays a quiet NaN: ndmesh::BFloat16),
/// i < n; on CUDA cuda::cast, bit for bit the same.
void cast(BFloat16* dst, const float* src, std::int64_t n, Device device);
/// dst[i] = src[i] widened to float (exact), i < n.
void cast(float* dst, const BFloat16* src, std::int64_t n, Device device);

/// C = alpha op(A) op(B) + beta C (ndmesh::gemm, tensor/blas.hpp) where the matrices live.
template <typename T>
void gemm(Device device, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
          const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc);

/// gemm with the operands A and B rounded as `precision` says: kFp32 is gemm above; kBf16
/// rounds each stored element of A and B to bfloat16 (nearest even; double through float)
/// into scratch copies and accumulates in T into C (CPU: ndmesh::gemm on the rounded copies;
/// CUDA: cuda::cast into bf16 scratch and cuda::gemm_bf16_f32).
template <typename T>
void gemm(Device device, MatmulPrecision precision, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
          std::int64_t k, T alpha, const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
          std::int64_t ldc);

/// An operand that several products read under one MatmulPrecision, rounded once: kBf16
/// rounds its `extent` stored elements (rows x row stride) when it is made, as gemm would
/// for each product, and the products below read that copy (a layer's backward reads its
/// output's gradient twice: for its input's gradient and for its weight's). Under kFp32 it
/// is the pointer. The rounded copy lives where the operand does (a bf16 device buffer on
/// CUDA); `x` must not change while the operand is in use.
template <typename T>
class SharedOperand {
 public:
  SharedOperand(Device device, MatmulPrecision precision, const T* x, std::int64_t extent);
  /// An operand stored in bfloat16 already (kBf16, nothing rounded): `x` itself on CUDA, its
  /// `extent` elements widened to T on the CPU. data() is nullptr: there is no T original.
  SharedOperand(Device device, const BFloat16* x, std::int64_t extent);
  const T* data() const { return x_; }
  Device device() const { return device_; }
  MatmulPrecision precision() const { return precision_; }
  /// The rounded elements (bfloat16 on CUDA, T holding bfloat16 values on the CPU); nullptr
  /// under kFp32.
  const void* rounded() const;

 private:
  const T* x_;
  Device device_;
  MatmulPrecision precision_;
  const void* stored_ = nullptr;  // the bfloat16 operand on CUDA (second constructor)
  DeviceBuffer on_device_;
  std::vector<T> on_host_;
};

/// n elements of T where `device` keeps data, left uninitialised: a transient that a kernel
/// writes whole before anything reads it (the caching allocator's block on CUDA, with no
/// memset; a vector on the CPU). Tensor zeroes what it allocates; this does not. Also a few
/// sums that kernels write where the data is and the host reads once (to_host).
template <typename T>
class Scratch {
 public:
  Scratch(std::int64_t n, Device device) : n_(n) {
    if (device == Device::kCpu)
      on_host_.resize(static_cast<std::size_t>(n));
    else
      on_device_ = DeviceBuffer(static_cast<std::size_t>(n) * sizeof(T));
  }
  Scratch() = default;
  T* data() { return on_host_.empty() ? static_cast<T*>(on_device_.data()) : on_host_.data(); }
  std::int64_t size() const { return n_; }
  /// Elements [first, first + count) set to zero (on the stream on CUDA: nothing waits).
  void zero(std::int64_t first, std::int64_t count) {
    if (on_host_.empty())
      cuda::memset_zero(static_cast<T*>(on_device_.data()) + first, static_cast<std::size_t>(count) * sizeof(T));
    else
      std::fill_n(on_host_.begin() + first, count, T{});
  }
  /// Every element set to zero (on the stream on CUDA: nothing waits).
  void zero() {
    if (on_host_.empty())
      cuda::memset_zero(on_device_.data(), static_cast<std::size_t>(n_) * sizeof(T));
    else
      std::fill(on_host_.begin(), on_host_.end(), T{});
  }
  /// The elements on the host (waits for the stream on CUDA).
  std::vector<T> to_host() const {
    if (!on_host_.empty()) return on_host_;
    std::vector<T> host(static_cast<std::size_t>(n_));
    cuda::copy_to_host(host.data(), on_device_.data(), host.size() * sizeof(T));
    return host;
  }

 private:
  std::int64_t n_ = 0;
  DeviceBuffer on_device_;
  std::vector<T> on_host_;
};

/// gemm as above with A and B SharedOperands (A's device and precision; B's must match: a
/// weight kept in bfloat16, ParamStore::param_bf16, is a B of kBf16 made from stored bf16).
template <typename T>
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
          const SharedOperand<T>& a, std::int64_t lda, const SharedOperand<T>& b, std::int64_t ldb, T beta, T* c,
          std::int64_t ldc);
/// B's stored extent for gemm's shapes (k x n, n x k transposed, rows ldb apart): what a
/// SharedOperand of B rounds.
std::int64_t extent_b(bool trans_b, std::int64_t n, std::int64_t k, std::int64_t ldb);

/// What a product can fuse after it (gemm_fused).
enum class Fused : std::uint8_t {
  kBias,      ///< C = product + bias[n] on every row (beta 0)
  kGelu,      ///< into bf16: aux = product + bias[n], C = gelu(aux) (nn::Gelu's tanh form; beta 0)
  kBiasGrad,  ///< with trans_a (A = dout [k, m]): also dbias[m] += the sums of A's rows over k
  kDGelu,     ///< into bf16: C = product * gelu'(aux) (aux read, not written; beta 0)
};
/// gemm into T with A and B SharedOperands and kBias (`bias`) or kBiasGrad (`dbias`) fused
/// into the product (a cuBLASLt epilogue, cuda::try_gemm_bf16_f32): true when it ran; false,
/// having done nothing, where it cannot fuse: the CPU, fp32 products, a T other than float, or
/// no cuBLASLt algorithm for it. The caller then runs the product and the step apart. Under
/// bf16 the fused bias gradient sums the rounded A (what the product reads).
template <typename T>
[[nodiscard]] bool gemm_fused(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                              const SharedOperand<T>& a, std::int64_t lda, const SharedOperand<T>& b,
                              std::int64_t ldb, T beta, T* c, std::int64_t ldc, Fused what, const T* bias,
                              T* dbias);

/// gemm into bfloat16 (alpha 1, beta 0; A and B of precision kBf16) with `what` fused, its
/// aux bf16: kGelu (aux = the product + bias[n], C = gelu(aux), each rounded once from the
/// fp32 value; `bias` kBf16, rounded as the operands) or kDGelu (C = the product * gelu'(aux),
/// aux read; no bias): cuda::try_gemm_bf16. True when it ran; false, having done nothing,
/// elsewhere (the CPU, a T other than float, no cuBLASLt algorithm): the caller then runs the
/// product into fp32 and the step apart (nn::Gelu's bf16 overloads compute the same).
template <typename T>
[[nodiscard]] bool gemm_fused(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                              const SharedOperand<T>& a, std::int64_t lda, const SharedOperand<T>& b,
                              std::int64_t ldb, BFloat16* c, std::int64_t ldc, Fused what,
                              const SharedOperand<T>* bias, BFloat16* aux);

/// C = alpha op(A) op(B) into bfloat16 (beta 0): A and B rounded as the kBf16 gemm rounds
/// them (both of precision kBf16), fp32 accumulation, each output rounded once (CUDA:
/// cuda::gemm_bf16; the CPU: the product of the rounded copies in T, then rounded). With
/// `bias` (n elements, kBf16: rounded to bf16 as the operands; alpha 1, rows n apart) the
/// output is the product + bias[j] in fp32, rounded once (CUDA: cuBLASLt's bias epilogue,
/// cuda::try_gemm_bf16 with kBias; where it declines, the fp32 product, the bias and one rounding).
template <typename T>
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
          const SharedOperand<T>& a, std::int64_t lda, const SharedOperand<T>& b, std::int64_t ldb, BFloat16* c,
          std::int64_t ldc, const SharedOperand<T>* bias = nullptr);

/// x[i] rounded to bfloat16 and kept in T (what bf16 storage of x would hold), i < n.
template <typename T>
void round_to_bf16(T* x, std::int64_t n, Device device);

/// The element types CUDA holds: float, and bfloat16 (the activations of bf16 mixed
/// precision; copy and zero only here, its arithmetic is the kernels' of nn/cuda_ops.hpp).
template <typename T>
inline constexpr bool kCudaHolds = std::is_same_v<T, float> || std::is_same_v<T, BFloat16>;

/// ConfigError when `device` cannot hold elements of T (CUDA holds float and bfloat16).
template <typename T>
void check_device(Device device);

/// Makes `device` ready for this process: nothing on the CPU; on CUDA cuda::init(local_rank)
/// (a ConfigError saying why when CUDA cannot run here).
void init_device(Device device, int local_rank);
/// The most bytes of `device` memory handed out at once so far (on CUDA the caching
/// allocator's peak, cuda::allocator_stats()); 0 on the CPU.
std::int64_t peak_device_bytes(Device device);

/// Host elements (tokens, targets, positions) where the kernels on `device` read them: `host`
/// itself on the CPU; on CUDA a copy of its n elements in `staged` (resized to [n] on
/// `device` when needed), ordered on the compute stream (cuda::upload: no host wait).
template <typename T>
const T* stage(Tensor<T>& staged, const T* host, std::int64_t n, Device device) {
  if (device == Device::kCpu) return host;
  if (staged.device() != device || staged.numel() != n) {
    staged.set_device(device);
    staged.resize({n});
  }
  cuda::upload(staged.data(), host, static_cast<std::size_t>(n) * sizeof(T));
  return staged.data();
}
/// What stage() returned last for the same `host` and `staged`.
template <typename T>
const T* staged(const Tensor<T>& staged, const T* host, Device device) {
  return device == Device::kCpu ? host : staged.data();
}

}  // namespace ndmesh::ops
