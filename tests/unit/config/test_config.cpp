// One test per validation rule with bad input: the message names the field, the value
// and a valid choice that the test checks by hand.
#include <chrono>
#include <cstdio>
#include <fstream>

#include <gtest/gtest.h>

#include "ndmesh/config/config.hpp"
#include "ndmesh/core/error.hpp"

namespace ndmesh {
namespace {

ParallelConfig make(std::int64_t dp, std::int64_t pp, std::int64_t cp, std::int64_t tp) {
  ParallelConfig c;
  c.dims = {{"dp", dp}, {"pp", pp}, {"cp", cp}, {"tp", tp}};
  return c;
}

ModelSpec gpt(std::int64_t layers = 24, std::int64_t hidden = 1024, std::int64_t heads = 16,
              std::int64_t seq = 2048) {
  return {.name = "", .layers = layers, .hidden = hidden, .heads = heads, .seq = seq, .vocab = 50304};
}

// The model-shape rules live in model_problems alone: a vocabulary needs two tokens.
TEST(ModelProblems, VocabOfOneIsRejected) {
  ModelSpec m = gpt();
  m.vocab = 1;
  auto list = model_problems(m);
  ASSERT_EQ(list.size(), 1u);
  EXPECT_NE(list[0].find("vocab=1"), std::string::npos) << list[0];
  m.vocab = 2;
  EXPECT_TRUE(model_problems(m).empty());
}

// Suggesting a divisor does not count down one by one: tp = 2^40 answers at once.
TEST(ModelProblems, HugeSizesSuggestDivisorsAtOnce) {
  ParallelConfig c = make(1, 1, 1, std::int64_t{1} << 40);
  ModelSpec m = gpt(24, std::int64_t{1} << 40, 16, 2048);
  auto started = std::chrono::steady_clock::now();
  auto with_model = problems(c, &m);
  EXPECT_FALSE(with_model.empty());
  m = gpt(24, 1024, (std::int64_t{1} << 40) + 1, 2048);
  auto shape = model_problems(m);
  ASSERT_FALSE(shape.empty());
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(2));
}

// The single problem reported, which must contain every fragment.
void expect_problem(const ParallelConfig& c, const ModelSpec* m, std::vector<std::string> fragments) {
  auto list = problems(c, m);
  ASSERT_EQ(list.size(), 1u) << (list.empty() ? "no problem" : list[0] + " | " + list.back());
  for (const auto& f : fragments)
    EXPECT_NE(list[0].find(f), std::string::npos) << "'" << f << "' not in: " << list[0];
}

TEST(Validation, ValidConfigHasNoProblems) {
  ParallelConfig c = make(2, 2, 1, 2);
  c.world = 8;
  c.global_batch = 16;
  ModelSpec m = gpt();
  EXPECT_TRUE(problems(c, &m).empty());
  EXPECT_NO_THROW(validate(c, &m));
}

TEST(Validation, ProductVersusWorld) {
  ParallelConfig c = make(3, 2, 1, 2);
  c.world = 8;
  expect_problem(c, nullptr, {"dp*pp*cp*tp = 3*2*1*2 = 12", "world has 8 ranks", "dp=2"});
}

TEST(Validation, InferredSize) {
  ParallelConfig c = make(-1, 2, 1, 2);
  ParallelConfig r = resolve(c, 16);
  EXPECT_EQ(r.size("dp"), 4);
  EXPECT_EQ(r.world, 16);
  EXPECT_THROW(resolve(c, 10), ConfigError);  // 10 not divisible by 4
  try {
    resolve(make(-1, -1, 1, 2), 16);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("dp and pp are both -1"), std::string::npos) << e.what();
  }
  expect_problem(c, nullptr, {"dp=-1 is not resolved"});
}

TEST(Validation, DuplicateAndUnknownDims) {
  ParallelConfig c;
  c.dims = {{"dp", 2}, {"dp", 2}};
  expect_problem(c, nullptr, {"'dp' appears twice"});
  EXPECT_THROW(layout_dims({.sizes = {{"tp", 2}}, .order = "dp,pp,xx,tp"}), ConfigError);
  EXPECT_THROW(layout_dims({.sizes = {{"tp", 2}}, .order = "dp,tp,tp"}), ConfigError);
  EXPECT_THROW(layout_dims({.sizes = {{"zz", 2}}}), ConfigError);
}

TEST(Validation, LayersDivisibleByPp) {
  ParallelConfig c = make(1, 4, 1, 1);
  c.global_batch = 4;
  ModelSpec m = gpt(30);
  expect_problem(c, &m, {"layers=30", "pp=4", "pp=3 or pp=5", "layers=28 or layers=32"});
}

TEST(Validation, LayersDivisibleByPpTimesVpp) {
  ParallelConfig c = make(1, 4, 1, 1);
  c.schedule = Schedule::kInterleaved;
  c.vpp = 2;
  c.global_batch = 8;
  ModelSpec m = gpt(20);
  expect_problem(c, &m, {"layers=20", "pp*vpp = 4*2 = 8", "layers=16 or layers=24"});
}

TEST(Validation, HeadsDivisibleByTp) {
  ParallelConfig c = make(1, 1, 1, 8);
  ModelSpec m = gpt(24, 1536, 12);
  expect_problem(c, &m, {"heads=12", "tp=8", "tp=6 or tp=12"});
}

TEST(Validation, KvHeadsMultipleOrDivisorOfTp) {
  ParallelConfig c = make(1, 1, 1, 4);
  ModelSpec m = gpt(24, 1536, 24);
  m.kv_heads = 6;  // neither a multiple (6 % 4) nor a divisor (4 % 6) of 4
  expect_problem(c, &m, {"kv_heads=6", "tp=4", "tp=3 or tp=6"});
  m.kv_heads = 2;  // divisor of tp=4: kv heads are replicated
  EXPECT_TRUE(problems(c, &m).empty());
  m.kv_heads = 8;  // multiple of tp=4
  EXPECT_TRUE(problems(c, &m).empty());
}

TEST(Validation, HiddenDivisibleByTp) {
  // hidden = heads * head_dim, so tp | heads implies tp | hidden: a hidden size that tp
  // does not divide always comes with a heads problem too. Both are reported.
  ParallelConfig c = make(1, 1, 1, 4);
  ModelSpec m = gpt(24, 1030, 2);
  m.ffn = 4120;
  auto list = problems(c, &m);
  ASSERT_EQ(list.size(), 2u);
  EXPECT_NE(list[0].find("heads=2 is not divisible by tp=4"), std::string::npos) << list[0];
  EXPECT_NE(list[1].find("hidden=1030 is not divisible by tp=4; use tp=2 or tp=5"), std::string::npos)
      << list[1];
}

TEST(Validation, FfnDivisibleByTp) {
  ParallelConfig c = make(1, 1, 1, 4);
  ModelSpec m = gpt(24, 1024, 16);
  m.ffn = 2730;
  expect_problem(c, &m, {"ffn=2730", "tp=4", "tp=3 or tp=5"});
}

TEST(Validation, SequenceDivisibleForContextParallel) {
  ParallelConfig c = make(1, 1, 4, 1);
  ModelSpec m = gpt(24, 1024, 16, 2044);
  expect_problem(c, &m, {"seq=2044", "2*cp = 8", "seq=2040 or seq=2048"});
  c = make(1, 1, 2, 3);
  c.sequence_parallel = true;
  m = gpt(24, 1536, 12, 2040);  // lcm(4, 6) = 12; 2040 % 12 = 0
  EXPECT_TRUE(problems(c, &m).empty());
  m.seq = 2044;
  expect_problem(c, &m, {"seq=2044", "lcm(2*cp, cp*tp) = lcm(4, 6)", "seq=2040 or seq=2052"});
}

TEST(Validation, GlobalBatchDivisibleByMicroBatchTimesDp) {
  ParallelConfig c = make(4, 1, 1, 1);
  c.micro_batch = 2;
  c.global_batch = 20;
  expect_problem(c, nullptr,
                 {"global_batch=20", "micro_batch*dp = 2*4 = 8", "global_batch=16 or global_batch=24"});
}

TEST(Validation, MicroBatchesAtLeastPpFor1F1B) {
  ParallelConfig c = make(2, 4, 1, 1);
  c.global_batch = 6;  // 3 micro-batches of 1 per dp rank
  expect_problem(c, nullptr, {"3 micro-batches", "pp=4", "global_batch=8"});
  c.schedule = Schedule::kGpipe;  // GPipe runs with any count
  EXPECT_TRUE(problems(c, nullptr).empty());
}

TEST(Validation, ExpertsDivisibleByEp) {
  ParallelConfig c;
  c.dims = {{"dp", 1}, {"ep", 4}, {"tp", 1}};
  ModelSpec m = gpt();
  m.experts = 6;
  expect_problem(c, &m, {"experts=6", "ep=4", "ep=3 or ep=6"});
  m.experts = 0;
  expect_problem(c, &m, {"ep=4", "dense"});
}

TEST(Validation, MicroBatchPositive) {
  ParallelConfig c = make(1, 1, 1, 1);
  c.micro_batch = 0;
  expect_problem(c, nullptr, {"micro_batch=0", "at least 1"});
}

TEST(Validation, AllProblemsReportedTogether) {
  ParallelConfig c = make(3, 4, 1, 8);
  c.world = 64;
  ModelSpec m = gpt(30, 1024, 12);
  auto list = problems(c, &m);
  // world mismatch, layers % pp, heads % tp (hidden 1024 % heads 12 is a model problem).
  ASSERT_GE(list.size(), 2u);
  try {
    validate(c, &m);
    FAIL();
  } catch (const ConfigError& e) {
    std::string what = e.what();
    EXPECT_EQ(what.rfind("[config] ", 0), 0u) << what;
    EXPECT_NE(what.find("problems:"), std::string::npos) << what;
  }
}

TEST(Layout, DefaultOrderAndSpellings) {
  auto dims = layout_dims({.sizes = {{"tp", 2}, {"dp", 2}}});
  EXPECT_EQ(Mesh(dims).to_string(), "dp=2,pp=1,cp=1,tp=2");
  dims = layout_dims({.sizes = {{"tp", 2}, {"ep", 2}}});
  EXPECT_EQ(Mesh(dims).to_string(), "dp=1,pp=1,ep=2,cp=1,tp=2");
  auto a = layout_dims({.sizes = {{"tp", 2}, {"cp", 2}, {"dp", 2}, {"pp", 2}}, .order = "pp,dp,cp,tp"});
  auto b =
      layout_dims({.sizes = {{"tp", 2}, {"cp", 2}, {"dp", 2}, {"pp", 2}}, .megatron_order = "tp-cp-dp-pp"});
  EXPECT_EQ(Mesh(a), Mesh(b));
  EXPECT_EQ(Mesh(layout_dims({.dims = "pipe=2,tensor=2,data=4"})).to_string(), "pipe=2,tensor=2,data=4");
  EXPECT_THROW(layout_dims({.sizes = {{"tp", 2}}, .dims = "a=2"}), ConfigError);
  EXPECT_THROW(layout_dims({.order = "dp,tp", .megatron_order = "tp-dp"}), ConfigError);
  // ep=2 with an order that does not name it
  try {
    layout_dims({.sizes = {{"ep", 2}}, .order = "dp,pp,cp,tp"});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("ep=2"), std::string::npos) << e.what();
  }
}

TEST(Schedules, NamesRoundTrip) {
  for (Schedule s : {Schedule::kGpipe, Schedule::k1F1B, Schedule::kInterleaved, Schedule::kZbH1})
    EXPECT_EQ(parse_schedule(schedule_name(s)), s);
  EXPECT_THROW(parse_schedule("pipedream"), ConfigError);
}

class ConfigFileTest : public ::testing::Test {
 protected:
  std::string write(const std::string& text) {
    std::string path = ::testing::TempDir() + "ndmesh_config_test.toml";
    std::ofstream(path) << text;
    return path;
  }
};

TEST_F(ConfigFileTest, ReadsEverySection) {
  auto f = load_config_file(write(R"(
[parallel]
tp = 2
pp = 2
dp = -1
order = "dp,pp,cp,tp"
ranks_per_node = 8
schedule = "interleaved"
vpp = 2
sequence_parallel = true
[model]
layers = 24
hidden = 1024
heads = 16
seq = 2048
vocab = 50304
[training]
micro_batch = 2
global_batch = 64
)"));
  EXPECT_EQ(f.layout.sizes.at("tp"), 2);
  EXPECT_EQ(f.layout.sizes.at("dp"), -1);
  EXPECT_EQ(f.layout.order, "dp,pp,cp,tp");
  EXPECT_EQ(f.parallel.ranks_per_node, 8);
  EXPECT_EQ(f.parallel.schedule, Schedule::kInterleaved);
  EXPECT_EQ(f.parallel.vpp, 2);
  EXPECT_TRUE(f.parallel.sequence_parallel);
  ASSERT_TRUE(f.model.has_value());
  EXPECT_EQ(f.model->layers, 24);
  EXPECT_EQ(f.parallel.micro_batch, 2);
  EXPECT_EQ(f.parallel.global_batch, 64);
  EXPECT_FALSE(f.layout.sizes.count("cp"));  // not in the file: left to flags and defaults
}

TEST_F(ConfigFileTest, UnknownKeyNamesKeyAndFile) {
  std::string path = write("[parallel]\ntp = 2\ntpp = 4\n");
  try {
    load_config_file(path);
    FAIL();
  } catch (const ConfigError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("parallel.tpp"), std::string::npos) << what;
    EXPECT_NE(what.find(path), std::string::npos) << what;
  }
}

TEST_F(ConfigFileTest, WrongTypeAndSyntaxAndMissingFile) {
  EXPECT_THROW(load_config_file(write("[parallel]\ntp = \"two\"\n")), ConfigError);
  EXPECT_THROW(load_config_file(write("[parallel\ntp = 2\n")), ConfigError);
  EXPECT_THROW(load_config_file(write("[model]\nlayers = 2.5\n")), ConfigError);
  EXPECT_THROW(load_config_file(write("[parallel]\nschedule = \"fast\"\n")), ConfigError);
  EXPECT_THROW(load_config_file("/nonexistent/ndmesh.toml"), ConfigError);
}

}  // namespace
}  // namespace ndmesh
