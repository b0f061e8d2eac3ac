// The CUDA emulator's account of device work (bench/bench_gpu_model.cpp, tests/gpu/test_account.cpp):
// what every kernel launch, matrix product, cuDNN call, copy and memset on the device did, the
// host's waits for the device, and the allocations the caching allocator would have asked the
// driver for. Linked into the emulated binaries only (tests/gpu/CMakeLists.txt).
//
// How a launch is measured: the account's copy of the translated kernels
// (ndmesh_cuda_emulated_account, linked into bench_gpu_model and test_account; the kernel tests
// link an uninstrumented one) is compiled with GCC's ThreadSanitizer instrumentation
// (-fsanitize=thread, without its run-time: account.cpp defines the hooks),
// which calls a hook with the address and size of every load and store. While a block of an
// accounted launch runs, the hooks keep the accesses that fall into device memory: the bytes
// moved by accesses of each width (1, 2, 4, 8 or 16 bytes: a float4 or a 16-byte pack is one
// 16-byte access, as on the GPU, which the compile flags keep from being split or merged), and
// the distinct bytes read and written (32-byte sectors with a mask of their bytes).
//
// Modes:
//  - kArithmetic: every block of every launch runs, as without the account; the distinct bytes
//    are the launch's, exactly.
//  - kCountOnly: nothing of the arithmetic runs but a sample of each launch's blocks (the
//    middle block of each fifth of the grid: all of them when there are at most five); device
//    memory is address space only (an unbacked arena: untouched pages read as zeros), matrix
//    products and copies larger than 1 MiB are recorded, not run, and cuDNN's attention is
//    "available" and recorded (it is what a GPU run takes under --precision bf16). A launch's
//    bytes are then extrapolated from its sample: a sector that two or more sampled blocks
//    touched is counted once (a weight every block reads), one that a single block touched is
//    that block's own and counts grid / sampled times. So a whole GPT-2 small step is
//    accounted in seconds. What the sampled blocks read is zeros or what small uploads
//    (tokens, targets, tables) wrote: enough for the kernels' control flow, nothing more.
// The mode is chosen before the device allocations to account (the account's arena holds every
// device allocation made while the account is on, so that the hooks tell device memory by its
// address; memory allocated before is not seen), and may change between steps.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ndmesh::cuda::emulator {

enum class AccountMode { kOff, kArithmetic, kCountOnly };

/// Access widths the hooks distinguish: 1, 2, 4, 8 and 16 bytes (index i: 1 << i bytes).
inline constexpr int kWidths = 5;

/// One kernel launch.
struct LaunchRecord {
  std::string name;                  ///< what check_launch named it ("" if nothing did)
  std::array<unsigned, 3> grid{}, block{};
  std::size_t shared_bytes = 0;      ///< dynamic shared memory
  double bytes_read = 0, bytes_written = 0;  ///< distinct device bytes (count-only: extrapolated)
  std::array<double, kWidths> access_bytes{};  ///< device bytes moved by accesses of each width
  int sampled_blocks = 0;            ///< blocks run (count-only: the sample; else every block)
  std::int64_t blocks() const {
    return std::int64_t{grid[0]} * grid[1] * grid[2];
  }
  std::int64_t threads_per_block() const { return std::int64_t{block[0]} * block[1] * block[2]; }
  double bytes() const { return bytes_read + bytes_written; }
  /// Share of the bytes its accesses moved that went through accesses narrower than 16 bytes.
  double narrow_share() const;
};

/// One matrix product (cuda::gemm, gemm_bf16, gemm_bf16_f32, try_gemm_bf16(_f32)) as cuBLASLt
/// would get it: row-major C[m, n] = op(A)[m, k] op(B)[k, n] with row strides lda, ldb, ldc.
struct ProductRecord {
  std::string name;  ///< the kernel times' name: "gemm bf16>fp32 16384x2304x768 NT +bias grad"
  bool trans_a = false, trans_b = false;
  std::int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  int ab_bytes = 4, c_bytes = 4;   ///< element sizes of A and B, of C
  std::string epilogue;            ///< "", "bias", "gelu", "dgelu", "bias grad", ...
  /// The largest power of two up to 16 that divides each pointer (bias and aux 16 when absent).
  unsigned align_a = 16, align_b = 16, align_c = 16, align_bias = 16, align_aux = 16;
  bool beta_reads_c = false;
  bool ran = true;  ///< false: a try_ product that declined (nothing ran)
  double flops() const { return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k); }
  /// A, B, C once each (C twice when beta reads it), and the epilogue's vector and aux.
  double bytes() const;
  /// Why cuBLASLt would be kept off its fastest kernels, or "" (an operand's row stride, lda
  /// ldb or ldc times the element size, or the length of its rows not a multiple of 16 bytes;
  /// a pointer not 16-byte aligned).
  std::string misalignment() const;
};

/// One call of cuDNN's fused attention (forward or backward; bf16 q, k, v, o and their gradients).
struct CudnnRecord {
  std::string name;  ///< "attention_forward_cudnn (batch=16 seq=1024 heads=12 kv_heads=12 head_dim=64)"
  bool backward = false;
  std::int64_t batch = 0, seq = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int element_bytes = 2;
  /// Causal FLOPs as `ndmesh plan` counts them: forward 2 b s^2 H hd (half of Q K^T and P V),
  /// backward 5 b s^2 H hd (its four products and the recomputed scores).
  double flops() const;
  /// q, k, v, o (and in the backward dO, dq, dk, dv) once each, and the fp32 statistics.
  double bytes() const;
};

/// A copy or memset on the device.
struct CopyRecord {
  std::string name;  ///< "copy host to device", "copy on the device", "copy device to host", "memset"
  std::size_t bytes = 0;
  bool ran = true;   ///< count-only: false when skipped (larger than 1 MiB)
};

/// A block the caching allocator would have taken from the driver (cudaMalloc): none was
/// cached in its size class (512 B below 1 MiB, 2 MiB above: src/tensor/cuda/device.cu).
struct AllocationRecord {
  std::size_t bytes = 0;     ///< the size class
  std::string after;         ///< the device operation recorded last before it ("" at the start)
};

/// What happened between two account_take() calls, in call order.
struct Account {
  enum class Kind : std::uint8_t { kLaunch, kProduct, kCudnn, kCopy };
  struct Op {
    Kind kind;
    std::size_t index;  ///< into the vector of its kind
  };
  std::vector<LaunchRecord> launches;
  std::vector<ProductRecord> products;
  std::vector<CudnnRecord> cudnn;
  std::vector<CopyRecord> copies;
  std::vector<AllocationRecord> allocations;
  std::vector<Op> order;
  std::int64_t host_waits = 0;  ///< synchronisations, copies to the host, event waits
};

/// Turns the account on in `mode` (or off with kOff; queued work runs first, in the old mode).
/// Device memory allocated while it is on comes from its arena; allocate what is to be
/// accounted after the first call.
void account_start(AccountMode mode);
/// The mode account_start chose (kOff before).
AccountMode account_mode();
/// Runs what is queued, and returns and forgets what was recorded since the last call (the
/// allocator's cache stays: the next step reuses what the last freed).
Account account_take();

}  // namespace ndmesh::cuda::emulator
