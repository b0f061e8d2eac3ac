// gemm against a naive triple loop (every transpose combination, strided operands),
// and the flat parameter store's layout.
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "ndmesh/core/dtype.hpp"
#include "ndmesh/core/error.hpp"
#include "ndmesh/tensor/blas.hpp"
#include "ndmesh/tensor/ops.hpp"
#include "ndmesh/tensor/params.hpp"
#include "ndmesh/tensor/rng.hpp"
#include "ndmesh/tensor/tensor.hpp"

namespace ndmesh {
namespace {

template <typename T>
void check_gemm(bool ta, bool tb) {
  Rng rng(42);
  const std::int64_t m = 5, n = 4, k = 3, lda_pad = 2, ldb_pad = 1, ldc_pad = 3;
  // Stored shapes: A is [m, k] or [k, m] (transposed), with padding columns.
  const std::int64_t a_rows = ta ? k : m, a_cols = ta ? m : k, lda = a_cols + lda_pad;
  const std::int64_t b_rows = tb ? n : k, b_cols = tb ? k : n, ldb = b_cols + ldb_pad;
  const std::int64_t ldc = n + ldc_pad;
  std::vector<T> a(static_cast<std::size_t>(a_rows * lda)), b(static_cast<std::size_t>(b_rows * ldb)),
      c(static_cast<std::size_t>(m * ldc));
  for (auto& x : a) x = static_cast<T>(rng.normal());
  for (auto& x : b) x = static_cast<T>(rng.normal());
  for (auto& x : c) x = static_cast<T>(rng.normal());
  std::vector<T> expect = c;
  auto A = [&](std::int64_t i, std::int64_t p) { return ta ? a[p * lda + i] : a[i * lda + p]; };
  auto B = [&](std::int64_t p, std::int64_t j) { return tb ? b[j * ldb + p] : b[p * ldb + j]; };
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (std::int64_t p = 0; p < k; ++p) s += static_cast<double>(A(i, p)) * static_cast<double>(B(p, j));
      expect[i * ldc + j] = static_cast<T>(2.0 * s + 0.5 * static_cast<double>(c[i * ldc + j]));
    }
  gemm<T>(ta, tb, m, n, k, T(2), a.data(), lda, b.data(), ldb, T(0.5), c.data(), ldc);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < ldc; ++j) {
      const double tol = sizeof(T) == 4 ? 1e-5 : 1e-13;
      EXPECT_NEAR(c[i * ldc + j], expect[i * ldc + j], tol)
          << "ta=" << ta << " tb=" << tb << " at " << i << "," << j;
    }
}

TEST(Tensor, TheElementTypeIsPartOfTheTensor) {
  static_assert(Tensor<float>::dtype() == DType::kFloat32);
  static_assert(Tensor<BFloat16>::dtype() == DType::kBFloat16);
  static_assert(Tensor<std::int32_t>::dtype() == DType::kInt32);
  // A bfloat16 tensor on the CPU: zeroed, copied and zeroed again through ops.
  Tensor<BFloat16> a({2, 3}), b({2, 3});
  EXPECT_EQ(a.numel(), 6);
  for (std::int64_t i = 0; i < 6; ++i) a[i] = BFloat16(static_cast<float>(i) + 0.5f);
  ops::copy(b.data(), a.data(), 6, Device::kCpu);
  EXPECT_EQ(static_cast<float>(b[5]), 5.5f);
  ops::zero(b.data(), 6, Device::kCpu);
  EXPECT_EQ(b[5], BFloat16(0.0f));
  // double stays off the GPU: refused in one line (InternalError: a bug of the caller).
  EXPECT_THROW(ops::check_device<double>(Device::kCuda), Error);
}

// The resident set of this process in bytes (VmRSS of /proc/self/status).
std::int64_t resident_bytes() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  ADD_FAILURE() << "no VmRSS in /proc/self/status";
  return 0;
}

TEST(Tensor, ResizeZeroesEveryElementWhetherItReallocatesOrNot) {
  Tensor<float> t({4, 5});
  for (std::int64_t i = 0; i < 20; ++i) t[i] = 1.0f + static_cast<float>(i);
  t.resize({3});  // shrinks within the storage
  EXPECT_EQ(t.numel(), 3);
  for (std::int64_t i = 0; i < 3; ++i) EXPECT_EQ(t[i], 0.0f) << i;
  for (std::int64_t i = 0; i < 3; ++i) t[i] = 7.0f;
  t.resize({2, 10});  // grows back within the storage: the old values must not come back
  for (std::int64_t i = 0; i < 20; ++i) EXPECT_EQ(t[i], 0.0f) << i;
  for (std::int64_t i = 0; i < 20; ++i) t[i] = 3.0f;
  t.resize({100});  // grows past it: fresh storage
  for (std::int64_t i = 0; i < 100; ++i) EXPECT_EQ(t[i], 0.0f) << i;
  Tensor<BFloat16> h({7});
  for (std::int64_t i = 0; i < 7; ++i) EXPECT_EQ(h[i], BFloat16(0.0f)) << i;
  // to_host() gives the values.
  t[99] = 2.5f;
  EXPECT_EQ(t.to_host().at(99), 2.5f);
}

// A tensor allocated and not written holds no resident memory (zero pages until written):
// a ZeRO-3 rank's full-size flat buffers cost only the blocks it writes.
TEST(Tensor, AnUnwrittenTensorIsNotResident) {
  constexpr std::int64_t kElements = 32 << 20;  // 128 MiB of float
  const std::int64_t before = resident_bytes();
  Tensor<float> t({kElements});
  const std::int64_t allocated = resident_bytes();
  EXPECT_LT(allocated - before, 8 << 20)
      << "allocating 128 MiB made " << ((allocated - before) >> 20) << " MiB resident";
  for (std::int64_t i = 0; i < kElements / 2; ++i) t[i] = 1.0f;  // the first half written
  const std::int64_t written = resident_bytes();
  EXPECT_GT(written - before, 56 << 20)
      << "writing 64 MiB made " << ((written - before) >> 20) << " MiB resident";
  EXPECT_LT(written - before, 72 << 20);
  EXPECT_EQ(t[kElements - 1], 0.0f);  // unwritten elements read as zero
}

TEST(Gemm, MatchesNaiveLoopsFloat) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) check_gemm<float>(ta, tb);
}

TEST(Gemm, MatchesNaiveLoopsDouble) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) check_gemm<double>(ta, tb);
}

TEST(Threads, SetAndRead) {
  set_blas_threads(1);
  EXPECT_EQ(blas_threads(), 1);
  EXPECT_THROW(set_blas_threads(0), Error);
}

TEST(ParamStore, AlignedOffsetsNamedViewsZeroPadding) {
  ParamStore<float> store;
  int a = store.add("a.weight", {3, 5}, true);
  int b = store.add("a.bias", {3}, false);
  int c = store.add("c", {17}, true);
  EXPECT_THROW(store.add("a.bias", {1}, false), Error);
  store.allocate();
  EXPECT_THROW(store.add("late", {1}, false), Error);
  EXPECT_EQ(store.view(a).offset, 0);
  EXPECT_EQ(store.view(b).offset, 16);  // 15 rounded up to kParamAlign
  EXPECT_EQ(store.view(c).offset, 32);
  EXPECT_EQ(store.size(), 64);  // 32 + 17 = 49, rounded up to a multiple of 16
  EXPECT_EQ(store.parameter_count(), 15 + 3 + 17);
  EXPECT_EQ(store.find("a.bias"), b);
  EXPECT_EQ(store.find("nope"), -1);
  EXPECT_EQ(store.param(c), store.params().data() + 32);
  EXPECT_EQ(store.grad(c), store.grads().data() + 32);
  for (float x : store.params()) EXPECT_EQ(x, 0.0f);
}

// The expert partition (expert parallelism): what is declared between begin_experts() and
// end_experts() goes after the dense part and its padding, whatever the declaration order; the
// dense offsets (and so the units) are those of a store without it.
TEST(ParamStore, ExpertPartitionGoesAfterThePaddedDensePart) {
  ParamStore<float> store({.pad_to = 5, .expert_pad_to = 5});
  const int a = store.add("a", {3, 5}, true);
  store.begin_experts();
  const int e = store.add("e", {7}, true);
  EXPECT_THROW(store.begin_experts(), Error);
  store.end_experts();
  const int c = store.add("c", {17}, true);
  EXPECT_THROW(store.end_experts(), Error);
  store.allocate();
  EXPECT_EQ(store.view(a).offset, 0);
  EXPECT_EQ(store.view(c).offset, 16);  // as if "e" were not there
  // 16 + 17 aligned to 16 (48), padded to a multiple of pad_to 5 that is aligned too (80)
  EXPECT_EQ(store.expert_offset(), 80);
  EXPECT_FALSE(store.view(a).expert);
  EXPECT_TRUE(store.view(e).expert);
  EXPECT_EQ(store.view(e).offset, store.expert_offset());
  EXPECT_EQ(store.size(), store.expert_offset() + 20);  // 7 aligned to 16, then to expert_pad_to 5
  EXPECT_EQ(store.param(e), store.params().data() + store.expert_offset());
  EXPECT_EQ(store.parameter_count(), 15 + 7 + 17);
}

// The bfloat16 copy of the parameters (bf16 products on a GPU read their weights from it): it
// is current only after refresh_bf16() or a writer's bf16_written(), holds each parameter
// rounded to bfloat16 (nearest even, as BFloat16 rounds), and every other way of writing
// the parameters (the writable span, mutable_param, params_from_host) makes it stale, where
// param_bf16 answers nullptr and the layers round the fp32 weights themselves. A refresh of
// a current copy casts nothing.
TEST(ParamStore, Bf16CopyIsCurrentOnlyAfterARefreshOrAWriterThatWritesIt) {
  ParamStore<float> store;
  const int w = store.add("w", {3, 7}, true), b = store.add("b", {5}, false);
  EXPECT_FALSE(store.keeps_bf16_copy());
  EXPECT_EQ(store.bf16_copy(), nullptr);
  store.allocate();
  Rng rng(5);
  for (float& x : store.params()) x = static_cast<float>(rng.normal());
  store.refresh_bf16();  // no copy kept: nothing to do
  EXPECT_EQ(store.param_bf16(w), nullptr);
  store.keep_bf16_copy();
  EXPECT_TRUE(store.keeps_bf16_copy());
  EXPECT_EQ(store.param_bf16(w), nullptr) << "a new copy is stale";
  auto expect_current = [&](const char* when) {
    ASSERT_NE(store.param_bf16(w), nullptr) << when;
    for (int id : {w, b})
      for (std::int64_t i = 0; i < store.view(id).numel; ++i)
        EXPECT_EQ(store.param_bf16(id)[i].bits, BFloat16(store.param(id)[i]).bits) << when << ", " << store.view(id).name << "[" << i << "]";
  };
  store.refresh_bf16();
  expect_current("after the first refresh");
  store.refresh_bf16();
  EXPECT_EQ(store.bf16_refreshes(), 1) << "a refresh of a current copy casts";
  store.mutable_param(b)[2] = 3.0f;
  EXPECT_EQ(store.param_bf16(b), nullptr) << "mutable_param leaves the copy current";
  store.refresh_bf16();
  expect_current("after mutable_param and a refresh");
  store.params()[store.view(w).offset] = -1.5f;
  EXPECT_EQ(store.param_bf16(w), nullptr) << "the writable span leaves the copy current";
  store.refresh_bf16();
  const std::vector<float> host(static_cast<std::size_t>(store.size()), 0.25f);
  store.params_from_host(host.data());
  EXPECT_EQ(store.param_bf16(w), nullptr) << "params_from_host leaves the copy current";
  store.refresh_bf16();
  expect_current("after params_from_host and a refresh");
  EXPECT_EQ(store.bf16_refreshes(), 4);
  // A writer that writes both (AdamW's kernel) marks it current without a cast.
  float* p = store.params().data();
  BFloat16* p16 = store.bf16_copy();
  for (std::int64_t i = 0; i < store.size(); ++i) p[i] = 0.5f * static_cast<float>(i), p16[i] = BFloat16(p[i]);
  store.bf16_written();
  expect_current("after a writer wrote both");
  EXPECT_EQ(store.bf16_refreshes(), 4);
  // Reading does not make it stale.
  EXPECT_NE(std::as_const(store).params().data(), nullptr);
  EXPECT_NE(store.param(w), nullptr);
  EXPECT_NE(store.param_bf16(w), nullptr);
}

// Tensor-parallel shards: the fused q|k|v rows (three pieces along dim 0) and a column
// split (dim 1) of a full tensor whose element (i, j) is 100 i + j; every rank's slice,
// written back, rebuilds the full tensor; logical offsets use the full sizes.
TEST(ParamShard, SlicesOfTheFullTensorAndBack) {
  const std::int64_t rows = 12, cols = 3;  // q 4 rows, k 4, v 4
  std::vector<double> full(static_cast<std::size_t>(rows * cols));
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j) full[static_cast<std::size_t>(i * cols + j)] = 100.0 * i + j;
  for (int tp : {1, 2, 4}) {
    std::vector<double> rebuilt(full.size(), -1.0);
    for (int r = 0; r < tp; ++r) {
      ParamShard s{.dim = 0, .full_shape = {rows, cols}, .rank = r, .size = tp};
      for (std::int64_t start : {0, 4, 8}) s.pieces.push_back({start, 4 / tp});
      const std::vector<std::int64_t> local_shape = {rows / tp, cols};
      std::vector<double> local(static_cast<std::size_t>(rows / tp * cols));
      copy_shard(s, local_shape, local.data(), full.data(), false);
      // Local row k of piece p is full row start_p + r * (4 / tp) + k.
      for (std::int64_t p = 0; p < 3; ++p)
        for (std::int64_t k = 0; k < 4 / tp; ++k)
          EXPECT_EQ(local[static_cast<std::size_t>((p * (4 / tp) + k) * cols)], 100.0 * (4 * p + r * (4 / tp) + k))
              << "tp " << tp << " rank " << r;
      copy_shard(s, local_shape, local.data(), rebuilt.data(), true);
    }
    EXPECT_EQ(rebuilt, full) << "tp " << tp;
  }
  // Columns: rank 1 of 3 holds column 1 of every row.
  ParamShard col{.dim = 1, .full_shape = {rows, cols}, .pieces = {{0, 1}}, .rank = 1, .size = 3};
  std::vector<double> local(static_cast<std::size_t>(rows));
  copy_shard(col, {rows, 1}, local.data(), full.data(), false);
  for (std::int64_t i = 0; i < rows; ++i) EXPECT_EQ(local[static_cast<std::size_t>(i)], 100.0 * i + 1);

  ParamStore<float> store;
  store.add("w", {rows / 2, cols}, true, ParamShard{.dim = 0, .full_shape = {rows, cols}, .pieces = {{0, 6}}, .size = 2});
  store.add("b", {5}, false);
  EXPECT_THROW(store.add("bad", {5, cols}, true, ParamShard{.dim = 0, .full_shape = {rows, cols}, .pieces = {{0, 6}}, .size = 2}),
               Error);
  std::int64_t total = 0;
  EXPECT_EQ(store.logical_offsets(&total), (std::vector<std::int64_t>{0, 48}));  // 36 rounded up to 48
  EXPECT_EQ(total, 64);
  EXPECT_EQ(store.view(0).full_numel(), rows * cols);
}

TEST(Rng, SplitMix64ReferenceValues) {
  // First outputs of SplitMix64 seeded with 0 (reference values of the published algorithm).
  Rng rng(0);
  EXPECT_EQ(rng.next(), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(rng.next(), 0x6E789E6AA1B965F4ull);
  Rng again(0);
  again.next();
  Rng copy(again.state());
  EXPECT_EQ(copy.next(), 0x6E789E6AA1B965F4ull);
}

}  // namespace
}  // namespace ndmesh
