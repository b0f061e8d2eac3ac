// One test per validation rule with bad input: the message names the field, the value
// and a valid choice that the test checks by hand.
#include <chrono>
#include <cstdio>
#include <fstream>

#include <gtest/gtest.h>
#include <unistd.h>

#include "ndmesh/config/config.hpp"
#include "ndmesh/config/training.hpp"
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

// Layers need not divide the pipeline (ndmesh train splits blocks with balanced_partition);
// every chunk needs a block. uneven_stages = false still asks for an even split.
TEST(Validation, LayersOverPipelineChunks) {
  ParallelConfig c = make(1, 4, 1, 1);
  c.global_batch = 4;
  ModelSpec m = gpt(30);
  EXPECT_TRUE(problems(c, &m).empty());  // 8,8,7,7
  c.uneven_stages = false;
  expect_problem(c, &m, {"layers=30", "pp=4", "pp=3 or pp=5", "layers=28 or layers=32"});
  c.uneven_stages = true;
  m.layers = 3;
  expect_problem(c, &m, {"--layers=3 over --pp=4 x --vpp=1", "4 pipeline chunks"});
}

TEST(Validation, LayersOverPpTimesVpp) {
  ParallelConfig c = make(1, 4, 1, 1);
  c.schedule = Schedule::kInterleaved;
  c.vpp = 2;
  c.global_batch = 8;
  ModelSpec m = gpt(20);
  EXPECT_TRUE(problems(c, &m).empty());
  c.uneven_stages = false;
  expect_problem(c, &m, {"layers=20", "pp*vpp = 4*2 = 8", "layers=16 or layers=24"});
  c.uneven_stages = true;
  m.layers = 6;
  expect_problem(c, &m, {"--layers=6 over --pp=4 x --vpp=2", "8 pipeline chunks"});
}

TEST(Validation, HeadsDivisibleByTp) {
  ParallelConfig c = make(1, 1, 1, 8);
  ModelSpec m = gpt(24, 1536, 12);
  expect_problem(c, &m, {"--tp=8 does not divide --heads=12", "--tp=6 or --tp=12"});
}

// ndmesh train splits kv heads over tp and never replicates them: tp must divide them.
TEST(Validation, KvHeadsDivisibleByTp) {
  ParallelConfig c = make(1, 1, 1, 4);
  ModelSpec m = gpt(24, 1536, 24);
  m.kv_heads = 6;
  expect_problem(c, &m, {"--tp=4 does not divide --kv-heads=6", "--tp=3 or --tp=6"});
  m.kv_heads = 2;  // fewer kv heads than tp: would need replication
  expect_problem(c, &m, {"--tp=4 does not divide --kv-heads=2", "--tp=2"});
  m.kv_heads = 8;  // a multiple of tp = 4
  EXPECT_TRUE(problems(c, &m).empty());
}

TEST(Validation, HiddenFollowsFromHeads) {
  // hidden = heads * head_dim, so tp | heads implies tp | hidden: the heads rule says it.
  ParallelConfig c = make(1, 1, 1, 4);
  ModelSpec m = gpt(24, 1030, 2);
  m.ffn = 4120;
  expect_problem(c, &m, {"--tp=4 does not divide --heads=2"});
}

TEST(Validation, FfnDivisibleByTp) {
  ParallelConfig c = make(1, 1, 1, 4);
  ModelSpec m = gpt(24, 1024, 16);
  m.ffn = 2730;
  expect_problem(c, &m, {"--tp=4 does not divide --ffn=2730", "--tp=3 or --tp=5"});
}

TEST(Validation, AnyVocabularySplitsOverTpPadded) {
  // GPT-2's 50257 tokens: the vocabulary-parallel rows are padded to a multiple of 64 and of
  // tp (50304), so no tp is refused for it.
  ModelSpec m = gpt();
  m.vocab = 50257;
  for (std::int64_t tp : {1, 2, 4, 8, 16}) {
    ParallelConfig c = make(1, 1, 1, tp);
    EXPECT_TRUE(problems(c, &m).empty()) << "tp=" << tp << ": " << problems(c, &m).front();
  }
  EXPECT_EQ(m.padded_vocab(1), 50304);
  EXPECT_EQ(m.padded_vocab(8), 50304);
  EXPECT_EQ(m.padded_vocab(3), 50304);  // 262 x 192: a multiple of 64 and of 3
  m.vocab = 50;
  EXPECT_EQ(m.padded_vocab(1), 64);
  EXPECT_EQ(m.padded_vocab(3), 192);
  m.vocab = 50257;
  m.vocab_multiple = 1;  // no padding beyond what tp needs
  EXPECT_EQ(m.padded_vocab(1), 50257);
  EXPECT_EQ(m.padded_vocab(4), 50260);
}

TEST(Validation, SequenceChunksForContextParallel) {
  ParallelConfig c = make(1, 1, 4, 1);
  ModelSpec m = gpt(24, 1024, 16, 2044);
  expect_problem(c, &m, {"--seq=2044 is not divisible by 8", "--seq=2040 or --seq=2048"});
  m.seq = 6;  // fewer tokens than 2 cp chunks
  expect_problem(c, &m, {"--seq=6 cannot be split", "--cp 3 or less"});
  // Sequence parallelism splits a micro-batch's rows (micro-batch x seq / cp) over tp:
  // cp = 2, tp = 3: 2040 / 2 = 1020 rows divide by 3; 2044 / 2 = 1022 do not.
  c = make(1, 1, 2, 3);
  c.sequence_parallel = true;
  m = gpt(24, 1536, 12, 2040);
  m.vocab = 50304;
  EXPECT_TRUE(problems(c, &m).empty());
  m.seq = 2044;
  expect_problem(c, &m, {"--sequence-parallel with --tp=3", "micro-batch x --seq / --cp"});
  c.micro_batch = 3;  // 3 x 1022 rows divide by 3 again
  c.global_batch = 3;
  EXPECT_TRUE(problems(c, &m).empty());
}

TEST(Validation, SequenceParallelNeedsTp) {
  ParallelConfig c = make(2, 1, 1, 1);
  c.sequence_parallel = true;
  expect_problem(c, nullptr, {"--sequence-parallel needs --tp > 1"});
}

TEST(Validation, GlobalBatchSplitsOverDpAndMicroBatches) {
  ParallelConfig c = make(4, 1, 1, 1);
  c.micro_batch = 2;
  c.global_batch = 20;  // 5 per dp rank: micro-batches of 2 do not divide it
  expect_problem(c, nullptr,
                 {"--micro-batch=2 does not divide the local batch 5", "--global-batch 20 / --dp 4"});
  c.global_batch = 18;
  expect_problem(c, nullptr, {"--global-batch=18 is not divisible by --dp=4", "--global-batch 16"});
}

// ndmesh train runs 1F1B and ZB-H1 with fewer micro-batches than stages (a larger bubble).
TEST(Validation, FewerMicroBatchesThanStagesRun) {
  ParallelConfig c = make(2, 4, 1, 1);
  c.global_batch = 6;  // 3 micro-batches of 1 per dp rank
  EXPECT_TRUE(problems(c, nullptr).empty());
  c.schedule = Schedule::kZbH1;
  EXPECT_TRUE(problems(c, nullptr).empty());
}

TEST(Validation, InterleavedSchedule) {
  ParallelConfig c = make(2, 4, 1, 1);
  c.schedule = Schedule::kInterleaved;
  c.global_batch = 16;  // 8 micro-batches per pipeline, a multiple of pp = 4
  expect_problem(c, nullptr, {"--schedule interleaved needs --vpp 2 or more (now 1)"});
  c.vpp = 2;
  EXPECT_TRUE(problems(c, nullptr).empty());
  c.global_batch = 12;  // 6 micro-batches
  expect_problem(c, nullptr, {"a multiple of --pp=4 micro-batches per step", "gives 6"});
  c = make(2, 1, 1, 1);
  c.schedule = Schedule::kInterleaved;
  c.vpp = 2;
  expect_problem(c, nullptr, {"--schedule interleaved needs --pp 2 or more"});
  c = make(2, 2, 1, 1);
  c.vpp = 2;
  expect_problem(c, nullptr, {"--vpp=2 applies only to --schedule interleaved (now 1f1b)"});
}

TEST(Validation, ZeroBubbleCannotRecompute) {
  ParallelConfig c = make(1, 2, 1, 1);
  c.schedule = Schedule::kZbH1;
  c.global_batch = 4;
  EXPECT_TRUE(problems(c, nullptr).empty());
  c.recompute = true;
  expect_problem(c, nullptr, {"--recompute with --schedule zb-h1", "--recompute none or --schedule 1f1b"});
}

TEST(Validation, PipelineLimitsOfTheExecutor) {
  ParallelConfig c = make(1, kMaxPipelineStages + 1, 1, 1);
  c.global_batch = kMaxPipelineStages + 1;
  expect_problem(c, nullptr, {"--pp=257 is above the limit of 256"});
  c = make(1, 100, 1, 1);
  c.global_batch = 20000;  // 100 x 20000 actions
  expect_problem(c, nullptr, {"exceeds 1000000"});
}

// The training rules on their own, as the Trainer and `ndmesh train` call them.
TEST(TrainingProblems, TrainerOptions) {
  const ModelSpec m{.layers = 2, .hidden = 64, .heads = 4, .kv_heads = 2, .seq = 64, .vocab = 32};
  TrainingRun r{.dp = 2, .global_batch = 16};
  EXPECT_TRUE(training_problems(r, &m).empty());
  r.tp = 4;  // kv_heads = 2
  auto p = training_problems(r, &m);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_NE(p[0].find("--tp=4 does not divide --kv-heads=2"), std::string::npos) << p[0];
  r.tp = 1;
  r.cp = 2;
  r.cp_contiguous = true;
  EXPECT_TRUE(training_problems(r, &m).empty());
  r.pp = 4;  // 2 layers, 4 chunks
  p = training_problems(r, &m);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_NE(p[0].find("--layers=2 over --pp=4 x --vpp=1"), std::string::npos) << p[0];
  r.pp_layers_entries = 4;  // an explicit partition is parse_partition's to check
  EXPECT_TRUE(training_problems(r, &m).empty());
  r.pp = 2;
  r.pp_layers_entries = 0;
  r.micro_batch = -1;
  p = training_problems(r, &m);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_NE(p[0].find("--micro-batch=-1 must be >= 0"), std::string::npos) << p[0];
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

// A folded ep below 1 is its own problem, not a division by zero in the experts' rule.
TEST(Validation, FoldedEpBelowOneIsAProblem) {
  ParallelConfig c;
  c.dims = {{"dp", 2}, {"tp", 1}};
  c.world = 2;
  ModelSpec m = gpt();
  m.experts = 4;
  for (std::int64_t ep : {0, -2}) {
    c.folded_ep = ep;
    expect_problem(c, &m, {"ep=" + std::to_string(ep) + " must divide dp*cp"});
  }
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
    // One file per test process: ctest runs the tests of this fixture side by side.
    std::string path = ::testing::TempDir() + "ndmesh_config_test." + std::to_string(::getpid()) + ".toml";
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
