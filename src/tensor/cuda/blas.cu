// ndmesh::gemm on the device through cuBLASLt (cuda_ops.hpp, "tensor").
//
// Row-major to column-major: a row-major matrix with row stride ld is, read column-major,
// its transpose with leading dimension ld. So the row-major C[m,n] = op(A) op(B) is the
// column-major Cᵀ[n,m] = op(B)ᵀ op(A)ᵀ: cuBLASLt multiplies B (first) by A (second), each
// transposed exactly when the row-major call asks for it, with M = n, N = m, K = k.
//
// fp32 with CUBLAS_COMPUTE_32F: no TF32 (CUBLAS_COMPUTE_32F_FAST_TF32 would round the
// inputs to 10 mantissa bits and break the agreement with the CPU). One cuBLASLt handle
// per process, used on the compute stream; one 32 MiB workspace from the caching
// allocator (what cuBLAS asks for on Hopper). The descriptors and the algorithm the
// heuristic picks are cached per shape, transposes, strides and pointer alignment, so a
// training step asks the heuristic once per distinct product.
//
// cuBLASLt is loaded on the first product (dlopen), not linked: the library is over 500 MB,
// and loading it cost every process of a CPU run about 55 ms at start-up (0.25 s on each
// 8-rank job of the test suite) although only --device cuda uses it. The major version of
// the toolkit ndmesh was built with is tried first, then the one before it (PyTorch's pip
// packages may carry only that one; the functions and types used here are the same in
// both), and one log line says which file was loaded and its cublasLtGetVersion.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <link.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>

#include "ndmesh/nn/cuda_ops.hpp"
#include "tensor/cuda/common.cuh"

namespace ndmesh::cuda {

namespace {

using detail::check_launch;
using detail::compute_stream;

constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;

// The cuBLASLt functions gemm calls, from the library loaded on first use.
struct LtApi {
  decltype(&cublasLtCreate) Create;
  decltype(&cublasLtGetStatusName) GetStatusName;
  decltype(&cublasLtGetStatusString) GetStatusString;
  decltype(&cublasLtMatmul) Matmul;
  decltype(&cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic;
  decltype(&cublasLtMatmulDescCreate) MatmulDescCreate;
  decltype(&cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute;
  decltype(&cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate;
  decltype(&cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute;
  decltype(&cublasLtMatrixLayoutCreate) MatrixLayoutCreate;
};

// libcublasLt.so.<major> from the library path, else from beside the CUDA runtime this
// process loaded (the toolkit keeps them in one directory); nullptr when neither has it.
void* open_lt_soname(const std::string& soname, std::string& why) {
  if (void* h = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
  const char* error = dlerror();
  if (why.empty()) why = error ? error : soname + ": not found";
  Dl_info info{};
  const auto probe = static_cast<cudaError_t (*)(int*)>(&cudaGetDeviceCount);
  if (dladdr(reinterpret_cast<void*>(probe), &info) != 0 && info.dli_fname != nullptr) {
    std::string dir = info.dli_fname;
    dir.resize(dir.rfind('/') + 1);
    if (!dir.empty())
      if (void* h = dlopen((dir + soname).c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
  }
  return nullptr;
}

// The file a dlopen handle came from ("?" when the loader does not say).
std::string loaded_path(void* h) {
  link_map* map = nullptr;
  if (dlinfo(h, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr &&
      *map->l_name != '\0')
    return map->l_name;
  return "?";
}

// libcublasLt.so.<built major>, else .so.<built major - 1>, with one log line naming it.
void* open_lt() {
  std::string why, tried;
  for (int major = CUBLAS_VER_MAJOR; major >= CUBLAS_VER_MAJOR - 1 && major >= 12; --major) {
    const std::string soname = "libcublasLt.so." + std::to_string(major);
    tried += (tried.empty() ? "" : ", then ") + soname;
    void* h = open_lt_soname(soname, why);
    if (h == nullptr) continue;
    std::string version = "unknown";
    if (void* get = dlsym(h, "cublasLtGetVersion"))
      version = std::to_string(reinterpret_cast<std::size_t (*)()>(get)());
    detail::note("cuBLASLt: loaded " + loaded_path(h) + " (cublasLtGetVersion " + version + ")" +
                 (major == CUBLAS_VER_MAJOR ? std::string()
                                            : "; built with cuBLAS " + std::to_string(CUBLAS_VER_MAJOR) +
                                                  ", whose library was not found"));
    return h;
  }
  detail::fail_error(
      "cuBLASLt: cannot load " + tried + " (" + why +
      "): put the CUDA toolkit's library directory, or PyTorch's site-packages/nvidia/*/lib that "
      "has it, on LD_LIBRARY_PATH");
}

const LtApi& lt_api() {
  static const LtApi api = [] {
    void* h = open_lt();
    auto sym = [h](auto& fn, const char* name) {
      void* p = dlsym(h, name);
      if (p == nullptr)
        detail::fail_error(std::string("cuBLASLt: the loaded library has no ") + name +
                           ": put the library of the " + "CUDA toolkit ndmesh was built with (cuBLAS " +
                           std::to_string(CUBLAS_VER_MAJOR) + ") first on LD_LIBRARY_PATH");
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
    };
    LtApi a{};
    sym(a.Create, "cublasLtCreate");
    sym(a.GetStatusName, "cublasLtGetStatusName");
    sym(a.GetStatusString, "cublasLtGetStatusString");
    sym(a.Matmul, "cublasLtMatmul");
    sym(a.MatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic");
    sym(a.MatmulDescCreate, "cublasLtMatmulDescCreate");
    sym(a.MatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute");
    sym(a.MatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate");
    sym(a.MatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy");
    sym(a.MatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute");
    sym(a.MatrixLayoutCreate, "cublasLtMatrixLayoutCreate");
    return a;
  }();
  return api;
}

void check_lt(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    detail::fail_error(std::string("cuBLASLt ") + what + " failed: " + lt_api().GetStatusString(s) + " (" +
                       lt_api().GetStatusName(s) + ")");
}

// The largest power of two up to 16 that divides the address: what cuBLASLt may assume.
std::uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t bytes = 16;
  while (bytes > 4 && a % bytes != 0) bytes /= 2;
  return bytes;
}

struct Key {
  bool trans_a, trans_b;
  std::int64_t m, n, k, lda, ldb, ldc;
  std::uint32_t align_a, align_b, align_c;
  cudaDataType_t ab = CUDA_R_32F, c = CUDA_R_32F;  // element types of A and B, of C
  GemmEpilogue epilogue = GemmEpilogue::kNone;
  auto tie() const {
    return std::tie(trans_a, trans_b, m, n, k, lda, ldb, ldc, align_a, align_b, align_c, ab, c, epilogue);
  }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
};

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t first = nullptr, second = nullptr, out = nullptr;  // B, A, C (column-major)
  cublasLtMatmulAlgo_t algo{};
  bool found = true;  // false: the heuristic had no algorithm for a product that may decline
};

struct Lt {
  std::mutex mutex;
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::map<Key, Plan> plans;
};

Lt& lt() {
  static Lt s;
  return s;
}

std::string timing_name(const Key& key);

bool uses_aux(GemmEpilogue e) {
  return e == GemmEpilogue::kGeluAux || e == GemmEpilogue::kDGelu || e == GemmEpilogue::kDGeluNoBiasGrad;
}

// The plan of `key`; with `may_decline` a product the heuristic has no algorithm for gets a
// plan with found = false (a log line names it once: its caller runs it apart), else it fails.
Plan make_plan(cublasLtHandle_t handle, const Key& key, bool may_decline) {
  Plan p;
  check_lt(lt_api().MatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul descriptor");
  const cublasOperation_t op_first = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  check_lt(lt_api().MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof op_first),
           "transpose attribute");
  check_lt(lt_api().MatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof op_second),
           "transpose attribute");
  // Stored (column-major) shapes: B is n x k (k x n when transposed), A is k x m (m x k).
  const auto u = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
  if (key.epilogue != GemmEpilogue::kNone) {
    cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_DEFAULT;
    switch (key.epilogue) {
      case GemmEpilogue::kNone: break;
      case GemmEpilogue::kBias: e = CUBLASLT_EPILOGUE_BIAS; break;
      case GemmEpilogue::kGeluAux: e = CUBLASLT_EPILOGUE_GELU_AUX_BIAS; break;
      case GemmEpilogue::kDGelu: e = CUBLASLT_EPILOGUE_DGELU_BGRAD; break;
      case GemmEpilogue::kDGeluNoBiasGrad: e = CUBLASLT_EPILOGUE_DGELU; break;
      case GemmEpilogue::kBGradB: e = CUBLASLT_EPILOGUE_BGRADB; break;
    }
    // An epilogue attribute this cuBLASLt refuses declines the product (with may_decline).
    bool accepted = true;
    auto set = [&](cublasLtMatmulDescAttributes_t attribute, const void* value, std::size_t bytes, const char* what) {
      const cublasStatus_t st = lt_api().MatmulDescSetAttribute(p.desc, attribute, value, bytes);
      if (st != CUBLAS_STATUS_SUCCESS && !may_decline) check_lt(st, what);
      accepted = accepted && st == CUBLAS_STATUS_SUCCESS;
    };
    set(CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e, "epilogue");
    // The bias and its gradient have C's type: cuBLASLt 13.1 finds no algorithm otherwise.
    const cudaDataType_t bias_type = key.c;
    if (key.epilogue != GemmEpilogue::kDGeluNoBiasGrad)
      set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type, "bias type");
    if (uses_aux(key.epilogue)) {
      const std::int64_t ld = key.ldc;  // aux [m, n] row-major, as C
      set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld, "aux leading dimension");
    }
    if (!accepted) {
      detail::note("cuBLASLt refuses the epilogue of " + timing_name(key) + ": the product and its epilogue run apart");
      p.found = false;
      return p;
    }
  }
  check_lt(lt_api().MatrixLayoutCreate(&p.first, key.ab, key.trans_b ? u(key.k) : u(key.n),
                                       key.trans_b ? u(key.n) : u(key.k), key.ldb),
           "layout of B");
  check_lt(lt_api().MatrixLayoutCreate(&p.second, key.ab, key.trans_a ? u(key.m) : u(key.k),
                                       key.trans_a ? u(key.k) : u(key.m), key.lda),
           "layout of A");
  check_lt(lt_api().MatrixLayoutCreate(&p.out, key.c, u(key.n), u(key.m), key.ldc), "layout of C");

  cublasLtMatmulPreference_t pref = nullptr;
  check_lt(lt_api().MatmulPreferenceCreate(&pref), "preference");
  const std::uint64_t ws = kWorkspaceBytes;
  check_lt(
      lt_api().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
      "workspace preference");
  // cuBLASLt's A is our B and its B our A.
  const std::uint32_t aligns[3] = {key.align_b, key.align_a, key.align_c};
  const cublasLtMatmulPreferenceAttributes_t which[3] = {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                         CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                         CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES};
  for (int i = 0; i < 3; ++i)
    check_lt(lt_api().MatmulPreferenceSetAttribute(pref, which[i], &aligns[i], sizeof aligns[i]),
             "alignment preference");
  check_lt(lt_api().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &aligns[2],
                                                 sizeof aligns[2]),
           "alignment preference");
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t s = lt_api().MatmulAlgoGetHeuristic(handle, p.desc, p.first, p.second, p.out, p.out,
                                                           pref, 1, &result, &found);
  lt_api().MatmulPreferenceDestroy(pref);
  if (may_decline && (s == CUBLAS_STATUS_NOT_SUPPORTED || (s == CUBLAS_STATUS_SUCCESS && found == 0))) {
    detail::note("cuBLASLt has no algorithm for " + timing_name(key) + " (" + lt_api().GetStatusString(s) +
                 "): the product and its epilogue run apart");
    p.found = false;
    return p;
  }
  if (s != CUBLAS_STATUS_SUCCESS || found == 0)
    detail::fail_error(std::string("cuBLASLt has no ") + (key.ab == CUDA_R_32F ? "fp32" : "bf16") +
                       " algorithm (epilogue " + std::to_string(static_cast<int>(key.epilogue)) +
                       ") for gemm(trans_a=" + std::to_string(key.trans_a) +
                       ", trans_b=" + std::to_string(key.trans_b) + ", m=" + std::to_string(key.m) +
                       ", n=" + std::to_string(key.n) + ", k=" + std::to_string(key.k) +
                       ", lda=" + std::to_string(key.lda) + ", ldb=" + std::to_string(key.ldb) +
                       ", ldc=" + std::to_string(key.ldc) + "): " + lt_api().GetStatusString(s));
  p.algo = result.algo;
  return p;
}

// C = beta C over m rows of n (k = 0: no product to add); beta = 0 writes zeros, as BLAS.
__global__ void scale_rows_kernel(float* c, std::int64_t m, std::int64_t n, std::int64_t ldc, float beta) {
  const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
  for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < m * n; i += stride) {
    float& x = c[(i / n) * ldc + i % n];
    x = beta == 0.0f ? 0.0f : x * beta;
  }
}

// A product's row in the kernel times: "gemm bf16>fp32 16384x2304x768 NT +bias", the shape
// as m x n x k and A's and B's orientation (N: as stored, T: transposed).
std::string timing_name(const Key& key) {
  static const char* const kEpilogue[] = {"", " +bias", " +gelu", " +dgelu +bias grad", " +bias grad", " +dgelu"};
  const auto type = [](cudaDataType_t t) { return t == CUDA_R_16BF ? "bf16" : "fp32"; };
  char name[160];
  std::snprintf(name, sizeof name, "gemm %s%s%s %lldx%lldx%lld %c%c%s", type(key.ab), key.c != key.ab ? ">" : "",
                key.c != key.ab ? type(key.c) : "", static_cast<long long>(key.m), static_cast<long long>(key.n),
                static_cast<long long>(key.k), key.trans_a ? 'T' : 'N', key.trans_b ? 'T' : 'N',
                kEpilogue[static_cast<int>(key.epilogue)]);
  return name;
}

// C = alpha op(A) op(B) + beta C with the plan of `key`; the epilogue's pointers (bias, aux,
// dbias) are set on the cached descriptor under the lock, just before the call. With
// `may_decline`, false (nothing run) where cuBLASLt has no algorithm for it.
bool run(const Key& key, float alpha, const void* a, const void* b, float beta, void* c, const void* bias,
         void* aux, void* dbias, bool may_decline = false) {
  Lt& s = lt();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.handle == nullptr) {
    check_lt(lt_api().Create(&s.handle), "handle creation");
    s.workspace = alloc(kWorkspaceBytes);
  }
  auto it = s.plans.find(key);
  if (it == s.plans.end()) it = s.plans.emplace(key, make_plan(s.handle, key, may_decline)).first;
  Plan& plan = it->second;  // std::map nodes never move
  if (!plan.found) return false;
  const void* bias_pointer = key.epilogue == GemmEpilogue::kBias || key.epilogue == GemmEpilogue::kGeluAux
                                 ? bias
                                 : static_cast<const void*>(dbias);
  if (key.epilogue != GemmEpilogue::kNone && key.epilogue != GemmEpilogue::kDGeluNoBiasGrad) {
    if (bias_pointer == nullptr)
      detail::fail_error("gemm: the epilogue " + std::to_string(static_cast<int>(key.epilogue)) +
                         " needs its bias (or bias gradient) pointer");
    check_lt(lt_api().MatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_pointer,
                                             sizeof bias_pointer),
             "bias pointer");
  }
  if (uses_aux(key.epilogue)) {
    if (aux == nullptr) detail::fail_error("gemm: the GELU epilogues need the aux pointer");
    check_lt(lt_api().MatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux),
             "aux pointer");
  }
  const cublasStatus_t st = lt_api().Matmul(s.handle, plan.desc, &alpha, b, plan.first, a, plan.second, &beta, c,
                                            plan.out, c, plan.out, &plan.algo, s.workspace, kWorkspaceBytes,
                                            compute_stream());
  // A product declines only where the heuristic has no algorithm for it (make_plan). Once it
  // offered one, a call that fails (INVALID_VALUE: an argument it refuses) is an error naming
  // the call: taken as "declined" it would hide a bug behind a slower path.
  if (st != CUBLAS_STATUS_SUCCESS)
    detail::fail_error("cuBLASLt matmul " + timing_name(key) + " (lda " + std::to_string(key.lda) + ", ldb " +
                       std::to_string(key.ldb) + ", ldc " + std::to_string(key.ldc) + ", alignments " +
                       std::to_string(key.align_a) + "/" + std::to_string(key.align_b) + "/" +
                       std::to_string(key.align_c) + " B) failed: " + lt_api().GetStatusString(st) + " (" +
                       lt_api().GetStatusName(st) + ")" +
                       (may_decline ? "; NDMESH_EPILOGUES=off runs every epilogue apart" : ""));
  if (detail::timing()) detail::timed(timing_name(key).c_str());
  return true;
}

}  // namespace

void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
          const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
          std::int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    scale_rows_kernel<<<detail::blocks_for(m * n), detail::kThreads, 0, compute_stream()>>>(c, m, n, ldc,
                                                                                            beta);
    check_launch("gemm with k = 0");
    return;
  }
  run(Key{trans_a, trans_b, m, n, k, lda, ldb, ldc, alignment(a), alignment(b), alignment(c)}, alpha, a, b, beta,
      c, nullptr, nullptr, nullptr);
}

void gemm_bf16(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
               const BFloat16* a, std::int64_t lda, const BFloat16* b, std::int64_t ldb, float beta, BFloat16* c,
               std::int64_t ldc, GemmEpilogue epilogue, const BFloat16* bias, BFloat16* aux, BFloat16* dbias) {
  if (m <= 0 || n <= 0 || k <= 0)
    detail::fail_error("gemm_bf16: m, n and k must be positive (" + std::to_string(m) + ", " + std::to_string(n) +
                       ", " + std::to_string(k) + ")");
  const Key key{trans_a,      trans_b,      m,           n,          k,        lda,      ldb, ldc,
                alignment(a), alignment(b), alignment(c), CUDA_R_16BF, CUDA_R_16BF, epilogue};
  run(key, alpha, a, b, beta, c, bias, aux, dbias);
}

void gemm_bf16_f32(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                   const BFloat16* a, std::int64_t lda, const BFloat16* b, std::int64_t ldb, float beta, float* c,
                   std::int64_t ldc, GemmEpilogue epilogue, float* dbias) {
  if (m <= 0 || n <= 0 || k <= 0)
    detail::fail_error("gemm_bf16_f32: m, n and k must be positive (" + std::to_string(m) + ", " +
                       std::to_string(n) + ", " + std::to_string(k) + ")");
  const Key key{trans_a,      trans_b,      m,           n,          k,          lda,      ldb, ldc,
                alignment(a), alignment(b), alignment(c), CUDA_R_16BF, CUDA_R_32F, epilogue};
  run(key, alpha, a, b, beta, c, nullptr, nullptr, dbias);
}

bool try_gemm_bf16(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                   const BFloat16* a, std::int64_t lda, const BFloat16* b, std::int64_t ldb, BFloat16* c,
                   std::int64_t ldc, GemmEpilogue epilogue, const BFloat16* bias, BFloat16* aux) {
  if (m <= 0 || n <= 0 || k <= 0)
    detail::fail_error("try_gemm_bf16: m, n and k must be positive (" + std::to_string(m) + ", " +
                       std::to_string(n) + ", " + std::to_string(k) + ")");
  if (epilogue != GemmEpilogue::kBias && epilogue != GemmEpilogue::kGeluAux &&
      epilogue != GemmEpilogue::kDGeluNoBiasGrad)
    detail::fail_error("try_gemm_bf16 takes the bias, GELU with aux or dGELU epilogue");
  // cuBLASLt's GELU aux rows are a multiple of 8 elements apart.
  if (uses_aux(epilogue) && ldc % 8 != 0) return false;
  const Key key{trans_a,      trans_b,      m,           n,           k,       lda, ldb, ldc, alignment(a),
                alignment(b), alignment(c), CUDA_R_16BF, CUDA_R_16BF, epilogue};
  return run(key, 1.0f, a, b, 0.0f, c, bias, aux, nullptr, true);
}

bool try_gemm_bf16_f32(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                       const BFloat16* a, std::int64_t lda, const BFloat16* b, std::int64_t ldb, float beta, float* c,
                       std::int64_t ldc, GemmEpilogue epilogue, const float* bias, float* aux, float* dbias) {
  if (m <= 0 || n <= 0 || k <= 0)
    detail::fail_error("try_gemm_bf16_f32: m, n and k must be positive (" + std::to_string(m) + ", " +
                       std::to_string(n) + ", " + std::to_string(k) + ")");
  // cuBLASLt's GELU aux rows are a multiple of 8 elements apart.
  if (uses_aux(epilogue) && ldc % 8 != 0) return false;
  const Key key{trans_a,      trans_b,      m,           n,          k,          lda,      ldb, ldc,
                alignment(a), alignment(b), alignment(c), CUDA_R_16BF, CUDA_R_32F, epilogue};
  return run(key, alpha, a, b, beta, c, bias, aux, dbias, true);
}

}  // namespace ndmesh::cuda
