// GPU ONLY: runs on a machine with an NVIDIA GPU (built where CUDA is, NDMESH_CUDA); without
// a usable GPU it prints why and exits 0, so that `make bench` on a CPU machine goes on.
//
// Times every kernel of nn/cuda_ops.hpp at the GPT-2 small shape (batch 4, sequence 1024,
// hidden 768, 12 heads of 64, vocabulary 50304 = 50257 padded to a multiple of 128, 124M
// parameters) in fp32, each against a baseline measured in the same run:
//  - gemm (our cuBLASLt path) against cublasSgemm (plain cuBLAS, default math: no TF32) of
//    the same shape and transposes;
//  - the memory-bound kernels against a device-to-device copy moving the same number of
//    bytes (each input read once, each output written once: the fewest bytes the kernel
//    must move), so a ratio near 1 means the kernel runs at the copy's bandwidth;
//  - attention against the cuBLASLt gemm doing the same useful FLOPs (the causal half of
//    QKᵀ and PV: one [B H T, hd] x [hd, T] product for the forward, 2.5 of them for the
//    backward's five products).
// Then the bf16 mixed-precision kernels, each against its fp32 twin (or the unfused fp32
// kernels it replaces) in the same run: ratio < 1 is the speed-up; the gemms print the
// TFLOP/s they reach on tensor cores (an H100's dense bf16 peak is 989).
// Each time is the median of 7 samples of 10 launches between CUDA events, after a warm-up.
// The table ends with ratio = kernel / baseline (lower is better; 1 = as fast as the baseline).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "ndmesh/core/dtype.hpp"
#include "ndmesh/nn/cuda_ops.hpp"
#include "ndmesh/tensor/device.hpp"

namespace {

using ndmesh::DeviceBuffer;
namespace cuda = ndmesh::cuda;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(fmt::format("{}: {}", what, cudaGetErrorString(e)));
}

cudaStream_t stream() { return static_cast<cudaStream_t>(cuda::stream()); }

// Median milliseconds of one call of f.
double time_ms(const std::function<void()>& f) {
  constexpr int kWarmup = 3, kSamples = 7, kReps = 10;
  for (int i = 0; i < kWarmup; ++i) f();
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<double> ms;
  for (int s = 0; s < kSamples; ++s) {
    check(cudaEventRecord(start, stream()), "cudaEventRecord");
    for (int r = 0; r < kReps; ++r) f();
    check(cudaEventRecord(stop, stream()), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float t = 0;
    check(cudaEventElapsedTime(&t, start, stop), "cudaEventElapsedTime");
    ms.push_back(t / kReps);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// A device buffer of n floats with non-zero values (zeros run faster than real data).
DeviceBuffer floats(std::int64_t n, float scale = 1.0f) {
  std::vector<float> host(static_cast<std::size_t>(n));
  std::uint32_t x = 12345;
  for (float& v : host) {
    x = x * 1664525u + 1013904223u;
    v = scale * (static_cast<float>(x >> 8) * 0x1.0p-24f * 2.0f - 1.0f);
  }
  DeviceBuffer b(host.size() * sizeof(float));
  cuda::copy_to_device(b.data(), host.data(), host.size() * sizeof(float));
  return b;
}

template <typename T>
DeviceBuffer ints(std::int64_t n, std::int64_t below) {
  std::vector<T> host(static_cast<std::size_t>(n));
  std::uint32_t x = 777;
  for (T& v : host) {
    x = x * 1664525u + 1013904223u;
    v = static_cast<T>((x >> 8) % static_cast<std::uint32_t>(below));
  }
  DeviceBuffer b(host.size() * sizeof(T));
  cuda::copy_to_device(b.data(), host.data(), host.size() * sizeof(T));
  return b;
}

float* f32(const DeviceBuffer& b) { return static_cast<float*>(b.data()); }

struct Row {
  std::string name, shape;
  double ms;
  std::string baseline;
  double base_ms;
  std::string rate;  // achieved GB/s or TFLOP/s
};

class Bench {
 public:
  Bench() {
    if (cublasCreate(&blas_) != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("cublasCreate failed");
    cublasSetStream(blas_, stream());
  }
  ~Bench() { cublasDestroy(blas_); }

  // Time of a device-to-device copy moving `bytes` (read + written), memoised.
  double copy_ms(double bytes) {
    const auto half = static_cast<std::size_t>(bytes / 2);
    if (copy_src_.bytes() < half) copy_src_ = DeviceBuffer(half), copy_dst_ = DeviceBuffer(half);
    return time_ms([&] { cuda::copy_device(copy_dst_.data(), copy_src_.data(), half); });
  }

  void memory_bound(const std::string& name, const std::string& shape, double bytes,
                    const std::function<void()>& f) {
    const double ms = time_ms(f);
    rows_.push_back({name, shape, ms, "copy of the same bytes", copy_ms(bytes), fmt::format("{:.0f} GB/s", bytes / ms / 1e6)});
  }

  // Row-major C[m,n] = op(A) op(B), ours against cublasSgemm.
  void gemm(const std::string& name, bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k) {
    DeviceBuffer a = floats(m * k), b = floats(k * n), c = floats(m * n);
    const std::int64_t lda = ta ? m : k, ldb = tb ? k : n;
    const float alpha = 1.0f, beta = 0.0f;
    const double ms = time_ms([&] { cuda::gemm(ta, tb, m, n, k, 1.0f, f32(a), lda, f32(b), ldb, 0.0f, f32(c), n); });
    const double base = time_ms([&] {
      cublasSgemm(blas_, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n),
                  static_cast<int>(m), static_cast<int>(k), &alpha, f32(b), static_cast<int>(ldb), f32(a),
                  static_cast<int>(lda), &beta, f32(c), static_cast<int>(n));
    });
    rows_.push_back({name, fmt::format("{}x{}x{} {}{}", m, n, k, ta ? "T" : "N", tb ? "T" : "N"), ms, "cublasSgemm",
                     base, fmt::format("{:.1f} TFLOP/s", 2.0 * m * n * k / ms / 1e9)});
  }

  void compute_bound(const std::string& name, const std::string& shape, double flops, const std::string& baseline,
                     double base_ms, const std::function<void()>& f) {
    const double ms = time_ms(f);
    rows_.push_back({name, shape, ms, baseline, base_ms, fmt::format("{:.1f} TFLOP/s", flops / ms / 1e9)});
  }

  // Host work (driver calls, no kernels) timed on the host: the median of 7 samples of one
  // call, the device idle before and after each.
  void host(const std::string& name, const std::string& shape, const std::string& baseline, double base_ms,
            const std::string& rate_unit, double units, const std::function<void()>& f) {
    f();  // warm-up
    std::vector<double> ms;
    for (int s = 0; s < 7; ++s) {
      cuda::synchronize();
      const auto t0 = std::chrono::steady_clock::now();
      f();
      cuda::synchronize();
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    const double median = ms[ms.size() / 2];
    rows_.push_back(
        {name, shape, median, baseline, base_ms, fmt::format("{:.1f} {}", median * 1e3 / units, rate_unit)});
  }

  // A kernel against another measured in the same run (its fp32 twin): no rate.
  void versus(const std::string& name, const std::string& shape, const std::string& baseline, double base_ms,
              const std::function<void()>& f) {
    rows_.push_back({name, shape, time_ms(f), baseline, base_ms, "-"});
  }

  void print() const {
    fmt::print("\n{:<28} {:<26} {:>10} {:>14} {:>10} {:>8}  {}\n", "kernel", "shape", "ms", "rate", "base ms",
               "ratio", "baseline (same run)");
    for (const Row& r : rows_)
      fmt::print("{:<28} {:<26} {:>10.4f} {:>14} {:>10.4f} {:>8.2f}  {}\n", r.name, r.shape, r.ms, r.rate, r.base_ms,
                 r.ms / r.base_ms, r.baseline);
  }

 private:
  cublasHandle_t blas_ = nullptr;
  DeviceBuffer copy_src_, copy_dst_;
  std::vector<Row> rows_;
};

void run() {
  constexpr std::int64_t B = 4, T = 1024, C = 768, H = 12, hd = 64, V = 50304, N = B * T, P = 124'475'904;
  constexpr double f = sizeof(float);
  Bench bench;

  // Matrix products of one block and the head (forward, then the backward's dinp and dW).
  bench.gemm("gemm qkv", false, true, N, 3 * C, C);
  bench.gemm("gemm attn proj", false, true, N, C, C);
  bench.gemm("gemm fc", false, true, N, 4 * C, C);
  bench.gemm("gemm fc proj", false, true, N, C, 4 * C);
  bench.gemm("gemm fc dinp", false, false, N, C, 4 * C);
  bench.gemm("gemm fc dW", true, false, 4 * C, C, N);
  bench.gemm("gemm lm head", false, true, N, V, C);
  bench.gemm("gemm lm head dinp", false, false, N, C, V);
  bench.gemm("gemm lm head dW", true, false, V, C, N);

  {  // element-wise, over the activations of one block and the parameters
    DeviceBuffer x = floats(N * C), y = floats(N * C), p = floats(P, 1e-3f);
    DeviceBuffer h(static_cast<std::size_t>(N * C) * sizeof(ndmesh::BFloat16));
    const std::string nc = fmt::format("{}x{}", N, C);
    bench.memory_bound("add_inplace", nc, 3 * f * N * C, [&] { cuda::add_inplace(f32(x), f32(y), N * C); });
    bench.memory_bound("fill", nc, f * N * C, [&] { cuda::fill(f32(x), 0.5f, N * C); });
    bench.memory_bound("scale", nc, 2 * f * N * C, [&] { cuda::scale(f32(x), 0.999f, N * C); });
    bench.memory_bound("square_sum (grad norm)", fmt::format("{}", P), f * P, [&] { cuda::square_sum(f32(p), P); });
    bench.memory_bound("sum", fmt::format("{}", P), f * P, [&] { cuda::sum(f32(p), P); });
    bench.memory_bound("cast to bf16", nc, 6.0 * N * C,
                       [&] { cuda::cast(static_cast<ndmesh::BFloat16*>(h.data()), f32(x), N * C); });
    bench.memory_bound("cast from bf16", nc, 6.0 * N * C,
                       [&] { cuda::cast(f32(y), static_cast<const ndmesh::BFloat16*>(h.data()), N * C); });
  }
  {  // bias, GELU, LayerNorm
    DeviceBuffer a = floats(N * 4 * C), da = floats(N * 4 * C), d = floats(N * 4 * C), bias = floats(4 * C),
                 dbias = floats(4 * C);
    const std::string n3 = fmt::format("{}x{}", N, 3 * C), n4 = fmt::format("{}x{}", N, 4 * C);
    bench.memory_bound("bias_forward", n3, 2 * f * N * 3 * C, [&] { cuda::bias_forward(f32(a), f32(bias), N, 3 * C); });
    bench.memory_bound("bias_backward", n3, f * N * 3 * C, [&] { cuda::bias_backward(f32(dbias), f32(d), N, 3 * C); });
    bench.memory_bound("gelu_forward", n4, 2 * f * N * 4 * C, [&] { cuda::gelu_forward(f32(da), f32(a), N * 4 * C); });
    bench.memory_bound("gelu_backward", n4, 4 * f * N * 4 * C,
                       [&] { cuda::gelu_backward(f32(da), f32(d), f32(a), N * 4 * C); });
    DeviceBuffer x = floats(N * C), out = floats(N * C), mean = floats(N), rstd = floats(N), w = floats(C),
                 b = floats(C), dw = floats(C), db = floats(C);
    const std::string nc = fmt::format("{}x{}", N, C);
    bench.memory_bound("layernorm_forward", nc, 2 * f * N * C, [&] {
      cuda::layernorm_forward(f32(out), f32(mean), f32(rstd), f32(x), f32(w), f32(b), N, C, 1e-5f);
    });
    cuda::layernorm_forward(f32(out), f32(mean), f32(rstd), f32(x), f32(w), f32(b), N, C, 1e-5f);
    bench.memory_bound("layernorm_backward", nc, 4 * f * N * C, [&] {
      cuda::layernorm_backward(f32(a), f32(dw), f32(db), f32(d), f32(x), f32(w), f32(mean), f32(rstd), N, C);
    });
  }
  {  // embedding
    DeviceBuffer out = floats(N * C), wte = floats(V * C), wpe = floats(T * C), dwte = floats(V * C),
                 dwpe = floats(T * C), dout = floats(N * C);
    DeviceBuffer tokens = ints<std::int32_t>(N, V), positions = ints<std::int64_t>(T, T);
    const std::string nc = fmt::format("{}x{}", N, C);
    const auto* tok = static_cast<const std::int32_t*>(tokens.data());
    const auto* pos = static_cast<const std::int64_t*>(positions.data());
    // The backward buckets its rows on the host: the same tokens and positions there.
    std::vector<std::int32_t> host_tok(static_cast<std::size_t>(N));
    std::vector<std::int64_t> host_pos(static_cast<std::size_t>(T));
    cuda::copy_to_host(host_tok.data(), tok, host_tok.size() * sizeof(std::int32_t));
    cuda::copy_to_host(host_pos.data(), pos, host_pos.size() * sizeof(std::int64_t));
    bench.memory_bound("embedding_tokens_forward", nc, 2 * f * N * C,
                       [&] { cuda::embedding_tokens_forward(f32(out), tok, f32(wte), N, C, 0, V); });
    bench.memory_bound("embedding_positions_forward", nc, 2 * f * N * C,
                       [&] { cuda::embedding_positions_forward(f32(out), f32(wpe), pos, 0, N, T, C); });
    bench.memory_bound("embedding_backward", nc, 3 * f * N * C, [&] {
      cuda::embedding_backward(f32(dwte), f32(dwpe), f32(dout), host_tok.data(), host_pos.data(), N, T, C, 0, V);
    });
  }
  {  // cross-entropy over the padded vocabulary
    DeviceBuffer logits = floats(N * V, 4.0f), probs = floats(N * V), losses = floats(N), dlogits = floats(N * V);
    DeviceBuffer targets = ints<std::int32_t>(N, V);
    const auto* tg = static_cast<const std::int32_t*>(targets.data());
    const std::string nv = fmt::format("{}x{}", N, V);
    bench.memory_bound("cross_entropy_forward", nv, 2 * f * N * V,
                       [&] { cuda::cross_entropy_forward(f32(probs), f32(losses), f32(logits), tg, N, V); });
    bench.memory_bound("cross_entropy_backward", nv, 3 * f * N * V,
                       [&] { cuda::cross_entropy_backward(f32(dlogits), f32(probs), tg, N, V, 1.0f / N); });
  }
  {  // AdamW over the whole model
    DeviceBuffer w = floats(P, 0.02f), g = floats(P, 1e-3f), m = floats(P, 1e-4f), v = floats(P, 1e-6f);
    bench.memory_bound("adamw_update", fmt::format("{}", P), 7 * f * P, [&] {
      cuda::adamw_update(f32(w), f32(g), f32(m), f32(v), P, 6e-4, 0.9, 0.95, 1e-8, 0.1, 1.0, 0.1, 0.05);
    });
  }
  {  // attention, causal, 12 heads of 64
    DeviceBuffer qkv = floats(N * 3 * C), out = floats(N * C), lse = floats(B * H * T), dout = floats(N * C),
                 dqkv = floats(N * 3 * C);
    // The same useful FLOPs through cuBLASLt: [B H T, hd] x [hd, T] is 2 B H T² hd, the
    // causal half of the forward's two products; the backward's five are 2.5 of it.
    DeviceBuffer q = floats(B * H * T * hd), k = floats(T * hd), s(static_cast<std::size_t>(B * H * T * T) * 4);
    const double gemm_ms = time_ms([&] {
      cuda::gemm(false, true, B * H * T, T, hd, 1.0f, f32(q), hd, f32(k), hd, 0.0f, static_cast<float*>(s.data()), T);
    });
    const double flops = 2.0 * B * H * T * T * hd;
    const std::string shape = fmt::format("B{} T{} H{} hd{}", B, T, H, hd);
    bench.compute_bound("attention_forward", shape, flops, "cuBLASLt gemm, same FLOPs", gemm_ms, [&] {
      cuda::attention_forward(f32(out), f32(lse), f32(qkv), B, T, H, H, hd, nullptr);
    });
    bench.compute_bound("attention_backward", shape, 2.5 * flops, "cuBLASLt gemm, same FLOPs", 2.5 * gemm_ms, [&] {
      cuda::attention_backward(f32(dqkv), f32(dout), f32(qkv), f32(out), f32(lse), B, T, H, H, hd, nullptr);
    });
  }
  {  // bf16 mixed precision against the fp32 twins
    const auto bf16 = [](std::int64_t n, float scale = 1.0f) {
      DeviceBuffer x = floats(n, scale), h(static_cast<std::size_t>(n) * sizeof(ndmesh::BFloat16));
      cuda::cast(static_cast<ndmesh::BFloat16*>(h.data()), f32(x), n);
      return h;
    };
    const auto b16 = [](const DeviceBuffer& b) { return static_cast<ndmesh::BFloat16*>(b.data()); };
    // Products: bf16 in, fp32 accumulation, bf16 out, against the fp32 gemm of the shape.
    const auto gemm_pair = [&](const std::string& name, std::int64_t m, std::int64_t n, std::int64_t k) {
      DeviceBuffer a = floats(m * k), b = floats(n * k), c = floats(m * n);
      DeviceBuffer ha = bf16(m * k), hb = bf16(n * k), hc = bf16(m * n);
      const double base =
          time_ms([&] { cuda::gemm(false, true, m, n, k, 1.0f, f32(a), k, f32(b), k, 0.0f, f32(c), n); });
      const std::string shape = fmt::format("{}x{}x{} NT", m, n, k);
      bench.compute_bound(name, shape, 2.0 * m * n * k, "fp32 gemm (same run)", base, [&] {
        cuda::gemm_bf16(false, true, m, n, k, 1.0f, b16(ha), k, b16(hb), k, 0.0f, b16(hc), n);
      });
    };
    gemm_pair("gemm_bf16 qkv", N, 3 * C, C);
    gemm_pair("gemm_bf16 fc", N, 4 * C, C);
    gemm_pair("gemm_bf16 lm head", N, V, C);
    {  // fc + bias + GELU in one call (aux kept) against fp32 gemm, bias_forward, gelu_forward
      DeviceBuffer a = floats(N * C), w = floats(4 * C * C), pre = floats(N * 4 * C), act = floats(N * 4 * C),
                   bias = floats(4 * C);
      DeviceBuffer ha = bf16(N * C), hw = bf16(4 * C * C), hact = bf16(N * 4 * C), haux = bf16(N * 4 * C),
                   hbias = bf16(4 * C);
      const double base = time_ms([&] {
        cuda::gemm(false, true, N, 4 * C, C, 1.0f, f32(a), C, f32(w), C, 0.0f, f32(pre), 4 * C);
        cuda::bias_forward(f32(pre), f32(bias), N, 4 * C);
        cuda::gelu_forward(f32(act), f32(pre), N * 4 * C);
      });
      bench.compute_bound("gemm_bf16 fc+bias+gelu", fmt::format("{}x{}x{} NT", N, 4 * C, C), 2.0 * N * 4 * C * C,
                          "fp32 gemm, bias, gelu", base, [&] {
                            cuda::gemm_bf16(false, true, N, 4 * C, C, 1.0f, b16(ha), C, b16(hw), C, 0.0f, b16(hact),
                                            4 * C, cuda::GemmEpilogue::kGeluAux, b16(hbias), b16(haux));
                          });
    }
    {  // Each cuBLASLt epilogue of a bf16 step against the plain product and the kernel it saves
       // (llm.c ships its GELU fusion off): ratio < 1, the epilogue is faster; the GPU check's
       // kernels-bench step says which to keep (NDMESH_EPILOGUES=off runs them all apart).
      const std::int64_t F = 4 * C;
      DeviceBuffer ha = bf16(N * C), hw = bf16(F * C), hout = bf16(N * F), haux = bf16(N * F), hbias = bf16(F),
                   hdpre = bf16(N * F), hdc = bf16(N * C), p32 = floats(N * F), b32 = floats(F), db32 = floats(F),
                   dw32 = floats(F * C);
      const std::string fc = fmt::format("{}x{}x{} NT", N, F, C);
      // qkv's bias: the product into bf16 with the bias, against gemm_bf16 and bias_forward (bf16 rows).
      bench.versus("epilogue +bias (qkv)", fmt::format("{}x{}x{} NT", N, 3 * C, C), "gemm_bf16 + bias_forward",
                   time_ms([&] {
                     cuda::gemm_bf16(false, true, N, 3 * C, C, 1.0f, b16(ha), C, b16(hw), C, 0.0f, b16(hout), 3 * C);
                     cuda::bias_forward(b16(hout), f32(b32), N, 3 * C);
                   }),
                   [&] {
                     if (!cuda::try_gemm_bf16(false, true, N, 3 * C, C, b16(ha), C, b16(hw), C, b16(hout), 3 * C,
                                              cuda::GemmEpilogue::kBias, b16(hbias), nullptr))
                       throw std::runtime_error("cuBLASLt declined the bias epilogue (qkv)");
                   });
      // fc's bias and GELU (the aux kept) against the fp32 product and gelu_bias_forward.
      bench.versus("epilogue +gelu (fc)", fc, "gemm_bf16_f32 + gelu_bias_forward",
                   time_ms([&] {
                     cuda::gemm_bf16_f32(false, true, N, F, C, 1.0f, b16(ha), C, b16(hw), C, 0.0f, f32(p32), F);
                     cuda::gelu_bias_forward(b16(hout), b16(haux), f32(p32), b16(hbias), N, F);
                   }),
                   [&] {
                     if (!cuda::try_gemm_bf16(false, true, N, F, C, b16(ha), C, b16(hw), C, b16(hout), F,
                                              cuda::GemmEpilogue::kGeluAux, b16(hbias), b16(haux)))
                       throw std::runtime_error("cuBLASLt declined the GELU epilogue (fc)");
                   });
      // The MLP projection's input gradient through GELU's derivative, against the fp32
      // product and gelu_backward into bf16.
      bench.versus("epilogue +dgelu (proj dinp)", fmt::format("{}x{}x{} NN", N, F, C),
                   "gemm_bf16_f32 + gelu_backward", time_ms([&] {
                     cuda::gemm_bf16_f32(false, false, N, F, C, 1.0f, b16(hdc), C, b16(hw), F, 0.0f, f32(p32), F);
                     cuda::gelu_backward(b16(hdpre), f32(p32), b16(haux), N * F);
                   }),
                   [&] {
                     if (!cuda::try_gemm_bf16(false, false, N, F, C, b16(hdc), C, b16(hw), F, b16(hdpre), F,
                                              cuda::GemmEpilogue::kDGeluNoBiasGrad, nullptr, b16(haux)))
                       throw std::runtime_error("cuBLASLt declined the dGELU epilogue");
                   });
      // fc's weight gradient with its bias gradient, against the product and bias_backward.
      bench.versus("epilogue +bias grad (fc dW)", fmt::format("{}x{}x{} TN", F, C, N),
                   "gemm_bf16_f32 + bias_backward", time_ms([&] {
                     cuda::gemm_bf16_f32(true, false, F, C, N, 1.0f, b16(hdpre), F, b16(ha), C, 1.0f, f32(dw32), C);
                     cuda::bias_backward(f32(db32), b16(hdpre), N, F);
                   }),
                   [&] {
                     if (!cuda::try_gemm_bf16_f32(true, false, F, C, N, 1.0f, b16(hdpre), F, b16(ha), C, 1.0f, f32(dw32),
                                                  C, cuda::GemmEpilogue::kBGradB, nullptr, nullptr, f32(db32)))
                       throw std::runtime_error("cuBLASLt declined the bias gradient epilogue");
                   });
    }
    {  // residual + LayerNorm, and the LayerNorm backward
      DeviceBuffer x = floats(N * C), r = floats(N * C), out = floats(N * C), mean = floats(N), rstd = floats(N),
                   w = floats(C), b = floats(C), dw = floats(C), db = floats(C), d = floats(N * C), dx = floats(N * C);
      DeviceBuffer hx = bf16(N * C), hr = bf16(N * C), hres = bf16(N * C), hout = bf16(N * C), hdy = bf16(N * C),
                   hdx = bf16(N * C);
      const std::string nc = fmt::format("{}x{}", N, C);
      const double base = time_ms([&] {
        cuda::add_inplace(f32(x), f32(r), N * C);
        cuda::layernorm_forward(f32(out), f32(mean), f32(rstd), f32(x), f32(w), f32(b), N, C, 1e-5f);
      });
      bench.versus("residual_layernorm bf16", nc, "fp32 add_inplace + layernorm", base, [&] {
        cuda::residual_layernorm_forward(b16(hres), b16(hout), f32(mean), f32(rstd), b16(hx), b16(hr), f32(w), f32(b),
                                         N, C, 1e-5f);
      });
      const double base_bwd = time_ms([&] {
        cuda::layernorm_backward(f32(dx), f32(dw), f32(db), f32(d), f32(x), f32(w), f32(mean), f32(rstd), N, C);
      });
      bench.versus("layernorm_backward bf16", nc, "fp32 layernorm_backward", base_bwd, [&] {
        cuda::layernorm_backward(b16(hdx), f32(dw), f32(db), b16(hdy), b16(hres), f32(w), f32(mean), f32(rstd), N, C);
      });
    }
    {  // the classifier in place on bf16 logits against the fp32 forward + backward pair
      DeviceBuffer logits = floats(N * V, 4.0f), probs = floats(N * V), losses = floats(N), dlogits = floats(N * V);
      DeviceBuffer hl = bf16(N * V, 4.0f), targets = ints<std::int32_t>(N, 50257);
      const auto* tg = static_cast<const std::int32_t*>(targets.data());
      const double base = time_ms([&] {
        cuda::cross_entropy_forward(f32(probs), f32(losses), f32(logits), tg, N, V);
        cuda::cross_entropy_backward(f32(dlogits), f32(probs), tg, N, V, 1.0f / N);
      });
      bench.versus("classifier bf16 (in place)", fmt::format("{}x{} of {}", N, 50257, V),
                   "fp32 cross_entropy fwd + bwd", base,
                          [&] { cuda::classifier_forward_backward(b16(hl), f32(losses), tg, N, 50257, V, 1.0f / N); });
    }
    {  // multi-tensor AdamW (with the bf16 weight copy) against one adamw_update per tensor
      constexpr int kTensors = 148;  // GPT-2 small's parameter tensors
      const std::int64_t per = P / kTensors;
      DeviceBuffer w = floats(P, 0.02f), g = floats(P, 1e-3f), m = floats(P, 1e-4f), v = floats(P, 1e-6f),
                   hw(static_cast<std::size_t>(P) * sizeof(ndmesh::BFloat16));
      std::vector<cuda::AdamWSegment> segments;
      for (int i = 0; i < kTensors; ++i)
        segments.push_back(
            {.param = i * per, .grad = i * per, .state = i * per, .count = per, .decay = i % 2 ? 0.1 : 0.0});
      const double base = time_ms([&] {
        for (const auto& sg : segments)
          cuda::adamw_update(f32(w) + sg.param, f32(g) + sg.grad, f32(m) + sg.state, f32(v) + sg.state, sg.count,
                             6e-4, 0.9, 0.95, 1e-8, sg.decay, 1.0, 0.1, 0.05);
      });
      bench.versus("adamw_update_multi + bf16 copy", fmt::format("{} in {}", P, kTensors),
                   "one adamw_update per tensor", base, [&] {
                            cuda::adamw_update_multi(f32(w), b16(hw), f32(g), f32(m), f32(v), segments.data(),
                                                     kTensors, 6e-4, 0.9, 0.95, 1e-8, 1.0, 0.1, 0.05);
                          });
    }
  }
  {  // ZeRO's mappable memory (cuda::map_pages / unmap_pages: CUDA's virtual memory management):
     // giving back and backing again 64 MiB in 2 MiB chunks, as a ZeRO-2/3 step does for each
     // unit (GPT-2 small: about 700 chunk cycles a step), against copying the same bytes
    const std::size_t bytes = 64u << 20;
    DeviceBuffer m = DeviceBuffer::mappable(bytes);
    const double chunks = static_cast<double>(bytes / cuda::map_granularity());
    bench.host("unmap + map (mappable)",
               fmt::format("{:.0f} chunks of {} KiB", chunks, cuda::map_granularity() >> 10),
               "device copy of the bytes", bench.copy_ms(2.0 * bytes), "us/chunk", chunks, [&] {
                 cuda::unmap_pages(m.data(), bytes);
                 cuda::map_pages(m.data(), bytes);
               });
  }
  cuda::synchronize();
  bench.print();
}

}  // namespace

int main() {
  const std::string why = cuda::unavailable_reason();
  if (!why.empty()) {
    fmt::print("bench_gpu_kernels: skipped (needs a GPU): {}\n", why);
    return 0;
  }
  try {
    cuda::init(0);
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    fmt::print("bench_gpu_kernels on {} ({} SMs), fp32, TF32 off\n", prop.name, prop.multiProcessorCount);
    run();
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_gpu_kernels: {}\n", e.what());
    return 1;
  }
  return 0;
}
