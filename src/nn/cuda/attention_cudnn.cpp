// nn::Attention on the tensor cores through cuDNN's fused flash attention (SDPA), the bf16
// path of --precision bf16 on CUDA (cuda_ops.hpp; docs/internals/cuda-kernels.md). The fp32 flash
// kernel (attention.cu) stays the fp32 path and the reference this is tested against
// (tests/gpu/test_attention_cudnn.cpp).
//
// Layout: qkv rows [b, t, (H + 2 KV) hd] are rounded to bfloat16 once (cuda::cast) and handed
// to cuDNN as three strided views of the same buffer, Q [b, H, t, hd], K and V [b, KV, t, hd],
// each with strides (seq W, hd, W, 1) for the row width W = (H + 2 KV) hd, so no
// transposition or copy per head; the output O [b, H, t, hd] with strides (seq H hd, hd, H hd,
// 1) is exactly the [b, t, H hd] rows of attention_forward; the statistics [b, H, t, 1] (the
// natural log-sum-exp of the scaled scores, fp32) are exactly its lse. Grouped-query
// attention is cuDNN's own (K and V with fewer heads; the backward sums dK, dV over the
// group). The backward writes dQ, dK, dV into one bf16 buffer laid out like qkv, which is
// widened into dqkv (written, not added: the caller does not zero it first).
//
// Graphs (the frontend's graph API) are built once per (batch, seq, heads, kv heads, head
// dim) and direction, and cached for the process; a shape cuDNN has no engine for is
// remembered as such (one warning line) and the caller runs the flash kernel. The backward
// asks for cuDNN's deterministic algorithm first (the same bits on every run, as everything
// else in ndmesh), and takes the other one only when that has no engine, or when
// NDMESH_DETERMINISTIC=0 leaves the choice to cuDNN (to measure what determinism costs).
//
// Loading: libcudnn.so.9 is opened on first use (dlopen, NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING),
// from the library path or beside the CUDA runtime this process loaded, like cuBLASLt: a CPU
// run never loads it, and a machine without cuDNN falls back to the flash kernel. The frontend
// also opens the CUDA runtime by name; it is pointed at the one already loaded
// (CUDNN_FRONTEND_CUDART_LIB_NAME, unless the user set it), so that a second runtime on the
// library path (PyTorch's CUDA 12 one, say) is never mixed in.
//
// This file is the only one that includes the frontend's headers (heavy: about 40 s of CPU at
// -O1, src/nn/CMakeLists.txt), compiled by the host compiler.
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <link.h>

#include <algorithm>
#include <cmath>
#include <compare>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include <cudnn_frontend.h>

#include "ndmesh/core/env.hpp"
#include "ndmesh/core/error.hpp"
#include "ndmesh/core/log.hpp"
#include "ndmesh/nn/cuda_ops.hpp"
#include "ndmesh/tensor/device.hpp"
#include "nn/cuda/attention_cudnn.hpp"
#include "tensor/cuda/errors.hpp"

// The frontend's dynamic loading reads cuDNN's entry points through this handle, which the
// program sets (cudnn_frontend_shim.h).
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}  // namespace cudnn_frontend

namespace ndmesh::cuda {

namespace {

namespace fe = cudnn_frontend;

// The tensors' uids in a graph's variant pack.
enum Uid : std::int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

// The process's cuDNN: the library, one handle (for the one device of this process), or why not.
struct Library {
  void* handle = nullptr;  // dlopen
  cudnnHandle_t cudnn = nullptr;
  cudnnStatus_t (*set_stream)(cudnnHandle_t, cudaStream_t) = nullptr;
  const char* (*error_string)(cudnnStatus_t) = nullptr;
  std::string why;  // empty when usable
};

// The folder of the CUDA runtime this process loaded ("" when the loader does not say).
std::string cudart_path() {
  Dl_info info{};
  const auto probe = static_cast<cudaError_t (*)(int*)>(&cudaGetDeviceCount);
  if (dladdr(reinterpret_cast<void*>(probe), &info) == 0 || info.dli_fname == nullptr) return "";
  return info.dli_fname;
}

// The file a dlopen handle came from ("?" when the loader does not say).
std::string loaded_path(void* h) {
  link_map* map = nullptr;
  return dlinfo(h, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name ? map->l_name : "?";
}

Library load() {
  Library lib;
  const std::string cudart = cudart_path();
  // Not an NDMESH_ variable: an instruction to the frontend, set for this process only and
  // never over the user's own choice.
  if (!cudart.empty()) setenv("CUDNN_FRONTEND_CUDART_LIB_NAME", cudart.c_str(), 0);
  lib.handle = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
  std::string error;
  if (!lib.handle) {
    const char* e = dlerror();
    error = e ? e : "libcudnn.so.9: not found";
    if (const auto slash = cudart.rfind('/'); slash != std::string::npos)
      lib.handle = dlopen((cudart.substr(0, slash + 1) + "libcudnn.so.9").c_str(), RTLD_NOW | RTLD_LOCAL);
  }
  if (!lib.handle) {
    lib.why = "cannot load libcudnn.so.9 (" + error + "): put cuDNN 9's lib folder on LD_LIBRARY_PATH";
    return lib;
  }
  lib.set_stream = reinterpret_cast<decltype(lib.set_stream)>(dlsym(lib.handle, "cudnnSetStream"));
  lib.error_string = reinterpret_cast<decltype(lib.error_string)>(dlsym(lib.handle, "cudnnGetErrorString"));
  auto version = reinterpret_cast<std::size_t (*)()>(dlsym(lib.handle, "cudnnGetVersion"));
  if (!lib.set_stream || !lib.error_string || !version) {
    lib.why = loaded_path(lib.handle) + " lacks cudnnSetStream, cudnnGetErrorString or cudnnGetVersion";
    return lib;
  }
  fe::cudnn_dlhandle = lib.handle;
  try {
    if (const cudnnStatus_t s = fe::detail::create_handle(&lib.cudnn); s != CUDNN_STATUS_SUCCESS) {
      lib.why = std::string("cudnnCreate failed: ") + lib.error_string(s);
      return lib;
    }
  } catch (const std::exception& e) {  // the frontend throws when its dlopen or dlsym fails
    lib.why = std::string("cudnnCreate failed: ") + e.what();
    return lib;
  }
  log::info("[cuda] cuDNN attention: loaded {} (cudnnGetVersion {}, frontend {})", loaded_path(lib.handle),
            version(), CUDNN_FRONTEND_VERSION);
  return lib;
}

std::mutex& mutex() {
  static std::mutex m;
  return m;
}

// Under mutex().
Library& library() {
  static Library lib = load();
  return lib;
}

struct Shape {
  std::int64_t batch, seq, heads, kv_heads, head_dim;
  bool backward;
  bool deterministic = true;  // the backward: cuDNN's deterministic engine first (NDMESH_DETERMINISTIC)
  auto operator<=>(const Shape&) const = default;

  std::int64_t width() const { return (heads + 2 * kv_heads) * head_dim; }
  std::string str() const {
    return fmt::format("batch={} seq={} heads={} kv_heads={} head_dim={}", batch, seq, heads, kv_heads,
                       head_dim);
  }
};

// A built graph, or why there is none.
struct Plan {
  std::shared_ptr<fe::graph::Graph> graph;
  std::int64_t workspace = 0;
  std::string why;
};

std::map<Shape, Plan>& plans() {
  static std::map<Shape, Plan> p;
  return p;
}

// Q [b, H, t, hd], K and V [b, KV, t, hd]: strided views of the packed rows.
void qkv_tensors(fe::graph::Graph& g, const Shape& s, std::shared_ptr<fe::graph::Tensor_attributes> (&t)[3],
                 Uid q, Uid k, Uid v) {
  const std::int64_t w = s.width(), d = s.head_dim;
  const std::vector<std::int64_t> stride = {s.seq * w, d, w, 1};
  t[0] = g.tensor(fe::graph::Tensor_attributes()
                      .set_name("Q")
                      .set_uid(q)
                      .set_dim({s.batch, s.heads, s.seq, d})
                      .set_stride(stride));
  t[1] = g.tensor(fe::graph::Tensor_attributes()
                      .set_name("K")
                      .set_uid(k)
                      .set_dim({s.batch, s.kv_heads, s.seq, d})
                      .set_stride(stride));
  t[2] = g.tensor(fe::graph::Tensor_attributes()
                      .set_name("V")
                      .set_uid(v)
                      .set_dim({s.batch, s.kv_heads, s.seq, d})
                      .set_stride(stride));
}

// O, dO [b, H, t, hd] as [b, t, H hd] rows.
fe::graph::Tensor_attributes& out_layout(fe::graph::Tensor_attributes& t, const Shape& s) {
  const std::int64_t d = s.head_dim;
  return t.set_dim({s.batch, s.heads, s.seq, d}).set_stride({s.seq * s.heads * d, d, s.heads * d, 1});
}

// Statistics [b, H, t, 1] fp32 as lse[b, H, t].
fe::graph::Tensor_attributes& stats_layout(fe::graph::Tensor_attributes& t, const Shape& s) {
  return t.set_dim({s.batch, s.heads, s.seq, 1})
      .set_stride({s.heads * s.seq, s.seq, 1, 1})
      .set_data_type(fe::DataType_t::FLOAT);
}

std::shared_ptr<fe::graph::Graph> new_graph() {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

float scale_of(const Shape& s) { return 1.0f / std::sqrt(static_cast<float>(s.head_dim)); }

std::shared_ptr<fe::graph::Graph> forward_graph(const Shape& s) {
  auto g = new_graph();
  std::shared_ptr<fe::graph::Tensor_attributes> t[3];
  qkv_tensors(*g, s, t, kQ, kK, kV);
  auto [o, stats] = g->sdpa(t[0], t[1], t[2],
                            fe::graph::SDPA_attributes()
                                .set_name("sdpa_forward")
                                .set_generate_stats(true)
                                .set_causal_mask(true)
                                .set_attn_scale(scale_of(s)));
  out_layout(o->set_output(true).set_uid(kO), s);
  stats_layout(stats->set_output(true).set_uid(kStats), s);
  return g;
}

std::shared_ptr<fe::graph::Graph> backward_graph(const Shape& s, bool deterministic) {
  auto g = new_graph();
  std::shared_ptr<fe::graph::Tensor_attributes> t[3];
  qkv_tensors(*g, s, t, kQ, kK, kV);
  fe::graph::Tensor_attributes o_attr, do_attr, stats_attr;
  auto o = g->tensor(out_layout(o_attr.set_name("O").set_uid(kO), s));
  auto dout = g->tensor(out_layout(do_attr.set_name("dO").set_uid(kDO), s));
  auto stats = g->tensor(stats_layout(stats_attr.set_name("Stats").set_uid(kStats), s));
  auto [dq, dk, dv] = g->sdpa_backward(t[0], t[1], t[2], o, dout, stats,
                                       fe::graph::SDPA_backward_attributes()
                                           .set_name("sdpa_backward")
                                           .set_causal_mask(true)
                                           .set_attn_scale(scale_of(s))
                                           .set_deterministic_algorithm(deterministic));
  const std::int64_t w = s.width(), d = s.head_dim;
  const std::vector<std::int64_t> stride = {s.seq * w, d, w, 1};
  dq->set_output(true).set_uid(kDQ).set_dim({s.batch, s.heads, s.seq, d}).set_stride(stride);
  dk->set_output(true).set_uid(kDK).set_dim({s.batch, s.kv_heads, s.seq, d}).set_stride(stride);
  dv->set_output(true).set_uid(kDV).set_dim({s.batch, s.kv_heads, s.seq, d}).set_stride(stride);
  return g;
}

// The frontend's steps from a described graph to a runnable plan; the first failure says why.
std::string build(fe::graph::Graph& g, cudnnHandle_t handle, std::int64_t& workspace) {
  auto step = [](fe::error_t e, const char* what) -> std::string {
    return e.is_good() ? "" : std::string(what) + ": " + e.get_message();
  };
  std::string why;
  if ((why = step(g.validate(), "validate")).empty() &&
      (why = step(g.build_operation_graph(handle), "build_operation_graph")).empty() &&
      (why = step(g.create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans")).empty() &&
      (why = step(g.check_support(handle), "check_support")).empty() &&
      (why = step(g.build_plans(handle, fe::BuildPlanPolicy_t::HEURISTICS_CHOICE), "build_plans")).empty())
    why = step(g.get_workspace_size(workspace), "get_workspace_size");
  return why;
}

// The cached plan of `s` (built now if new), or nullptr when cuDNN cannot run it: then one
// warning line the first time (an Error when required). Under mutex().
const Plan* plan_for(const Shape& s, bool required, const char* what) {
  Library& lib = library();
  if (!lib.why.empty()) {
    static bool warned = false;
    if (required) fail<ConfigError>("cuda", "{} under NDMESH_ATTENTION=cudnn ({}): {}", what, s.str(), lib.why);
    if (!warned)
      log::warn("[cuda] cuDNN attention unavailable ({}): attention runs on the flash kernel", lib.why);
    warned = true;
    return nullptr;
  }
  auto [it, fresh] = plans().try_emplace(s);
  Plan& p = it->second;
  if (fresh) {
    try {
      if (s.backward) {
        p.graph = backward_graph(s, s.deterministic);
        p.why = build(*p.graph, lib.cudnn, p.workspace);
        if (!p.why.empty() && s.deterministic) {
          p.graph = backward_graph(s, false);
          if (build(*p.graph, lib.cudnn, p.workspace).empty()) {
            log::info(
                "[cuda] cuDNN attention backward ({}): no deterministic engine ({}); using the other one",
                s.str(), p.why);
            p.why.clear();
          }
        }
      } else {
        p.graph = forward_graph(s);
        p.why = build(*p.graph, lib.cudnn, p.workspace);
      }
    } catch (const std::exception& e) {  // the frontend's own exceptions (dlsym, bad attributes)
      p.why = e.what();
    }
    if (!p.why.empty()) {
      p.graph.reset();
      if (!required)
        log::warn("[cuda] {} ({}): cuDNN has no engine ({}); this shape runs on the flash kernel", what,
                  s.str(), p.why);
    }
  }
  if (!p.why.empty()) {
    if (required)
      fail<Error>("cuda", "{} under NDMESH_ATTENTION=cudnn ({}): cuDNN has no engine: {}", what, s.str(),
                  p.why);
    return nullptr;
  }
  return &p;
}

void execute(const Plan& p, const Shape& s, std::unordered_map<std::int64_t, void*>& pack, const char* what) {
  Library& lib = library();
  if (const cudnnStatus_t st = lib.set_stream(lib.cudnn, static_cast<cudaStream_t>(cuda::stream()));
      st != CUDNN_STATUS_SUCCESS)
    fail<Error>("cuda", "{} ({}): cudnnSetStream failed: {}", what, s.str(), lib.error_string(st));
  DeviceBuffer workspace(static_cast<std::size_t>(p.workspace));
  fe::error_t e = p.graph->execute(lib.cudnn, pack, p.workspace > 0 ? workspace.data() : nullptr);
  if (e.is_bad()) fail<Error>("cuda", "{} ({}): cuDNN execute failed: {}", what, s.str(), e.get_message());
  if (cuda::detail::timing()) cuda::detail::timed(fmt::format("{} ({})", what, s.str()).c_str());
}

}  // namespace

namespace detail {

std::string cudnn_unavailable_reason() {
  std::lock_guard<std::mutex> lock(mutex());
  return library().why;
}

bool cudnn_forward(BFloat16* out, float* lse, const BFloat16* qkv, std::int64_t batch, std::int64_t seq,
                   std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim, bool required) {
  if (batch <= 0 || seq <= 0) return true;
  const Shape s{batch, seq, heads, kv_heads, head_dim, false};
  std::lock_guard<std::mutex> lock(mutex());
  const Plan* p = plan_for(s, required, "attention_forward_cudnn");
  if (!p) return false;
  auto* q = const_cast<BFloat16*>(qkv);  // read only
  std::unordered_map<std::int64_t, void*> pack = {{kQ, q},
                                                  {kK, q + heads * head_dim},
                                                  {kV, q + (heads + kv_heads) * head_dim},
                                                  {kO, out},
                                                  {kStats, lse}};
  execute(*p, s, pack, "attention_forward_cudnn");
  return true;
}

bool cudnn_forward(float* out, float* lse, const float* qkv, std::int64_t batch, std::int64_t seq,
                   std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim, bool required) {
  const std::int64_t n_qkv = std::max<std::int64_t>(batch * seq * (heads + 2 * kv_heads) * head_dim, 0);
  const std::int64_t n_out = std::max<std::int64_t>(batch * seq * heads * head_dim, 0);
  DeviceBuffer qkv16(static_cast<std::size_t>(n_qkv) * sizeof(BFloat16));
  DeviceBuffer out16(static_cast<std::size_t>(n_out) * sizeof(BFloat16));
  if (n_qkv > 0) cast(static_cast<BFloat16*>(qkv16.data()), qkv, n_qkv);
  if (!cudnn_forward(static_cast<BFloat16*>(out16.data()), lse, static_cast<const BFloat16*>(qkv16.data()), batch, seq,
                     heads, kv_heads, head_dim, required))
    return false;
  if (n_out > 0) cast(out, static_cast<const BFloat16*>(out16.data()), n_out);
  return true;
}

bool cudnn_backward(BFloat16* dqkv, const BFloat16* dout, const BFloat16* qkv, const BFloat16* out,
                    const float* lse, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                    std::int64_t kv_heads, std::int64_t head_dim, bool required) {
  if (batch <= 0 || seq <= 0) return true;
  // NDMESH_DETERMINISTIC=0: cuDNN's own choice of engine, which may add in any order.
  const Shape s{
      batch, seq, heads, kv_heads, head_dim, true, env::integer("NDMESH_DETERMINISTIC", 1, 0, 1) == 1};
  std::lock_guard<std::mutex> lock(mutex());
  const Plan* p = plan_for(s, required, "attention_backward_cudnn");
  if (!p) return false;
  auto* q = const_cast<BFloat16*>(qkv);  // the inputs are read only
  // dQ, dK and dV cover a row of dqkv: every element written.
  std::unordered_map<std::int64_t, void*> pack = {{kQ, q},
                                                  {kK, q + heads * head_dim},
                                                  {kV, q + (heads + kv_heads) * head_dim},
                                                  {kO, const_cast<BFloat16*>(out)},
                                                  {kDO, const_cast<BFloat16*>(dout)},
                                                  {kStats, const_cast<float*>(lse)},
                                                  {kDQ, dqkv},
                                                  {kDK, dqkv + heads * head_dim},
                                                  {kDV, dqkv + (heads + kv_heads) * head_dim}};
  execute(*p, s, pack, "attention_backward_cudnn");
  return true;
}

bool cudnn_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                    std::int64_t batch, std::int64_t seq, std::int64_t heads, std::int64_t kv_heads,
                    std::int64_t head_dim, bool required) {
  // out is the forward's bf16 output widened: rounding it again is exact.
  const std::int64_t n_qkv = std::max<std::int64_t>(batch * seq * (heads + 2 * kv_heads) * head_dim, 0);
  const std::int64_t n_out = std::max<std::int64_t>(batch * seq * heads * head_dim, 0);
  DeviceBuffer qkv16(static_cast<std::size_t>(n_qkv) * sizeof(BFloat16));
  DeviceBuffer dqkv16(static_cast<std::size_t>(n_qkv) * sizeof(BFloat16));
  DeviceBuffer out16(static_cast<std::size_t>(n_out) * sizeof(BFloat16));
  DeviceBuffer dout16(static_cast<std::size_t>(n_out) * sizeof(BFloat16));
  if (n_qkv > 0) cast(static_cast<BFloat16*>(qkv16.data()), qkv, n_qkv);
  if (n_out > 0) {
    cast(static_cast<BFloat16*>(out16.data()), out, n_out);
    cast(static_cast<BFloat16*>(dout16.data()), dout, n_out);
  }
  if (!cudnn_backward(static_cast<BFloat16*>(dqkv16.data()), static_cast<const BFloat16*>(dout16.data()),
                      static_cast<const BFloat16*>(qkv16.data()), static_cast<const BFloat16*>(out16.data()), lse,
                      batch, seq, heads, kv_heads, head_dim, required))
    return false;
  if (n_qkv > 0) cast(dqkv, static_cast<const BFloat16*>(dqkv16.data()), n_qkv);
  return true;
}

}  // namespace detail

}  // namespace ndmesh::cuda
