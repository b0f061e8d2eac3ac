// safetensors: the tensor file format of Hugging Face checkpoints, read and written directly.
//
// A file is an 8-byte little-endian header length N, then N bytes of JSON (padded with
// spaces), then the data: {"NAME": {"dtype": "F32", "shape": [..], "data_offsets": [BEGIN,
// END]}, ..., "__metadata__": {"format": "pt"}} with byte offsets into the data that follows
// the header, tensors row-major and little-endian. A folder holds one model.safetensors or
// shards named by model.safetensors.index.json ({"weight_map": {"NAME": "FILE"}}).
//
// Reading maps the file (mmap) and converts one tensor at a time to float32, so reading a
// model costs about one tensor of memory beyond what the caller keeps. Every field of the
// header is untrusted: a truncated header, offsets past the file, a size that does not
// match the shape, an unsupported dtype or an index naming a missing shard is an IoError
// naming the file and the tensor or key. Writing takes each tensor from a callback, one at
// a time, and converts it to the file's dtype (bf16: round to nearest even, as torch does).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace ndmesh::model {

/// The element types ndmesh reads (and, F32 and BF16, writes).
enum class SafeDtype { kF32, kBF16, kF16 };
/// "F32", "BF16", "F16" (the header's spelling).
const char* safetensors_dtype_name(SafeDtype dtype);
/// Bytes of one element.
std::int64_t safetensors_dtype_bytes(SafeDtype dtype);

/// bfloat16 and IEEE half bits <-> float.
float bf16_to_float(std::uint16_t bits);
std::uint16_t float_to_bf16(float x);  ///< round to nearest even; NaN stays NaN
float f16_to_float(std::uint16_t bits);

/// One tensor of a file's header.
struct SafeTensor {
  std::string name;
  SafeDtype dtype = SafeDtype::kF32;
  std::vector<std::int64_t> shape;
  std::int64_t begin = 0, end = 0;  ///< bytes in the data section
  std::int64_t numel() const;
};

/// One safetensors file, mapped.
class SafetensorsFile {
 public:
  /// Maps and checks the file (IoError naming it and the tensor or key otherwise: missing,
  /// shorter than its header, a header that is not JSON or names an unsupported dtype,
  /// offsets past the data or not matching the shape).
  explicit SafetensorsFile(std::string path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  /// In the header's order.
  const std::vector<SafeTensor>& tensors() const { return tensors_; }
  /// The tensor named `name`, or nullptr.
  const SafeTensor* find(const std::string& name) const;
  /// "__metadata__" (string values only).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// The tensor's numel() values as float32. The file's pages it read are given back (a
  /// later read maps them again).
  void read(const SafeTensor& tensor, float* out) const;
  /// A block of the tensor seen as a row-major matrix [shape[0], numel / shape[0]] (a
  /// vector: [n, 1]): rows [row, row + rows) and columns [col, col + cols), as float32 into
  /// `out` with `ld` floats from one row to the next. Only those bytes are read: whole rows
  /// are one contiguous range, a column range one range per row.
  void read_block(const SafeTensor& tensor, std::int64_t row, std::int64_t rows, std::int64_t col,
                  std::int64_t cols, float* out, std::int64_t ld) const;
  /// Bytes of tensor data read so far (by read and read_block).
  std::int64_t bytes_read() const { return bytes_read_; }

 private:
  std::string path_;
  void* map_ = nullptr;
  std::size_t map_bytes_ = 0;
  const unsigned char* data_ = nullptr;  // the data section
  std::vector<SafeTensor> tensors_;
  std::map<std::string, std::size_t> index_;
  std::map<std::string, std::string> metadata_;
  mutable std::int64_t bytes_read_ = 0;
};

/// The file names of a Hugging Face folder.
inline constexpr const char* kSafetensorsFile = "model.safetensors";
inline constexpr const char* kSafetensorsIndex = "model.safetensors.index.json";

/// The tensors of a Hugging Face folder: its model.safetensors, or the shards its
/// model.safetensors.index.json names (each mapped when the folder is opened).
class SafetensorsFolder {
 public:
  /// IoError naming the folder when it holds neither file, the index when it is not JSON,
  /// has no weight_map or names a shard that is missing (with a tensor it holds), and a
  /// file as SafetensorsFile says.
  explicit SafetensorsFolder(const std::string& dir);
  /// The tensor and the file that holds it, or {nullptr, nullptr}.
  std::pair<const SafeTensor*, const SafetensorsFile*> find(const std::string& name) const;
  /// Every tensor name, sorted.
  std::vector<std::string> names() const;
  /// The files read (one, or the shards).
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::size_t> where_;  // tensor -> files_ index
};

/// A tensor to write: its name and shape, and a callback that fills numel values (float32).
struct SafeTensorOut {
  std::string name;
  std::vector<std::int64_t> shape;
  std::function<void(float* out)> fill;
};

/// Writes `tensors` (in this order) as one safetensors file of `dtype` (F32 or BF16) with
/// `metadata` as "__metadata__"; the callbacks run one at a time (one tensor in memory).
/// The file is written and synced; IoError naming it on failure.
void write_safetensors(const std::string& path, const std::vector<SafeTensorOut>& tensors, SafeDtype dtype,
                       const std::map<std::string, std::string>& metadata);

}  // namespace ndmesh::model
