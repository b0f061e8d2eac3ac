// Data sources (closed-form entropy rate), training to the entropy rate, determinism,
// and checkpoints (exact resume, corrupt and mismatched files).
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include <gtest/gtest.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/model/checkpoint.hpp"
#include "ndmesh/model/data.hpp"
#include "ndmesh/model/trainer.hpp"
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
  m.next_batch(batch, seq, tokens.data(), targets.data());
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
  src.next_batch(3, 4, tokens.data(), targets.data());
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    EXPECT_GE(tokens[i], 'a');
    EXPECT_LE(tokens[i], 'g');
    EXPECT_EQ(targets[i], tokens[i] + 1);  // consecutive letters
  }
  EXPECT_THROW(src.next_batch(1, 8, tokens.data(), targets.data()), ConfigError);  // needs 9 bytes
  fs::remove(path);
  EXPECT_THROW(ByteSource("/nonexistent/file.txt", 1), IoError);
}

TrainOptions small_run(std::int64_t steps) {
  return {.model = {.layers = 1, .hidden = 32, .heads = 2, .kv_heads = 1, .seq = 32, .vocab = 16},
          .batch = 8,
          .steps = steps,
          .lr = 1e-2,
          .warmup = 10,
          .seed = 1};
}

std::unique_ptr<DataSource> markov16() {
  return std::make_unique<MarkovSource>(MarkovOptions{.vocab = 16, .seed = 1, .sharpness = 2.5});
}

TEST(Training, ReachesWithinTenPercentOfTheEntropyRate) {
  set_blas_threads(1);
  Trainer t(small_run(150), markov16());
  const double entropy = *t.data().entropy_rate();
  const double start = t.evaluate(8);
  while (t.steps_done() < 150) t.step();
  const double end = t.evaluate(32);
  EXPECT_NEAR(start, std::log(16.0), 0.05);
  EXPECT_LT(end, 1.10 * entropy) << "entropy rate " << entropy;
  // A loss below the entropy rate on held-out data would mean a broken loss or data.
  EXPECT_GT(end, 0.97 * entropy);
}

std::vector<double> losses(Trainer& t, std::int64_t until) {
  std::vector<double> out;
  while (t.steps_done() < until) out.push_back(t.step().loss);
  return out;
}

TEST(Training, SameSeedAndThreadsGiveBitIdenticalLosses) {
  for (int threads : {1, 2}) {
    set_blas_threads(threads);
    Trainer a(small_run(20), markov16()), b(small_run(20), markov16());
    auto la = losses(a, 20), lb = losses(b, 20);
    for (std::size_t i = 0; i < la.size(); ++i)
      EXPECT_EQ(la[i], lb[i]) << "step " << i + 1 << " threads " << threads;
    EXPECT_LT(la.back(), la.front());  // it does train
  }
  set_blas_threads(1);
  TrainOptions other = small_run(20);
  other.seed = 2;
  Trainer a(small_run(20), markov16()), c(other, markov16());
  EXPECT_NE(losses(a, 1)[0], losses(c, 1)[0]);
}

struct TempFile {
  fs::path path = fs::temp_directory_path() / fmt::format("ndmesh_ckpt_{}_{}.bin", ::getpid(), counter++);
  ~TempFile() { fs::remove(path); }
  static inline int counter = 0;
};

TEST(Checkpoint, SaveLoadContinueGivesTheUninterruptedLosses) {
  set_blas_threads(1);
  Trainer whole(small_run(20), markov16());
  auto expected = losses(whole, 20);

  TempFile file;
  {
    Trainer first(small_run(20), markov16());
    losses(first, 10);
    first.save(file.path.string());
  }
  // No temporary file is left next to the checkpoint.
  for (const auto& entry : fs::directory_iterator(file.path.parent_path()))
    EXPECT_EQ(entry.path().string().find(file.path.string() + ".tmp"), std::string::npos);
  TrainOptions resumed_options = small_run(20);
  resumed_options.seed = 99;  // the checkpoint, not the seed, decides the weights
  Trainer resumed(resumed_options, markov16());
  resumed.load(file.path.string());
  EXPECT_EQ(resumed.steps_done(), 10);
  auto rest = losses(resumed, 20);
  ASSERT_EQ(rest.size(), 10u);
  for (std::size_t i = 0; i < rest.size(); ++i) EXPECT_EQ(rest[i], expected[10 + i]) << "step " << 11 + i;
}

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

  // Version 2 with a consistent header checksum: header is magic | version | crc | size | body crc.
  auto v2 = bytes;
  const std::uint32_t version = 2;
  std::memcpy(v2.data() + 8, &version, 4);
  std::vector<unsigned char> covered(v2.begin() + 8, v2.begin() + 12);
  covered.insert(covered.end(), v2.begin() + 16, v2.begin() + 28);
  const auto crc = static_cast<std::uint32_t>(crc32(crc32(0, Z_NULL, 0), covered.data(), covered.size()));
  std::memcpy(v2.data() + 12, &crc, 4);
  write_all(bad.path, v2);
  expect_io_error(bad.path, "format version 2");

  expect_io_error(fs::path("/nonexistent/ckpt.bin"), "cannot open");
  EXPECT_THROW(save_checkpoint("/nonexistent/dir/ckpt.bin", c), IoError);
}

TEST(Checkpoint, MismatchedRunIsAConfigErrorNamingTheField) {
  set_blas_threads(1);
  TempFile file;
  Trainer a(small_run(5), markov16());
  a.step();
  a.save(file.path.string());
  TrainOptions wider = small_run(5);
  wider.model.hidden = 64;
  Trainer b(wider, markov16());
  try {
    b.load(file.path.string());
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("hidden: checkpoint has 32, the run has 64"), std::string::npos)
        << e.what();
  }
  Trainer c(small_run(5), std::make_unique<MarkovSource>(MarkovOptions{.vocab = 16, .seed = 2}));
  EXPECT_THROW(c.load(file.path.string()), ConfigError);
}

TEST(Trainer, ScheduleWarmsUpThenDecaysToTheFloor) {
  TrainOptions o = small_run(110);
  o.lr = 1.0;
  o.warmup = 10;
  o.min_lr_ratio = 0.1;
  Trainer t(o, markov16());
  EXPECT_DOUBLE_EQ(t.lr_at(0), 0.1);
  EXPECT_DOUBLE_EQ(t.lr_at(9), 1.0);
  EXPECT_DOUBLE_EQ(t.lr_at(10), 1.0);
  EXPECT_NEAR(t.lr_at(60), 0.55, 1e-12);  // half way: floor + (1 - floor) / 2
  EXPECT_NEAR(t.lr_at(110), 0.1, 1e-12);
}

TEST(Trainer, VocabMismatchWithDataIsAConfigError) {
  TrainOptions o = small_run(5);
  o.model.vocab = 20;
  EXPECT_THROW(Trainer(o, markov16()), ConfigError);
}

}  // namespace
}  // namespace ndmesh::model
