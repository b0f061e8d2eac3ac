#include "ndmesh/nn/offload.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <memory>
#include <thread>

#include <fmt/format.h>

#include "ndmesh/core/env.hpp"
#include "ndmesh/core/error.hpp"
#include "ndmesh/tensor/device.hpp"

namespace ndmesh::nn {
namespace {

constexpr std::int64_t kAlign = 4096;  // O_DIRECT: offsets, sizes and buffers on this boundary

struct FreeAligned {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<char, FreeAligned>;

Buffer aligned_buffer(std::int64_t bytes) {
  void* p = std::aligned_alloc(kAlign, static_cast<std::size_t>(bytes));
  if (p == nullptr) fail<Error>("offload", "cannot allocate a {} byte I/O buffer", bytes);
  return Buffer(static_cast<char*>(p));
}

// A new offload file of `bytes` (zero-filled by ftruncate; blocks are allocated as they are
// first written), O_DIRECT where the file system has it (not tmpfs: there the page cache,
// dropped after each transfer). Returns the descriptor; `direct` says which.
int create_file(const std::string& path, std::int64_t bytes, bool& direct) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_DIRECT, 0600);
  direct = fd >= 0;
  if (fd < 0 && errno == EINVAL) fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0)
    fail<IoError>("offload", "cannot create the offload file '{}': {}; check --offload-dir", path,
                  std::strerror(errno));
  if (::ftruncate(fd, bytes) != 0) {
    const int e = errno;
    ::close(fd);
    ::unlink(path.c_str());
    fail<IoError>("offload", "cannot size the offload file '{}' to {} bytes: {}", path, bytes, std::strerror(e));
  }
  return fd;
}

// All `bytes` at byte `at` of the file, read into or written from `buffer` (aligned for
// O_DIRECT); without O_DIRECT the pages are dropped from the cache after (written ones synced
// first), so that the resident set really shrinks.
void transfer(int fd, bool direct, const std::string& path, bool write, off_t at, std::int64_t bytes,
              void* buffer) {
  std::int64_t done = 0;
  while (done < bytes) {
    char* p = static_cast<char*>(buffer) + done;
    const auto left = static_cast<std::size_t>(bytes - done);
    const ssize_t n = write ? ::pwrite(fd, p, left, at + done) : ::pread(fd, p, left, at + done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      fail<IoError>("offload", "{} the offload file '{}' at byte {} failed: {}", write ? "writing" : "reading",
                    path, at + done, n < 0 ? std::strerror(errno) : "unexpected end of file");
    done += n;
  }
  if (!direct) {
    if (write) ::fdatasync(fd);
    ::posix_fadvise(fd, at, static_cast<off_t>(bytes), POSIX_FADV_DONTNEED);
  }
}

}  // namespace

OffloadFile::OffloadFile(std::string path, std::int64_t elements, std::int64_t chunk)
    : path_(std::move(path)), elements_(elements) {
  NDMESH_CHECK(elements >= 0 && chunk >= 1, "offload", "elements={} chunk={}", elements, chunk);
  // A chunk's block is 2 x chunk floats, a multiple of 4096 bytes when chunk is of 1024.
  pause_s_ = env::seconds("NDMESH_OFFLOAD_PAUSE_S", 0);
  chunk_ = (std::min(chunk, std::max<std::int64_t>(elements, 1)) + 1023) / 1024 * 1024;
  chunks_ = (elements_ + chunk_ - 1) / chunk_;
  block_bytes_ = 2 * chunk_ * static_cast<std::int64_t>(sizeof(float));
  fd_ = create_file(path_, chunks_ * block_bytes_, direct_);
}

OffloadFile::~OffloadFile() {
  ::close(fd_);
  ::unlink(path_.c_str());
}

void OffloadFile::io(bool write, std::int64_t chunk, void* buffer, bool count) {
  const auto t0 = std::chrono::steady_clock::now();
  const off_t at = static_cast<off_t>(chunk * block_bytes_);
  // The last chunk's block is full size too (the file is), so every transfer is aligned.
  transfer(fd_, direct_, path_, write, at, block_bytes_, buffer);
  if (!count) return;
  if (write && pause_s_ > 0) std::this_thread::sleep_for(std::chrono::duration<double>(pause_s_));
  (write ? bytes_written_ : bytes_read_) += block_bytes_;
  io_ns_ +=
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
}

void OffloadFile::stream(const std::function<void(std::int64_t, std::int64_t, float*, float*)>& fn) {
  if (chunks_ == 0) return;
  std::array<Buffer, 3> buffers;
  for (auto& b : buffers) b = aligned_buffer(block_bytes_);
  // Declared after the buffers: a future's destructor waits for its task, so on an error
  // every task ends before the buffers are freed.
  std::array<std::future<void>, 3> reads, writes;
  auto start_read = [&](std::int64_t k) {
    const auto b = static_cast<std::size_t>(k % 3);
    if (writes[b].valid()) writes[b].get();  // chunk k - 3's write-back left this buffer
    reads[b] = std::async(std::launch::async, [this, k, p = buffers[b].get()] { io(false, k, p, true); });
  };
  start_read(0);
  for (std::int64_t k = 0; k < chunks_; ++k) {
    const auto b = static_cast<std::size_t>(k % 3);
    reads[b].get();
    if (k + 1 < chunks_) start_read(k + 1);
    auto* m = reinterpret_cast<float*>(buffers[b].get());
    const std::int64_t first = k * chunk_;
    fn(first, std::min(chunk_, elements_ - first), m, m + chunk_);
    writes[b] = std::async(std::launch::async, [this, k, p = buffers[b].get()] { io(true, k, p, true); });
  }
  for (auto& w : writes)
    if (w.valid()) w.get();
}

void OffloadFile::read_all(float* m, float* v) {
  Buffer buffer = aligned_buffer(block_bytes_);
  for (std::int64_t k = 0; k < chunks_; ++k) {
    io(false, k, buffer.get(), false);
    const auto* b = reinterpret_cast<const float*>(buffer.get());
    const std::int64_t first = k * chunk_, count = std::min(chunk_, elements_ - first);
    std::copy_n(b, count, m + first);
    std::copy_n(b + chunk_, count, v + first);
  }
}

void OffloadFile::write_all(const float* m, const float* v) {
  Buffer buffer = aligned_buffer(block_bytes_);
  std::memset(buffer.get(), 0, static_cast<std::size_t>(block_bytes_));
  for (std::int64_t k = 0; k < chunks_; ++k) {
    auto* b = reinterpret_cast<float*>(buffer.get());
    const std::int64_t first = k * chunk_, count = std::min(chunk_, elements_ - first);
    std::copy_n(m + first, count, b);
    std::copy_n(v + first, count, b + chunk_);
    io(true, k, buffer.get(), false);
  }
}

OffloadArray::OffloadArray(std::string path, std::int64_t elements) : path_(std::move(path)), elements_(elements) {
  NDMESH_CHECK(elements >= 0, "offload", "elements={}", elements);
  fd_ = create_file(path_, (elements * 4 + kAlign - 1) / kAlign * kAlign, direct_);
}

OffloadArray::~OffloadArray() {
  ::close(fd_);
  ::unlink(path_.c_str());
}

void OffloadArray::io(bool write, std::int64_t page, std::int64_t pages, void* buffer) {
  const std::int64_t bytes = pages * kAlign;
  transfer(fd_, direct_, path_, write, static_cast<off_t>(page * kAlign), bytes, buffer);
  (write ? bytes_written_ : bytes_read_) += bytes;
}

void OffloadArray::read(std::int64_t first, std::int64_t count, float* out) {
  if (count <= 0) return;
  NDMESH_CHECK(first >= 0 && first + count <= elements_, "offload", "read of [{}, {}) from {} elements", first,
               first + count, elements_);
  constexpr std::int64_t per_page = kAlign / 4;
  const std::int64_t lo = first / per_page, hi = (first + count + per_page - 1) / per_page;
  Buffer buffer = aligned_buffer((hi - lo) * kAlign);
  io(false, lo, hi - lo, buffer.get());
  std::copy_n(reinterpret_cast<const float*>(buffer.get()) + (first - lo * per_page), count, out);
}

void OffloadArray::write(std::int64_t first, std::int64_t count, const float* in) {
  if (count <= 0) return;
  NDMESH_CHECK(first >= 0 && first + count <= elements_, "offload", "write of [{}, {}) to {} elements", first,
               first + count, elements_);
  constexpr std::int64_t per_page = kAlign / 4;
  const std::int64_t lo = first / per_page, hi = (first + count + per_page - 1) / per_page;
  Buffer buffer = aligned_buffer((hi - lo) * kAlign);
  auto* b = reinterpret_cast<float*>(buffer.get());
  // Partial edge pages keep the elements beside the range.
  if (first % per_page != 0) io(false, lo, 1, b);
  if ((first + count) % per_page != 0 && (hi - 1 != lo || first % per_page == 0))
    io(false, hi - 1, 1, b + (hi - 1 - lo) * per_page);
  std::copy_n(in, count, b + (first - lo * per_page));
  io(true, lo, hi - lo, b);
}

std::vector<std::string> find_stale_offload(const std::string& dir, const std::string& prefix) {
  namespace fs = std::filesystem;
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() > 6 && name.ends_with(".adamw") && name.starts_with(prefix)) out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

PinnedOffload::PinnedOffload(std::int64_t elements, std::int64_t chunk)
    : elements_(elements), chunk_(std::max<std::int64_t>(1, std::min(chunk, std::max<std::int64_t>(1, elements)))) {
  NDMESH_CHECK(elements >= 0 && chunk > 0, "offload", "pinned offload of {} elements in chunks of {}", elements, chunk);
  try {
    host_ = static_cast<float*>(cuda::alloc_pinned(static_cast<std::size_t>(host_bytes())));
  } catch (const Error& e) {
    fail<>("offload", "--offload optimizer keeps the optimizer state in pinned host memory: {}; leave --offload out",
           e.what());
  }
  std::fill(host_, host_ + 2 * elements_, 0.0f);  // the moments start at zero
  try {
    for (void*& e : events_) e = cuda::stream_ops().create_event();
  } catch (...) {
    for (void* e : events_)
      if (e != nullptr) cuda::stream_ops().destroy_event(e);
    cuda::free_pinned(host_);
    throw;
  }
}

PinnedOffload::~PinnedOffload() {
  for (void* e : events_)
    if (e != nullptr) cuda::stream_ops().destroy_event(e);
  cuda::free_pinned(host_);
}

}  // namespace ndmesh::nn
