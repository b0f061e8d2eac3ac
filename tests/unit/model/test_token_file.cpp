// Token files as GPU users keep them (TokenFileSource): llm.c shards (GPT-2's uint16 and Llama 3's
// uint32 format) and raw uint16, one file
// or a glob of shards. Each window read back is the written tokens at its offset; bad files
// are ConfigErrors naming the file and the fix.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/model/data.hpp"

namespace ndmesh::model {
namespace {

namespace fs = std::filesystem;

class TokenFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ndmesh_tokens_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Tokens t_i = (i * 7 + shard * 3) % vocab, written as an llm.c shard or raw uint16.
  std::vector<std::uint16_t> write(const std::string& name, std::int64_t n, int shard, bool llmc,
                                   std::int32_t magic = TokenFileSource::kLlmcMagic, std::int32_t version = 1,
                                   std::int64_t claimed = -1) {
    std::vector<std::uint16_t> t(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) t[static_cast<std::size_t>(i)] = static_cast<std::uint16_t>((i * 7 + shard * 3) % 50);
    std::ofstream out(dir_ / name, std::ios::binary);
    if (llmc) {
      std::vector<std::int32_t> header(256, 0);
      header[0] = magic;
      header[1] = version;
      header[2] = static_cast<std::int32_t>(claimed >= 0 ? claimed : n);
      out.write(reinterpret_cast<const char*>(header.data()), 1024);
    }
    out.write(reinterpret_cast<const char*>(t.data()), static_cast<std::streamsize>(t.size() * 2));
    return t;
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  // Every window of `src` (seq 16, 40 sequences) is a run of consecutive tokens of one of `shards`.
  static void expect_windows_of(const TokenFileSource& src, const std::vector<std::vector<std::uint16_t>>& shards) {
    const std::int64_t seq = 16;
    std::vector<std::int32_t> tok(seq), tgt(seq);
    for (std::int64_t i = 0; i < 40; ++i) {
      src.sequence(DataSource::kTrainStream, 3, i, seq, tok.data(), tgt.data());
      bool found = false;
      for (const auto& s : shards)
        for (std::size_t at = 0; at + seq < s.size() && !found; ++at) {
          bool same = true;
          for (std::int64_t t = 0; t < seq && same; ++t)
            same = tok[static_cast<std::size_t>(t)] == s[at + static_cast<std::size_t>(t)] &&
                   tgt[static_cast<std::size_t>(t)] == s[at + static_cast<std::size_t>(t) + 1];
          found = same;
        }
      EXPECT_TRUE(found) << "window " << i << " is not a run of one shard";
    }
  }
  fs::path dir_;
};

TEST_F(TokenFile, LlmcShardReadsItsTokensAfterTheHeader) {
  const auto t = write("a.bin", 1000, 0, true);
  TokenFileSource src(path("a.bin"), DataFormat::kAuto, 50, 1);
  EXPECT_EQ(src.tokens(), 1000);
  EXPECT_EQ(src.vocab(), 50);
  EXPECT_NE(src.describe().find("format=llmc"), std::string::npos) << src.describe();
  expect_windows_of(src, {t});
}

TEST_F(TokenFile, RawUint16IsNanoGptsTrainBin) {
  const auto t = write("train.bin", 999, 0, false);
  TokenFileSource src(path("train.bin"), DataFormat::kAuto, 50, 1);
  EXPECT_EQ(src.tokens(), 999);
  EXPECT_NE(src.describe().find("format=uint16"), std::string::npos);
  expect_windows_of(src, {t});
}

TEST_F(TokenFile, AGlobReadsEveryShardInNameOrderAndTheSameSeedGivesTheSameBatch) {
  const auto a = write("s_000.bin", 300, 0, true), b = write("s_001.bin", 500, 1, true);
  TokenFileSource src(path("s_*.bin"), DataFormat::kLlmc, 50, 9);
  EXPECT_EQ(src.shards(), 2u);
  EXPECT_EQ(src.tokens(), 800);
  expect_windows_of(src, {a, b});
  TokenFileSource again(path("s_*.bin"), DataFormat::kLlmc, 50, 9);
  std::vector<std::int32_t> x(16), y(16), x2(16), y2(16);
  src.sequence(0, 5, 2, 16, x.data(), y.data());
  again.sequence(0, 5, 2, 16, x2.data(), y2.data());
  EXPECT_EQ(x, x2);
  EXPECT_EQ(y, y2);
  // through the factory: a .bin file is tokens, anything else bytes
  EXPECT_NE(open_data_file(path("s_*.bin"), DataFormat::kAuto, 50, 9)->describe().find("tokens"), std::string::npos);
}

void expect_config_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected: " << needle;
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST_F(TokenFile, BadFilesNameTheFileAndTheFix) {
  write("magic.bin", 100, 0, true, 123);
  write("v2.bin", 100, 0, true, TokenFileSource::kLlmcMagic, 2);
  write("short.bin", 100, 0, true, TokenFileSource::kLlmcMagic, 1, 200);
  write("ok.bin", 100, 0, true);
  { std::ofstream(dir_ / "odd.bin", std::ios::binary) << "abc"; }
  expect_config_error([&] { TokenFileSource(path("magic.bin"), DataFormat::kLlmc, 50, 1); }, "not an llm.c token shard");
  expect_config_error([&] { TokenFileSource(path("v2.bin"), DataFormat::kAuto, 50, 1); }, "llm.c shard version 2");
  expect_config_error([&] { TokenFileSource(path("short.bin"), DataFormat::kAuto, 50, 1); },
                      "the header says 200 tokens");
  expect_config_error([&] { TokenFileSource(path("odd.bin"), DataFormat::kUint16, 50, 1); },
                      "not a whole number of uint16 tokens");
  expect_config_error([&] { TokenFileSource(path("none_*.bin"), DataFormat::kAuto, 50, 1); }, "no file matches");
  expect_config_error([&] { TokenFileSource(path("ok.bin"), DataFormat::kAuto, 0, 1); }, "give the vocabulary with --vocab");
  expect_config_error([&] { open_data_file(path("ok.bin"), DataFormat::kAuto, 0, 1); }, "--vocab");
  TokenFileSource small(path("ok.bin"), DataFormat::kAuto, 20, 1);  // tokens go up to 49
  std::vector<std::int32_t> x(16), y(16);
  expect_config_error(
      [&] {
        for (int i = 0; i < 20; ++i) small.sequence(0, 0, i, 16, x.data(), y.data());
      },
      "is not below --vocab=20");
  expect_config_error([&] { small.check_seq(200); }, "needs --seq + 1 = 201");
  expect_config_error([&] { parse_data_format("parquet"); }, "--data-format=parquet is not a data format");
}

// llm.c's Llama 3 shard: magic 20240801, version 7, uint32 tokens. `count` tokens
// t_i = 65530 + i * 977 (mod vocab): most above uint16's range.
std::vector<std::uint32_t> write_llama3(const fs::path& file, std::int64_t count, std::int64_t vocab,
                                        std::int32_t magic = kLlmcMagic32,
                                        std::int32_t version = kLlmcVersion32, std::int64_t claimed = -1) {
  std::vector<std::uint32_t> t(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i)
    t[static_cast<std::size_t>(i)] = static_cast<std::uint32_t>((65530 + i * 977) % vocab);
  std::vector<std::int32_t> header(256, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = static_cast<std::int32_t>(claimed >= 0 ? claimed : count);
  std::ofstream out(file, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), 1024);
  out.write(reinterpret_cast<const char*>(t.data()), static_cast<std::streamsize>(t.size() * 4));
  return t;
}

TEST_F(TokenFile, Llama3ShardReadsUint32TokensExactly) {
  const std::int64_t vocab = 128256;
  const auto t = write_llama3(dir_ / "l3.bin", 700, vocab);
  ASSERT_GT(*std::max_element(t.begin(), t.end()), 65535u);
  TokenFileSource src(path("l3.bin"), DataFormat::kAuto, vocab, 1);
  EXPECT_EQ(src.tokens(), 700);
  EXPECT_NE(src.describe().find("format=llmc-uint32"), std::string::npos) << src.describe();
  // every window is a run of the written tokens, above 65535 included
  std::vector<std::int32_t> tok(16), tgt(16);
  for (std::int64_t i = 0; i < 20; ++i) {
    src.sequence(DataSource::kTrainStream, 1, i, 16, tok.data(), tgt.data());
    std::size_t at = 0;
    while (at + 16 < t.size() && static_cast<std::uint32_t>(tok[0]) != t[at]) ++at;
    ASSERT_LT(at + 16, t.size()) << "window " << i;
    for (std::size_t k = 0; k < 16; ++k) {
      EXPECT_EQ(static_cast<std::uint32_t>(tok[k]), t[at + k]);
      EXPECT_EQ(static_cast<std::uint32_t>(tgt[k]), t[at + k + 1]);
    }
  }
  // a held-out part counts uint32 tokens, not bytes: the last 10% are the last 70 tokens
  TokenFileSource val(path("l3.bin"), DataFormat::kLlmc, vocab, 1,
                      {.begin = 0.9, .end = 1, .flag = "--val-data"});
  EXPECT_EQ(val.tokens(), 70);
  tok.resize(69);
  tgt.resize(69);
  val.sequence(DataSource::kEvalStream, 0, 0, 69, tok.data(), tgt.data());  // the only window
  EXPECT_EQ(static_cast<std::uint32_t>(tok[0]), t[630]);
  EXPECT_EQ(static_cast<std::uint32_t>(tgt[0]), t[631]);
}

TEST_F(TokenFile, ConsecutiveSourceReadsBothLlmcFormatsInOrder) {
  const std::int64_t vocab = 128256;
  const auto t = write_llama3(dir_ / "l3.bin", 100, vocab);
  const auto g = write("g2.bin", 100, 0, true);
  ConsecutiveSource l3(path("l3.bin"), DataFormat::kAuto, vocab, 2, 8, 3);  // 49 tokens
  ConsecutiveSource g2(path("g2.bin"), DataFormat::kAuto, 50, 2, 8, 3);
  EXPECT_EQ(l3.tokens(), 49);
  std::vector<std::int32_t> tok(8), tgt(8), gtok(8), gtgt(8);
  for (std::int64_t b = 0; b < 3; ++b)
    for (std::int64_t i = 0; i < 2; ++i) {
      l3.sequence(0, b, i, 8, tok.data(), tgt.data());
      g2.sequence(0, b, i, 8, gtok.data(), gtgt.data());
      for (std::int64_t k = 0; k < 8; ++k) {
        const auto at = static_cast<std::size_t>((b * 2 + i) * 8 + k);
        EXPECT_EQ(static_cast<std::uint32_t>(tok[static_cast<std::size_t>(k)]), t[at]);
        EXPECT_EQ(static_cast<std::uint32_t>(tgt[static_cast<std::size_t>(k)]), t[at + 1]);
        EXPECT_EQ(gtok[static_cast<std::size_t>(k)], g[at]);
        EXPECT_EQ(gtgt[static_cast<std::size_t>(k)], g[at + 1]);
      }
    }
  expect_config_error([&] { ConsecutiveSource(path("l3.bin"), DataFormat::kAuto, vocab, 2, 8, 7); },
                      "holds 100 llm.c uint32 tokens but 7 batches of 2 x 8 need 113");
  expect_config_error([&] { ConsecutiveSource(path("l3.bin"), DataFormat::kAuto, 65536, 2, 8, 1); },
                      "outside the model's vocabulary of 65536");
}

TEST_F(TokenFile, BadLlama3ShardsNameTheFile) {
  const std::int64_t vocab = 128256;
  write_llama3(dir_ / "v1.bin", 100, vocab, kLlmcMagic32, 1);
  write_llama3(dir_ / "g7.bin", 100, vocab, kLlmcMagic, 7);
  write_llama3(dir_ / "trunc.bin", 100, vocab, kLlmcMagic32, kLlmcVersion32, 150);
  write_llama3(dir_ / "ok.bin", 100, vocab);
  expect_config_error([&] { TokenFileSource(path("v1.bin"), DataFormat::kAuto, vocab, 1); },
                      "v1.bin: llm.c shard version 1 with magic 20240801; ndmesh reads version 7 (uint32");
  expect_config_error([&] { TokenFileSource(path("g7.bin"), DataFormat::kLlmc, vocab, 1); },
                      "g7.bin: llm.c shard version 7 with magic 20240520; ndmesh reads version 1 (uint16");
  expect_config_error(
      [&] { TokenFileSource(path("trunc.bin"), DataFormat::kAuto, vocab, 1); },
      "trunc.bin: the header says 150 tokens (1624 bytes with the header) but the file has 1424");
  expect_config_error([&] { ConsecutiveSource(path("trunc.bin"), DataFormat::kAuto, vocab, 1, 8, 1); },
                      "trunc.bin: the header says 150 tokens");
  expect_config_error([&] { ConsecutiveSource(path("v1.bin"), DataFormat::kLlmc, vocab, 1, 8, 1); },
                      "v1.bin: llm.c shard version 1");
  // uint16 shards cap --vocab at 65536; uint32 ones do not
  write("g.bin", 100, 0, true);
  expect_config_error([&] { TokenFileSource(path("g.bin"), DataFormat::kAuto, vocab, 1); },
                      "are uint16 (at most 65536 ids)");
  TokenFileSource ok(path("ok.bin"), DataFormat::kAuto, vocab, 1);
  std::vector<std::int32_t> x(16), y(16);
  TokenFileSource small(path("ok.bin"), DataFormat::kAuto, 65536, 1);
  expect_config_error(
      [&] {
        for (int i = 0; i < 20; ++i) small.sequence(0, 0, i, 16, x.data(), y.data());
      },
      "is not below --vocab=65536");
}

}  // namespace
}  // namespace ndmesh::model
