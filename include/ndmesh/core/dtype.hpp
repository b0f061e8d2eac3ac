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
enum class DType : std::uint8_t { kFloat32, kFloat64, kInt32, kInt64 };

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
  }
  return "?";
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
