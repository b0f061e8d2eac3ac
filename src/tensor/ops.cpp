#include "ndmesh/tensor/ops.hpp"

#include <algorithm>
#include <type_traits>
#include <vector>

#include "ndmesh/core/env.hpp"
#include "ndmesh/core/error.hpp"
#include "ndmesh/tensor/blas.hpp"
#include "tensor/cuda_twin.hpp"

namespace ndmesh::ops {

template <typename T>
void check_device(Device device) {
  if (device == Device::kCpu) return;
  if constexpr (!kCudaHolds<T>)
    fail<InternalError>("tensor", "CUDA holds float and bfloat16 elements only; {} runs on the CPU",
                        dtype_name(DTypeOf<T>::value));
  if (!cuda::built()) fail<ConfigError>("cuda", "{}", cuda::unavailable_reason());
}

void init_device(Device device, int local_rank) {
  if (device == Device::kCuda) cuda::init(local_rank);
}

std::int64_t peak_device_bytes(Device device) {
  return device == Device::kCuda ? cuda::allocator_stats().peak_allocated_bytes : 0;
}

template <typename T>
void copy(T* dst, const T* src, std::int64_t n, Device device) {
  NDMESH_CUDA_TWIN(device, cuda::copy_device(dst, src, static_cast<std::size_t>(n) * sizeof(T)))
  std::copy(src, src + n, dst);
}

template <typename T>
void zero(T* dst, std::int64_t n, Device device) {
  NDMESH_CUDA_TWIN(device, cuda::memset_zero(dst, static_cast<std::size_t>(n) * sizeof(T)))
  std::fill(dst, dst + n, T(0));
}

template <typename T>
void copy_to_host(T* host_dst, const T* src, std::int64_t n, Device device) {
  NDMESH_CUDA_TWIN(device, cuda::copy_to_host(host_dst, src, static_cast<std::size_t>(n) * sizeof(T)))
  std::copy_n(src, n, host_dst);
}

void copy_to_host(std::int64_t* host_dst, const std::int64_t* src, std::int64_t n, Device device) {
  if (device == Device::kCuda) return cuda::copy_to_host(host_dst, src, static_cast<std::size_t>(n) * sizeof(*src));
  std::copy_n(src, n, host_dst);
}

template <typename T>
void copy_from_host(T* dst, const T* host_src, std::int64_t n, Device device) {
  NDMESH_CUDA_TWIN(device, cuda::copy_to_device(dst, host_src, static_cast<std::size_t>(n) * sizeof(T)))
  std::copy_n(host_src, n, dst);
}

template <typename T>
void fill(T* dst, T value, std::int64_t n, Device device) {
  NDMESH_CUDA_TWIN(device, cuda::fill(dst, value, n))
  std::fill(dst, dst + n, value);
}

template <typename T>
void add(T* dst, const T* src, std::int64_t n, Device device) {
  NDMESH_CUDA_TWIN(device, cuda::add_inplace(dst, src, n))
  for (std::int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

template <typename T>
void copy_rows(T* dst, std::int64_t ld_dst, const T* src, std::int64_t ld_src, std::int64_t rows, std::int64_t cols,
               bool accumulate, Device device) {
  NDMESH_CUDA_TWIN(device, cuda::copy_rows(dst, ld_dst, src, ld_src, rows, cols, accumulate))
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* s = src + r * ld_src;
    T* d = dst + r * ld_dst;
    for (std::int64_t c = 0; c < cols; ++c) d[c] = accumulate ? d[c] + s[c] : s[c];
  }
}

template <typename T>
double square_sum(const T* x, std::int64_t n, Device device) {
  NDMESH_CUDA_TWIN(device, return cuda::square_sum(x, n))
  double s = 0;
  for (std::int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return s;
}

template <typename T>
double square_sum_many(std::span<const std::pair<const T*, std::int64_t>> pieces, Device device) {
  NDMESH_CUDA_TWIN(device, {
    std::vector<const float*> xs;
    std::vector<std::int64_t> ns;
    for (const auto& [x, n] : pieces) xs.push_back(x), ns.push_back(n);
    return cuda::square_sum_many(xs.data(), ns.data(), static_cast<int>(xs.size()));
  })
  double sum = 0;
  for (const auto& [x, n] : pieces) sum += square_sum(x, n, device);
  return sum;
}

template <typename T>
void square_sum_many_into(double* result, std::span<const std::pair<const T*, std::int64_t>> pieces,
                          Device device) {
  NDMESH_CUDA_TWIN(device, {
    std::vector<const float*> xs;
    std::vector<std::int64_t> ns;
    for (const auto& [x, n] : pieces) xs.push_back(x), ns.push_back(n);
    cuda::square_sum_many_into(result, xs.data(), ns.data(), static_cast<int>(xs.size()));
  })
  *result = square_sum_many(pieces, device);
}

// NDMESH_CUDA_TWIN's element type is the bfloat16 side: CUDA holds both.
void cast(BFloat16* dst, const float* src, std::int64_t n, Device device) {
  using T = BFloat16;
  NDMESH_CUDA_TWIN(device, cuda::cast(dst, src, n))
  for (std::int64_t i = 0; i < n; ++i) dst[i] = BFloat16(src[i]);
}

void cast(float* dst, const BFloat16* src, std::int64_t n, Device device) {
  using T = BFloat16;
  NDMESH_CUDA_TWIN(device, cuda::cast(dst, src, n))
  for (std::int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

template <typename T>
void gemm(Device device, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
          const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
  NDMESH_CUDA_TWIN(device, cuda::gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc))
  ndmesh::gemm<T>(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

namespace {
// x rounded to bfloat16 (through float), kept in T.
template <typename T>
T bf16_value(T x) {
  return static_cast<T>(static_cast<float>(BFloat16(static_cast<float>(x))));
}

// The first `extent` elements of an operand, rounded to bfloat16: its rows and whatever lies
// between them under a row stride longer than a row (never read by the product).
template <typename T>
const T* rounded_to_bf16(std::vector<T>& scratch, const T* x, std::int64_t extent) {
  scratch.resize(static_cast<std::size_t>(extent));
  for (std::int64_t i = 0; i < extent; ++i) scratch[static_cast<std::size_t>(i)] = bf16_value(x[i]);
  return scratch.data();
}

// Stored extents: A is m x k (k x m transposed), B is k x n (n x k transposed).
std::int64_t extent_a(bool trans_a, std::int64_t m, std::int64_t k, std::int64_t lda) {
  return ((trans_a ? k : m) - 1) * lda + (trans_a ? m : k);
}

// The bf16 product of rounded operands (SharedOperand::rounded's types), accumulated in T.
template <typename T>
void rounded_product(Device device, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                     T alpha, const void* a, std::int64_t lda, const void* b, std::int64_t ldb, T beta, T* c,
                     std::int64_t ldc) {
  NDMESH_CUDA_TWIN(device, cuda::gemm_bf16_f32(trans_a, trans_b, m, n, k, alpha, static_cast<const BFloat16*>(a),
                                               lda, static_cast<const BFloat16*>(b), ldb, beta, c, ldc))
  // A product of two bf16 values is exact in fp32 (8 + 8 significant bits): on the rounded
  // copies the fp32 gemm is a bf16 product with fp32 accumulation.
  ndmesh::gemm<T>(trans_a, trans_b, m, n, k, alpha, static_cast<const T*>(a), lda, static_cast<const T*>(b), ldb,
                  beta, c, ldc);
}
}  // namespace

namespace {
// x's first `extent` elements rounded to bfloat16 where x lives: into `on_device` (bf16) on
// CUDA, into `on_host` (T) on the CPU.
template <typename T>
void round_operand(Device device, const T* x, std::int64_t extent, [[maybe_unused]] DeviceBuffer& on_device,
                   std::vector<T>& on_host) {
  NDMESH_CUDA_TWIN(device, {
    on_device = DeviceBuffer(static_cast<std::size_t>(extent) * sizeof(BFloat16));
    cuda::cast(static_cast<BFloat16*>(on_device.data()), x, extent);
  })
  rounded_to_bf16(on_host, x, extent);
}
}  // namespace

std::int64_t extent_b(bool trans_b, std::int64_t n, std::int64_t k, std::int64_t ldb) {
  return ((trans_b ? n : k) - 1) * ldb + (trans_b ? k : n);
}

template <typename T>
SharedOperand<T>::SharedOperand(Device device, MatmulPrecision precision, const T* x, std::int64_t extent)
    : x_(x), device_(device), precision_(precision) {
  if (precision != MatmulPrecision::kFp32 && extent > 0) round_operand(device, x, extent, on_device_, on_host_);
}

template <typename T>
SharedOperand<T>::SharedOperand(Device device, const BFloat16* x, std::int64_t extent)
    : x_(nullptr), device_(device), precision_(MatmulPrecision::kBf16) {
  if (device == Device::kCuda) {
    stored_ = x;
    return;
  }
  on_host_.resize(static_cast<std::size_t>(std::max<std::int64_t>(extent, 0)));
  for (std::size_t i = 0; i < on_host_.size(); ++i) on_host_[i] = static_cast<T>(static_cast<float>(x[i]));
}

template <typename T>
const void* SharedOperand<T>::rounded() const {
  if (precision_ == MatmulPrecision::kFp32) return nullptr;
  if (stored_ != nullptr) return stored_;
  return device_ == Device::kCuda ? on_device_.data() : static_cast<const void*>(on_host_.data());
}

template <typename T>
void gemm(Device device, MatmulPrecision precision, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
          std::int64_t k, T alpha, const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
          std::int64_t ldc) {
  if (precision == MatmulPrecision::kFp32 || m <= 0 || n <= 0 || k <= 0)  // no product: nothing to round
    return gemm<T>(device, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  // The rounded copies go back to the caching allocator (CUDA) when they go out of scope,
  // which hands them out again only to work ordered after this product on the compute stream.
  const SharedOperand<T> a16(device, precision, a, extent_a(trans_a, m, k, lda)),
      b16(device, precision, b, extent_b(trans_b, n, k, ldb));
  rounded_product<T>(device, trans_a, trans_b, m, n, k, alpha, a16.rounded(), lda, b16.rounded(), ldb, beta, c, ldc);
}

namespace {
template <typename T>
void check_operands(const SharedOperand<T>& a, const SharedOperand<T>& b) {
  NDMESH_CHECK(a.device() == b.device() && a.precision() == b.precision(), "ops",
               "a product's operands must share device and precision: A {} {}, B {} {}; make both SharedOperands "
               "under the same MatmulPrecision",
               device_name(a.device()), a.precision() == MatmulPrecision::kBf16 ? "bf16" : "fp32",
               device_name(b.device()), b.precision() == MatmulPrecision::kBf16 ? "bf16" : "fp32");
}
}  // namespace

template <typename T>
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
          const SharedOperand<T>& a, std::int64_t lda, const SharedOperand<T>& b, std::int64_t ldb, T beta, T* c,
          std::int64_t ldc) {
  check_operands(a, b);
  const Device device = a.device();
  if (a.precision() == MatmulPrecision::kFp32 || m <= 0 || n <= 0 || k <= 0)  // k = 0 reads neither operand
    return gemm<T>(device, trans_a, trans_b, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c, ldc);
  rounded_product<T>(device, trans_a, trans_b, m, n, k, alpha, a.rounded(), lda, b.rounded(), ldb, beta, c, ldc);
}

namespace {
// NDMESH_EPILOGUES=off: every epilogue runs apart, as where cuBLASLt has no algorithm for it
// (read at each product, so that a test can switch it; validated at start-up, env::check_all).
bool epilogues_off() { return env::string("NDMESH_EPILOGUES", "auto") == "off"; }
}  // namespace

template <typename T>
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
          const SharedOperand<T>& a, std::int64_t lda, const SharedOperand<T>& b, std::int64_t ldb, BFloat16* c,
          std::int64_t ldc, const SharedOperand<T>* bias) {
  NDMESH_CHECK(a.precision() == MatmulPrecision::kBf16, "ops",
               "a product into bfloat16 takes bf16 operands, but A's precision is fp32; make A a SharedOperand "
               "under MatmulPrecision::kBf16");
  check_operands(a, b);
  if (bias != nullptr) {
    check_operands(a, *bias);
    NDMESH_CHECK(alpha == T(1) && ldc == n && k > 0, "ops",
                 "a product into bfloat16 with a bias takes alpha 1 (got {}), rows n = {} apart (got {}) and k > 0 "
                 "(got {})",
                 static_cast<double>(alpha), n, ldc, k);
  }
  if (m <= 0 || n <= 0) return;
  const Device device = a.device();
  NDMESH_CUDA_TWIN(device, {
    const auto* a16 = static_cast<const BFloat16*>(a.rounded());
    const auto* b16 = static_cast<const BFloat16*>(b.rounded());
    if (bias == nullptr) return cuda::gemm_bf16(trans_a, trans_b, m, n, k, alpha, a16, lda, b16, ldb, 0.0f, c, ldc);
    const auto* bias16 = static_cast<const BFloat16*>(bias->rounded());
    if (!epilogues_off() && cuda::try_gemm_bf16(trans_a, trans_b, m, n, k, a16, lda, b16, ldb, c, ldc,
                                                cuda::GemmEpilogue::kBias, bias16, nullptr))
      return;
    // No algorithm for the epilogue: the fp32 product, the rounded bias added, one rounding.
    Scratch<float> product(m * n, device), b32(n, device);
    cuda::gemm_bf16_f32(trans_a, trans_b, m, n, k, 1.0f, a16, lda, b16, ldb, 0.0f, product.data(), n);
    cuda::cast(b32.data(), bias16, n);
    cuda::bias_forward(product.data(), b32.data(), m, n);
    cuda::cast(c, product.data(), m * n);
  })
  std::vector<T> product(static_cast<std::size_t>(m * n));
  ndmesh::gemm<T>(trans_a, trans_b, m, n, k, alpha, static_cast<const T*>(a.rounded()), lda,
                  static_cast<const T*>(b.rounded()), ldb, T(0), product.data(), n);
  const T* b16 = bias != nullptr ? static_cast<const T*>(bias->rounded()) : nullptr;
  for (std::int64_t r = 0; r < m; ++r)
    for (std::int64_t j = 0; j < n; ++j) {
      T y = product[static_cast<std::size_t>(r * n + j)];
      if (b16 != nullptr) y += b16[j];
      c[r * ldc + j] = BFloat16(static_cast<float>(y));
    }
}

template <typename T>
bool gemm_fused([[maybe_unused]] bool trans_a, [[maybe_unused]] bool trans_b, std::int64_t m, std::int64_t n,
                std::int64_t k, const SharedOperand<T>& a, [[maybe_unused]] std::int64_t lda,
                [[maybe_unused]] const SharedOperand<T>& b, [[maybe_unused]] std::int64_t ldb, [[maybe_unused]] T beta,
                [[maybe_unused]] T* c, [[maybe_unused]] std::int64_t ldc, [[maybe_unused]] Fused what,
                [[maybe_unused]] const T* bias, [[maybe_unused]] T* dbias) {
  NDMESH_CHECK(what == Fused::kBias || what == Fused::kBiasGrad, "ops",
               "a product into T fuses its bias or its bias gradient; GELU and its derivative go into bfloat16");
  const Device device = a.device();
  check_operands(a, b);
  if (device != Device::kCuda || a.precision() != MatmulPrecision::kBf16 || m <= 0 || n <= 0 || k <= 0 ||
      epilogues_off())
    return false;
  NDMESH_CUDA_TWIN(device, {
    using E = cuda::GemmEpilogue;
    const E epilogue = what == Fused::kBias ? E::kBias : E::kBGradB;
    // cuBLASLt writes the bias gradient: into scratch, then added to the accumulated one.
    DeviceBuffer sums(what == Fused::kBiasGrad ? static_cast<std::size_t>(m) * sizeof(float) : 0);
    if (!cuda::try_gemm_bf16_f32(trans_a, trans_b, m, n, k, 1.0f, static_cast<const BFloat16*>(a.rounded()), lda,
                                 static_cast<const BFloat16*>(b.rounded()), ldb, beta, c, ldc, epilogue, bias,
                                 nullptr, static_cast<float*>(sums.data())))
      return false;
    if (what == Fused::kBiasGrad) add<T>(dbias, static_cast<const float*>(sums.data()), m, device);
    return true;
  })
  return false;
}

template <typename T>
bool gemm_fused([[maybe_unused]] bool trans_a, [[maybe_unused]] bool trans_b, std::int64_t m, std::int64_t n,
                std::int64_t k, const SharedOperand<T>& a, [[maybe_unused]] std::int64_t lda,
                [[maybe_unused]] const SharedOperand<T>& b, [[maybe_unused]] std::int64_t ldb,
                [[maybe_unused]] BFloat16* c, [[maybe_unused]] std::int64_t ldc, Fused what,
                [[maybe_unused]] const SharedOperand<T>* bias, [[maybe_unused]] BFloat16* aux) {
  NDMESH_CHECK(what == Fused::kGelu || what == Fused::kDGelu, "ops",
               "a product into bfloat16 fuses GELU with its aux or GELU's derivative only");
  NDMESH_CHECK(
      (what == Fused::kGelu) == (bias != nullptr) && aux != nullptr, "ops",
      "a product into bfloat16 with GELU takes its bias and aux, with GELU's derivative its aux only");
  const Device device = a.device();
  check_operands(a, b);
  if (bias != nullptr) check_operands(a, *bias);
  if (device != Device::kCuda || a.precision() != MatmulPrecision::kBf16 || m <= 0 || n <= 0 || k <= 0 ||
      epilogues_off())
    return false;
  NDMESH_CUDA_TWIN(device, {
    return cuda::try_gemm_bf16(
        trans_a, trans_b, m, n, k, static_cast<const BFloat16*>(a.rounded()), lda,
        static_cast<const BFloat16*>(b.rounded()), ldb, c, ldc,
        what == Fused::kGelu ? cuda::GemmEpilogue::kGeluAux : cuda::GemmEpilogue::kDGeluNoBiasGrad,
        bias != nullptr ? static_cast<const BFloat16*>(bias->rounded()) : nullptr, aux);
  })
  return false;
}

template <typename T>
void fill_columns(T* x, std::int64_t rows, std::int64_t width, std::int64_t from, T value, Device device) {
  if (from >= width || rows <= 0) return;
  NDMESH_CUDA_TWIN(device, cuda::fill_columns(x, rows, width, from, value))
  for (std::int64_t r = 0; r < rows; ++r) std::fill(x + r * width + from, x + (r + 1) * width, value);
}

template <typename T>
void round_to_bf16(T* x, std::int64_t n, Device device) {
  NDMESH_CUDA_TWIN(device, cuda::round_to_bf16(x, n))
  for (std::int64_t i = 0; i < n; ++i) x[i] = bf16_value(x[i]);
}

#define NDMESH_OPS(T)                                                                                        \
  template void check_device<T>(Device);                                                                     \
  template void copy<T>(T*, const T*, std::int64_t, Device);                                                 \
  template void zero<T>(T*, std::int64_t, Device);                                                           \
  template void fill<T>(T*, T, std::int64_t, Device);                                                        \
  template void fill_columns<T>(T*, std::int64_t, std::int64_t, std::int64_t, T, Device);                     \
  template void copy_to_host<T>(T*, const T*, std::int64_t, Device);                                         \
  template void copy_from_host<T>(T*, const T*, std::int64_t, Device);                                       \
  template void add<T>(T*, const T*, std::int64_t, Device);                                                  \
  template void copy_rows<T>(T*, std::int64_t, const T*, std::int64_t, std::int64_t, std::int64_t, bool,      \
                             Device);                                                                        \
  template double square_sum<T>(const T*, std::int64_t, Device);                                             \
  template double square_sum_many<T>(std::span<const std::pair<const T*, std::int64_t>>, Device);            \
  template void square_sum_many_into<T>(double*, std::span<const std::pair<const T*, std::int64_t>>,         \
                                        Device);                                                             \
  template void gemm<T>(Device, bool, bool, std::int64_t, std::int64_t, std::int64_t, T, const T*,           \
                        std::int64_t, const T*, std::int64_t, T, T*, std::int64_t);                          \
  template void gemm<T>(Device, MatmulPrecision, bool, bool, std::int64_t, std::int64_t, std::int64_t, T,    \
                        const T*, std::int64_t, const T*, std::int64_t, T, T*, std::int64_t);                \
  template class SharedOperand<T>;                                                                           \
  template void gemm<T>(bool, bool, std::int64_t, std::int64_t, std::int64_t, T, const SharedOperand<T>&,    \
                        std::int64_t, const SharedOperand<T>&, std::int64_t, T, T*, std::int64_t);           \
  template void gemm<T>(bool, bool, std::int64_t, std::int64_t, std::int64_t, T, const SharedOperand<T>&,    \
                        std::int64_t, const SharedOperand<T>&, std::int64_t, BFloat16*, std::int64_t,        \
                        const SharedOperand<T>*);                                                            \
  template void round_to_bf16<T>(T*, std::int64_t, Device);                                                  \
  template bool gemm_fused<T>(bool, bool, std::int64_t, std::int64_t, std::int64_t, const SharedOperand<T>&, \
                              std::int64_t, const SharedOperand<T>&, std::int64_t, T, T*, std::int64_t,      \
                              Fused, const T*, T*);                                                          \
  template bool gemm_fused<T>(bool, bool, std::int64_t, std::int64_t, std::int64_t, const SharedOperand<T>&, \
                              std::int64_t, const SharedOperand<T>&, std::int64_t, BFloat16*, std::int64_t,  \
                              Fused, const SharedOperand<T>*, BFloat16*);
NDMESH_OPS(float)
NDMESH_OPS(double)
// bfloat16 tensors: placed, copied and zeroed here; computed on by the bf16 kernels.
template void check_device<BFloat16>(Device);
template void copy<BFloat16>(BFloat16*, const BFloat16*, std::int64_t, Device);
template void zero<BFloat16>(BFloat16*, std::int64_t, Device);

}  // namespace ndmesh::ops
