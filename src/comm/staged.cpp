// The staged communicator (comm/staged.hpp): written against StagingMemory, so that the
// in-process tests run it with a fake device memory; a GPU run gives it CUDA's
// (src/backends/staged).
#include "ndmesh/comm/staged.hpp"

#include <cstdlib>
#include <functional>
#include <string>

#include <fmt/format.h>

#include "comm/backend.hpp"
#include "ndmesh/core/error.hpp"

namespace ndmesh::comm {
namespace {

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
  StagedComm(std::shared_ptr<detail::CommImpl> cpu, std::shared_ptr<StagingMemory> memory)
      : cpu_(std::move(cpu)), memory_(std::move(memory)), name_(fmt::format("{}-staged", cpu_->backend())) {
    members_ = cpu_->members();
  }

  std::string_view backend() const override { return name_; }
  int rank() const override { return cpu_->rank(); }
  int size() const override { return cpu_->size(); }
  std::string_view host_of(std::int64_t r) const override { return cpu_->host_of(r); }
  std::size_t max_count() const override { return cpu_->max_count(); }
  std::shared_ptr<detail::CommImpl> split(std::optional<std::int64_t> color, std::int64_t key) override {
    auto c = cpu_->split(color, key);
    return c ? std::make_shared<StagedComm>(std::move(c), memory_) : nullptr;
  }
  std::shared_ptr<detail::CommImpl> self() override { return make(cpu_->self()); }
  std::shared_ptr<detail::CommImpl> split_node() override { return make(cpu_->split_node()); }
  std::shared_ptr<detail::CommImpl> dup() override { return make(cpu_->dup()); }
  std::string thread_limit() const override { return cpu_->thread_limit(); }
  bool wait_for_progress(std::chrono::microseconds at_most) override {
    return cpu_->wait_for_progress(at_most);
  }
  bool handles_device(const void* data) const override { return memory_->is_device(data); }

  std::unique_ptr<detail::WorkImpl> barrier(bool blocking) override { return cpu_->barrier(blocking); }

  std::unique_ptr<detail::WorkImpl> broadcast(ElementSpan data, int root, bool blocking) override {
    if (!memory_->is_device(data.data)) return cpu_->broadcast(data, root, blocking);
    auto host = memory_->host_buffer(data.bytes());
    if (rank() == root) memory_->copy(host.get(), data.data, data.bytes());
    const bool back = rank() != root;
    return done(cpu_->broadcast({host.get(), data.count, data.dtype}, root, blocking), blocking,
                [mem = memory_, host, data, back] {
                  if (back) mem->copy(data.data, host.get(), data.bytes());
                });
  }

  std::unique_ptr<detail::WorkImpl> all_reduce(ElementSpan data, ReduceOp op, bool blocking) override {
    if (!memory_->is_device(data.data)) return cpu_->all_reduce(data, op, blocking);
    auto host = memory_->host_buffer(data.bytes());
    memory_->copy(host.get(), data.data, data.bytes());
    ElementSpan h{host.get(), data.count, data.dtype};
    const int n = op == ReduceOp::kAvg ? size() : 0;
    return done(cpu_->all_reduce(h, op == ReduceOp::kAvg ? ReduceOp::kSum : op, blocking), blocking,
                [mem = memory_, host, h, data, n] {
                  if (n > 0) divide(h, n);
                  mem->copy(data.data, host.get(), data.bytes());
                });
  }

  // `out` is a block of `in` (in place: this rank's) or a separate buffer: either way the CPU
  // backend reduces into the first block of the host copy, which goes back to `out`.
  std::unique_ptr<detail::WorkImpl> reduce_scatter(ElementSpan in, ElementSpan out, ReduceOp op,
                                                   bool blocking) override {
    if (!memory_->is_device(in.data) && !memory_->is_device(out.data))
      return cpu_->reduce_scatter(in, out, op, blocking);
    auto host = memory_->host_buffer(in.bytes());
    memory_->copy(host.get(), in.data, in.bytes());
    ElementSpan h_in{host.get(), in.count, in.dtype}, h_out{host.get(), out.count, out.dtype};
    const int n = op == ReduceOp::kAvg ? size() : 0;
    return done(cpu_->reduce_scatter(h_in, h_out, op == ReduceOp::kAvg ? ReduceOp::kSum : op, blocking),
                blocking, [mem = memory_, host, h_out, out, n] {
                  if (n > 0) divide(h_out, n);
                  mem->copy(out.data, host.get(), out.bytes());
                });
  }

  std::unique_ptr<detail::WorkImpl> all_gather(ElementSpan in, ElementSpan out, bool blocking) override {
    if (!memory_->is_device(in.data) && !memory_->is_device(out.data))
      return cpu_->all_gather(in, out, blocking);
    auto host = memory_->host_buffer(out.bytes());
    char* mine = host.get() + static_cast<std::size_t>(rank()) * in.bytes();
    memory_->copy(mine, in.data, in.bytes());
    return done(cpu_->all_gather({mine, in.count, in.dtype}, {host.get(), out.count, out.dtype}, blocking),
                blocking, [mem = memory_, host, out] { mem->copy(out.data, host.get(), out.bytes()); });
  }

  std::unique_ptr<detail::WorkImpl> all_to_all(ElementSpan in, ElementSpan out, bool blocking) override {
    if (!memory_->is_device(in.data) && !memory_->is_device(out.data))
      return cpu_->all_to_all(in, out, blocking);
    auto h_in = memory_->host_buffer(in.bytes());
    auto h_out = memory_->host_buffer(out.bytes());
    memory_->copy(h_in.get(), in.data, in.bytes());
    return done(
        cpu_->all_to_all({h_in.get(), in.count, in.dtype}, {h_out.get(), out.count, out.dtype}, blocking),
        blocking, [mem = memory_, h_in, h_out, out] { mem->copy(out.data, h_out.get(), out.bytes()); });
  }

  std::unique_ptr<detail::WorkImpl> all_to_all_v(ElementSpan in, std::span<const std::int64_t> send_counts,
                                                 ElementSpan out, std::span<const std::int64_t> recv_counts,
                                                 bool blocking) override {
    if (!memory_->is_device(in.data) && !memory_->is_device(out.data))
      return cpu_->all_to_all_v(in, send_counts, out, recv_counts, blocking);
    auto h_in = memory_->host_buffer(in.bytes());
    auto h_out = memory_->host_buffer(out.bytes());
    memory_->copy(h_in.get(), in.data, in.bytes());
    return done(cpu_->all_to_all_v({h_in.get(), in.count, in.dtype}, send_counts,
                                   {h_out.get(), out.count, out.dtype}, recv_counts, blocking),
                blocking,
                [mem = memory_, h_in, h_out, out] { mem->copy(out.data, h_out.get(), out.bytes()); });
  }

  std::unique_ptr<detail::WorkImpl> send(ElementSpan data, int peer, int tag, bool blocking) override {
    if (!memory_->is_device(data.data)) return cpu_->send(data, peer, tag, blocking);
    auto host = memory_->host_buffer(data.bytes());
    memory_->copy(host.get(), data.data, data.bytes());
    return done(cpu_->send({host.get(), data.count, data.dtype}, peer, tag, blocking), blocking, [host] {});
  }

  std::unique_ptr<detail::WorkImpl> recv(ElementSpan data, int peer, int tag, bool blocking) override {
    if (!memory_->is_device(data.data)) return cpu_->recv(data, peer, tag, blocking);
    auto host = memory_->host_buffer(data.bytes());
    return done(cpu_->recv({host.get(), data.count, data.dtype}, peer, tag, blocking), blocking,
                [mem = memory_, host, data] { mem->copy(data.data, host.get(), data.bytes()); });
  }

  [[noreturn]] void abort_job(int code) override {
    cpu_->abort_job(code);
    std::abort();  // not reached: abort_job ends the process
  }
  bool interrupt(std::string_view component, const std::string& message, bool timed_out) override {
    return cpu_->interrupt(component, message, timed_out);
  }

 protected:
  // Communicator::abort() on a staged group ends its host group too: the operations in flight
  // are the host group's (a staged all_reduce waits in the CPU backend's), and only that
  // backend can end them at once and tell the members waiting for this one (gloo, inproc).
  void end_in_flight(const std::string& why) override {
    cpu_->abort(abort_state().component(), why, abort_state().timed_out());
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

  std::shared_ptr<detail::CommImpl> make(std::shared_ptr<detail::CommImpl> c) const {
    return std::make_shared<StagedComm>(std::move(c), memory_);
  }

  std::shared_ptr<detail::CommImpl> cpu_;
  std::shared_ptr<StagingMemory> memory_;
  std::string name_;
};

}  // namespace

Communicator staged(const Communicator& cpu, std::shared_ptr<StagingMemory> memory) {
  NDMESH_CHECK(cpu.valid() && memory != nullptr, "comm",
               "a staged communicator needs a CPU communicator and a memory");
  return detail::make_communicator(std::make_shared<StagedComm>(detail::impl_of(cpu), std::move(memory)),
                                   cpu.name());
}

}  // namespace ndmesh::comm
