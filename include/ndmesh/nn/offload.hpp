// Offload of the optimizer state to a file: the storage tier below AdamW (--offload
// optimizer). The state of n elements (first and second moments) lives in one file, laid
// out as chunks of `chunk` elements, each chunk one aligned block [m of the chunk][v of the
// chunk]. stream() walks the chunks through a window of three buffers: while chunk i is
// updated, chunk i+1 is read and chunk i-1 written back (one I/O task each, on threads).
// The file is opened with O_DIRECT where the file system takes it (no page cache at all);
// elsewhere (tmpfs) every block is flushed and dropped from the page cache after use
// (posix_fadvise DONTNEED), so the resident set holds the window, not the state.
//
// The file is the run's scratch space, not a checkpoint: it is removed when the object is
// destroyed (a normal end or an error), so a file found at the next start is the trace of
// a process that was killed; find_stale_offload() names such files.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ndmesh::nn {

/// The moments of `elements` elements in the file `path` (created, zero-filled; IoError
/// when it cannot be). `chunk`: elements per streamed chunk (rounded up to 1024).
class OffloadFile {
 public:
  OffloadFile(std::string path, std::int64_t elements, std::int64_t chunk = kDefaultChunk);
  ~OffloadFile();
  OffloadFile(const OffloadFile&) = delete;
  OffloadFile& operator=(const OffloadFile&) = delete;

  /// 4 Mi elements: 32 MiB per chunk (both moments), a window of 96 MiB.
  static constexpr std::int64_t kDefaultChunk = std::int64_t{1} << 22;

  /// Calls fn(first, count, m, v) for the chunks in order, with the moments of elements
  /// [first, first + count) in buffers it may change; the changes are written back.
  /// Reads run one chunk ahead, writes one behind, beside fn.
  void stream(const std::function<void(std::int64_t first, std::int64_t count, float* m, float* v)>& fn);
  /// Every element's moments, to and from host arrays of `elements()` each.
  void read_all(float* m, float* v);
  void write_all(const float* m, const float* v);

  std::int64_t elements() const { return elements_; }
  const std::string& path() const { return path_; }
  bool direct() const { return direct_; }
  /// Bytes of the three buffers of the window.
  std::int64_t window_bytes() const { return 3 * block_bytes_; }
  /// Bytes stream() read and wrote so far, and the seconds its I/O tasks took (summed).
  std::int64_t bytes_read() const { return bytes_read_.load(); }
  std::int64_t bytes_written() const { return bytes_written_.load(); }
  double io_seconds() const { return static_cast<double>(io_ns_.load()) * 1e-9; }

 private:
  void io(bool write, std::int64_t chunk, void* buffer, bool count);
  std::string path_;
  std::int64_t elements_, chunk_, chunks_, block_bytes_;
  int fd_ = -1;
  bool direct_ = false;
  double pause_s_ = 0;  // NDMESH_OFFLOAD_PAUSE_S (a test hook)
  std::atomic<std::int64_t> bytes_read_{0}, bytes_written_{0}, io_ns_{0};
};

/// One array of `elements` floats in the file `path` (created, zero-filled; IoError when it
/// cannot be), read and written by element ranges: --offload optimizer+params keeps a rank's
/// shard of the parameters here between uses. O_DIRECT where the file system takes it
/// (whole 4 KiB pages through a bounce buffer: a range's partial edge pages are read before
/// they are written), else the page cache, flushed and dropped after each transfer. The
/// file is removed when the object is destroyed.
class OffloadArray {
 public:
  OffloadArray(std::string path, std::int64_t elements);
  ~OffloadArray();
  OffloadArray(const OffloadArray&) = delete;
  OffloadArray& operator=(const OffloadArray&) = delete;

  /// Elements [first, first + count) into `out` / from `in`.
  void read(std::int64_t first, std::int64_t count, float* out);
  void write(std::int64_t first, std::int64_t count, const float* in);

  std::int64_t elements() const { return elements_; }
  const std::string& path() const { return path_; }
  std::int64_t bytes_read() const { return bytes_read_; }
  std::int64_t bytes_written() const { return bytes_written_; }

 private:
  void io(bool write, std::int64_t page, std::int64_t pages, void* buffer);
  std::string path_;
  std::int64_t elements_ = 0;
  int fd_ = -1;
  bool direct_ = false;
  std::int64_t bytes_read_ = 0, bytes_written_ = 0;
};

/// --offload optimizer on a GPU (ZeRO-Offload's shape): the moments and an fp32 master copy
/// of `elements` owned elements live in pinned host memory (cuda::alloc_pinned), beside two
/// staging buffers of `chunk` elements for the gradients on their way to the host. AdamW
/// streams its update through it (AdamW::offload_to_host): on the copy stream
/// (cuda::copy_stream) the gradients of chunk i+1 go device-to-host while the host updates
/// chunk i with the CPU optimizer's loop, and each updated chunk of the master goes
/// host-to-device into the parameters. The GPU keeps the parameters and gradients only.
class PinnedOffload {
 public:
  PinnedOffload(std::int64_t elements, std::int64_t chunk = kDefaultChunk);
  ~PinnedOffload();
  PinnedOffload(const PinnedOffload&) = delete;
  PinnedOffload& operator=(const PinnedOffload&) = delete;

  /// 1 Mi elements: 4 MiB per staging buffer.
  static constexpr std::int64_t kDefaultChunk = std::int64_t{1} << 20;

  /// The moments (zero at first) and the master copy, `elements()` each, in state order;
  /// staging buffer k (0 or 1) of `chunk()` elements.
  float* m() const { return host_; }
  float* v() const { return host_ + elements_; }
  float* master() const { return host_ + 2 * elements_; }
  float* staging(int k) const { return host_ + 3 * elements_ + k * chunk_; }
  std::int64_t elements() const { return elements_; }
  std::int64_t chunk() const { return chunk_; }
  /// Pinned host bytes held (moments, master, staging).
  std::int64_t host_bytes() const { return (3 * elements_ + 2 * chunk_) * static_cast<std::int64_t>(sizeof(float)); }
  /// Events on the copy stream: staging buffer k filled (0, 1), the stream's start (2), its end (3).
  void* event(int k) const { return events_[k]; }
  /// Bytes copied device-to-host and host-to-device so far (AdamW counts them here).
  std::int64_t bytes_to_host = 0, bytes_to_device = 0;

 private:
  std::int64_t elements_, chunk_;
  float* host_ = nullptr;
  void* events_[4] = {};
};

/// The offload files (`*.adamw`) in `dir` whose names start with `prefix` (a run's rank
/// prefix, or empty: any), sorted; for the check at start.
std::vector<std::string> find_stale_offload(const std::string& dir, const std::string& prefix = "");

}  // namespace ndmesh::nn
