// Checkpoint directories (model/checkpoint_dir.hpp) without processes: slices written
// under one tensor-parallel split are read back under others (the logical tensor is the
// same), a reader touches only the slices it needs, and a corrupt, truncated, incomplete
// or malformed directory is refused naming the file. The multi-process save/load under
// every layout is tests/mpi/train_checkpoint.sh.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ndmesh/core/error.hpp"
#include "ndmesh/model/checkpoint_dir.hpp"
#include "support/temp_dir.hpp"

namespace ndmesh::model {
namespace {

namespace fs = std::filesystem;

struct TempDir : testing_support::TempDir {
  TempDir() : testing_support::TempDir("ndmesh_ckdir") {}
};

// The view tp rank `rank` of `size` holds of a [rows, cols] matrix split along `dim`
// into `pieces` equal pieces per rank (pieces = 3 mimics the fused q|k|v rows).
ParamView view_of(int rank, int size, int dim, int pieces, std::int64_t rows, std::int64_t cols) {
  ParamView v;
  v.name = "w";
  v.shard.full_shape = {rows, cols};
  v.shape = v.shard.full_shape;
  if (size > 1) {
    v.shard.dim = dim;
    v.shard.rank = rank;
    v.shard.size = size;
    const std::int64_t along = v.shard.full_shape[static_cast<std::size_t>(dim)];
    for (int p = 0; p < pieces; ++p) v.shard.pieces.push_back({p * along / pieces, along / pieces / size});
    v.shape[static_cast<std::size_t>(dim)] = along / size;
  }
  v.numel = v.shape[0] * v.shape[1];
  return v;
}

// Writes the logical tensor `full` (and m = full + 1000, v = full + 2000) as `size` tp
// slices, one shard file per rank, with a manifest.
Manifest write_split(const fs::path& dir, const std::vector<float>& full, int size, int dim, int pieces,
                     std::int64_t rows, std::int64_t cols) {
  Manifest m;
  m.spec = {.name = "", .layers = 1, .hidden = 4, .heads = 1, .seq = 4, .vocab = 4};
  m.step = 3;
  m.adam_steps = 3;
  m.data = "test";
  for (int r = 0; r < size; ++r) {
    ParamView v = view_of(r, size, dim, pieces, rows, cols);
    std::vector<float> p(static_cast<std::size_t>(v.numel)), mm(p.size()), vv(p.size());
    std::vector<float> f(full), fm(full), fv(full);
    for (auto& x : fm) x += 1000;
    for (auto& x : fv) x += 2000;
    copy_shard(v.shard, v.shape, p.data(), f.data(), false);
    copy_shard(v.shard, v.shape, mm.data(), fm.data(), false);
    copy_shard(v.shard, v.shape, vv.data(), fv.data(), false);
    ShardFileWriter w(dir.string(), "shard-" + std::to_string(r) + ".bin", r);
    TensorRecord t{"w", {rows, cols}, {*w.append(v.shard, v.shape, p.data(), mm.data(), vv.data())}};
    add_manifest_part(m, manifest_part({t}, w.close()));
  }
  write_manifest(dir.string(), m);
  return m;
}

std::vector<float> iota_tensor(std::int64_t n) {
  std::vector<float> full(static_cast<std::size_t>(n));
  std::iota(full.begin(), full.end(), 0.0f);
  return full;
}

// Reads tp rank `rank` of `size` and checks it against the logical tensor.
void expect_reads(const fs::path& dir, const std::vector<float>& full, int rank, int size, int dim,
                  int pieces, std::int64_t rows, std::int64_t cols) {
  const Manifest m = read_manifest(dir.string());
  ParamView v = view_of(rank, size, dim, pieces, rows, cols);
  std::vector<float> p(static_cast<std::size_t>(v.numel)), mm(p.size()), vv(p.size()), want(p.size());
  read_tensor(dir.string(), m, *m.find("w"), v, p.data(), mm.data(), vv.data());
  std::vector<float> f(full);
  copy_shard(v.shard, v.shape, want.data(), f.data(), false);
  for (std::size_t i = 0; i < p.size(); ++i) {
    ASSERT_EQ(p[i], want[i]) << "rank " << rank << "/" << size << " element " << i;
    ASSERT_EQ(mm[i], want[i] + 1000);
    ASSERT_EQ(vv[i], want[i] + 2000);
  }
}

TEST(CheckpointDir, EverySplitReadsEveryOtherSplit) {
  const std::int64_t rows = 24, cols = 8;
  const std::vector<float> full = iota_tensor(rows * cols);
  for (int dim : {0, 1})
    for (int pieces : {1, 3}) {
      if (dim == 1 && pieces == 3) continue;  // cols 8 is not 3 x tp pieces
      for (int saved : {1, 2, 4}) {
        TempDir d;
        write_split(d.path, full, saved, dim, pieces, rows, cols);
        for (int loaded : {1, 2, 4})
          for (int r = 0; r < loaded; ++r) expect_reads(d.path, full, r, loaded, dim, pieces, rows, cols);
      }
    }
}

TEST(CheckpointDir, OtherSplitDimensionReadsAll) {
  // Saved split along rows, read split along columns: every slice is needed.
  const std::int64_t rows = 8, cols = 8;
  const std::vector<float> full = iota_tensor(rows * cols);
  TempDir d;
  write_split(d.path, full, 2, 0, 1, rows, cols);
  for (int r = 0; r < 2; ++r) expect_reads(d.path, full, r, 2, 1, 1, rows, cols);
}

// Flips one byte at `offset` of a file.
void flip(const fs::path& file, std::int64_t offset) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(offset);
  char c = 0;
  f.read(&c, 1);
  f.seekp(offset);
  c = static_cast<char>(c ^ 0x40);
  f.write(&c, 1);
}

template <typename F>
void expect_io_error(F&& f, const std::string& needle) {
  try {
    f();
    FAIL() << "no error; expected one containing: " << needle;
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(CheckpointDir, ReadsOnlyTheSlicesItNeeds) {
  const std::int64_t rows = 16, cols = 4;
  const std::vector<float> full = iota_tensor(rows * cols);
  TempDir d;
  write_split(d.path, full, 4, 0, 1, rows, cols);
  flip(d.path / "shard-3.bin", 5);  // only tp rank 3's rows are corrupt
  // tp 2 rank 0 needs the slices of saved ranks 0 and 1: fine. Rank 1 needs 2 and 3.
  expect_reads(d.path, full, 0, 2, 0, 1, rows, cols);
  expect_io_error([&] { expect_reads(d.path, full, 1, 2, 0, 1, rows, cols); }, "shard-3.bin' is corrupt");
  const Manifest m = read_manifest(d.path.string());
  expect_io_error([&] { verify_checkpoint_dir(d.path.string(), m); }, "shard-3.bin' is corrupt");
}

TEST(CheckpointDir, IncompleteAndMalformedDirectoriesNameTheFile) {
  const std::int64_t rows = 8, cols = 4;
  const std::vector<float> full = iota_tensor(rows * cols);
  TempDir d;
  write_split(d.path, full, 2, 0, 1, rows, cols);
  const fs::path manifest = d.path / kManifestFile;
  const nlohmann::json good = [&] {
    std::ifstream in(manifest);
    return nlohmann::json::parse(in);
  }();
  auto write_manifest_text = [&](const std::string& t) { std::ofstream(manifest, std::ios::trunc) << t; };
  auto edited = [&](auto&& edit) {
    nlohmann::json j = good;
    edit(j);
    return j.dump();
  };

  // A truncated shard file.
  fs::resize_file(d.path / "shard-1.bin", 10);
  const Manifest m = read_manifest(d.path.string());
  expect_io_error([&] { verify_checkpoint_dir(d.path.string(), m); },
                  "shard-1.bin' has 10 bytes but the manifest says");
  // A missing one.
  fs::remove(d.path / "shard-1.bin");
  expect_io_error([&] { verify_checkpoint_dir(d.path.string(), m); }, "shard-1.bin': No such file");
  // Manifests that lie.
  write_manifest_text("{ not json");
  expect_io_error([&] { read_manifest(d.path.string()); }, "manifest.json' is not valid JSON");
  write_manifest_text(edited([](auto& j) { j["version"] = 9; }));
  expect_io_error([&] { read_manifest(d.path.string()); },
                  "has format version 9 but this build reads version 3");
  write_manifest_text(edited([](auto& j) { j["tensors"][0]["slices"][1]["pieces"][0][0] = 3; }));
  expect_io_error([&] { read_manifest(d.path.string()); }, "do not tile it");
  write_manifest_text(edited([](auto& j) { j["step"] = -1; }));
  expect_io_error([&] { read_manifest(d.path.string()); }, "step = -1 is outside");
  write_manifest_text(edited([](auto& j) { j["files"][1]["name"] = "../etc/passwd"; }));
  expect_io_error([&] { read_manifest(d.path.string()); }, "which is not a file name");
  // No manifest at all: an incomplete directory.
  fs::remove(manifest);
  expect_io_error([&] { read_manifest(d.path.string()); }, "has no manifest.json");
  expect_io_error([&] { read_manifest((d.path / "nothing").string()); }, "does not exist");
}

TEST(CheckpointDir, CommitReplacesTheWholeDirectory) {
  TempDir d;
  const fs::path dir = d.path / "ck";
  const std::vector<float> full = iota_tensor(8 * 4);
  for (int round = 0; round < 2; ++round) {
    const std::string tmp = checkpoint_temp_dir(dir.string());
    EXPECT_EQ(fs::path(tmp).parent_path(), dir.parent_path());
    prepare_checkpoint_temp_dir(tmp);
    write_split(tmp, full, round == 0 ? 2 : 1, 0, 1, 8, 4);
    commit_checkpoint_dir(tmp, dir.string());
    EXPECT_FALSE(fs::exists(tmp));
    EXPECT_TRUE(is_checkpoint_dir(dir.string()));
    // The second commit leaves no file of the first behind.
    EXPECT_EQ(fs::exists(dir / "shard-1.bin"), round == 0);
  }
}

TEST(CheckpointDir, ElementCountsThatOverflowNameTheTensor) {
  // Dims within the per-dim bound whose products do not fit 64 bits: refused naming the
  // tensor, where a wrapped count would have passed the bounds checks.
  TempDir d;
  write_split(d.path, iota_tensor(8 * 4), 1, 0, 1, 8, 4);
  const fs::path manifest = d.path / kManifestFile;
  nlohmann::json good = nlohmann::json::parse(std::ifstream(manifest));
  auto with_shape = [&](std::vector<std::int64_t> shape) {
    nlohmann::json j = good;
    j["tensors"][0]["shape"] = shape;
    j["tensors"][0]["slices"][0]["shape"] = shape;
    std::ofstream(manifest, std::ios::trunc) << j.dump();
  };
  const std::int64_t big = std::int64_t{1} << 40;
  with_shape({big, big});  // 2^80 elements
  expect_io_error(
      [&] { read_manifest(d.path.string()); },
      "tensor 'w' has shape [1099511627776, 1099511627776], whose element count does not fit 64 bits");
  with_shape({big, std::int64_t{1} << 20});  // 2^60 elements fit, 12 bytes each do not
  expect_io_error([&] { read_manifest(d.path.string()); },
                  "tensor 'w' has a slice of shape [1099511627776, 1048576] whose size does not fit 64 bits");
}

TEST(CheckpointDir, CommitNeedsEveryShardFileAndNamesItsWriter) {
  // Node-local disks: a writer on another node put its shard where the rank committing
  // cannot see it. The commit fails naming the file and its writer (rank and node), and
  // the previous checkpoint stays in place.
  TempDir d;
  const fs::path dir = d.path / "ck";
  const std::vector<float> full = iota_tensor(8 * 4);
  std::string tmp = checkpoint_temp_dir(dir.string());
  prepare_checkpoint_temp_dir(tmp);
  write_split(tmp, full, 1, 0, 1, 8, 4);
  commit_checkpoint_dir(tmp, dir.string());
  const std::string before = [&] {
    std::ifstream in(dir / kManifestFile);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }();
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof(host) - 1), 0);
  const std::string writer = std::string("rank 1 on ") + host;

  prepare_checkpoint_temp_dir(tmp);
  const Manifest m = write_split(tmp, full, 2, 0, 1, 8, 4);
  EXPECT_EQ(m.files[1].rank, 1);
  EXPECT_EQ(m.files[1].host, host);
  EXPECT_EQ(read_manifest(tmp).files[1].host, host);  // recorded in manifest.json
  fs::remove(fs::path(tmp) / "shard-1.bin");
  expect_io_error([&] { commit_checkpoint_dir(tmp, dir.string()); },
                  "shard-1.bin' is missing on " + std::string(host) +
                      ", where the manifest is written, but " + writer + " wrote it");
  expect_io_error([&] { commit_checkpoint_dir(tmp, dir.string()); },
                  "a multi-node save needs a shared file system");
  // A shard of another size (another disk's file under the same name).
  prepare_checkpoint_temp_dir(tmp);
  write_split(tmp, full, 2, 0, 1, 8, 4);
  fs::resize_file(fs::path(tmp) / "shard-1.bin", 10);
  expect_io_error([&] { commit_checkpoint_dir(tmp, dir.string()); },
                  "shard-1.bin' has 10 bytes on " + std::string(host) +
                      ", where the manifest is written, but " + writer + " wrote 192");
  // A writer whose node lacks the folder the committing rank prepared on its own.
  expect_io_error([&] { ShardFileWriter(tmp + "-elsewhere", "shard-1.bin", 1); },
                  "-elsewhere/shard-1.bin' on " + std::string(host) + ": the folder does not exist here");
  // The previous checkpoint is whole and unchanged.
  const Manifest kept = read_manifest(dir.string());
  EXPECT_EQ(kept.files.size(), 1u);
  verify_checkpoint_dir(dir.string(), kept);
  std::ifstream in(dir / kManifestFile);
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()), before);
}

}  // namespace
}  // namespace ndmesh::model
