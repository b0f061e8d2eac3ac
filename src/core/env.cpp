#include "ndmesh/core/env.hpp"

#include <cerrno>
#include <cstdlib>

#include "ndmesh/core/error.hpp"

namespace ndmesh::env {

const std::vector<Variable>& variables() {
  static const std::vector<Variable> kVariables = {
      {"NDMESH_TIMEOUT_S", "seconds", "300",
       "timeout of every blocking or awaited communication; on expiry the job aborts naming the group"},
      {"NDMESH_INIT_TIMEOUT_S", "seconds", "NDMESH_TIMEOUT_S",
       "bound of the engine's start-up (MPI_Init, or every rank arriving at the TCP store); on expiry the "
       "process exits 124 with one line"},
      {"NDMESH_CHECKPOINT_PAUSE_S", "seconds", "unset",
       "test hook: a checkpoint save waits this long with its shard files written, before its manifest"},
      {"NDMESH_TEST_EXIT_BEFORE_GLOO", "integer", "0",
       "test hook: 1 makes this rank exit after the store's rendezvous, before it publishes its Gloo "
       "address"},
      {"NDMESH_OFFLOAD_PAUSE_S", "seconds", "unset",
       "test hook: each chunk the optimizer writes back to its offload file waits this long once written (a "
       "process can be killed in the middle of the write-back)"},
      {"NDMESH_TEST_LOSS_SCALE", "number", "1",
       "test hook: ndmesh train multiplies every token's loss weight in the gradient by this (a deliberately "
       "wrong "
       "weight, e.g. a missing 1/dp, that the equivalence tests must catch)"},
      {"NDMESH_REQUIRE_GPU", "integer", "0",
       "1: the GPU tests fail instead of being skipped when no GPU can run (scripts/gpu_check.sh sets it)"},
      {"NDMESH_THREADS", "integer",
       "the core count for one process (ndmesh train); 1 per rank when several share a machine",
       "BLAS and compute threads per process"},
      {"NDMESH_LOG", "string", "info", "log level: error, warn, info, debug"},
      {"NDMESH_ATTENTION", "string", "auto",
       "attention core on CUDA: auto (cuDNN's fused flash attention under --precision bf16 where built and "
       "loadable, else the flash kernel), flash (always the fp32 flash kernel), cudnn (as auto, but cuDNN's "
       "absence is an error)"},
      {"NDMESH_DETERMINISTIC", "integer", "1",
       "1: every GPU kernel ndmesh runs gives the same bits on every run (cuDNN's attention backward on its "
       "deterministic engine); 0: cuDNN picks its engine, which may add in any order (the same within "
       "rounding; to measure what determinism costs)"},
      {"NDMESH_EPILOGUES", "string", "auto",
       "matrix products' epilogues on CUDA under --precision bf16: auto (the bias, GELU, GELU's derivative "
       "and "
       "the bias gradients inside cuBLASLt's products where it has an algorithm), off (every one apart: the "
       "product, then its own kernel; to compare or to rule the epilogues out)"},
      {"NDMESH_BACKEND", "string", "mpi; gloo under torchrun; self without a launcher",
       "communication backend: mpi (under mpirun or srun), gloo (CPU over TCP, under torchrun or any launcher "
       "that sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), self (a process started by hand: a world of "
       "one, no MPI_Init; mpi starts it as an MPI singleton instead), nccl (when built with GPUs)"},
      {"NDMESH_COORDINATOR", "string", "unset",
       "HOST:PORT of an ndmesh coordinator: ndmesh train runs as one elastic data-parallel replica "
       "(docs/elastic.md)"},
      {"NDMESH_REPLICA_ID", "integer", "unset",
       "with NDMESH_COORDINATOR: this replica's id, 0..R-1, the same across its restarts"},
      {"NDMESH_ELASTIC_TIMEOUT_S", "seconds", "10",
       "elastic: bound of the reduction across replicas and of a generation's rendezvous; a replica silent "
       "longer is left out of the step"},
      {"NDMESH_ELASTIC_RECONNECT_S", "seconds", "30",
       "elastic: how long a replica retries an unreachable coordinator (a restart) before it stops"},
      {"NDMESH_TEST_ELASTIC_KILL", "string", "unset",
       "test hook: REPLICA:RANK:STEP:POINT makes that rank of that replica SIGKILL itself at that step, at "
       "POINT reduce (inside the reduction across replicas), vote or update"},
      {"NDMESH_LAUNCH_NOTIFY", "string", "set by ndmesh launch",
       "socket of the supervising ndmesh launch: a rank ending the job on a timeout tells it why"},
  };
  return kVariables;
}

namespace {
const Variable& declared(std::string_view name) {
  for (const auto& v : variables())
    if (v.name == name) return v;
  fail<InternalError>("env", "{} is read but not declared in src/core/env.cpp", name);
}
}  // namespace

std::optional<std::string> raw(std::string_view name) {
  declared(name);
  const char* value = std::getenv(std::string(name).c_str());
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

std::int64_t integer(std::string_view name, std::int64_t fallback, std::int64_t min, std::int64_t max) {
  auto value = raw(name);
  if (!value) return fallback;
  errno = 0;
  char* end = nullptr;
  long long parsed = std::strtoll(value->c_str(), &end, 10);
  if (errno != 0 || end == value->c_str() || *end != '\0' || parsed < min || parsed > max)
    fail<ConfigError>("env", "{}='{}' is not an integer in [{}, {}]; set it to e.g. {} or unset it", name,
                      *value, min, max, fallback);
  return parsed;
}

namespace {
// A positive number below 1e7; `what` names it in the message.
double positive(std::string_view name, double fallback, std::string_view what) {
  auto value = raw(name);
  if (!value) return fallback;
  errno = 0;
  char* end = nullptr;
  double parsed = std::strtod(value->c_str(), &end);
  if (errno != 0 || end == value->c_str() || *end != '\0' || !(parsed > 0) || parsed > 1e7)
    fail<ConfigError>("env", "{}='{}' is not a positive {}; set it to e.g. {} or unset it", name, *value,
                      what, fallback);
  return parsed;
}
}  // namespace

double seconds(std::string_view name, double fallback) {
  return positive(name, fallback, "number of seconds");
}

double number(std::string_view name, double fallback) { return positive(name, fallback, "number"); }

std::string string(std::string_view name, std::string_view fallback) {
  auto value = raw(name);
  return value ? *value : std::string(fallback);
}

namespace {
void one_of(std::string_view name, std::initializer_list<std::string_view> allowed, std::string_view use) {
  auto value = raw(name);
  if (!value) return;
  for (auto a : allowed)
    if (*value == a) return;
  fail<ConfigError>("env", "{}='{}' is not known; use {} or unset it", name, *value, use);
}
}  // namespace

void check_all() {
  (void)seconds("NDMESH_TIMEOUT_S", 300);
  (void)seconds("NDMESH_INIT_TIMEOUT_S", 300);
  (void)seconds("NDMESH_CHECKPOINT_PAUSE_S", 1);
  (void)seconds("NDMESH_OFFLOAD_PAUSE_S", 1);
  (void)number("NDMESH_TEST_LOSS_SCALE", 1);
  (void)integer("NDMESH_TEST_EXIT_BEFORE_GLOO", 0, 0, 1);
  (void)integer("NDMESH_THREADS", 1, 1, 1024);
  (void)integer("NDMESH_REQUIRE_GPU", 0, 0, 1);
  (void)integer("NDMESH_DETERMINISTIC", 1, 0, 1);
  (void)integer("NDMESH_REPLICA_ID", 0, 0, 1 << 20);
  (void)seconds("NDMESH_ELASTIC_TIMEOUT_S", 10);
  (void)seconds("NDMESH_ELASTIC_RECONNECT_S", 30);  // the bounds of tensor/blas.cpp
  one_of("NDMESH_LOG", {"error", "warn", "info", "debug"}, "error, warn, info or debug");
  one_of("NDMESH_ATTENTION", {"auto", "flash", "cudnn"}, "auto, flash or cudnn");
  one_of("NDMESH_EPILOGUES", {"auto", "off"}, "auto or off");
  one_of("NDMESH_BACKEND", {"mpi", "gloo", "nccl", "self"}, "mpi, gloo, self (or nccl when built with GPUs)");
}

}  // namespace ndmesh::env
