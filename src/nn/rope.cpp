#include "ndmesh/nn/rope.hpp"

#include <cmath>
#include <numbers>
#include <type_traits>

#include "ndmesh/core/error.hpp"
#include "tensor/cuda_twin.hpp"

namespace ndmesh::nn {

namespace {
// HF's base frequencies and Llama 3's rescaling (transformers' _compute_llama3_parameters),
// in the precision C.
template <typename C>
std::vector<C> inv_freq_in(const RopeOptions& o) {
  const std::int64_t d = o.head_dim;
  std::vector<C> f(static_cast<std::size_t>(d / 2));
  for (std::int64_t i = 0; i < d / 2; ++i) {
    // torch: 1 / base ** (arange(0, d, 2).float() / d), each step in float.
    const C e = static_cast<C>(2 * i) / static_cast<C>(d);
    f[static_cast<std::size_t>(i)] = C(1) / static_cast<C>(std::pow(static_cast<C>(o.theta), e));
  }
  const RopeScaling& s = o.scaling;
  if (s.factor > 0) {
    const C old_len = static_cast<C>(s.original_positions);
    const C low_wavelen = old_len / static_cast<C>(s.low_freq_factor);
    const C high_wavelen = old_len / static_cast<C>(s.high_freq_factor);
    for (C& x : f) {
      const C wavelen = C(2) * std::numbers::pi_v<C> / x;
      C scaled = wavelen > low_wavelen ? x / static_cast<C>(s.factor) : x;
      const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
      if (medium) {
        const C smooth = (old_len / wavelen - static_cast<C>(s.low_freq_factor)) /
                         static_cast<C>(s.high_freq_factor - s.low_freq_factor);
        scaled = (C(1) - smooth) * scaled / static_cast<C>(s.factor) + smooth * scaled;
      }
      x = scaled;
    }
  }
  return f;
}
}  // namespace

std::vector<float> rope_inv_freq(const RopeOptions& options) { return inv_freq_in<float>(options); }

template <typename T>
Rope<T>::Rope(RopeOptions options) : options_(options) {
  NDMESH_CHECK_CONFIG(options_.head_dim > 0 && options_.head_dim % 2 == 0, "model",
                      "rotary positions need an even head size, but it is {}; use --positions learned, or a "
                      "--hidden / --heads (or --head-dim) that gives an even head size",
                      options_.head_dim);
  NDMESH_CHECK_CONFIG(options_.theta > 0, "model",
                      "--rope-theta={} must be positive; e.g. --rope-theta 10000", options_.theta);
  NDMESH_CHECK_CONFIG(
      options_.scaling.factor == 0 ||
          (options_.scaling.factor >= 1 && options_.scaling.original_positions > 0 &&
           options_.scaling.high_freq_factor > options_.scaling.low_freq_factor &&
           options_.scaling.low_freq_factor > 0),
      "model",
      "rope scaling factor={} low_freq_factor={} high_freq_factor={} original positions={}: need "
      "factor >= 1, 0 < low < high and positions > 0 (Llama 3.1: 8, 1, 4, 8192)",
      options_.scaling.factor, options_.scaling.low_freq_factor, options_.scaling.high_freq_factor,
      options_.scaling.original_positions);
  inv_freq_ = inv_freq_in<float>(options_);
  inv_freq_double_ = inv_freq_in<double>(options_);
}

template <typename T>
template <typename S>
void Rope<T>::rotate(S* x, std::int64_t rows, std::int64_t seq, std::int64_t width, std::int64_t heads,
                     const std::int64_t* positions, [[maybe_unused]] Device device, bool inverse) const {
  const std::int64_t d = options_.head_dim, half = d / 2;
  NDMESH_CHECK(heads * d <= width, "nn", "rope: {} heads of {} do not fit rows of {}", heads, d, width);
  NDMESH_CUDA_TWIN(device, {
    if (inv_freq_device_.numel() == 0) {
      inv_freq_device_.set_device(Device::kCuda);
      inv_freq_device_.resize({half});
      cuda::upload(inv_freq_device_.data(), inv_freq_.data(), static_cast<std::size_t>(half) * sizeof(float));
    }
    cuda::rope_rotate(x, inv_freq_device_.data(), positions, rows, seq, width, heads, d, inverse);
  })
  // The math in float for float and bf16 storage (as HF: angles, cos and sin in float), in
  // double for the double model.
  using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const C sign = inverse ? C(-1) : C(1);
  std::vector<C> cs(static_cast<std::size_t>(half)), sn(static_cast<std::size_t>(half));
  std::int64_t last = -1;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t p = positions != nullptr ? positions[r % seq] : r % seq;
    if (p != last) {
      for (std::int64_t i = 0; i < half; ++i) {
        if constexpr (std::is_same_v<C, double>) {
          const double a = static_cast<double>(p) * inv_freq_double_[static_cast<std::size_t>(i)];
          cs[static_cast<std::size_t>(i)] = std::cos(a);
          sn[static_cast<std::size_t>(i)] = std::sin(a);
        } else {
          const float a = static_cast<float>(p) * inv_freq_[static_cast<std::size_t>(i)];
          cs[static_cast<std::size_t>(i)] = static_cast<float>(std::cos(static_cast<double>(a)));
          sn[static_cast<std::size_t>(i)] = static_cast<float>(std::sin(static_cast<double>(a)));
        }
      }
      last = p;
    }
    for (std::int64_t h = 0; h < heads; ++h) {
      S* v = x + r * width + h * d;
      for (std::int64_t i = 0; i < half; ++i) {
        const C c = cs[static_cast<std::size_t>(i)], s = sign * sn[static_cast<std::size_t>(i)];
        C a, b;
        if constexpr (std::is_same_v<S, BFloat16>) {
          a = static_cast<C>(static_cast<float>(v[i]));
          b = static_cast<C>(static_cast<float>(v[i + half]));
          v[i] = BFloat16(static_cast<float>(a * c - b * s));
          v[i + half] = BFloat16(static_cast<float>(b * c + a * s));
        } else {
          a = v[i];
          b = v[i + half];
          v[i] = a * c - b * s;
          v[i + half] = b * c + a * s;
        }
      }
    }
  }
}

// rotate() for the element types forward() and backward() take: T and bfloat16.
#define NDMESH_ROPE_ROTATE(T, S)                                                               \
  template void Rope<T>::rotate<S>(S*, std::int64_t, std::int64_t, std::int64_t, std::int64_t, \
                                   const std::int64_t*, Device, bool) const;
NDMESH_ROPE_ROTATE(float, float)
NDMESH_ROPE_ROTATE(float, BFloat16)
NDMESH_ROPE_ROTATE(double, double)
NDMESH_ROPE_ROTATE(double, BFloat16)
#undef NDMESH_ROPE_ROTATE

template class Rope<float>;
template class Rope<double>;

}  // namespace ndmesh::nn
