// Data sources (closed-form entropy rate, indexable batches) and checkpoint files (corrupt,
// crafted and old-version files). Training itself is tested in tests/unit/parallel.
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include <gtest/gtest.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/model/checkpoint.hpp"
#include "ndmesh/model/data.hpp"
#include "ndmesh/tensor/blas.hpp"

namespace ndmesh::model {
namespace {

namespace fs = std::filesystem;

double h2(double p) { return -p * std::log(p) - (1 - p) * std::log(1 - p); }

TEST(Markov, TwoStateChainHasClosedFormEntropyRate) {
  // P = [[1-a, a], [b, 1-b]]: pi = (b, a) / (a + b), H = pi0 h(a) + pi1 h(b).
  const double a = 0.2, b = 0.6;
  std::vector<double> p = {1 - a, a, b, 1 - b};
  auto pi = MarkovSource::stationary_of(p, 2);
  EXPECT_NEAR(pi[0], b / (a + b), 1e-14);
  EXPECT_NEAR(pi[1], a / (a + b), 1e-14);
  EXPECT_NEAR(MarkovSource::entropy_rate_of(p, pi, 2), (b * h2(a) + a * h2(b)) / (a + b), 1e-14);
}

TEST(Markov, UniformChainHasEntropyLogVocab) {
  MarkovSource m({.vocab = 8, .seed = 3, .sharpness = 0});
  EXPECT_NEAR(*m.entropy_rate(), std::log(8.0), 1e-12);
}

TEST(Markov, SamplesFollowTheChain) {
  MarkovSource m({.vocab = 6, .seed = 2, .sharpness = 1.5});
  for (std::int64_t i = 0; i < 6; ++i) {
    double row = 0;
    for (std::int64_t j = 0; j < 6; ++j) row += m.transition(i, j);
    EXPECT_NEAR(row, 1.0, 1e-12);
  }
  // The mean of -ln P(next | cur) over many samples estimates the entropy rate; its
  // standard error is well under 0.01 with 200k transitions.
  const std::int64_t batch = 100, seq = 2000;
  std::vector<std::int32_t> tokens(batch * seq), targets(batch * seq);
  m.batch(DataSource::kTrainStream, 0, 0, batch, seq, tokens.data(), targets.data());
  double nll = 0;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    nll -= std::log(m.transition(tokens[i], targets[i]));
    if (i % seq != 0) {
      EXPECT_EQ(tokens[i], targets[i - 1]);
    }
  }
  EXPECT_NEAR(nll / static_cast<double>(tokens.size()), *m.entropy_rate(), 0.02);
}

TEST(Markov, BadOptionsAreConfigErrors) {
  EXPECT_THROW(MarkovSource({.vocab = 1}), ConfigError);
  EXPECT_THROW(MarkovSource({.vocab = 4, .sharpness = -1}), ConfigError);
}

TEST(Bytes, WindowsAndErrors) {
  const fs::path path = fs::temp_directory_path() / fmt::format("ndmesh_bytes_{}.txt", ::getpid());
  std::ofstream(path) << "abcdefgh";
  ByteSource src(path.string(), 1);
  std::vector<std::int32_t> tokens(3 * 4), targets(3 * 4);
  src.batch(DataSource::kTrainStream, 5, 0, 3, 4, tokens.data(), targets.data());
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    EXPECT_GE(tokens[i], 'a');
    EXPECT_LE(tokens[i], 'g');
    EXPECT_EQ(targets[i], tokens[i] + 1);  // consecutive letters
  }
  EXPECT_THROW(src.check_seq(8), ConfigError);  // needs 9 bytes
  EXPECT_NO_THROW(src.check_seq(7));
  fs::remove(path);
  EXPECT_THROW(ByteSource("/nonexistent/file.txt", 1), ConfigError);
  EXPECT_THROW(ByteSource(fs::temp_directory_path().string(), 1), ConfigError);  // a directory
  EXPECT_THROW(ByteSource("/dev/zero", 1), ConfigError);                         // a device, endless
  EXPECT_THROW(ByteSource("", 1), ConfigError);
}

TEST(Data, ASequenceIsAFunctionOfStepAndIndexOnly) {
  // Any rank can read its slice of a step: sequence i of step s is the same whether read
  // alone, inside a larger batch, or after other steps; other steps and streams differ.
  MarkovSource m({.vocab = 16, .seed = 4});
  const std::int64_t seq = 32;
  std::vector<std::int32_t> all(8 * seq), all_t(8 * seq), one(seq), one_t(seq);
  m.batch(DataSource::kTrainStream, 7, 0, 8, seq, all.data(), all_t.data());
  for (std::int64_t i = 0; i < 8; ++i) {
    m.sequence(DataSource::kTrainStream, 7, i, seq, one.data(), one_t.data());
    EXPECT_TRUE(std::equal(one.begin(), one.end(), all.begin() + i * seq)) << "sequence " << i;
    EXPECT_TRUE(std::equal(one_t.begin(), one_t.end(), all_t.begin() + i * seq)) << "sequence " << i;
  }
  std::vector<std::int32_t> other(seq), other_t(seq);
  m.sequence(DataSource::kTrainStream, 8, 0, seq, other.data(), other_t.data());
  EXPECT_NE(other, std::vector<std::int32_t>(all.begin(), all.begin() + seq));
  m.sequence(DataSource::kEvalStream, 7, 0, seq, other.data(), other_t.data());
  EXPECT_NE(other, std::vector<std::int32_t>(all.begin(), all.begin() + seq));
  // Another source with the same seed reads the same sequence.
  MarkovSource again({.vocab = 16, .seed = 4});
  again.sequence(DataSource::kTrainStream, 7, 3, seq, other.data(), other_t.data());
  EXPECT_TRUE(std::equal(other.begin(), other.end(), all.begin() + 3 * seq));
}

struct TempFile {
  fs::path path = fs::temp_directory_path() / fmt::format("ndmesh_ckpt_{}_{}.bin", ::getpid(), counter++);
  ~TempFile() { fs::remove(path); }
  static inline int counter = 0;
};

std::vector<unsigned char> read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void write_all(const fs::path& p, const std::vector<unsigned char>& bytes) {
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

void expect_io_error(const fs::path& p, const std::string& needle) {
  try {
    load_checkpoint(p.string());
    ADD_FAILURE() << "expected IoError containing '" << needle << "'";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(p.string()), std::string::npos) << e.what();
  }
}

TEST(Checkpoint, CorruptFilesAreClearErrors) {
  TempFile good, bad;
  Checkpoint c;
  c.spec = {.layers = 1, .hidden = 2, .heads = 1, .seq = 2, .vocab = 3};
  c.data = "test";
  c.params = {1, 2, 3};
  c.adam_m = {4, 5, 6};
  c.adam_v = {7, 8, 9};
  save_checkpoint(good.path.string(), c);
  const auto bytes = read_all(good.path);
  Checkpoint back = load_checkpoint(good.path.string());
  EXPECT_EQ(back.params, c.params);
  EXPECT_EQ(back.adam_v, c.adam_v);
  EXPECT_EQ(back.data, "test");

  auto flipped = bytes;
  flipped.at(flipped.size() - 2) ^= 0x40;  // a bit in the last v value
  write_all(bad.path, flipped);
  expect_io_error(bad.path, "checksum mismatch");

  write_all(bad.path, std::vector<unsigned char>(bytes.begin(), bytes.end() - 5));
  expect_io_error(bad.path, "truncated");

  auto magic = bytes;
  magic[0] = 'X';
  write_all(bad.path, magic);
  expect_io_error(bad.path, "not an ndmesh checkpoint");

  // Other versions with a consistent header checksum: header is magic | version | crc | size | body crc.
  for (std::uint32_t version : {1u, 3u}) {
  auto v2 = bytes;
  std::memcpy(v2.data() + 8, &version, 4);
  std::vector<unsigned char> covered(v2.begin() + 8, v2.begin() + 12);
  covered.insert(covered.end(), v2.begin() + 16, v2.begin() + 28);
  const auto crc = static_cast<std::uint32_t>(crc32(crc32(0, Z_NULL, 0), covered.data(), covered.size()));
  std::memcpy(v2.data() + 12, &crc, 4);
  write_all(bad.path, v2);
  expect_io_error(bad.path, fmt::format("format version {}", version));
  if (version == 1) expect_io_error(bad.path, "predates indexable batches");
  }

  expect_io_error(fs::path("/nonexistent/ckpt.bin"), "does not exist");
  expect_io_error(fs::temp_directory_path(), "not a regular file");
  EXPECT_THROW(save_checkpoint("/nonexistent/dir/ckpt.bin", c), IoError);
}

TEST(Checkpoint, CraftedFieldsWithValidChecksumsAreRefused) {
  TempFile file;
  Checkpoint c;
  c.spec = {.layers = 1, .hidden = 2, .heads = 1, .seq = 2, .vocab = 3};
  c.data = "test";
  c.params = c.adam_m = c.adam_v = {1, 2, 3};
  c.step = -5;
  save_checkpoint(file.path.string(), c);
  expect_io_error(file.path, "step -5");
  c.step = 3;
  c.adam_steps = 3;
  c.spec.hidden = 0;
  save_checkpoint(file.path.string(), c);
  expect_io_error(file.path, "outside [1, 2^40]");
}

}  // namespace
}  // namespace ndmesh::model
