// The CUDA emulator's account of device work (emulator/account.hpp), which bench_gpu_model and
// its regression check (gpu_model.*) rest on: what it records of a launch (grid, block, the
// distinct bytes read and written, the width of the accesses), of a product, of a copy, of the
// host's waits and of the caching allocator's driver allocations; that the count-only mode's
// extrapolation from a sample of blocks gives a launch's bytes; and that the kernels the step
// moves its activations with use 16-byte accesses (a scalar LayerNorm fails here). Emulator only.
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "emulator/account.hpp"
#include "gpu_test.hpp"
#include "ndmesh/nn/cuda_ops.hpp"

namespace ndmesh {
namespace {

using cuda::emulator::Account;
using cuda::emulator::AccountMode;
using cuda::emulator::LaunchRecord;
using testing::ptr;

// Starts the account in `mode` and forgets what it recorded so far.
void start(AccountMode mode) {
  cuda::init(0);
  cuda::emulator::account_start(mode);
  cuda::emulator::account_take();
}

// The one launch named `name` in `a` (fails the test when not exactly one).
const LaunchRecord* only(const Account& a, const std::string& name) {
  const LaunchRecord* found = nullptr;
  int n = 0;
  for (const LaunchRecord& l : a.launches)
    if (l.name == name) found = &l, ++n;
  EXPECT_EQ(n, 1) << "launches named " << name;
  return found;
}

TEST(EmulatorAccount, ALaunchRecordsItsGridItsDistinctBytesAndItsAccessWidths) {
  start(AccountMode::kArithmetic);
  const std::int64_t n = 4096 * 3 + 5;  // a scalar tail of 1 element after the float4 body
  DeviceBuffer x(static_cast<std::size_t>(n) * 4), y(static_cast<std::size_t>(n) * 4);
  cuda::fill(ptr<float>(y), 1.0f, n);
  cuda::emulator::account_take();
  cuda::add_inplace(ptr<float>(x), ptr<float>(y), n);
  const Account a = cuda::emulator::account_take();
  ASSERT_EQ(a.launches.size(), 1u);
  const LaunchRecord& l = a.launches[0];
  EXPECT_EQ(l.name, "add_inplace");
  EXPECT_EQ(l.grid[0], static_cast<unsigned>(((n + 3) / 4 + 255) / 256));  // blocks_for over float4s
  EXPECT_EQ(l.block[0], 256u);
  EXPECT_EQ(l.sampled_blocks, static_cast<int>(l.blocks()));
  EXPECT_DOUBLE_EQ(l.bytes_read, 2.0 * 4 * static_cast<double>(n));  // x and y, each once
  EXPECT_DOUBLE_EQ(l.bytes_written, 4.0 * static_cast<double>(n));
  // 3 x 4096 / 4 float4 loads of x and y and stores of x; the tail's scalars (3 x 4 B).
  EXPECT_DOUBLE_EQ(l.access_bytes[4], 3.0 * 16 * static_cast<double>(n / 4));
  EXPECT_DOUBLE_EQ(l.access_bytes[2], 3.0 * 4 * static_cast<double>(n % 4));
  EXPECT_LT(l.narrow_share(), 0.001);
  // Misaligned by 4 bytes, the same kernel falls back to scalar accesses.
  cuda::add_inplace(ptr<float>(x) + 1, ptr<float>(y) + 1, n - 1);
  const Account b = cuda::emulator::account_take();
  ASSERT_EQ(b.launches.size(), 1u);
  EXPECT_DOUBLE_EQ(b.launches[0].narrow_share(), 1.0);
  cuda::emulator::account_start(AccountMode::kOff);
}

TEST(EmulatorAccount, CountOnlyExtrapolatesALaunchsBytesFromASampleOfItsBlocks) {
  // A launch whose blocks all do the same: the sample's bytes times grid / sample are the
  // launch's, exactly; a weight every block reads (LayerNorm's) is counted once.
  start(AccountMode::kArithmetic);
  const std::int64_t rows = 8 * 64, c = 768;  // 64 blocks of 8 rows
  DeviceBuffer inp(static_cast<std::size_t>(rows * c) * 4), out(static_cast<std::size_t>(rows * c) * 2),
      w(static_cast<std::size_t>(c) * 4), b(static_cast<std::size_t>(c) * 4), mean(static_cast<std::size_t>(rows) * 4),
      rstd(static_cast<std::size_t>(rows) * 4);
  cuda::fill(ptr<float>(inp), 0.5f, rows * c);
  cuda::fill(ptr<float>(w), 1.0f, c);
  cuda::fill(ptr<float>(b), 0.0f, c);
  cuda::emulator::account_take();
  auto norm = [&] {
    cuda::layernorm_forward(ptr<BFloat16>(out), ptr<float>(mean), ptr<float>(rstd), ptr<float>(inp), ptr<float>(w),
                            ptr<float>(b), rows, c, 1e-5f);
    return cuda::emulator::account_take();
  };
  const Account exact = norm();
  cuda::emulator::account_start(AccountMode::kCountOnly);
  const Account sampled = norm();
  const LaunchRecord* e = only(exact, "layernorm_forward (into bf16)");
  const LaunchRecord* s = only(sampled, "layernorm_forward (into bf16)");
  ASSERT_TRUE(e && s);
  EXPECT_GT(e->blocks(), 5);
  EXPECT_EQ(s->sampled_blocks, 5);
  // inp and the weights read, out (bf16), mean and rstd written.
  EXPECT_DOUBLE_EQ(e->bytes_read, 4.0 * static_cast<double>(rows * c + 2 * c));
  EXPECT_DOUBLE_EQ(e->bytes_written, 2.0 * static_cast<double>(rows * c) + 8.0 * static_cast<double>(rows));
  EXPECT_DOUBLE_EQ(s->bytes_read, e->bytes_read);
  EXPECT_DOUBLE_EQ(s->bytes_written, e->bytes_written);
  EXPECT_NEAR(s->narrow_share(), e->narrow_share(), 1e-12);
  cuda::emulator::account_start(AccountMode::kOff);
}

TEST(EmulatorAccount, ProductsRecordTheirShapeTypesAlignmentAndRows) {
  start(AccountMode::kCountOnly);  // the product is recorded, not run
  const std::int64_t m = 64, n = 50257, k = 768;
  DeviceBuffer a(static_cast<std::size_t>(m * k) * 2), b(static_cast<std::size_t>(n * k) * 2),
      c(static_cast<std::size_t>(m * 50304) * 2);
  cuda::gemm_bf16(false, true, m, n, k, 1.0f, ptr<BFloat16>(a), k, ptr<BFloat16>(b), k, 0.0f, ptr<BFloat16>(c), n);
  cuda::gemm_bf16(false, true, m, 50304, k, 1.0f, ptr<BFloat16>(a), k, ptr<BFloat16>(b), k, 0.0f, ptr<BFloat16>(c),
                  50304);
  // The product into padded rows still writes rows of 50257 elements.
  cuda::gemm_bf16(false, true, m, n, k, 1.0f, ptr<BFloat16>(a), k, ptr<BFloat16>(b), k, 0.0f, ptr<BFloat16>(c), 50304);
  // A pointer 2 bytes into a buffer: aligned to 2 bytes only.
  cuda::gemm_bf16(false, true, m, 64, k, 1.0f, ptr<BFloat16>(a) + 1, k, ptr<BFloat16>(b), k, 0.0f, ptr<BFloat16>(c), 64);
  const Account r = cuda::emulator::account_take();
  ASSERT_EQ(r.products.size(), 4u);
  EXPECT_EQ(r.products[0].name, "gemm bf16 64x50257x768 NT");
  EXPECT_EQ(r.products[0].m, m);
  EXPECT_EQ(r.products[0].ldc, n);
  EXPECT_EQ(r.products[0].ab_bytes, 2);
  EXPECT_EQ(r.products[0].misalignment(), "ldc 100514 B");  // GPT-2's unpadded vocabulary
  EXPECT_EQ(r.products[1].misalignment(), "");              // padded to 50304
  EXPECT_EQ(r.products[2].misalignment(), "C rows of 100514 B");
  EXPECT_EQ(r.products[3].misalignment(), "A aligned to 2 B");
  EXPECT_DOUBLE_EQ(r.products[1].flops(), 2.0 * m * 50304 * k);
  ASSERT_EQ(r.order.size(), 4u);
  EXPECT_EQ(r.order[3].kind, Account::Kind::kProduct);
  cuda::emulator::account_start(AccountMode::kOff);
}

TEST(EmulatorAccount, DriverAllocationsAreTheCachingAllocatorsMissesAndHostWaitsAreCounted) {
  start(AccountMode::kArithmetic);
  {
    DeviceBuffer first(3000);  // a class of 3072 bytes: nothing cached yet
  }
  const Account a = cuda::emulator::account_take();
  ASSERT_EQ(a.allocations.size(), 1u);
  EXPECT_EQ(a.allocations[0].bytes, 3072u);
  {
    DeviceBuffer again(2900);  // the same class: the block given back serves it
    DeviceBuffer big(std::size_t{3} << 20);
    double host = 0;
    cuda::copy_to_host(&host, again.data(), sizeof host);
    cuda::synchronize();
  }
  const Account b = cuda::emulator::account_take();
  ASSERT_EQ(b.allocations.size(), 1u);
  EXPECT_EQ(b.allocations[0].bytes, std::size_t{4} << 20);  // 2 MiB classes above 1 MiB
  EXPECT_EQ(b.host_waits, 2);
  ASSERT_EQ(b.copies.size(), 1u);
  EXPECT_EQ(b.copies[0].name, "copy device to host");
  cuda::emulator::account_start(AccountMode::kOff);
}

TEST(EmulatorAccount, TheKernelsThatMoveTheActivationsUse16ByteAccesses) {
  // The kernels of a bf16 step at GPT-2's width (768 channels; 64 rows): at most a tenth of
  // what each moves goes through accesses narrower than 16 bytes (a LayerNorm, cast, classifier
  // or AdamW that loads one element at a time moves all of it so: bench_gpu_model's
  // narrow_access_kernels).
  start(AccountMode::kArithmetic);
  const std::int64_t rows = 64, c = 768, vocab = 1024, n = rows * c;
  auto f32 = [](std::int64_t k) { return DeviceBuffer(static_cast<std::size_t>(k) * 4); };
  auto b16 = [](std::int64_t k) { return DeviceBuffer(static_cast<std::size_t>(k) * 2); };
  DeviceBuffer x = f32(n), r = f32(n), res = f32(n), dx = f32(n), dy = f32(n), w = f32(c), b = f32(c), dw = f32(c),
               db = f32(c), ds = f32(c), mean = f32(rows), rstd = f32(rows), y16 = b16(n), logits = b16(rows * vocab),
               losses = f32(rows), targets(static_cast<std::size_t>(rows) * 4), wte = f32(vocab * c), wpe = f32(c * c),
               pos(static_cast<std::size_t>(c) * 8), sq(8);
  for (DeviceBuffer* d : {&x, &r, &dy, &w, &b, &dw, &db, &ds, &mean, &rstd, &wte, &wpe})
    cuda::fill(ptr<float>(*d), 0.5f, static_cast<std::int64_t>(d->bytes() / 4));
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(rows));
  std::vector<std::int64_t> positions(static_cast<std::size_t>(rows));
  for (std::int64_t i = 0; i < rows; ++i)
    tokens[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i * 7 % vocab), positions[static_cast<std::size_t>(i)] = i;
  cuda::copy_to_device(targets.data(), tokens.data(), tokens.size() * 4);
  cuda::copy_to_device(pos.data(), positions.data(), positions.size() * 8);
  cuda::emulator::account_take();
  cuda::layernorm_forward(ptr<BFloat16>(y16), ptr<float>(mean), ptr<float>(rstd), ptr<float>(x), ptr<float>(w),
                          ptr<float>(b), rows, c, 1e-5f);
  cuda::residual_layernorm_forward(ptr<float>(res), ptr<BFloat16>(y16), ptr<float>(mean), ptr<float>(rstd),
                                   ptr<float>(x), ptr<float>(r), ptr<float>(w), ptr<float>(b), rows, c, 1e-5f,
                                   ptr<float>(b));
  cuda::layernorm_backward(ptr<float>(dx), ptr<float>(dw), ptr<float>(db), ptr<float>(dy), ptr<float>(x),
                           ptr<float>(w), ptr<float>(mean), ptr<float>(rstd), rows, c, ptr<float>(r), ptr<float>(ds));
  cuda::bias_forward(ptr<float>(x), ptr<float>(b), rows, c, ptr<float>(r));
  cuda::cast(ptr<BFloat16>(y16), ptr<float>(x), n);
  cuda::cast(ptr<float>(x), ptr<BFloat16>(y16), n);
  cuda::classifier_forward_backward(ptr<BFloat16>(logits), ptr<float>(losses), ptr<std::int32_t>(targets), rows,
                                    vocab - 5, vocab, 0.01f);
  cuda::embedding_forward(ptr<BFloat16>(y16), ptr<std::int32_t>(targets), ptr<float>(wte), ptr<float>(wpe),
                          ptr<std::int64_t>(pos), rows, rows, c);
  cuda::embedding_backward(ptr<float>(wte), ptr<float>(wpe), ptr<float>(dy), tokens.data(), positions.data(), rows,
                           rows, c, 0, vocab);
  const cuda::AdamWSegment segments[] = {{0, 0, 0, n, 0.1}};
  cuda::adamw_update_multi(ptr<float>(x), ptr<BFloat16>(y16), ptr<float>(dy), ptr<float>(r), ptr<float>(res),
                           segments, 1, 1e-3, 0.9, 0.95, 1e-8, 1.0, 0.1, 0.05);
  const float* pieces[] = {ptr<float>(dy), ptr<float>(dw)};
  const std::int64_t sizes[] = {n, c};
  cuda::square_sum_many_into(ptr<double>(sq), pieces, sizes, 2);
  const Account a = cuda::emulator::account_take();
  std::set<std::string> seen;
  for (const LaunchRecord& l : a.launches) {
    seen.insert(l.name);
    if (l.bytes() < 4096) continue;  // the final passes of the sums, a few bytes each
    EXPECT_LT(l.narrow_share(), 0.1) << l.name << ": " << 100 * l.narrow_share()
                                     << "% of its bytes in accesses under 16 bytes";
  }
  for (const char* name : {"layernorm_forward (into bf16)", "residual_layernorm_forward (into bf16)",
                           "layernorm_backward", "column sums", "bias_forward (+residual)", "cast to bfloat16",
                           "cast from bfloat16", "classifier_forward_backward", "embedding_forward",
                           "embedding_backward (token table)", "embedding_backward (position table)",
                           "adamw_update_multi", "square_sum_many"})
    EXPECT_EQ(seen.count(name), 1u) << "no launch named " << name;
  cuda::emulator::account_start(AccountMode::kOff);
}

}  // namespace
}  // namespace ndmesh
