#include "ndmesh/train/tensorboard.hpp"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>

#include <fmt/core.h>

#include "ndmesh/core/error.hpp"

namespace ndmesh::train {

namespace {

constexpr std::array<std::uint32_t, 256> make_crc32c_table() {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) != 0 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<std::uint32_t, 256> kCrc32cTable = make_crc32c_table();

// TFRecord's masked CRC (a CRC of data that holds CRCs is weak, so it is rotated and offset).
std::uint32_t masked_crc(const void* data, std::size_t bytes) {
  const std::uint32_t crc = crc32c(data, bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

void put_le(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// Protocol buffer wire format: varints, fixed 64- and 32-bit numbers, length-delimited fields.
void varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void key(std::string& out, int field, int wire_type) {
  varint(out, static_cast<std::uint64_t>(field << 3 | wire_type));
}
void field_double(std::string& out, int field, double v) {
  key(out, field, 1);
  std::uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  put_le(out, bits, 8);
}
void field_float(std::string& out, int field, float v) {
  key(out, field, 5);
  std::uint32_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  put_le(out, bits, 4);
}
void field_varint(std::string& out, int field, std::uint64_t v) {
  key(out, field, 0);
  varint(out, v);
}
void field_bytes(std::string& out, int field, std::string_view v) {
  key(out, field, 2);
  varint(out, v.size());
  out.append(v);
}

// Event fields 1 (wall_time) and 2 (step).
std::string event_head(double wall_time, std::int64_t step) {
  std::string e;
  field_double(e, 1, wall_time);
  if (step != 0) field_varint(e, 2, static_cast<std::uint64_t>(step));
  return e;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

std::uint32_t crc32c(const void* data, std::size_t bytes, std::uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (std::size_t i = 0; i < bytes; ++i) crc = kCrc32cTable[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

std::string tfrecord(std::string_view data) {
  std::string out, length;
  put_le(length, data.size(), 8);
  out += length;
  put_le(out, masked_crc(length.data(), length.size()), 4);
  out.append(data);
  put_le(out, masked_crc(data.data(), data.size()), 4);
  return out;
}

std::string scalar_event(double wall_time, std::int64_t step,
                         const std::vector<std::pair<std::string, float>>& values) {
  std::string summary;
  for (const auto& [tag, value] : values) {
    std::string v;
    field_bytes(v, 1, tag);
    field_float(v, 2, value);
    field_bytes(summary, 1, v);
  }
  std::string e = event_head(wall_time, step);
  field_bytes(e, 5, summary);
  return e;
}

std::string file_version_event(double wall_time) {
  std::string e = event_head(wall_time, 0);
  field_bytes(e, 3, "brain.Event:2");
  return e;
}

std::string session_start_event(double wall_time, std::int64_t step) {
  std::string log;
  field_varint(log, 1, 1);  // SessionLog.status = START
  std::string e = event_head(wall_time, step);
  field_bytes(e, 7, log);
  return e;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir, std::optional<std::int64_t> resumed_at) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) fail<IoError>("train", "--tensorboard={}: cannot create the folder: {}", dir, ec.message());
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "localhost");
  path_ =
      (std::filesystem::path(dir) / fmt::format("events.out.tfevents.{}.{}.{}.ndmesh",
                                                static_cast<long long>(std::time(nullptr)), host, ::getpid()))
          .string();
  file_ = std::fopen(path_.c_str(), "wb");
  if (file_ == nullptr)
    fail<IoError>("train", "--tensorboard: cannot create '{}': {}", path_, std::strerror(errno));
  write(file_version_event(now_seconds()));
  if (resumed_at) write(session_start_event(now_seconds(), *resumed_at + 1));
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void TensorBoardWriter::write(const std::string& event) {
  const std::string record = tfrecord(event);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() || std::fflush(file_) != 0)
    fail<IoError>("train", "--tensorboard: cannot write '{}': {} (disk full?)", path_, std::strerror(errno));
}

void TensorBoardWriter::on_step(const StepRecord& r) {
  std::vector<std::pair<std::string, float>> v = {
      {"loss", static_cast<float>(r.stats.loss)},
      {"lr", static_cast<float>(r.stats.lr)},
      {"grad_norm", static_cast<float>(r.stats.grad_norm)},
      {"tokens_per_second", static_cast<float>(r.tokens_per_second)}};
  if (r.mfu) v.emplace_back("mfu", static_cast<float>(*r.mfu));
  v.emplace_back("peak_memory_bytes", static_cast<float>(r.peak_memory_bytes));
  if (r.val_loss) v.emplace_back("val_loss", static_cast<float>(*r.val_loss));
  write(scalar_event(now_seconds(), r.stats.step, v));
}

}  // namespace ndmesh::train
