// Internal to the CUDA emulator: how device.cpp, blas.cpp and cudnn.cpp feed the account of
// device work (account.hpp; defined in account.cpp). Every function does nothing while the
// account is off.
#pragma once

#include <cstddef>
#include <cstdint>

#include "account.hpp"

namespace emu {

bool account_on();
/// The count-only mode: products, cuDNN calls and copies over 1 MiB are recorded, not run.
bool account_count_only();
/// Names this thread's last launch record if nothing has yet (cuda::detail::timed).
void account_name(const char* name);
void account_product(ndmesh::cuda::emulator::ProductRecord r);
void account_cudnn(ndmesh::cuda::emulator::CudnnRecord r);
void account_copy(const char* name, std::size_t bytes, bool ran);
void account_host_wait();
/// Device memory from the account's arena, and the caching allocator's bookkeeping: a driver
/// allocation is recorded where no block of the size class was given back before.
void* account_alloc(std::size_t bytes);
/// A block of `bytes` given back to the caching allocator (at the free call, as device.cu).
void account_cache_free(std::size_t bytes);
/// Returns p to the arena; false when p is not the arena's.
bool account_arena_free(void* p, std::size_t bytes);
/// The largest power of two up to 16 that divides the address (what cuBLASLt may assume).
inline unsigned alignment_of(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  unsigned bytes = 16;
  while (bytes > 1 && a % bytes != 0) bytes /= 2;
  return bytes;
}
/// Copies and memsets up to this many bytes run in count-only mode (the step's uploads and
/// tables, which kernels read for their control flow); larger ones are only recorded.
inline constexpr std::size_t kCountOnlyCopyLimit = std::size_t{1} << 20;

}  // namespace emu
