// Data parts (--val-fraction): a source restricted to a range of its file's tokens draws every
// window inside that range, so the training part and the held-out part never share a token
// position; the part is in describe() (a checkpoint of one part does not load into another).
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/model/data.hpp"

namespace ndmesh::model {
namespace {

namespace fs = std::filesystem;

class DataPartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ndmesh_part_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  // Raw uint16 tokens first, first + 1, ...: a token is its position.
  std::string tokens(const std::string& name, int first, int n) {
    std::vector<std::uint16_t> t(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) t[static_cast<std::size_t>(i)] = static_cast<std::uint16_t>(first + i);
    std::ofstream(dir_ / name, std::ios::binary)
        .write(reinterpret_cast<const char*>(t.data()), static_cast<std::streamsize>(t.size() * 2));
    return (dir_ / name).string();
  }
  // The lowest and highest token of `count` windows (and their targets) of step 0..9.
  static std::pair<int, int> span(const DataSource& src, std::int64_t seq, std::uint64_t stream) {
    int lo = 1 << 30, hi = -1;
    std::vector<std::int32_t> tok(static_cast<std::size_t>(seq)), tgt(tok.size());
    for (std::int64_t step = 0; step < 10; ++step)
      for (std::int64_t i = 0; i < 50; ++i) {
        src.sequence(stream, step, i, seq, tok.data(), tgt.data());
        for (std::int64_t t = 0; t < seq; ++t) {
          lo = std::min({lo, tok[static_cast<std::size_t>(t)], tgt[static_cast<std::size_t>(t)]});
          hi = std::max({hi, tok[static_cast<std::size_t>(t)], tgt[static_cast<std::size_t>(t)]});
          EXPECT_EQ(tgt[static_cast<std::size_t>(t)], tok[static_cast<std::size_t>(t)] + 1);
        }
      }
    return {lo, hi};
  }
  fs::path dir_;
};

TEST_F(DataPartTest, TokenShardsSplitAtTheFraction) {
  // Two shards of 1000 tokens: positions 0..999 and 1000..1999 of the concatenation.
  tokens("a.bin", 0, 1000);
  tokens("b.bin", 1000, 1000);
  const std::string glob = (dir_ / "*.bin").string();
  const TokenFileSource train(glob, DataFormat::kUint16, 4096, 1, {.end = 0.7});
  const TokenFileSource held(glob, DataFormat::kUint16, 4096, 1, {.begin = 0.7, .flag = "--val-data"});
  EXPECT_EQ(train.tokens(), 1400);
  EXPECT_EQ(held.tokens(), 600);
  for (std::uint64_t stream : {DataSource::kTrainStream, DataSource::kEvalStream}) {
    auto [lo, hi] = span(train, 16, stream);
    EXPECT_GE(lo, 0);
    EXPECT_LT(hi, 1400) << "a training window reads a held-out token";
    std::tie(lo, hi) = span(held, 16, stream);
    EXPECT_GE(lo, 1400) << "a held-out window reads a training token";
    EXPECT_LT(hi, 2000);
  }
  EXPECT_NE(train.describe().find("range=0..0.7"), std::string::npos) << train.describe();
  EXPECT_NE(held.describe().find("range=0.7..1"), std::string::npos) << held.describe();
  EXPECT_EQ(TokenFileSource(glob, DataFormat::kUint16, 4096, 1).describe().find("range"), std::string::npos);
}

TEST_F(DataPartTest, BytesSplitAtTheFraction) {
  std::string text(200, 'a');
  for (int i = 0; i < 200; ++i) text[static_cast<std::size_t>(i)] = static_cast<char>(i);
  std::ofstream(dir_ / "t.txt", std::ios::binary) << text;
  const std::string path = (dir_ / "t.txt").string();
  const ByteSource train(path, 1, {.end = 0.5});
  const ByteSource held(path, 1, {.begin = 0.5});
  EXPECT_EQ(train.bytes(), 100);
  auto [lo, hi] = span(train, 8, DataSource::kTrainStream);
  EXPECT_GE(lo, 0);
  EXPECT_LT(hi, 100);
  std::tie(lo, hi) = span(held, 8, DataSource::kEvalStream);
  EXPECT_GE(lo, 100);
  EXPECT_LT(hi, 200);
  // The size in describe() stays the file's.
  EXPECT_EQ(train.describe(), fmt::format("bytes file={} size=200 range=0..0.5", path));
}

TEST_F(DataPartTest, MessagesNameTheFlag) {
  try {
    ByteSource((dir_ / "missing.txt").string(), 1, {.flag = "--val-data"});
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--val-data="), std::string::npos) << e.what();
  }
  // A part too short for one window says so.
  tokens("short.bin", 0, 100);
  const TokenFileSource part((dir_ / "short.bin").string(), DataFormat::kUint16, 4096, 1, {.begin = 0.95});
  EXPECT_THROW(part.check_seq(16), ConfigError);
}

}  // namespace
}  // namespace ndmesh::model
