// The staged communicator (comm/staged.hpp) over in-process ranks, with a fake device memory
// that the host cannot touch: "device" buffers live in a PROT_NONE mapping (any host read or
// write of them is a SIGSEGV) whose contents only StagingMemory::copy reaches. So every
// operation must stage through host copies and the Communicator must leave device elements
// alone (an average divided on the host, a reduce_scatter_in_place's block moved on the host
// would crash), and the results must equal the CPU backend's.
#include "ndmesh/comm/staged.hpp"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <numeric>
#include <thread>
#include <vector>

#include "ndmesh/comm/inproc.hpp"

namespace ndmesh::comm {
namespace {

class FakeDeviceMemory final : public StagingMemory {
 public:
  explicit FakeDeviceMemory(std::size_t bytes) : size_(bytes), shadow_(bytes) {
    void* p = ::mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    base_ = p == MAP_FAILED ? nullptr : static_cast<char*>(p);
  }
  ~FakeDeviceMemory() override {
    if (base_ != nullptr) ::munmap(base_, size_);
  }
  bool ok() const { return base_ != nullptr; }

  template <typename T>
  T* alloc(std::size_t n) {
    std::lock_guard lock(mutex_);
    char* p = base_ + next_;
    next_ += (n * sizeof(T) + 63) / 64 * 64;
    if (next_ > size_) throw std::runtime_error("fake device memory is full");
    return reinterpret_cast<T*>(p);
  }
  template <typename T>
  T* upload(const std::vector<T>& v) {
    T* d = alloc<T>(v.size());
    copy(d, v.data(), v.size() * sizeof(T));
    return d;
  }
  template <typename T>
  std::vector<T> download(const T* d, std::size_t n) {
    std::vector<T> v(n);
    copy(v.data(), d, n * sizeof(T));
    return v;
  }

  bool is_device(const void* p) const override {
    auto* c = static_cast<const char*>(p);
    return c != nullptr && c >= base_ && c < base_ + size_;
  }
  void copy(void* dst, const void* src, std::size_t bytes) override {
    ++copies;
    std::memcpy(resolve(dst), resolve(src), bytes);
  }
  std::shared_ptr<char> host_buffer(std::size_t bytes) override {
    return std::shared_ptr<char>(new char[std::max<std::size_t>(bytes, 1)], std::default_delete<char[]>());
  }

  std::atomic<int> copies{0};

 private:
  char* resolve(const void* p) {
    auto* c = const_cast<char*>(static_cast<const char*>(p));
    return is_device(c) ? shadow_.data() + (c - base_) : c;
  }
  char* base_ = nullptr;
  std::size_t size_;
  std::vector<char> shadow_;
  std::mutex mutex_;
  std::size_t next_ = 0;
};

std::vector<float> values(int rank, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(rank * 100 + static_cast<int>(i));
  return v;
}

TEST(Staged, DeviceBuffersGoThroughHostCopiesAndGiveTheCpuResults) {
  auto mem = std::make_shared<FakeDeviceMemory>(std::size_t{1} << 20);
  ASSERT_TRUE(mem->ok());
  constexpr int kRanks = 3;
  constexpr std::size_t kBlock = 5;
  inproc::run(kRanks, [&](const Communicator& world) {
    const Communicator c = staged(world, mem);
    EXPECT_EQ(c.backend(), "inproc-staged");
    const int r = c.rank(), p = c.size();
    const std::size_t n = kBlock * static_cast<std::size_t>(p);
    auto sum_at = [&](std::size_t i) {
      float s = 0;
      for (int q = 0; q < p; ++q) s += values(q, n)[i];
      return s;
    };

    // all_reduce: sum, then avg (divided once, on the host copy), blocking and async.
    float* d = mem->upload(values(r, n));
    c.all_reduce(std::span<float>(d, n));
    auto got = mem->download(d, n);
    for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(got[i], sum_at(i));
    float* a = mem->upload(values(r, n));
    Work w = c.all_reduce_async(std::span<float>(a, n), {.op = ReduceOp::kAvg});
    w.wait();
    got = mem->download(a, n);
    for (std::size_t i = 0; i < n; ++i) EXPECT_FLOAT_EQ(got[i], sum_at(i) / static_cast<float>(p));

    // reduce_scatter in place (avg): this rank's block holds the average of every rank's block.
    float* rs = mem->upload(values(r, n));
    c.reduce_scatter_in_place(std::span<float>(rs, n), {.op = ReduceOp::kAvg});
    got = mem->download(rs, n);
    for (std::size_t i = 0; i < kBlock; ++i)
      EXPECT_FLOAT_EQ(got[static_cast<std::size_t>(r) * kBlock + i],
                      sum_at(static_cast<std::size_t>(r) * kBlock + i) / static_cast<float>(p));
    // Out of place (sum).
    float* in = mem->upload(values(r, n));
    float* out = mem->alloc<float>(kBlock);
    c.reduce_scatter(std::span<const float>(in, n), std::span<float>(out, kBlock));
    got = mem->download(out, kBlock);
    for (std::size_t i = 0; i < kBlock; ++i)
      EXPECT_EQ(got[i], sum_at(static_cast<std::size_t>(r) * kBlock + i));

    // all_gather in place and out of place: block q is rank q's.
    std::vector<float> blocks(n, -1.0f);
    std::copy_n(values(r, kBlock).begin(), kBlock, blocks.begin() + static_cast<std::ptrdiff_t>(r * kBlock));
    float* ag = mem->upload(blocks);
    c.all_gather_in_place(std::span<float>(ag, n));
    got = mem->download(ag, n);
    for (int q = 0; q < p; ++q)
      for (std::size_t i = 0; i < kBlock; ++i)
        EXPECT_EQ(got[static_cast<std::size_t>(q) * kBlock + i], values(q, kBlock)[i]);
    float* mine = mem->upload(values(r, kBlock));
    float* all = mem->alloc<float>(n);
    c.all_gather(std::span<const float>(mine, kBlock), std::span<float>(all, n));
    EXPECT_EQ(mem->download(all, n), got);

    // broadcast from rank 1; all_to_all; a ring of async send/recv.
    float* b = mem->upload(values(r, n));
    c.broadcast(std::span<float>(b, n), 1);
    EXPECT_EQ(mem->download(b, n), values(1, n));
    float* tin = mem->upload(values(r, n));
    float* tout = mem->alloc<float>(n);
    c.all_to_all(std::span<const float>(tin, n), std::span<float>(tout, n));
    got = mem->download(tout, n);
    for (int q = 0; q < p; ++q)
      for (std::size_t i = 0; i < kBlock; ++i)
        EXPECT_EQ(got[static_cast<std::size_t>(q) * kBlock + i],
                  values(q, n)[static_cast<std::size_t>(r) * kBlock + i]);
    float* s = mem->upload(values(r, kBlock));
    float* rcv = mem->alloc<float>(kBlock);
    std::vector<Work> ring;
    ring.push_back(c.send_async(std::span<const float>(s, kBlock), (r + 1) % p));
    ring.push_back(c.recv_async(std::span<float>(rcv, kBlock), (r + p - 1) % p));
    wait_all(ring);
    EXPECT_EQ(mem->download(rcv, kBlock), values((r + p - 1) % p, kBlock));

    // Splits are staged too; host buffers go to the CPU backend without copies.
    const Communicator pair = c.split(r < 2 ? std::optional<std::int64_t>(0) : std::nullopt, r, "pair");
    if (pair) {
      EXPECT_EQ(pair.backend(), "inproc-staged");
      float* x = mem->upload(values(r, 2));
      pair.all_reduce(std::span<float>(x, 2), {.op = ReduceOp::kAvg});
      EXPECT_EQ(mem->download(x, 2), (std::vector<float>{50, 51}));
    }
    c.barrier();
    const int before = mem->copies.load();
    std::vector<double> host(4, r + 1.0);
    c.all_reduce(std::span<double>(host), {.op = ReduceOp::kAvg});
    EXPECT_EQ(host, std::vector<double>(4, 2.0));
    c.barrier();
    EXPECT_EQ(mem->copies.load(), before);
  });
}

// Communicator::abort() of a staged group ends the operation in flight in its host group, on
// this member and on the members waiting for it (an elastic run's replicas aborting a sum of
// device gradients): before, the staged group recorded the abort but left the host group's
// all_reduce waiting until the job's timeout.
TEST(Staged, AnAbortEndsTheHostGroupsOperationInFlightOnEveryMember) {
  auto mem = std::make_shared<FakeDeviceMemory>(std::size_t{1} << 16);
  ASSERT_TRUE(mem->ok());
  inproc::run(3, [&](const Communicator& world) {
    const Communicator c = staged(world.dup("replicas"), mem);
    float* d = mem->upload(std::vector<float>(4, 1.0f));
    c.all_reduce(std::span<float>(d, 4));
    EXPECT_EQ(mem->download(d, 4), std::vector<float>(4, 3.0f));
    const auto t0 = std::chrono::steady_clock::now();
    if (world.rank() == 0) {
      // Ranks 1 and 2 wait in the all_reduce below for this one.
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      c.abort("replica 0 is gone");
      EXPECT_THROW(c.all_reduce(std::span<float>(d, 4)), Aborted);
    } else {
      try {
        c.all_reduce(std::span<float>(d, 4), {.timeout_s = 20});
        ADD_FAILURE() << "the all_reduce of an aborted staged group completed";
      } catch (const Aborted& e) {
        EXPECT_NE(std::string(e.what()).find("group replicas was aborted: replica 0 is gone"), std::string::npos)
            << e.what();
      }
      EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
    }
    // The job's other groups go on.
    std::int64_t one = 1;
    world.all_reduce(std::span<std::int64_t>(&one, 1));
    EXPECT_EQ(one, 3);
  });
}

}  // namespace
}  // namespace ndmesh::comm
