#include "ndmesh/model/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>

#include <fmt/core.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "ndmesh/core/error.hpp"

namespace ndmesh::model {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace {

// The safetensors library refuses headers above 100 MB; so do we (a corrupt length would
// otherwise ask for the whole file as JSON).
constexpr std::uint64_t kMaxHeader = 100'000'000;

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  fail<IoError>("safetensors", "'{}': {}", path, what);
}

bool parse_dtype(const std::string& s, SafeDtype& out) {
  if (s == "F32")
    out = SafeDtype::kF32;
  else if (s == "BF16")
    out = SafeDtype::kBF16;
  else if (s == "F16")
    out = SafeDtype::kF16;
  else
    return false;
  return true;
}

}  // namespace

const char* safetensors_dtype_name(SafeDtype dtype) {
  switch (dtype) {
    case SafeDtype::kF32:
      return "F32";
    case SafeDtype::kBF16:
      return "BF16";
    case SafeDtype::kF16:
      return "F16";
  }
  return "?";
}

std::int64_t safetensors_dtype_bytes(SafeDtype dtype) { return dtype == SafeDtype::kF32 ? 4 : 2; }

float bf16_to_float(std::uint16_t bits) {
  const std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

std::uint16_t float_to_bf16(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if (std::isnan(x)) return static_cast<std::uint16_t>((u >> 16) | 0x40);  // stays a (quiet) NaN
  u += 0x7fff + ((u >> 16) & 1);                                           // round to nearest, ties to even
  return static_cast<std::uint16_t>(u >> 16);
}

float f16_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  float f;
  if (exp == 0) {  // zero or subnormal: man * 2^-24
    f = std::ldexp(static_cast<float>(man), -24);
    if (sign) f = -f;
    return f;
  }
  std::uint32_t u;
  if (exp == 31)
    u = sign | 0x7f800000u | (man << 13);  // inf, NaN
  else
    u = sign | ((exp + 112) << 23) | (man << 13);
  std::memcpy(&f, &u, sizeof f);
  return f;
}

std::int64_t SafeTensor::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

SafetensorsFile::SafetensorsFile(std::string path) : path_(std::move(path)) {
  const int fd = ::open(path_.c_str(), O_RDONLY);
  if (fd < 0) bad(path_, fmt::format("cannot open it: {}", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    bad(path_, "is not a regular file");
  }
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    bad(path_,
        fmt::format("has {} bytes, fewer than the 8 of the header length: the file is truncated", size));
  }
  map_ = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    bad(path_, fmt::format("cannot map it: {}", std::strerror(errno)));
  }
  map_bytes_ = size;
  const auto* bytes = static_cast<const unsigned char*>(map_);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];
  if (n > kMaxHeader || n > size - 8)
    bad(path_,
        fmt::format("the header length says {} bytes but the file has {} after it: the header is truncated "
                    "(or this is not a safetensors file)",
                    n, size - 8));
  data_ = bytes + 8 + n;
  const std::uint64_t data_bytes = size - 8 - n;
  const json header = json::parse(reinterpret_cast<const char*>(bytes + 8),
                                  reinterpret_cast<const char*>(bytes + 8 + n), nullptr, false);
  if (header.is_discarded() || !header.is_object())
    bad(path_,
        fmt::format("its {}-byte header is not a JSON object: the file is truncated or not safetensors", n));
  for (const auto& [name, e] : header.items()) {
    if (name == "__metadata__") {
      if (!e.is_object()) bad(path_, "\"__metadata__\" is not an object");
      for (const auto& [k, v] : e.items())
        if (v.is_string()) metadata_[k] = v.get<std::string>();
      continue;
    }
    auto tensor_bad = [&](const std::string& what) { bad(path_, fmt::format("tensor '{}' {}", name, what)); };
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
      tensor_bad("needs \"dtype\", \"shape\" and \"data_offsets\"");
    SafeTensor t;
    t.name = name;
    if (!e["dtype"].is_string()) tensor_bad("has a dtype that is not a name");
    const std::string dtype = e["dtype"].get<std::string>();
    if (!parse_dtype(dtype, t.dtype))
      tensor_bad(
          fmt::format("has dtype {}; ndmesh reads F32, BF16 and F16 (save the model in one of them, e.g. "
                      "model.to(torch.float32).save_pretrained(...))",
                      dtype));
    if (!e["shape"].is_array()) tensor_bad("has a shape that is not a list");
    std::uint64_t numel = 1;
    for (const json& d : e["shape"]) {
      if (!d.is_number_unsigned()) tensor_bad("has a shape entry that is not a whole number");
      const auto x = d.get<std::uint64_t>();
      if (x > (std::uint64_t{1} << 40) || (x != 0 && numel > (std::uint64_t{1} << 50) / x))
        tensor_bad(fmt::format("has shape [{}], too large", fmt::join(e["shape"], ", ")));
      numel *= x;
      t.shape.push_back(static_cast<std::int64_t>(x));
    }
    const json& off = e["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      tensor_bad("has data_offsets that are not [begin, end]");
    const auto begin = off[0].get<std::uint64_t>(), end = off[1].get<std::uint64_t>();
    if (begin > end)
      tensor_bad(fmt::format("has data_offsets [{}, {}] that end before they begin", begin, end));
    if (end > data_bytes)
      tensor_bad(
          fmt::format("has data_offsets [{}, {}] past the end of the data ({} bytes): the file is truncated",
                      begin, end, data_bytes));
    const std::uint64_t want = numel * static_cast<std::uint64_t>(safetensors_dtype_bytes(t.dtype));
    if (end - begin != want)
      tensor_bad(fmt::format("has {} bytes at data_offsets [{}, {}] but its shape [{}] of {} needs {}",
                             end - begin, begin, end, fmt::join(t.shape, ", "), dtype, want));
    t.begin = static_cast<std::int64_t>(begin);
    t.end = static_cast<std::int64_t>(end);
    index_[name] = tensors_.size();
    tensors_.push_back(std::move(t));
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
}

const SafeTensor* SafetensorsFile::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

void SafetensorsFile::read(const SafeTensor& t, float* out) const {
  const std::int64_t rows = t.shape.empty() ? 1 : t.shape[0], cols = rows > 0 ? t.numel() / rows : 0;
  read_block(t, 0, rows, 0, cols, out, cols);
}

void SafetensorsFile::read_block(const SafeTensor& t, std::int64_t row, std::int64_t rows, std::int64_t col,
                                 std::int64_t cols, float* out, std::int64_t ld) const {
  const std::int64_t n = t.numel(), all_rows = t.shape.empty() ? 1 : t.shape[0];
  const std::int64_t all_cols = all_rows > 0 ? n / all_rows : 0;
  NDMESH_CHECK(row >= 0 && col >= 0 && rows >= 0 && cols >= 0 && row + rows <= all_rows &&
                   col + cols <= all_cols && ld >= cols,
               "safetensors", "'{}': block rows [{}, {}) cols [{}, {}) (ld {}) of tensor '{}' [{} x {}]",
               path_, row, row + rows, col, col + cols, ld, t.name, all_rows, all_cols);
  if (rows == 0 || cols == 0) return;
  // In chunks of rows, each chunk's pages of the mapping given back once converted (a later
  // read maps them again): reading a model tensor by tensor keeps about one tensor resident
  // (the output), not the file too.
  constexpr std::int64_t kChunk = std::int64_t{1} << 22;  // elements of the file, about
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const std::int64_t width = safetensors_dtype_bytes(t.dtype);
  const std::int64_t chunk_rows = std::max<std::int64_t>(1, kChunk / std::max<std::int64_t>(all_cols, 1));
  auto convert = [&](const unsigned char* p, std::int64_t count, float* dst) {
    if (t.dtype == SafeDtype::kF32) {
      std::memcpy(dst, p, static_cast<std::size_t>(count) * sizeof(float));
    } else {
      for (std::int64_t i = 0; i < count; ++i) {
        std::uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        dst[i] = t.dtype == SafeDtype::kBF16 ? bf16_to_float(h) : f16_to_float(h);
      }
    }
  };
  for (std::int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
    const std::int64_t nr = std::min(chunk_rows, rows - r0);
    const unsigned char* first_byte = data_ + t.begin + ((row + r0) * all_cols + col) * width;
    if (cols == all_cols && ld == cols) {  // whole rows: one contiguous range
      convert(first_byte, nr * cols, out + r0 * ld);
    } else {
      for (std::int64_t r = 0; r < nr; ++r)
        convert(first_byte + r * all_cols * width, cols, out + (r0 + r) * ld);
    }
    bytes_read_ += nr * cols * width;
    const auto begin = reinterpret_cast<std::uintptr_t>(first_byte);
    const auto end = begin + static_cast<std::uintptr_t>(((nr - 1) * all_cols + cols) * width);
    const auto first = (begin + page - 1) / page * page, last = end / page * page;
    if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
  }
}

SafetensorsFolder::SafetensorsFolder(const std::string& dir) {
  const fs::path single = fs::path(dir) / kSafetensorsFile, index = fs::path(dir) / kSafetensorsIndex;
  std::error_code ec;
  if (fs::exists(single, ec)) {
    files_.push_back(std::make_unique<SafetensorsFile>(single.string()));
    for (const SafeTensor& t : files_.back()->tensors()) where_[t.name] = 0;
    return;
  }
  if (!fs::exists(index, ec))
    fail<IoError>("safetensors",
                  "'{}' has neither {} nor {}; pass a folder saved by save_pretrained "
                  "(safe_serialization, the default)",
                  dir, kSafetensorsFile, kSafetensorsIndex);
  std::ifstream in(index);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const json j = json::parse(text, nullptr, false);
  if (!in || j.is_discarded() || !j.is_object()) bad(index.string(), "is not a JSON object");
  if (!j.contains("weight_map") || !j["weight_map"].is_object())
    bad(index.string(), "has no \"weight_map\" object");
  std::map<std::string, std::size_t> file_index;
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string()) bad(index.string(), fmt::format("weight_map['{}'] is not a file name", name));
    const std::string f = file.get<std::string>();
    if (f.empty() || f.find('/') != std::string::npos || f == "..")
      bad(index.string(), fmt::format("weight_map['{}'] = '{}' is not a file name in the folder", name, f));
    auto it = file_index.find(f);
    if (it == file_index.end()) {
      const fs::path shard = fs::path(dir) / f;
      if (!fs::exists(shard, ec))
        bad(index.string(),
            fmt::format("names the shard '{}' for tensor '{}', which is missing: copy every shard "
                        "of the model into the folder",
                        f, name));
      files_.push_back(std::make_unique<SafetensorsFile>(shard.string()));
      it = file_index.emplace(f, files_.size() - 1).first;
    }
    if (files_[it->second]->find(name) == nullptr)
      bad(index.string(), fmt::format("says tensor '{}' is in '{}', which does not hold it", name, f));
    where_[name] = it->second;
  }
}

std::pair<const SafeTensor*, const SafetensorsFile*> SafetensorsFolder::find(const std::string& name) const {
  const auto it = where_.find(name);
  if (it == where_.end()) return {nullptr, nullptr};
  const SafetensorsFile* f = files_[it->second].get();
  return {f->find(name), f};
}

std::vector<std::string> SafetensorsFolder::names() const {
  std::vector<std::string> out;
  for (const auto& [name, file] : where_) out.push_back(name);
  return out;
}

void write_safetensors(const std::string& path, const std::vector<SafeTensorOut>& tensors, SafeDtype dtype,
                       const std::map<std::string, std::string>& metadata) {
  NDMESH_CHECK(dtype == SafeDtype::kF32 || dtype == SafeDtype::kBF16, "safetensors",
               "writes F32 or BF16, not {}", safetensors_dtype_name(dtype));
  json header = json::object();
  if (!metadata.empty()) {
    json meta = json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = meta;
  }
  std::int64_t at = 0;
  for (const SafeTensorOut& t : tensors) {
    std::int64_t n = 1;
    for (std::int64_t d : t.shape) n *= d;
    const std::int64_t bytes = n * safetensors_dtype_bytes(dtype);
    header[t.name] = {
        {"dtype", safetensors_dtype_name(dtype)}, {"shape", t.shape}, {"data_offsets", {at, at + bytes}}};
    at += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) fail<IoError>("safetensors", "cannot create '{}': {}", path, std::strerror(errno));
  auto write = [&](const void* p, std::size_t n) {
    if (std::fwrite(p, 1, n, f) != n) {
      const int err = errno;
      std::fclose(f);
      fail<IoError>("safetensors", "cannot write '{}': {} (disk full?)", path, std::strerror(err));
    }
  };
  unsigned char len[8];
  std::uint64_t n = text.size();
  for (unsigned char& b : len) {
    b = static_cast<unsigned char>(n & 0xff);
    n >>= 8;
  }
  write(len, 8);
  write(text.data(), text.size());
  std::vector<float> values;
  std::vector<std::uint16_t> half;
  for (const SafeTensorOut& t : tensors) {
    std::int64_t count = 1;
    for (std::int64_t d : t.shape) count *= d;
    values.assign(static_cast<std::size_t>(count), 0.0f);
    t.fill(values.data());
    if (dtype == SafeDtype::kF32) {
      write(values.data(), values.size() * sizeof(float));
    } else {
      half.resize(values.size());
      std::transform(values.begin(), values.end(), half.begin(), float_to_bf16);
      write(half.data(), half.size() * sizeof(std::uint16_t));
    }
  }
  bool ok = std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  const int err = errno;
  ok = std::fclose(f) == 0 && ok;
  if (!ok) fail<IoError>("safetensors", "cannot write '{}': {} (disk full?)", path, std::strerror(err));
}

}  // namespace ndmesh::model
