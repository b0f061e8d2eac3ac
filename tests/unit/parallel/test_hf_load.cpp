// `--load HF_DIR` under layouts, on in-process ranks (comm/inproc.hpp): each rank reads only
// the parts of the Hugging Face tensors it keeps, and the loaded model is the serial one.
//
// A random Llama (GQA, untied, fp32 file) and GPT-2 (tied, Conv1D weights stored
// transposed, bf16 file) folder is loaded by a Trainer of each layout. What a rank keeps is
// computed here from its parameters' views alone: each view's tp slice marked in the full
// tensor with copy_shard (padding rows of the vocabulary are in no file), times the file's
// bytes per element. Without ZeRO-3 a rank must have read exactly that many bytes (a rank
// that read a whole tensor, or a slice twice, reads more); under ZeRO-3 the ranks of a
// gradient group split it: together they read one replica's worth. Then the first two
// steps' losses equal the serial load's within 1e-5 relative, which checks that what was
// read went where it belongs (a q/k/v or gate/up slice spanning two files' tensors, a
// column slice of a row-parallel weight, a transposed Conv1D weight's columns).
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ndmesh/comm/inproc.hpp"
#include "ndmesh/comm/process_groups.hpp"
#include "ndmesh/model/data.hpp"
#include "ndmesh/model/hf.hpp"
#include "ndmesh/model/safetensors.hpp"
#include "ndmesh/parallel/trainer.hpp"
#include "ndmesh/tensor/rng.hpp"
#include "support/model_fixtures.hpp"
#include "support/temp_dir.hpp"

namespace ndmesh::parallel {
namespace {

namespace fs = std::filesystem;

ModelSpec llama_spec() {
  ModelSpec s = with_arch(ModelSpec{}, "llama");
  s.layers = 2, s.hidden = 16, s.heads = 4, s.kv_heads = 2, s.ffn = 24, s.seq = 8, s.vocab = 70;
  s.tied_embeddings = false;
  return s;
}

ModelSpec gpt2_spec() {
  ModelSpec s = with_arch(ModelSpec{}, "gpt2");
  s.layers = 2, s.hidden = 16, s.heads = 4, s.seq = 8, s.vocab = 70;
  s.tied_embeddings = true;
  return s;
}

// A Hugging Face folder of `spec` with random values (std 0.1, norms' weights about 1).
void write_folder(const fs::path& dir, const ModelSpec& spec, model::SafeDtype dtype) {
  fs::create_directories(dir);
  std::ofstream(dir / model::kHfConfigFile) << model::hf_config_json(spec);
  std::vector<model::SafeTensorOut> out;
  std::uint64_t seed = 11;
  for (const model::HfTensor& h : model::hf_mapping(spec).hf) {
    const bool norm_weight = h.shape.size() == 1 && h.name.find("bias") == std::string::npos;
    out.push_back({h.name, h.shape, [shape = h.shape, s = seed++, norm_weight](float* values) {
                     Rng rng(s);
                     std::int64_t n = 1;
                     for (std::int64_t d : shape) n *= d;
                     for (std::int64_t i = 0; i < n; ++i)
                       values[i] = (norm_weight ? 1.0f : 0.0f) + 0.1f * static_cast<float>(rng.normal());
                   }});
  }
  model::write_safetensors((dir / model::kSafetensorsFile).string(), out, dtype, {});
}

struct Layout {
  std::string mesh;  // Mesh::parse text
  int zero = 0;
};

struct RankResult {
  std::int64_t bytes_read = 0;
  std::int64_t kept_bytes = 0;   // its views' tp slices (no ZeRO-3 split), in file bytes
  std::int64_t whole_bytes = 0;  // the whole tensors of its views, what a whole-tensor reader reads
  std::vector<double> losses;
};

// Loads `dir` with layout `l` on in-process ranks and trains two steps.
std::vector<RankResult> load_and_train(const std::string& dir, const ModelSpec& spec, std::int64_t width,
                                       const Layout& l) {
  const Mesh mesh = Mesh::parse(l.mesh);
  std::vector<RankResult> results(static_cast<std::size_t>(mesh.world_size()));
  comm::inproc::run(static_cast<int>(mesh.world_size()), [&](const comm::Communicator& world) {
    testing_support::single_blas_thread();
    ProcessGroups groups(mesh, world);
    TrainOptions o{.model = spec, .batch = 4, .micro_batch = 1, .steps = 2, .lr = 1e-2, .seed = 5};
    o.dp.zero = l.zero;
    Trainer t(o, std::make_unique<model::MarkovSource>(model::MarkovOptions{.vocab = spec.vocab, .seed = 3}),
              groups);
    RankResult& r = results[static_cast<std::size_t>(world.rank())];
    r.bytes_read = t.load(dir, true).bytes_read;
    for (const auto& chunk : t.chunks())
      for (const ParamView& v : chunk->params().views()) {
        // The elements of the full tensor this view holds: its slice copied into zeros as ones.
        std::vector<float> ones(static_cast<std::size_t>(v.numel), 1.0f);
        std::vector<float> full(static_cast<std::size_t>(v.full_numel()), 0.0f);
        copy_shard(v.shard, v.shape, ones.data(), full.data(), true);
        for (float x : full) r.kept_bytes += x == 1.0f ? width : 0;
        r.whole_bytes += v.full_numel() * width;
      }
    for (int s = 0; s < 2; ++s) r.losses.push_back(t.step().loss);
  });
  return results;
}

void check_layouts(const ModelSpec& spec, model::SafeDtype dtype) {
  testing_support::TempDir tmp("ndmesh_hf_load");
  const std::string dir = (tmp.path / "hf").string();
  write_folder(dir, spec, dtype);
  const std::int64_t width = model::safetensors_dtype_bytes(dtype);
  const RankResult serial = load_and_train(dir, spec, width, {"dp=1"})[0];
  // The serial load reads every tensor once: the whole file's data.
  EXPECT_EQ(serial.bytes_read, serial.whole_bytes);
  EXPECT_EQ(serial.bytes_read, serial.kept_bytes);
  for (const Layout& l :
       {Layout{"tp=2"}, Layout{"pp=2"}, Layout{"pp=2,tp=2"}, Layout{"dp=2", 3}, Layout{"dp=2,tp=2", 3}}) {
    const std::vector<RankResult> ranks = load_and_train(dir, spec, width, l);
    const std::int64_t dp = Mesh::parse(l.mesh).size_of("dp");
    std::int64_t read = 0, kept = 0;
    for (std::size_t k = 0; k < ranks.size(); ++k) {
      const RankResult& r = ranks[k];
      std::cout << fmt::format("[ {} {} zero {} ] rank {}: read {} bytes; its slices {}, whole tensors {}\n",
                               arch_name(spec), l.mesh, l.zero, k, r.bytes_read, r.kept_bytes, r.whole_bytes);
      if (l.zero == 3) {
        EXPECT_LT(r.bytes_read, r.kept_bytes) << l.mesh << " rank " << k;
      } else {
        EXPECT_EQ(r.bytes_read, r.kept_bytes) << l.mesh << " rank " << k << " read more than its slices";
      }
      read += r.bytes_read;
      kept += r.kept_bytes;
      ASSERT_EQ(r.losses.size(), serial.losses.size());
      for (std::size_t s = 0; s < r.losses.size(); ++s)
        EXPECT_NEAR(r.losses[s], serial.losses[s], 1e-5 * std::abs(serial.losses[s]))
            << l.mesh << " rank " << k << " step " << s + 1;
    }
    // Under ZeRO-3 the gradient group's ranks read disjoint blocks of one replica's slices.
    if (l.zero == 3) {
      EXPECT_EQ(read * dp, kept) << l.mesh;
    }
  }
}

TEST(HfLoad, LlamaRanksReadOnlyTheirSlicesAndMatchTheSerialLoad) {
  check_layouts(llama_spec(), model::SafeDtype::kF32);
}

TEST(HfLoad, Gpt2Bf16RanksReadOnlyTheirSlicesAndMatchTheSerialLoad) {
  check_layouts(gpt2_spec(), model::SafeDtype::kBF16);
}

}  // namespace
}  // namespace ndmesh::parallel
