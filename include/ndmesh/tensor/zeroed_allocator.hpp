// Host memory that reads as zero without being written: std::vector's allocator for buffers
// that may be far larger than what a rank ever touches (a ZeRO-3 rank's flat parameter and
// gradient buffers, of which it keeps one block per unit; a state dict's host copies, of which
// a load fills the kept ranges).
//
// allocate() is calloc: glibc serves a large block (above its mmap threshold, at most 32 MiB)
// from a fresh anonymous mapping and skips the clearing, so the pages stay the kernel's shared
// zero page until written and count in no resident set. Value-initialising an element (what
// vector(n) and resize(n) do) is a no-op, relying on that zero: it holds for elements in fresh
// storage, NOT for those a vector regrows into within its capacity after shrinking (they hold
// what they held). So grow only by taking fresh storage, as Tensor::resize does, or zero the
// elements yourself.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace ndmesh {

/// calloc-backed allocator whose value-initialisation leaves the (zero) memory as it is.
/// For types whose zero is all-zero bits (arithmetic types, BFloat16).
template <typename T>
struct ZeroedAllocator {
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>,
                "ZeroedAllocator holds trivially copyable types, whose zero is all-zero bits");
  using value_type = T;

  ZeroedAllocator() = default;
  template <typename U>
  ZeroedAllocator(const ZeroedAllocator<U>&) noexcept {}  // NOLINT(google-explicit-constructor): rebinding

  T* allocate(std::size_t n) {
    if (n == 0) return nullptr;
    if (n > static_cast<std::size_t>(-1) / sizeof(T)) throw std::bad_array_new_length();
    void* p = std::calloc(n, sizeof(T));
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t) noexcept { std::free(p); }

  /// Value-initialisation: the memory is already zero (see the file's comment).
  template <typename U>
  void construct(U*) noexcept {}
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }

  friend bool operator==(const ZeroedAllocator&, const ZeroedAllocator&) noexcept { return true; }
};

/// A vector whose fresh elements are zero pages until written (ZeroedAllocator).
template <typename T>
using ZeroedVector = std::vector<T, ZeroedAllocator<T>>;

}  // namespace ndmesh
