// `ndmesh calibrate`: measures on this machine what the planner's time model needs and
// writes a hardware file that `ndmesh plan --hardware FILE` reads (docs/plan.md).
//
//   mpirun -np 2 ndmesh calibrate --seconds 10 --output host.toml
//   ndmesh calibrate --output host.toml          (one rank: matrix multiplications only)
//
// Every rank multiplies matrices at the same time (as in training, they share the cores)
// with the BLAS thread count `ndmesh train` would use; the rate of the slowest rank is the
// planner's FLOP/s per "GPU". Inside a node (the ranks of one shared-memory split) it times
// all-reduce, all-gather and a point-to-point ping-pong at a small size (latency) and a
// large one (bandwidth); across nodes (the ranks with the same local rank) the all-reduce
// again. Bandwidths are bus bandwidths: all-reduce 2 (n-1)/n x bytes / time, all-gather
// (n-1)/n x gathered bytes / time, point-to-point bytes / one-way time.
//
// With --device cuda each rank takes its GPU (its local rank modulo the GPUs it sees) and
// times there what the planner needs of a GPU (nn/device_rates.hpp): the products of a
// GPT-2-small-like layer (--tokens x --hidden: the QKV, output, MLP up and down products of
// nn::Linear's forward) in fp32 (cuBLASLt, TF32 off: peak_tflops, and the [gemm] curve the
// overhead is fitted to, at tokens/8 and tokens) and with bf16 operands (bf16_tflops), a
// device-to-device copy (memory_gbps), copies between pinned host memory and the GPU
// (host_to_device_gbps, device_to_host_gbps), the fp32 attention kernel (--seq, --heads:
// attention_tflops), the GPU's memory (cudaMemGetInfo), and with
// several ranks the collectives over device buffers (NCCL, or staged: the train's device
// communicator).
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "ndmesh/comm/communicator.hpp"
#include "ndmesh/core/error.hpp"
#include "ndmesh/nn/device_rates.hpp"
#include "ndmesh/nn/offload.hpp"
#include "ndmesh/parallel/parallelize.hpp"
#include "ndmesh/plan/formulas.hpp"
#include "ndmesh/plan/hardware_file.hpp"
#include "ndmesh/tensor/blas.hpp"
#include "subcommand.hpp"

// Its own namespace: the tool compiles as a unity build (CMakeLists.txt), where every
// subcommand's file shares one translation unit with the others.
namespace ndmesh::cli::calibrate_command {
namespace {

using comm::Communicator;
using comm::ReduceOp;
using Clock = std::chrono::steady_clock;

struct CalibrateOptions {
  std::string output = "hardware.toml";
  double seconds = 10;
  std::int64_t threads = 0;
  std::int64_t gemm_size = 512;
  std::int64_t bytes = 4 << 20;
  double memory_gib = 0;
  std::string name;
  std::string device = "cpu";
  bool json = false;
  std::string disk_dir;   // where the disk rates are measured (default: the temporary folder)
  double disk_mib = 256;  // bytes of the file written and read back
  std::int64_t tokens = 8192;  // --device cuda: rows of the layer products (batch 8 x sequence 1024)
  std::int64_t hidden = 768;   // --device cuda: the layer's width (GPT-2 small)
  std::int64_t heads = 12;     // --device cuda: its attention heads
  std::int64_t seq = 1024;     // --device cuda: tokens per sequence of the attention core
};

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The disk a node offloads to: rank 0 writes a file of `mib` MiB through the offload
// path (O_DIRECT blocks, nn/offload.hpp) and reads it back; bytes/s of each.
std::pair<double, double> disk_rates(const std::string& dir, double mib) {
  const auto elements = static_cast<std::int64_t>(mib * (1 << 20) / 8);  // two moments of 4 bytes
  std::vector<float> m(static_cast<std::size_t>(elements), 1.0f), v(m.size(), 2.0f);
  const std::string path =
      (std::filesystem::path(dir) / fmt::format("ndmesh-calibrate-{}.adamw", ::getpid())).string();
  nn::OffloadFile file(path, elements);
  const double bytes = 8.0 * static_cast<double>(elements);
  auto t0 = Clock::now();
  file.write_all(m.data(), v.data());
  const double write = bytes / seconds_since(t0);
  t0 = Clock::now();
  file.read_all(m.data(), v.data());
  return {bytes / seconds_since(t0), write};
}

// Runs `op` repeatedly on every member of `c` for about `budget` seconds and returns the
// mean seconds per call of the slowest member. The count is fixed from a first call on
// group rank 0, so every member runs the same number of (collective) calls.
template <typename Op>
double time_op(const Communicator& c, double budget, const Op& op) {
  c.barrier();
  auto t0 = Clock::now();
  op();
  double first = seconds_since(t0);
  c.broadcast(std::span<double>(&first, 1), 0);
  std::int64_t iters =
      std::clamp<std::int64_t>(static_cast<std::int64_t>(budget / std::max(first, 1e-7)), 3, 1000000);
  c.barrier();
  t0 = Clock::now();
  for (std::int64_t i = 0; i < iters; ++i) op();
  double mean = seconds_since(t0) / static_cast<double>(iters);
  c.all_reduce(std::span<double>(&mean, 1), {.op = ReduceOp::kMax});
  return mean;
}

double total_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemTotal:") return kb * 1024.0;
  return static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
}

struct CommNumbers {
  double allreduce_gbps = 0, allreduce_latency_us = 0;
  double allgather_gbps = 0, allgather_latency_us = 0;
  double p2p_gbps = 0, p2p_latency_us = 0;
};

// `count` floats of 1 in host memory, or in device memory on a GPU rank.
class Floats {
 public:
  Floats(std::size_t count, bool device) : host_(device ? 0 : count, 1.0f) {
    if (!device) {
      span_ = std::span<float>(host_);
      return;
    }
    const std::vector<float> ones(count, 1.0f);
    device_ = DeviceBuffer(count * sizeof(float));
    cuda::copy_to_device(device_.data(), ones.data(), device_.bytes());
    cuda::synchronize();
    span_ = std::span<float>(static_cast<float*>(device_.data()), count);
  }
  std::span<float> span() const { return span_; }
  std::size_t size() const { return span_.size(); }

 private:
  std::vector<float> host_;
  DeviceBuffer device_;
  std::span<float> span_;
};

// All-reduce, all-gather and ping-pong between group ranks 0 and 1 of `c` (size >= 2); on
// device buffers when `device` (c is then a device communicator), each operation waited for.
CommNumbers measure_group(const Communicator& c, std::int64_t bytes, double budget, bool device) {
  const auto n = static_cast<double>(c.size());
  const std::size_t count = static_cast<std::size_t>(std::max<std::int64_t>(bytes / 4, 1));
  const double big = static_cast<double>(count) * 4;
  Floats buf_(count, device), small_(2, device);
  const std::span<float> buf = buf_.span(), small = small_.span();
  auto done = [device] {
    if (device) cuda::synchronize();  // a device operation is complete once the compute stream passed it
  };
  CommNumbers r;
  const double slice = budget / 6;
  double t = time_op(c, slice, [&] { c.all_reduce(small), done(); });
  r.allreduce_latency_us = t * 1e6;
  t = time_op(c, slice, [&] { c.all_reduce(buf), done(); });
  r.allreduce_gbps = 2 * (n - 1) / n * big / t / 1e9;

  const std::size_t part = std::max<std::size_t>(count / static_cast<std::size_t>(c.size()), 1);
  const Floats in(part, device), out(part * static_cast<std::size_t>(c.size()), device);
  const Floats in_small(2, device), out_small(2 * static_cast<std::size_t>(c.size()), device);
  t = time_op(c, slice, [&] { c.all_gather(std::span<const float>(in_small.span()), out_small.span()), done(); });
  r.allgather_latency_us = t * 1e6;
  t = time_op(c, slice, [&] { c.all_gather(std::span<const float>(in.span()), out.span()), done(); });
  r.allgather_gbps = (n - 1) / n * static_cast<double>(out.size()) * 4 / t / 1e9;

  // Ping-pong: rank 0 sends, rank 1 returns; the others only take part in the timing's
  // barriers and reductions. One round trip is two one-way transfers.
  auto ping = [&](std::span<float> data) {
    return [&c, data, &done] {
      if (c.rank() == 0) {
        c.send(std::span<const float>(data), 1);
        c.recv(data, 1);
      } else if (c.rank() == 1) {
        c.recv(data, 0);
        c.send(std::span<const float>(data), 0);
      }
      done();
    };
  };
  t = time_op(c, slice, ping(small));
  r.p2p_latency_us = t / 2 * 1e6;
  t = time_op(c, slice, ping(buf));
  r.p2p_gbps = big / (t / 2) / 1e9;
  return r;
}

nlohmann::json comm_json(const CommNumbers& c) {
  return {{"allreduce_gbps", c.allreduce_gbps},
          {"allreduce_latency_us", c.allreduce_latency_us},
          {"allgather_gbps", c.allgather_gbps},
          {"allgather_latency_us", c.allgather_latency_us},
          {"p2p_gbps", c.p2p_gbps},
          {"p2p_latency_us", c.p2p_latency_us}};
}

std::string comm_toml(const char* prefix, const CommNumbers& c) {
  return fmt::format(
      "{0}_allreduce_gbps = {1:.6g}\n{0}_allreduce_latency_us = {2:.6g}\n{0}_allgather_gbps = {3:.6g}\n"
      "{0}_allgather_latency_us = {4:.6g}\n{0}_p2p_gbps = {5:.6g}\n{0}_p2p_latency_us = {6:.6g}\n",
      prefix, c.allreduce_gbps, c.allreduce_latency_us, c.allgather_gbps, c.allgather_latency_us, c.p2p_gbps,
      c.p2p_latency_us);
}

// What --device cuda measures on each rank's GPU.
struct GpuNumbers {
  double fp32_flops = 0, bf16_flops = 0;  // the layer's products at --tokens rows
  double attention_flops = 0;             // the fp32 attention kernel, FLOPs as the planner counts them
  double bf16_attention_flops = 0;        // cuDNN's (--precision bf16's), where it runs; else 0
  std::string no_cudnn;                   // why it was not measured
  std::vector<plan::GemmPoint> fp32_curve, bf16_curve;
  double memory_bw = 0, host_to_device_bw = 0, device_to_host_bw = 0;
  cuda::MemoryInfo memory;  // before any buffer of calibrate's
};

// The products of one GPT layer of `tokens` rows and width h as nn::Linear's forward runs
// them (m, n, k): QKV, the attention output, the MLP's up and down.
std::vector<std::array<std::int64_t, 3>> layer_products(std::int64_t tokens, std::int64_t h) {
  return {{tokens, 3 * h, h}, {tokens, h, h}, {tokens, 4 * h, h}, {tokens, h, 4 * h}};
}

// Every rank at once on its GPU, for about `budget` seconds: 70% products, 10% the fp32
// attention (and 5% more cuDNN's, where every rank can run it), 20% copies. Each timed call
// runs kReps products (copies) and waits once.
GpuNumbers measure_gpu(const Communicator& world, const CalibrateOptions& o, double budget) {
  constexpr int kReps = 10;
  GpuNumbers g;
  g.memory = cuda::memory_info();
  const double per_product = budget * 0.7 / 16;
  for (const bool bf16 : {false, true}) {
    double flops = 0, seconds = 0;
    for (const std::int64_t rows : {std::max<std::int64_t>(o.tokens / 8, 1), o.tokens})
      for (const auto& [m, n, k] : layer_products(rows, o.hidden)) {
        const nn::GpuProduct product(m, n, k, bf16);
        product.run(1);  // cuBLASLt's plan and workspace
        const double t = time_op(world, per_product, [&] { product.run(kReps); }) / kReps;
        (bf16 ? g.bf16_curve : g.fp32_curve)
            .push_back({.m = static_cast<double>(m),
                        .n = static_cast<double>(n),
                        .k = static_cast<double>(k),
                        .flops = product.flops() / t});
        if (rows == o.tokens) flops += product.flops(), seconds += t;
      }
    (bf16 ? g.bf16_flops : g.fp32_flops) = flops / seconds;
  }
  {
    // The causal attention core of --tokens / --seq sequences, forward and backward: the
    // planner counts 3 x 4 b s^2 h / 2 FLOPs and 2 b s^2 h / 2 more for the backward's Q K^T.
    const std::int64_t batch = std::max<std::int64_t>(o.tokens / o.seq, 1);
    const nn::GpuAttention attention(batch, o.seq, o.hidden, o.heads);
    attention.run(1);
    const double t = time_op(world, budget * 0.1, [&] { attention.run(1); });
    const double b = static_cast<double>(batch), s = static_cast<double>(o.seq), h = static_cast<double>(o.hidden);
    g.attention_flops = 0.5 * (3 * 4 + 2) * b * s * s * h / t;
    // The bf16 runs' attention (cuDNN), the same shape and count, on every rank alike.
    g.no_cudnn = nn::GpuAttention::cudnn_unavailable_reason();
    std::int64_t can = g.no_cudnn.empty() ? 1 : 0;
    world.all_reduce(std::span<std::int64_t>(&can, 1), {.op = ReduceOp::kMin});
    if (can == 1) {
      const nn::GpuAttention cudnn(batch, o.seq, o.hidden, o.heads, true);
      cudnn.run(1);
      const double tc = time_op(world, budget * 0.05, [&] { cudnn.run(1); });
      g.bf16_attention_flops = 0.5 * (3 * 4 + 2) * b * s * s * h / tc;
    } else if (g.no_cudnn.empty()) {
      g.no_cudnn = "another rank cannot run it";
    }
  }
  const std::size_t bytes = std::size_t{256} << 20;
  for (const nn::CopyKind kind : {nn::CopyKind::kDeviceToDevice, nn::CopyKind::kHostToDevice,
                                  nn::CopyKind::kDeviceToHost}) {
    const nn::GpuCopy copy(kind, bytes);
    copy.run(1);
    const double t = time_op(world, budget * 0.2 / 3, [&] { copy.run(kReps); }) / kReps;
    const double rate = static_cast<double>(bytes) / t;
    if (kind == nn::CopyKind::kDeviceToDevice) g.memory_bw = 2 * rate;  // reads and writes every byte
    if (kind == nn::CopyKind::kHostToDevice) g.host_to_device_bw = rate;
    if (kind == nn::CopyKind::kDeviceToHost) g.device_to_host_bw = rate;
  }
  return g;
}

std::string tflops_list(const std::vector<plan::GemmPoint>& curve) {
  std::string out;
  for (const auto& p : curve) out += fmt::format("{}{:.6g}", out.empty() ? "" : ", ", p.flops / 1e12);
  return out;
}

int run(const CalibrateOptions& o) {
  NDMESH_CHECK_CONFIG(o.seconds > 0 && o.seconds <= 3600, "calibrate",
                      "--seconds {} must be in (0, 3600], e.g. --seconds 10", o.seconds);
  NDMESH_CHECK_CONFIG(o.threads >= 0 && o.threads <= 1024, "calibrate",
                      "--threads {} must be 0 (NDMESH_THREADS, else the core count) to 1024", o.threads);
  NDMESH_CHECK_CONFIG(o.gemm_size >= 16 && o.gemm_size <= 8192, "calibrate",
                      "--gemm-size {} must be 16 to 8192, e.g. --gemm-size 512", o.gemm_size);
  NDMESH_CHECK_CONFIG(o.bytes >= 1024 && o.bytes <= (std::int64_t{1} << 30), "calibrate",
                      "--bytes {} must be 1024 to 1073741824, e.g. --bytes 4194304", o.bytes);
  NDMESH_CHECK_CONFIG(o.memory_gib >= 0, "calibrate", "--memory-gib {} must be positive (or 0: measured)",
                      o.memory_gib);
  NDMESH_CHECK_CONFIG(!o.output.empty(), "calibrate",
                      "--output '' must name a file, e.g. --output host.toml");

  NDMESH_CHECK_CONFIG(o.device == "cpu" || o.device == "cuda", "calibrate",
                      "--device '{}' is not a device; use cpu (or cuda on a GPU build)", o.device);
  const bool gpu = o.device == "cuda";
  NDMESH_CHECK_CONFIG(o.tokens >= 8 && o.tokens <= (1 << 20), "calibrate",
                      "--tokens {} must be 8 to 1048576, e.g. --tokens 8192", o.tokens);
  NDMESH_CHECK_CONFIG(o.hidden >= 8 && o.hidden <= 65536, "calibrate",
                      "--hidden {} must be 8 to 65536, e.g. --hidden 768", o.hidden);
  NDMESH_CHECK_CONFIG(o.heads >= 1 && o.hidden % o.heads == 0, "calibrate",
                      "--heads {} must divide --hidden {}, e.g. --heads 12", o.heads, o.hidden);
  NDMESH_CHECK_CONFIG(o.seq >= 1 && o.seq <= o.tokens, "calibrate", "--seq {} must be 1 to --tokens {}, e.g. --seq 1024",
                      o.seq, o.tokens);
  if (gpu) {
    // No GPU here (or no CUDA in this build): one line, before any rank starts measuring.
    const std::string why = cuda::unavailable_reason();
    NDMESH_CHECK_CONFIG(why.empty(), "calibrate", "--device cuda: {}", why);
  }
  Communicator world = Communicator::world();
  const LaunchEnv launch = comm::resolve_launch_env(world);
  // On GPUs the groups carry device buffers, as `ndmesh train --device cuda`'s do (NCCL, or
  // staged through host memory); this also takes each rank's GPU.
  const Communicator links = gpu ? parallel::device_communicator(world, Device::kCuda) : world;
  Communicator node = links.split_node();
  std::int64_t nodes = *launch.node_rank + 1;
  world.all_reduce(std::span<std::int64_t>(&nodes, 1), {.op = ReduceOp::kMax});
  std::int64_t per_node = node.size();
  world.all_reduce(std::span<std::int64_t>(&per_node, 1), {.op = ReduceOp::kMax});

  const int threads = o.threads > 0 ? static_cast<int>(o.threads)
                                    : threads_from_env(static_cast<int>(std::thread::hardware_concurrency()));
  set_blas_threads(threads);
  const bool any_comm = world.size() > 1;
  const double gemm_budget = any_comm ? o.seconds * 0.4 : gpu ? o.seconds * 0.8 : o.seconds;
  const double node_budget = nodes > 1 ? o.seconds * 0.3 : o.seconds * 0.6;

  // The products the planner's rate and overhead come from, and the memory bandwidth.
  const std::int64_t n = o.gemm_size;
  double flops = 0, memory_gbps = 0;
  std::vector<plan::GemmPoint> curve;
  GpuNumbers g;
  if (gpu) {
    g = measure_gpu(world, o, gemm_budget);
    flops = g.fp32_flops, curve = g.fp32_curve, memory_gbps = g.memory_bw / 1e9;
  } else {
    // Matrix multiplications on every rank at once: C = A B, n x n x n, 2 n^3 FLOPs.
    std::vector<float> a(static_cast<std::size_t>(n * n), 0.5f), b(a.size(), 0.25f), c(a.size(), 0.0f);
    auto mm = [&] { gemm<float>(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n); };
    mm();  // warm up (BLAS thread start, page faults)
    const double gemm_s = time_op(world, gemm_budget, mm);
    flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / gemm_s;

    // The products the planner asks about, scaled to this machine: every (m, n, k) of
    // {n/4, n} with n = --gemm-size, each timed on every rank at once. Their alpha-beta fit is
    // the per-kernel overhead (plan/formulas.hpp fit_gemm).
    {
      const std::int64_t sizes[2] = {std::max<std::int64_t>(n / 4, 8), n};
      const double per_point = gemm_budget / 16;
      for (std::int64_t m1 : sizes)
        for (std::int64_t n1 : sizes)
          for (std::int64_t k1 : sizes) {
            std::vector<float> a1(static_cast<std::size_t>(m1 * k1), 0.5f),
                b1(static_cast<std::size_t>(k1 * n1), 0.25f), c1(static_cast<std::size_t>(m1 * n1), 0.0f);
            auto product = [&] {
              gemm<float>(false, false, m1, n1, k1, 1.0f, a1.data(), k1, b1.data(), n1, 0.0f, c1.data(), n1);
            };
            product();
            const double t = time_op(world, per_point, product);
            const double d_m = static_cast<double>(m1), d_n = static_cast<double>(n1),
                         d_k = static_cast<double>(k1);
            curve.push_back({.m = d_m, .n = d_n, .k = d_k, .flops = 2 * d_m * d_n * d_k / t});
          }
    }
    // Memory bandwidth per rank (all ranks at once): a copy of 64 MiB reads and writes it.
    {
      std::vector<float> from(std::size_t{16} << 20, 1.0f), to(from.size(), 0.0f);
      const double t =
          time_op(world, gemm_budget / 8, [&] { std::copy(from.begin(), from.end(), to.begin()); });
      memory_gbps = 2.0 * static_cast<double>(from.size()) * 4 / t / 1e9;
    }
  }

  CommNumbers intra, inter;
  if (node.size() > 1) intra = measure_group(node, o.bytes, node_budget, gpu);
  // Across nodes: the ranks with the same local rank, one per node.
  Communicator across = links.split(node.rank(), world.rank(), "across");
  if (nodes > 1 && across.size() > 1) inter = measure_group(across, o.bytes, o.seconds * 0.3, gpu);
  // Every rank needs the numbers of the groups it was not in only on rank 0, which writes:
  // the node group of rank 0 and the across group of local rank 0 both contain world rank 0.

  if (world.rank() != 0) return 0;
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  // On GPUs: the GPU's memory, shared by the node's ranks that share a GPU.
  const double share = gpu ? static_cast<double>((per_node + cuda::device_count() - 1) / cuda::device_count()) : 1.0;
  const double memory = o.memory_gib > 0 ? o.memory_gib * kGiB
                        : gpu ? static_cast<double>(g.memory.total_bytes) / share
                              : total_memory_bytes() / static_cast<double>(per_node);
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  plan::Hardware hw;
  hw.name = o.name.empty() ? fmt::format("calibrated-{}", host) : o.name;
  hw.memory_bytes = memory;
  // On a GPU, what was not free before calibrate's buffers (CUDA contexts, other processes).
  hw.reserved_bytes =
      gpu ? std::min(static_cast<double>(g.memory.total_bytes - g.memory.free_bytes) / share, memory / 2) : 0.0;
  hw.peak_flops = flops;
  hw.achievable_fraction = 1.0;
  // One rank per node measures no link: fall back to a large number so the planner's
  // communication terms stay small (no data moves in a one-rank layout anyway).
  const double intra_bw = node.size() > 1 ? intra.allreduce_gbps * 1e9 : 1e12;
  hw.intra_node_bw = intra_bw;
  hw.inter_node_bw = nodes > 1 ? inter.allreduce_gbps * 1e9 : intra_bw;
  hw.gpus_per_node = per_node;
  hw.memory_bw = memory_gbps * 1e9;
  hw.intra_node_latency = node.size() > 1 ? intra.p2p_latency_us * 1e-6 : 0.0;
  hw.inter_node_latency = nodes > 1 ? inter.p2p_latency_us * 1e-6 : hw.intra_node_latency;
  hw.gemm_overhead = plan::fit_gemm(curve, "calibrate").overhead_s;
  std::tie(hw.disk_read_bw, hw.disk_write_bw) = disk_rates(
      o.disk_dir.empty() ? std::filesystem::temp_directory_path().string() : o.disk_dir, o.disk_mib);
  hw.bf16_flops = g.bf16_flops;
  hw.attention_flops = g.attention_flops;
  hw.bf16_attention_flops = g.bf16_attention_flops;
  hw.host_to_device_bw = g.host_to_device_bw;
  hw.device_to_host_bw = g.device_to_host_bw;
  hw.source =
      gpu ? fmt::format(
                "ndmesh calibrate --device cuda on {} ({} ranks, {} node{}, {} GPU{} seen per rank, products of a "
                "{} x {} layer, {} B messages)",
                host, world.size(), nodes, nodes == 1 ? "" : "s", cuda::device_count(),
                cuda::device_count() == 1 ? "" : "s", o.tokens, o.hidden, o.bytes)
          : fmt::format(
                "ndmesh calibrate on {} ({} ranks, {} node{}, {} BLAS thread{} per rank, sgemm {}^3, {} B messages)",
                host, world.size(), nodes, nodes == 1 ? "" : "s", threads, threads == 1 ? "" : "s", n, o.bytes);

  std::string text = "# Written by `ndmesh calibrate`; read by `ndmesh plan --hardware FILE`.\n";
  if (gpu)
    text += fmt::format(
        "# peak_tflops is the fp32 rate (cuBLASLt, TF32 off) of the slowest rank's GPU over a {0} x {1} layer's\n"
        "# products (QKV, output, MLP up and down), bf16_tflops the same with bf16 operands (fp32 accumulation),\n"
        "# so achievable_fraction = 1; attention_tflops is the fp32 attention kernel's (causal, {2} heads,\n"
        "# sequences of {3}: forward and backward, FLOPs as the planner counts them), {4}; memory_gbps is a\n"
        "# device-to-device copy's, host_to_device_gbps and device_to_host_gbps copies with pinned host\n"
        "# memory; reserved_gib what was not free before them. Not measured (the planner's own model): the\n"
        "# element-wise kernels and the optimizer step beyond memory_gbps' traffic.\n",
        o.tokens, o.hidden, o.heads, o.seq,
        g.bf16_attention_flops > 0 ? "bf16_attention_tflops cuDNN's fused attention's (what bf16 runs use), the same"
                                   : "no bf16_attention_tflops (cuDNN attention: " + g.no_cudnn + ")");
  else
    text += "# peak_tflops is the measured fp32 sgemm rate of the slowest rank, so achievable_fraction = 1.\n";
  if (node.size() == 1)
    text += "# One rank per node: no link was measured; intra_node_gbps and inter_node_gbps are a placeholder\n"
            "# (1000 GB/s), latencies 0. Run the node's ranks under a launcher (mpirun -np N) to measure them.\n";
  text += plan::hardware_file_text(hw);
  {
    std::string m, nn, k, tf;
    for (const auto& p : curve) {
      const char* sep = m.empty() ? "" : ", ";
      m += fmt::format("{}{:.0f}", sep, p.m), nn += fmt::format("{}{:.0f}", sep, p.n);
      k += fmt::format("{}{:.0f}", sep, p.k), tf += fmt::format("{}{:.6g}", sep, p.flops / 1e12);
    }
    text += fmt::format(
        "\n# Products timed on every rank at once ({}); gemm_overhead_us is their fit.\n"
        "[gemm]\nm = [{}]\nn = [{}]\nk = [{}]\ntflops = [{}]\n",
        gpu ? "fp32 cuBLASLt, nn::Linear's forward at tokens/8 and tokens rows" : "fp32 sgemm here", m, nn, k, tf);
  }
  if (gpu)
    text += fmt::format(
        "\n[measured]\nranks = {}\nnodes = {}\ngpus_seen = {}\ntokens = {}\nhidden = {}\nheads = {}\nseq = {}\n"
        "fp32_tflops = {:.6g}\nbf16_tflops = {:.6g}\nbf16_products_tflops = [{}]\nmemory_total_gib = {:.6g}\n"
        "memory_free_gib = {:.6g}\n",
        world.size(), nodes, cuda::device_count(), o.tokens, o.hidden, o.heads, o.seq, g.fp32_flops / 1e12,
        g.bf16_flops / 1e12,
        tflops_list(g.bf16_curve), static_cast<double>(g.memory.total_bytes) / kGiB,
        static_cast<double>(g.memory.free_bytes) / kGiB);
  else
    text += fmt::format(
        "\n[measured]\nranks = {}\nnodes = {}\nthreads = {}\ngemm_size = {}\ngemm_tflops = {:.6g}\n",
        world.size(), nodes, threads, n, flops / 1e12);
  text += fmt::format("message_bytes = {}\nseconds = {:.6g}\n", o.bytes, o.seconds);
  if (node.size() > 1) text += comm_toml("intra", intra);
  if (nodes > 1) text += comm_toml("inter", inter);
  {
    std::ofstream out(o.output);
    NDMESH_CHECK_CONFIG(static_cast<bool>(out), "calibrate", "--output {}: cannot write the file", o.output);
    out << text;
  }
  if (o.json) {
    nlohmann::json j{{"output", o.output},
                     {"ranks", world.size()},
                     {"nodes", nodes},
                     {"threads", threads},
                     {"gemm_tflops", flops / 1e12},
                     {"memory_gib", memory / kGiB},
                     {"disk_read_gbps", hw.disk_read_bw / 1e9},
                     {"disk_write_gbps", hw.disk_write_bw / 1e9}};
    if (gpu) {
      j["device"] = "cuda";
      j["bf16_tflops"] = g.bf16_flops / 1e12;
      j["attention_tflops"] = g.attention_flops / 1e12;
      j["bf16_attention_tflops"] = g.bf16_attention_flops / 1e12;
      j["memory_gbps"] = g.memory_bw / 1e9;
      j["host_to_device_gbps"] = g.host_to_device_bw / 1e9;
      j["device_to_host_gbps"] = g.device_to_host_bw / 1e9;
    }
    if (node.size() > 1) j["intra"] = comm_json(intra);
    if (nodes > 1) j["inter"] = comm_json(inter);
    fmt::print("{}\n", j.dump());
  } else {
    if (gpu) {
      fmt::print(
          "products of a {} x {} layer: fp32 {:.2f} TFLOP/s, bf16 {:.2f} TFLOP/s; fp32 attention {:.2f} TFLOP/s, "
          "bf16 attention (cuDNN) {} per GPU (slowest of {} ranks)\n",
          o.tokens, o.hidden, g.fp32_flops / 1e12, g.bf16_flops / 1e12, g.attention_flops / 1e12,
          g.bf16_attention_flops > 0 ? fmt::format("{:.2f} TFLOP/s", g.bf16_attention_flops / 1e12)
                                     : "not measured (" + g.no_cudnn + ")",
          world.size());
      fmt::print(
          "device memory: {:.2f} GiB per rank, copies {:.0f} GB/s; pinned host to device {:.2f} GB/s, device to "
          "host {:.2f} GB/s\n",
          memory / kGiB, g.memory_bw / 1e9, g.host_to_device_bw / 1e9, g.device_to_host_bw / 1e9);
    } else {
      fmt::print("sgemm {}^3: {:.2f} GFLOP/s per rank ({} thread{}, slowest of {} ranks)\n", n, flops / 1e9,
                 threads, threads == 1 ? "" : "s", world.size());
    }
    fmt::print("disk: {:.3g} GB/s read, {:.3g} GB/s write (O_DIRECT, {} MiB)\n", hw.disk_read_bw / 1e9,
               hw.disk_write_bw / 1e9, o.disk_mib);
    if (node.size() > 1)
      fmt::print(
          "inside a node ({} ranks): all-reduce {:.2f} GB/s bus, {:.1f} us; all-gather {:.2f} GB/s, {:.1f} "
          "us; "
          "point-to-point {:.2f} GB/s, {:.1f} us\n",
          node.size(), intra.allreduce_gbps, intra.allreduce_latency_us, intra.allgather_gbps,
          intra.allgather_latency_us, intra.p2p_gbps, intra.p2p_latency_us);
    if (nodes > 1)
      fmt::print(
          "across {} nodes: all-reduce {:.2f} GB/s bus, {:.1f} us; point-to-point {:.2f} GB/s, {:.1f} us\n",
          nodes, inter.allreduce_gbps, inter.allreduce_latency_us, inter.p2p_gbps, inter.p2p_latency_us);
    fmt::print("wrote {}\n", o.output);
  }
  return 0;
}

Action setup(CLI::App& app) {
  auto o = std::make_shared<CalibrateOptions>();
  app.add_option("--output", o->output, "Hardware file to write (TOML)")->capture_default_str();
  app.add_option("--seconds", o->seconds, "Time budget of the whole measurement")->capture_default_str();
  app.add_option("--threads", o->threads,
                 "BLAS threads per rank (0: NDMESH_THREADS, else the core count, as "
                 "`ndmesh train`)")
      ->capture_default_str();
  app.add_option("--gemm-size", o->gemm_size, "n of the n x n x n sgemm timed (--device cpu)")->capture_default_str();
  app.add_option("--bytes", o->bytes, "Message size for the bandwidths")->capture_default_str();
  app.add_option("--memory-gib", o->memory_gib,
                 "Memory per rank to record (0: physical memory / ranks per node; on a GPU, its memory)")
      ->capture_default_str();
  app.add_option("--name", o->name, "Name in the file (default calibrated-<host>)");
  app.add_option(
         "--device", o->device,
         "cpu (matrix products through BLAS, communication over MPI or Gloo) or cuda (each rank's GPU: "
         "fp32 and bf16 products, the fp32 flash attention and cuDNN's bf16 attention (where built), device "
         "and pinned host copies, its memory, collectives over NCCL)")
      ->capture_default_str();
  app.add_option("--tokens", o->tokens, "--device cuda: rows of the layer's products (batch x sequence)")
      ->capture_default_str();
  app.add_option("--hidden", o->hidden, "--device cuda: width of the layer whose products are timed")
      ->capture_default_str();
  app.add_option("--heads", o->heads, "--device cuda: attention heads of that layer")->capture_default_str();
  app.add_option("--seq", o->seq, "--device cuda: tokens per sequence of its attention (--tokens / --seq sequences)")
      ->capture_default_str();
  app.add_flag("--json", o->json, "Print the numbers as one JSON line");
  app.add_option(
      "--disk-dir", o->disk_dir,
      "Folder on the disk offload uses, where rank 0 times writing and reading a file (default: the "
      "temporary folder)");
  app.add_option("--disk-mib", o->disk_mib, "MiB of that file")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 65536.0));
  app.footer(
      "Run under mpirun on the ranks the plan is for (e.g. mpirun -np 2), or alone. See "
      "docs/plan.md.");
  return [o] { return run(*o); };
}

const Subcommand kCalibrate{"calibrate",
                            "Measure matmul, memory and communication rates (CPU or GPU); write a hardware file for plan",
                            setup};

}  // namespace
}  // namespace ndmesh::cli::calibrate_command
