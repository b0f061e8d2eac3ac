#include "ndmesh/nn/linear.hpp"

#include <algorithm>
#include <type_traits>

#include "ndmesh/core/error.hpp"
#include "ndmesh/nn/gelu.hpp"
#include "ndmesh/tensor/blas.hpp"
#include "ndmesh/tensor/ops.hpp"
#include "tensor/cuda_twin.hpp"

namespace ndmesh::nn {

template <typename T>
Linear<T>::Linear(ParamStore<T>& store, LinearOptions options)
    : store_(&store), options_(std::move(options)) {
  NDMESH_CHECK(options_.in > 0 && options_.out > 0, "nn",
               "linear '{}' has in={} out={}; both must be positive", options_.name, options_.in,
               options_.out);
  if (options_.shared_weight >= 0) {
    const auto& v = store.view(options_.shared_weight);
    NDMESH_CHECK(v.numel == options_.in * options_.out, "nn",
                 "linear '{}' shares '{}' with {} elements but needs {}x{}", options_.name, v.name, v.numel,
                 options_.out, options_.in);
    weight_ = options_.shared_weight;
  } else {
    weight_ = store.add(options_.name + ".weight", {options_.out, options_.in}, true, options_.weight_shard);
  }
  if (options_.bias) bias_ = store.add(options_.name + ".bias", {options_.out}, false, options_.bias_shard);
}

template <typename T>
ops::SharedOperand<T> Linear<T>::weight_operand() const {
  const std::int64_t n = options_.in * options_.out;
  if (matmul_precision() == MatmulPrecision::kBf16)
    if (const BFloat16* w16 = store_->param_bf16(weight_)) return ops::SharedOperand<T>(device(), w16, n);
  return operand(store_->param(weight_), n);
}

template <typename T>
ops::SharedOperand<T> Linear<T>::input(const T* inp, const BFloat16* inp16, std::int64_t rows) const {
  const std::int64_t n = rows * options_.in;
  if (inp16 == nullptr) return operand(inp, n);
  NDMESH_CHECK(matmul_precision() == MatmulPrecision::kBf16, "nn",
               "linear '{}': an input stored in bfloat16 is for bf16 products, but its store's are fp32",
               options_.name);
  return ops::SharedOperand<T>(device(), inp16, n);
}

template <typename T>
void Linear<T>::forward(const T* inp, T* out, std::int64_t rows) const {
  forward(input(inp, nullptr, rows), out, rows);
}

template <typename T>
void Linear<T>::forward(const BFloat16* inp, T* out, std::int64_t rows) const {
  forward(input(nullptr, inp, rows), out, rows);
}

template <typename T>
void Linear<T>::forward(const ops::SharedOperand<T>& x, T* out, std::int64_t rows) const {
  const std::int64_t in = options_.in, n_out = options_.out;
  const ops::SharedOperand<T> w = weight_operand();
  if (device() != Device::kCpu) {
    if (bias_ >= 0 && !options_.deferred_bias &&
        ops::gemm_fused<T>(false, true, rows, n_out, in, x, in, w, in, T(0), out, n_out, ops::Fused::kBias,
                           store_->param(bias_), nullptr))
      return;
    ops::gemm<T>(false, true, rows, n_out, in, T(1), x, in, w, in, T(0), out, n_out);
    if (!options_.deferred_bias) add_bias(out, rows);
    return;
  }
  T beta = T(0);
  if (bias_ >= 0 && !options_.deferred_bias) {
    const T* b = store_->param(bias_);
    for (std::int64_t r = 0; r < rows; ++r) std::copy(b, b + n_out, out + r * n_out);
    beta = T(1);
  }
  ops::gemm<T>(false, true, rows, n_out, in, T(1), x, in, w, in, beta, out, n_out);
}

template <typename T>
void Linear<T>::forward_gelu(const T* inp, BFloat16* pre, BFloat16* out, std::int64_t rows) const {
  forward_gelu(input(inp, nullptr, rows), pre, out, rows);
}

template <typename T>
void Linear<T>::forward_gelu(const BFloat16* inp, BFloat16* pre, BFloat16* out, std::int64_t rows) const {
  forward_gelu(input(nullptr, inp, rows), pre, out, rows);
}

template <typename T>
void Linear<T>::forward_gelu(const ops::SharedOperand<T>& x, BFloat16* pre, BFloat16* out,
                             std::int64_t rows) const {
  const std::int64_t in = options_.in, n_out = options_.out;
  NDMESH_CHECK(matmul_precision() == MatmulPrecision::kBf16 && bias_ >= 0 && !options_.deferred_bias, "nn",
               "linear '{}': GELU into bfloat16 is for bf16 products and a bias that is not deferred",
               options_.name);
  const ops::SharedOperand<T> w = weight_operand(), b = bias_operand();
  if (may_fuse() &&
      ops::gemm_fused<T>(false, true, rows, n_out, in, x, in, w, in, out, n_out, ops::Fused::kGelu, &b, pre))
    return;
  ops::Scratch<T> product(rows * n_out, device());
  ops::gemm<T>(false, true, rows, n_out, in, T(1), x, in, w, in, T(0), product.data(), n_out);
  Gelu<T>::forward_bias(product.data(), b, pre, out, rows, n_out, device());
}

namespace {
template <typename T>
DeferredWeightGrads<T>*& deferred_sink() {
  thread_local DeferredWeightGrads<T>* sink = nullptr;
  return sink;
}

// dst[i] = src[i] widened to T (exact), where both live (a double layer runs on the CPU only).
template <typename T>
void widen(T* dst, const BFloat16* src, std::int64_t n, Device device) {
  if constexpr (std::is_same_v<T, float>) {
    ops::cast(dst, src, n, device);
  } else {
    ops::check_device<T>(device);
    for (std::int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(static_cast<float>(src[i]));
  }
}
}  // namespace

template <typename T>
void Linear<T>::backward(const T* dout, const T* inp, T* dinp, std::int64_t rows, GradInto into) const {
  backward(dout, inp, nullptr, dinp, rows, into);
}

template <typename T>
void Linear<T>::backward(const T* dout, const BFloat16* inp, T* dinp, std::int64_t rows, GradInto into) const {
  backward(dout, nullptr, inp, dinp, rows, into);
}

template <typename T>
void Linear<T>::backward(const T* dout, const T* inp, const BFloat16* inp16, T* dinp, std::int64_t rows,
                         GradInto into) const {
  const std::int64_t in = options_.in, n_out = options_.out;
  const T beta = into == GradInto::kSet ? T(0) : T(1);
  if (DeferredWeightGrads<T>* sink = deferred_sink<T>()) {  // dinp now, the weight part later
    if (dinp != nullptr)
      ops::gemm<T>(false, false, rows, in, n_out, T(1), operand(dout, rows * n_out), n_out, weight_operand(), in, beta,
                   dinp, in);
    sink->record(*this, dout, inp, inp16, rows);
    return;
  }
  // dout is A of both products (the input's gradient, the weight's): under bf16 rounded once.
  const ops::SharedOperand<T> d = operand(dout, rows * n_out);
  if (dinp != nullptr) ops::gemm<T>(false, false, rows, in, n_out, T(1), d, n_out, weight_operand(), in, beta, dinp, in);
  weight_product(d, input(inp, inp16, rows), rows);
}

template <typename T>
void Linear<T>::backward_gelu(const T* dout, const BFloat16* inp, const BFloat16* pre, BFloat16* dpre,
                              std::int64_t rows) const {
  const std::int64_t in = options_.in, n_out = options_.out;
  NDMESH_CHECK(matmul_precision() == MatmulPrecision::kBf16, "nn",
               "linear '{}': GELU's derivative into bfloat16 is for bf16 products", options_.name);
  if (may_fuse() && deferred_sink<T>() == nullptr) {
    const ops::SharedOperand<T> d = operand(dout, rows * n_out);
    // kDGelu only reads the aux (pre).
    if (ops::gemm_fused<T>(false, false, rows, in, n_out, d, n_out, weight_operand(), in, dpre, in,
                           ops::Fused::kDGelu, nullptr, const_cast<BFloat16*>(pre))) {
      weight_product(d, input(nullptr, inp, rows), rows);
      return;
    }
  }
  // The fp32 input gradient (the weight part as backward() does it), then GELU's derivative.
  ops::Scratch<T> product(rows * in, device());
  backward(dout, nullptr, inp, product.data(), rows, GradInto::kSet);
  Gelu<T>::backward(product.data(), pre, dpre, rows * in, device());
}

template <typename T>
ops::SharedOperand<T> Linear<T>::bias_operand() const {
  if (const BFloat16* b16 = store_->param_bf16(bias_)) return ops::SharedOperand<T>(device(), b16, options_.out);
  return operand(store_->param(bias_), options_.out);
}

template <typename T>
void Linear<T>::forward(const T* inp, BFloat16* out, std::int64_t ld_out, std::int64_t rows) const {
  forward(input(inp, nullptr, rows), out, ld_out, rows);
}

template <typename T>
void Linear<T>::forward(const BFloat16* inp, BFloat16* out, std::int64_t rows) const {
  forward(input(nullptr, inp, rows), out, options_.out, rows);
}

template <typename T>
void Linear<T>::forward(const ops::SharedOperand<T>& x, BFloat16* out, std::int64_t ld_out, std::int64_t rows) const {
  const std::int64_t in = options_.in, n_out = options_.out;
  const bool bias = bias_ >= 0;
  NDMESH_CHECK(matmul_precision() == MatmulPrecision::kBf16 && !options_.deferred_bias &&
                   (bias ? ld_out == n_out : ld_out >= n_out),
               "nn",
               "linear '{}': a bfloat16 output is for bf16 products, a bias that is not deferred, rows {} apart "
               "(got {})",
               options_.name, bias ? "= out = " + std::to_string(n_out) : ">= out = " + std::to_string(n_out), ld_out);
  if (!bias) return ops::gemm<T>(false, true, rows, n_out, in, T(1), x, in, weight_operand(), in, out, ld_out);
  const ops::SharedOperand<T> b = bias_operand();
  ops::gemm<T>(false, true, rows, n_out, in, T(1), x, in, weight_operand(), in, out, ld_out, &b);
}

template <typename T>
void Linear<T>::backward(const BFloat16* dout, std::int64_t ld_dout, const T* inp, T* dinp, std::int64_t rows,
                         GradInto into) const {
  backward(dout, ld_dout, inp, nullptr, dinp, rows, into);
}

template <typename T>
void Linear<T>::backward(const BFloat16* dout, const BFloat16* inp, T* dinp, std::int64_t rows, GradInto into) const {
  backward(dout, options_.out, nullptr, inp, dinp, rows, into);
}

template <typename T>
void Linear<T>::backward(const BFloat16* dout, std::int64_t ld_dout, const T* inp, const BFloat16* inp16, T* dinp,
                         std::int64_t rows, GradInto into) const {
  const std::int64_t in = options_.in, n_out = options_.out;
  const bool bias = bias_ >= 0 && !options_.deferred_bias;
  NDMESH_CHECK(matmul_precision() == MatmulPrecision::kBf16 && (bias ? ld_dout == n_out : ld_dout >= n_out),
               "nn", "linear '{}': a bfloat16 output gradient is for bf16 products, rows {} apart (got {})",
               options_.name, bias ? "= out = " + std::to_string(n_out) : ">= out = " + std::to_string(n_out),
               ld_dout);
  const ops::SharedOperand<T> d(store_->device(), dout, rows > 0 ? (rows - 1) * ld_dout + n_out : 0);
  if (dinp != nullptr)
    ops::gemm<T>(false, false, rows, in, n_out, T(1), d, ld_dout, weight_operand(), in,
                 into == GradInto::kSet ? T(0) : T(1), dinp, in);
  if (DeferredWeightGrads<T>* sink = deferred_sink<T>()) {  // the weight part later, from dout widened (exact)
    NDMESH_CHECK(ld_dout == n_out, "nn", "linear '{}': a split backward takes a bfloat16 gradient rows {} apart, not {}",
                 options_.name, n_out, ld_dout);
    return sink->record(*this, dout, inp, inp16, rows);
  }
  weight_product(d, input(inp, inp16, rows), rows, ld_dout);
}

template <typename T>
void Linear<T>::backward(const T* dout, const BFloat16* inp, BFloat16* dinp, std::int64_t rows) const {
  const std::int64_t in = options_.in, n_out = options_.out;
  NDMESH_CHECK(matmul_precision() == MatmulPrecision::kBf16, "nn",
               "linear '{}': an input gradient in bfloat16 is for bf16 products", options_.name);
  const ops::SharedOperand<T> d = operand(dout, rows * n_out);
  ops::gemm<T>(false, false, rows, in, n_out, T(1), d, n_out, weight_operand(), in, dinp, in);
  if (DeferredWeightGrads<T>* sink = deferred_sink<T>()) return sink->record(*this, dout, nullptr, inp, rows);
  weight_product(d, input(nullptr, inp, rows), rows);
}

template <typename T>
void Linear<T>::backward_weight(const T* dout, const T* inp, std::int64_t rows) const {
  weight_product(operand(dout, rows * options_.out), input(inp, nullptr, rows), rows);
}

template <typename T>
void Linear<T>::backward_weight(const T* dout, const BFloat16* inp, std::int64_t rows) const {
  weight_product(operand(dout, rows * options_.out), input(nullptr, inp, rows), rows);
}

template <typename T>
void Linear<T>::weight_product(const ops::SharedOperand<T>& dout, const ops::SharedOperand<T>& x, std::int64_t rows,
                               std::int64_t ld_dout) const {
  const std::int64_t in = options_.in, n_out = options_.out, ld = ld_dout > 0 ? ld_dout : n_out;
  const bool bias = bias_ >= 0 && !options_.deferred_bias;
  if (bias && ld == n_out &&
      ops::gemm_fused<T>(true, false, n_out, in, rows, dout, ld, x, in, T(1), store_->grad(weight_), in,
                         ops::Fused::kBiasGrad, nullptr, store_->grad(bias_)))
    return;
  ops::gemm<T>(true, false, n_out, in, rows, T(1), dout, ld, x, in, T(1), store_->grad(weight_), in);
  if (bias) backward_bias(dout, rows);
}

template <typename T>
void Linear<T>::backward_bias(const ops::SharedOperand<T>& dout, std::int64_t rows) const {
  if (dout.precision() == MatmulPrecision::kFp32) return backward_bias(dout.data(), rows);
  // Under bf16 the sums of the rounded gradient, on every device what the fused product sums.
  const std::int64_t n_out = options_.out;
  T* db = store_->grad(bias_);
  NDMESH_CUDA_TWIN(store_->device(),
                   cuda::bias_backward(db, static_cast<const BFloat16*>(dout.rounded()), rows, n_out))
  const T* d = static_cast<const T*>(dout.rounded());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t o = 0; o < n_out; ++o) db[o] += d[r * n_out + o];
}

template <typename T>
void Linear<T>::add_bias(T* out, std::int64_t rows, const T* residual) const {
  const std::int64_t n_out = options_.out;
  if (bias_ < 0) {
    if (residual != nullptr) ops::add(out, residual, rows * n_out, store_->device());
    return;
  }
  const T* b = store_->param(bias_);
  NDMESH_CUDA_TWIN(store_->device(), cuda::bias_forward(out, b, rows, n_out, residual))
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t o = 0; o < n_out; ++o) {
      T& y = out[r * n_out + o];
      y += b[o];
      if (residual != nullptr) y += residual[r * n_out + o];
    }
}

template <typename T>
void Linear<T>::backward_bias(const T* dout, std::int64_t rows) const {
  if (bias_ < 0) return;
  const std::int64_t n_out = options_.out;
  T* db = store_->grad(bias_);
  NDMESH_CUDA_TWIN(store_->device(), cuda::bias_backward(db, dout, rows, n_out))
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t o = 0; o < n_out; ++o) db[o] += dout[r * n_out + o];
}

template <typename T>
void DeferredWeightGrads<T>::record(const Linear<T>& layer, const T* dout, const T* inp, const BFloat16* inp16,
                                    std::int64_t rows) {
  // The copy stays where the layer runs (a device-to-device copy on CUDA): the caller's
  // dout buffer is reused before run().
  const std::int64_t n = rows * layer.options().out;
  Tensor<T> copy({n}, layer.device());
  ops::copy<T>(copy.data(), dout, n, layer.device());
  entries_.push_back({&layer, std::move(copy), inp, inp16, rows});
}

template <typename T>
void DeferredWeightGrads<T>::record(const Linear<T>& layer, const BFloat16* dout, const T* inp, const BFloat16* inp16,
                                    std::int64_t rows) {
  const std::int64_t n = rows * layer.options().out;
  Tensor<T> copy({n}, layer.device());
  widen(copy.data(), dout, n, layer.device());
  entries_.push_back({&layer, std::move(copy), inp, inp16, rows});
}

template <typename T>
std::int64_t Linear<T>::grads_end() const {
  auto end = [&](int id) { return id < 0 ? 0 : store_->view(id).offset + store_->view(id).numel; };
  return std::max(end(weight_), end(bias_));
}

template <typename T>
std::int64_t Linear<T>::grads_begin() const {
  const std::int64_t w = store_->view(weight_).offset;
  return bias_ < 0 ? w : std::min(w, store_->view(bias_).offset);
}

template <typename T>
void DeferredWeightGrads<T>::run(const std::function<void(std::int64_t)>& final_from,
                                 const std::function<void(std::int64_t)>& writes_at) {
  // from[k]: the largest grads_end() of the records k.. (what is not final before record k).
  std::vector<std::int64_t> from(entries_.size() + 1, 0);
  for (std::size_t k = entries_.size(); k-- > 0;) from[k] = std::max(from[k + 1], entries_[k].layer->grads_end());
  for (std::size_t k = 0; k < entries_.size(); ++k) {
    const Entry& e = entries_[k];
    if (writes_at) writes_at(e.layer->grads_begin());
    if (e.inp16 != nullptr)
      e.layer->backward_weight(e.dout.data(), e.inp16, e.rows);
    else
      e.layer->backward_weight(e.dout.data(), e.inp, e.rows);
    if (final_from) final_from(from[k + 1]);
  }
  entries_.clear();
}

template <typename T>
DeferWeightGrads<T>::DeferWeightGrads(DeferredWeightGrads<T>& sink) : previous_(deferred_sink<T>()) {
  deferred_sink<T>() = &sink;
}

template <typename T>
DeferWeightGrads<T>::DeferWeightGrads(std::nullptr_t) : previous_(deferred_sink<T>()) {
  deferred_sink<T>() = nullptr;
}

template <typename T>
DeferWeightGrads<T>::~DeferWeightGrads() {
  deferred_sink<T>() = previous_;
}

template class Linear<float>;
template class Linear<double>;
template class DeferredWeightGrads<float>;
template class DeferredWeightGrads<double>;
template class DeferWeightGrads<float>;
template class DeferWeightGrads<double>;

}  // namespace ndmesh::nn
