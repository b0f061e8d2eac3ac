// The staged device communicator (staged_backend.hpp). An operation on device buffers
// copies them to pinned host buffers on the compute stream and waits for it, runs the CPU
// backend's operation on the host copies (nonblocking when asked: the Work polls it), and
// once that is complete divides an average, copies the result back on the compute stream and
// waits for the copy, so that the pinned buffer may serve the next operation at once.
#include "backends/staged/staged_backend.hpp"

#include <cuda_runtime.h>

#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/tensor/device.hpp"

namespace ndmesh::comm::staged {

bool is_device_pointer(const void* p) {
  if (p == nullptr) return false;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // no driver, or a pointer CUDA does not know: host memory
    return false;
  }
  return a.type == cudaMemoryTypeDevice;
}

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail<>("comm", "staging a device buffer: {} failed: {}", what, cudaGetErrorString(e));
}

// Copies on the compute stream and waits for it (host, device or pinned memory on either side).
void copy_now(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  auto s = static_cast<cudaStream_t>(cuda::stream());
  check(cudaSetDevice(cuda::current_device()), "cudaSetDevice");  // on any thread: this process's GPU
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s), "cudaMemcpyAsync");
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

// Pinned host buffers, kept for reuse by size (the sizes of a training step repeat).
class PinnedPool {
 public:
  static PinnedPool& get() {
    static auto* pool = new PinnedPool;  // never destroyed: buffers live as long as the process
    return *pool;
  }
  std::shared_ptr<char> take(std::size_t bytes) {
    void* p = nullptr;
    {
      std::lock_guard lock(mutex_);
      auto& free = free_[bytes];
      if (!free.empty()) {
        p = free.back();
        free.pop_back();
      }
    }
    if (p == nullptr) check(cudaMallocHost(&p, std::max<std::size_t>(bytes, 1)), "cudaMallocHost");
    return std::shared_ptr<char>(static_cast<char*>(p), [this, bytes](char* q) {
      std::lock_guard lock(mutex_);
      free_[bytes].push_back(q);
    });
  }

 private:
  std::mutex mutex_;
  std::map<std::size_t, std::vector<void*>> free_;
};

void divide(ElementSpan data, int n) {
  if (data.dtype == DType::kFloat32) {
    auto* p = static_cast<float*>(data.data);
    for (std::size_t i = 0; i < data.count; ++i) p[i] /= static_cast<float>(n);
  } else if (data.dtype == DType::kFloat64) {
    auto* p = static_cast<double*>(data.data);
    for (std::size_t i = 0; i < data.count; ++i) p[i] /= static_cast<double>(n);
  }
}

// The CPU operation on the host copies, then the copy back once it is complete.
class StagedWork final : public detail::WorkImpl {
 public:
  StagedWork(std::unique_ptr<detail::WorkImpl> inner, std::function<void()> finish)
      : inner_(std::move(inner)), finish_(std::move(finish)) {}
  bool test() override {
    if (inner_ && !inner_->test()) return false;
    inner_.reset();
    if (finish_) {
      auto f = std::move(finish_);
      finish_ = nullptr;
      f();
    }
    return true;
  }

 private:
  std::unique_ptr<detail::WorkImpl> inner_;
  std::function<void()> finish_;
};

class StagedComm final : public detail::CommImpl {
 public:
  explicit StagedComm(std::shared_ptr<detail::CommImpl> cpu)
      : cpu_(std::move(cpu)), name_(fmt::format("{}-staged", cpu_->backend())) {
    members_ = cpu_->members();
  }

  std::string_view backend() const override { return name_; }
  int rank() const override { return cpu_->rank(); }
  int size() const override { return cpu_->size(); }
  std::string_view host_of(std::int64_t r) const override { return cpu_->host_of(r); }
  std::size_t max_count() const override { return cpu_->max_count(); }
  std::shared_ptr<detail::CommImpl> split(std::optional<std::int64_t> color, std::int64_t key) override {
    auto c = cpu_->split(color, key);
    return c ? wrap(std::move(c)) : nullptr;
  }
  std::shared_ptr<detail::CommImpl> self() override { return wrap(cpu_->self()); }
  std::shared_ptr<detail::CommImpl> split_node() override { return wrap(cpu_->split_node()); }
  std::shared_ptr<detail::CommImpl> dup() override { return wrap(cpu_->dup()); }
  std::string thread_limit() const override { return cpu_->thread_limit(); }
  bool wait_for_progress(std::chrono::microseconds at_most) override {
    return cpu_->wait_for_progress(at_most);
  }
  bool handles_device(const void* data) const override { return is_device_pointer(data); }

  std::unique_ptr<detail::WorkImpl> barrier(bool blocking) override { return cpu_->barrier(blocking); }

  std::unique_ptr<detail::WorkImpl> broadcast(ElementSpan data, int root, bool blocking) override {
    if (!is_device_pointer(data.data)) return cpu_->broadcast(data, root, blocking);
    auto host = PinnedPool::get().take(data.bytes());
    if (rank() == root) copy_now(host.get(), data.data, data.bytes());
    const bool back = rank() != root;
    return done(cpu_->broadcast({host.get(), data.count, data.dtype}, root, blocking), blocking,
                [host, data, back] {
                  if (back) copy_now(data.data, host.get(), data.bytes());
                });
  }

  std::unique_ptr<detail::WorkImpl> all_reduce(ElementSpan data, ReduceOp op, bool blocking) override {
    if (!is_device_pointer(data.data)) return cpu_->all_reduce(data, op, blocking);
    auto host = PinnedPool::get().take(data.bytes());
    copy_now(host.get(), data.data, data.bytes());
    ElementSpan h{host.get(), data.count, data.dtype};
    const int n = op == ReduceOp::kAvg ? size() : 0;
    return done(cpu_->all_reduce(h, op == ReduceOp::kAvg ? ReduceOp::kSum : op, blocking), blocking,
                [host, h, data, n] {
                  if (n > 0) divide(h, n);
                  copy_now(data.data, host.get(), data.bytes());
                });
  }

  // `out` is a block of `in` (in place: this rank's) or a separate buffer: either way the CPU
  // backend reduces into the first block of the host copy, which goes back to `out`.
  std::unique_ptr<detail::WorkImpl> reduce_scatter(ElementSpan in, ElementSpan out, ReduceOp op,
                                                   bool blocking) override {
    if (!is_device_pointer(in.data) && !is_device_pointer(out.data))
      return cpu_->reduce_scatter(in, out, op, blocking);
    auto host = PinnedPool::get().take(in.bytes());
    copy_now(host.get(), in.data, in.bytes());
    ElementSpan h_in{host.get(), in.count, in.dtype}, h_out{host.get(), out.count, out.dtype};
    const int n = op == ReduceOp::kAvg ? size() : 0;
    return done(cpu_->reduce_scatter(h_in, h_out, op == ReduceOp::kAvg ? ReduceOp::kSum : op, blocking),
                blocking, [host, h_out, out, n] {
                  if (n > 0) divide(h_out, n);
                  copy_now(out.data, host.get(), out.bytes());
                });
  }

  std::unique_ptr<detail::WorkImpl> all_gather(ElementSpan in, ElementSpan out, bool blocking) override {
    if (!is_device_pointer(in.data) && !is_device_pointer(out.data))
      return cpu_->all_gather(in, out, blocking);
    auto host = PinnedPool::get().take(out.bytes());
    char* mine = host.get() + static_cast<std::size_t>(rank()) * in.bytes();
    copy_now(mine, in.data, in.bytes());
    return done(cpu_->all_gather({mine, in.count, in.dtype}, {host.get(), out.count, out.dtype}, blocking),
                blocking, [host, out] { copy_now(out.data, host.get(), out.bytes()); });
  }

  std::unique_ptr<detail::WorkImpl> all_to_all(ElementSpan in, ElementSpan out, bool blocking) override {
    if (!is_device_pointer(in.data) && !is_device_pointer(out.data))
      return cpu_->all_to_all(in, out, blocking);
    auto h_in = PinnedPool::get().take(in.bytes());
    auto h_out = PinnedPool::get().take(out.bytes());
    copy_now(h_in.get(), in.data, in.bytes());
    return done(
        cpu_->all_to_all({h_in.get(), in.count, in.dtype}, {h_out.get(), out.count, out.dtype}, blocking),
        blocking, [h_in, h_out, out] { copy_now(out.data, h_out.get(), out.bytes()); });
  }

  std::unique_ptr<detail::WorkImpl> send(ElementSpan data, int peer, int tag, bool blocking) override {
    if (!is_device_pointer(data.data)) return cpu_->send(data, peer, tag, blocking);
    auto host = PinnedPool::get().take(data.bytes());
    copy_now(host.get(), data.data, data.bytes());
    return done(cpu_->send({host.get(), data.count, data.dtype}, peer, tag, blocking), blocking, [host] {});
  }

  std::unique_ptr<detail::WorkImpl> recv(ElementSpan data, int peer, int tag, bool blocking) override {
    if (!is_device_pointer(data.data)) return cpu_->recv(data, peer, tag, blocking);
    auto host = PinnedPool::get().take(data.bytes());
    return done(cpu_->recv({host.get(), data.count, data.dtype}, peer, tag, blocking), blocking,
                [host, data] { copy_now(data.data, host.get(), data.bytes()); });
  }

  [[noreturn]] void abort_job(int code) override {
    cpu_->abort_job(code);
    std::abort();  // not reached: abort_job ends the process
  }
  bool interrupt(std::string_view component, const std::string& message, bool timed_out) override {
    return cpu_->interrupt(component, message, timed_out);
  }

 private:
  // A blocking operation has completed: finish now. A nonblocking one finishes in its Work.
  static std::unique_ptr<detail::WorkImpl> done(std::unique_ptr<detail::WorkImpl> inner, bool blocking,
                                                std::function<void()> finish) {
    if (blocking) {
      finish();
      return nullptr;
    }
    return std::make_unique<StagedWork>(std::move(inner), std::move(finish));
  }

  std::shared_ptr<detail::CommImpl> cpu_;
  std::string name_;
};

}  // namespace

std::shared_ptr<detail::CommImpl> wrap(std::shared_ptr<detail::CommImpl> cpu) {
  NDMESH_CHECK(cpu != nullptr, "comm", "a staged communicator needs a CPU communicator");
  return std::make_shared<StagedComm>(std::move(cpu));
}

}  // namespace ndmesh::comm::staged
