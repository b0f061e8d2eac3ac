// safetensors (model/safetensors.hpp): files written here byte by byte are read with the
// values their bits say (F32, BF16, F16), the writer's files read back and have the layout
// the format fixes (8-byte length, JSON header padded to 8, offsets into the data), a
// sharded folder is read through its index, and bad input (truncated header, offsets past
// the file, a size that does not match the shape, an unsupported dtype, a missing shard) is
// one IoError naming the file and the tensor.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "ndmesh/core/error.hpp"
#include "ndmesh/model/safetensors.hpp"
#include "support/error_of.hpp"
#include "support/temp_dir.hpp"

namespace ndmesh::model {
namespace {

namespace fs = std::filesystem;
using testing_support::error_of;

struct TempDir : testing_support::TempDir {
  TempDir() : testing_support::TempDir("ndmesh_st") {}
};

// A safetensors file from a header text and data bytes, by hand.
void write_raw(const fs::path& p, const std::string& header, const std::string& data,
               std::uint64_t length = 0) {
  std::ofstream out(p, std::ios::binary);
  std::uint64_t n = length ? length : header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << header << data;
}

std::string bytes_of(const void* p, std::size_t n) { return std::string(static_cast<const char*>(p), n); }

TEST(Safetensors, HalfConversionsAreTheBitPatterns) {
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_float(0xc020), -2.5f);
  EXPECT_EQ(f16_to_float(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_float(0xc100), -2.5f);
  EXPECT_EQ(f16_to_float(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(f16_to_float(0x7bff), 65504.0f);               // largest finite
  EXPECT_TRUE(std::isinf(f16_to_float(0x7c00)));
  EXPECT_TRUE(std::isnan(f16_to_float(0x7e00)));
  EXPECT_EQ(f16_to_float(0x8000), -0.0f);
  EXPECT_TRUE(std::signbit(f16_to_float(0x8000)));
  // Round to nearest even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 -> 1 (even);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6 -> 1 + 2^-6 (even).
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(float_to_bf16(-2.5f), 0xc020);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(Safetensors, ReadsHandWrittenF32Bf16F16) {
  TempDir dir;
  const float f32[3] = {1.5f, -2.0f, 0.25f};
  const std::uint16_t bf16[2] = {0x3f80, 0xc020};                 // 1, -2.5
  const std::uint16_t f16[4] = {0x3c00, 0xc100, 0x0001, 0x3800};  // 1, -2.5, 2^-24, 0.5
  const std::string data = bytes_of(f32, 12) + bytes_of(bf16, 4) + bytes_of(f16, 8);
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},)"
      R"("b":{"dtype":"BF16","shape":[1,2],"data_offsets":[12,16]},)"
      R"("c":{"dtype":"F16","shape":[2,2],"data_offsets":[16,24]}})";
  write_raw(dir.path / "m.safetensors", header, data);
  SafetensorsFile file((dir.path / "m.safetensors").string());
  ASSERT_EQ(file.tensors().size(), 3u);
  EXPECT_EQ(file.metadata().at("format"), "pt");
  std::vector<float> out(4);
  file.read(*file.find("a"), out.data());
  EXPECT_EQ(out[0], 1.5f);
  EXPECT_EQ(out[1], -2.0f);
  EXPECT_EQ(out[2], 0.25f);
  const SafeTensor* b = file.find("b");
  EXPECT_EQ(b->shape, (std::vector<std::int64_t>{1, 2}));
  file.read(*b, out.data());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.5f);
  file.read(*file.find("c"), out.data());
  EXPECT_EQ(out, (std::vector<float>{1.0f, -2.5f, std::ldexp(1.0f, -24), 0.5f}));
  EXPECT_EQ(file.find("d"), nullptr);
}

// IEEE half bits of a whole number 0 < k < 2048 (exact).
std::uint16_t f16_of(int k) {
  int e = 0;
  while ((k >> (e + 1)) != 0) ++e;
  const int mantissa = ((k << 10) >> e) & 0x3ff;
  return static_cast<std::uint16_t>(((e + 15) << 10) | mantissa);
}

// A block (rows x columns, into a wider output) reads and converts just its bytes: whole
// rows as one range, a column range row by row; bytes_read() counts exactly those.
TEST(Safetensors, ReadBlockReadsOnlyTheBlock) {
  TempDir dir;
  std::vector<std::uint16_t> f16(12);  // [3, 4]: element (r, c) = 1 + 4 r + c
  for (int i = 0; i < 12; ++i) f16[static_cast<std::size_t>(i)] = f16_of(1 + i);
  write_raw(dir.path / "m.safetensors", R"({"w":{"dtype":"F16","shape":[3,4],"data_offsets":[0,24]}})",
            bytes_of(f16.data(), 24));
  SafetensorsFile file((dir.path / "m.safetensors").string());
  const SafeTensor& w = *file.find("w");
  std::vector<float> out(12, -7.0f);  // 2 rows of ld 5, then unused
  file.read_block(w, 1, 2, 1, 2, out.data(), 5);
  EXPECT_EQ(out, (std::vector<float>{6, 7, -7, -7, -7, 10, 11, -7, -7, -7, -7, -7}));
  EXPECT_EQ(file.bytes_read(), 2 * 2 * 2);
  std::fill(out.begin(), out.end(), -7.0f);
  file.read_block(w, 2, 1, 0, 4, out.data(), 4);  // a whole row
  EXPECT_EQ(out, (std::vector<float>{9, 10, 11, 12, -7, -7, -7, -7, -7, -7, -7, -7}));
  EXPECT_EQ(file.bytes_read(), 8 + 8);
  file.read(w, out.data());
  EXPECT_EQ(out, (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}));
  EXPECT_EQ(file.bytes_read(), 16 + 24);
}

TEST(Safetensors, WriterLayoutAndRoundTrip) {
  TempDir dir;
  const std::string path = (dir.path / "w.safetensors").string();
  const std::vector<float> a = {1, 2, 3, 4, 5, 6};
  const std::vector<float> b = {-1.0f, 1.0f + std::ldexp(1.0f, -8)};
  write_safetensors(path,
                    {{"x.weight", {2, 3}, [&](float* out) { std::copy(a.begin(), a.end(), out); }},
                     {"y", {2}, [&](float* out) { std::copy(b.begin(), b.end(), out); }}},
                    SafeDtype::kF32, {{"format", "pt"}});
  // The layout by hand: the header length, a multiple of 8, then the values at their offsets.
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 8 * sizeof(float));
  EXPECT_NE(bytes.find(R"("__metadata__":{"format":"pt"})"), std::string::npos);
  float first;
  std::memcpy(&first, bytes.data() + 8 + n, sizeof first);
  EXPECT_EQ(first, 1.0f);
  SafetensorsFile file(path);
  std::vector<float> out(6);
  file.read(*file.find("x.weight"), out.data());
  EXPECT_EQ(out, a);
  // BF16: rounded to nearest even.
  write_safetensors(path, {{"y", {2}, [&](float* o) { std::copy(b.begin(), b.end(), o); }}}, SafeDtype::kBF16,
                    {});
  SafetensorsFile half(path);
  EXPECT_EQ(half.find("y")->dtype, SafeDtype::kBF16);
  half.read(*half.find("y"), out.data());
  EXPECT_EQ(out[0], -1.0f);
  EXPECT_EQ(out[1], 1.0f);
}

TEST(Safetensors, ShardedFolderThroughItsIndex) {
  TempDir dir;
  auto fill = [](float v) {
    return [v](float* out) {
      out[0] = v;
      out[1] = v + 1;
    };
  };
  write_safetensors((dir.path / "model-00001-of-00002.safetensors").string(), {{"a", {2}, fill(1)}},
                    SafeDtype::kF32, {{"format", "pt"}});
  write_safetensors((dir.path / "model-00002-of-00002.safetensors").string(), {{"b", {2}, fill(5)}},
                    SafeDtype::kF32, {{"format", "pt"}});
  std::ofstream(dir.path / kSafetensorsIndex) << R"({"metadata":{"total_size":16},"weight_map":)"
                                                 R"({"a":"model-00001-of-00002.safetensors",)"
                                                 R"("b":"model-00002-of-00002.safetensors"}})";
  SafetensorsFolder folder(dir.path.string());
  EXPECT_EQ(folder.names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(folder.files().size(), 2u);
  auto [t, f] = folder.find("b");
  ASSERT_NE(t, nullptr);
  float out[2];
  f->read(*t, out);
  EXPECT_EQ(out[0], 5.0f);
  EXPECT_EQ(out[1], 6.0f);
  EXPECT_EQ(folder.find("c").first, nullptr);

  // A shard the index names is missing: the index, the shard and a tensor in it.
  fs::remove(dir.path / "model-00002-of-00002.safetensors");
  const std::string e = error_of<IoError>([&] { SafetensorsFolder again(dir.path.string()); });
  EXPECT_NE(e.find(kSafetensorsIndex), std::string::npos) << e;
  EXPECT_NE(e.find("model-00002-of-00002.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("'b'"), std::string::npos) << e;
  EXPECT_NE(e.find("missing"), std::string::npos) << e;
}

TEST(Safetensors, EmptyFolderNamesBothFiles) {
  TempDir dir;
  const std::string e = error_of<IoError>([&] { SafetensorsFolder f(dir.path.string()); });
  EXPECT_NE(e.find(kSafetensorsFile), std::string::npos) << e;
  EXPECT_NE(e.find(kSafetensorsIndex), std::string::npos) << e;
}

TEST(Safetensors, BadFilesNameTheFileAndTheTensor) {
  TempDir dir;
  const std::string p = (dir.path / "bad.safetensors").string();
  const float v[2] = {1, 2};
  auto expect = [&](const std::string& what, std::initializer_list<const char*> parts) {
    const std::string e = error_of<IoError>([&] { SafetensorsFile f(p); });
    EXPECT_NE(e.find(p), std::string::npos) << what << ": " << e;
    for (const char* part : parts) EXPECT_NE(e.find(part), std::string::npos) << what << ": " << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << what << ": one line: " << e;
  };
  // Shorter than the length field.
  std::ofstream(p, std::ios::binary) << "abc";
  expect("3 bytes", {"truncated"});
  // The header runs past the file.
  const std::string good = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  write_raw(p, good.substr(0, 20), "", good.size());
  expect("truncated header", {"truncated"});
  // The header is cut but its length fits (the JSON ends early).
  write_raw(p, good.substr(0, 20), "");
  expect("cut JSON", {"not a JSON object"});
  // Offsets past the data.
  write_raw(p, R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", bytes_of(v, 8));
  expect("offsets past the file", {"'w'", "past the end", "truncated"});
  // A size that does not match the shape.
  write_raw(p, R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", bytes_of(v, 8));
  expect("size vs shape", {"'w'", "[3]", "needs 12"});
  // Offsets that end before they begin.
  write_raw(p, R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", bytes_of(v, 8));
  expect("reversed offsets", {"'w'", "end before"});
  // An unsupported dtype.
  write_raw(p, R"({"w":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", bytes_of(v, 8));
  expect("dtype", {"'w'", "I64", "F32, BF16 and F16"});
  // A tensor entry without its fields.
  write_raw(p, R"({"w":{"dtype":"F32"}})", "");
  expect("fields", {"'w'", "data_offsets"});
  // Not a file.
  const std::string e =
      error_of<IoError>([&] { SafetensorsFile f((dir.path / "none.safetensors").string()); });
  EXPECT_NE(e.find("none.safetensors"), std::string::npos) << e;
}

}  // namespace
}  // namespace ndmesh::model
