// Element types that cross the library's boundaries (communication, checkpoints).
// Counts are always elements, never bytes: the byte size comes from the trait.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>

namespace ndmesh {

/// The element types ndmesh moves between ranks and to disk.
enum class DType : std::uint8_t { kFloat32, kFloat64, kInt32, kInt64, kBFloat16 };

/// bfloat16: the upper half of a float32 (8 exponent bits, 7 mantissa bits). Converting
/// from float rounds to nearest even; NaN stays NaN. Used to halve the bytes of gradient
/// communication; arithmetic happens in float.
struct BFloat16 {
  std::uint16_t bits = 0;

  BFloat16() = default;
  explicit BFloat16(float f) : bits(from_float(f)) {}
  explicit operator float() const {
    std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
    float f;
    __builtin_memcpy(&f, &u, sizeof f);
    return f;
  }
  static std::uint16_t from_float(float f) {
    std::uint32_t u;
    __builtin_memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<std::uint16_t>(u >> 16);
  }
  bool operator==(const BFloat16&) const = default;
};

/// The operands of a matrix product: fp32 as stored, or each operand rounded to bfloat16
/// (to nearest even, as BFloat16) with the products accumulated in fp32 into an fp32 result:
/// the arithmetic of a bf16 tensor-core product (a product of two bf16 values is exact in
/// fp32), up to summation order. Mixed precision at the matrix products (--precision bf16).
enum class MatmulPrecision : std::uint8_t { kFp32, kBf16 };

/// DTypeOf<T>::value is the DType of T; only defined for supported element types.
template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::kFloat32;
};
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::kFloat64;
};
template <>
struct DTypeOf<std::int32_t> {
  static constexpr DType value = DType::kInt32;
};
template <>
struct DTypeOf<std::int64_t> {
  static constexpr DType value = DType::kInt64;
};
template <>
struct DTypeOf<BFloat16> {
  static constexpr DType value = DType::kBFloat16;
};

/// True for the element types ndmesh can communicate.
template <typename T>
concept Element = requires {
  DTypeOf<T>::value;
};

/// Bytes per element of a DType.
constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat64:
      return 8;
    case DType::kInt32:
      return 4;
    case DType::kInt64:
      return 8;
    case DType::kBFloat16:
      return 2;
  }
  return 0;
}

/// Lower-case name of a DType ("float32", ...).
constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kBFloat16:
      return "bfloat16";
  }
  return "?";
}

/// Calls f(T{}) with the element type of `t` (float, double, int32, int64, BFloat16): the one
/// switch over DType that typed code dispatches through, e.g.
///   visit_dtype(s.dtype, [&]<typename T>(T) { use(std::span<T>(static_cast<T*>(s.data), s.count)); });
template <typename F>
decltype(auto) visit_dtype(DType t, F&& f) {
  switch (t) {
    case DType::kFloat32:
      return f(float{});
    case DType::kFloat64:
      return f(double{});
    case DType::kInt32:
      return f(std::int32_t{});
    case DType::kInt64:
      return f(std::int64_t{});
    case DType::kBFloat16:
      return f(BFloat16{});
  }
  __builtin_unreachable();  // every DType is a case above
}

/// A typed, untyped-at-runtime view of elements: what backends receive.
struct ElementSpan {
  void* data = nullptr;
  std::size_t count = 0;  ///< elements, not bytes
  DType dtype = DType::kFloat32;

  std::size_t bytes() const { return count * dtype_size(dtype); }

  /// A view of `s`; for a span of const elements the backend must only read it.
  template <typename T>
    requires Element<std::remove_const_t<T>>
  static ElementSpan of(std::span<T> s) {
    return {const_cast<std::remove_const_t<T>*>(s.data()), s.size(), DTypeOf<std::remove_const_t<T>>::value};
  }
};

}  // namespace ndmesh
