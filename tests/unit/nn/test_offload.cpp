// AdamW with its moments offloaded to a file (nn/offload.hpp): the same updates bit for bit
// as in memory, for a whole store and for ZeRO-like segments cut across chunks; the file
// is removed at the end; the streaming window's I/O counts.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "ndmesh/nn/adamw.hpp"
#include "ndmesh/nn/offload.hpp"
#include "ndmesh/tensor/rng.hpp"
#include "support/temp_dir.hpp"

namespace ndmesh::nn {
namespace {

namespace fs = std::filesystem;

struct TempDir : testing_support::TempDir {
  TempDir() : testing_support::TempDir("ndmesh_offload") {}
};

ParamStore<float> make_store() {
  ParamStore<float> s;
  s.add("a", {3001}, true);
  s.add("b", {17}, false);
  s.add("c", {2500}, true);
  s.allocate();
  return s;
}

void fill(ParamStore<float>& s, std::uint64_t seed, bool grads) {
  Rng rng(seed);
  float* p = grads ? s.grads().data() : s.params().data();
  for (std::int64_t i = 0; i < s.size(); ++i) p[i] = static_cast<float>(rng.normal());
}

// Three steps of AdamW over `segments`, in memory or offloaded with chunks of `chunk`.
std::vector<float> run(const std::vector<Segment>& segments, const fs::path* dir, std::int64_t chunk,
                       std::vector<float>* m_out = nullptr) {
  ParamStore<float> s = make_store();
  fill(s, 1, false);
  AdamW<float> adam(s, {.weight_decay = 0.1, .clip_norm = 1.0}, segments);
  if (dir) adam.offload_to((*dir / "x.adamw").string(), chunk);
  for (int step = 0; step < 3; ++step) {
    fill(s, 10 + static_cast<std::uint64_t>(step), true);
    adam.update(s, 1e-2, 2.0);
  }
  if (m_out) {
    std::vector<float> v;
    adam.moments_to_host(*m_out, v);
  }
  return {s.params().data(), s.params().data() + s.size()};
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(Offload, AdamWUpdatesAreTheSameBitForBit) {
  TempDir dir;
  const std::vector<std::vector<Segment>> layouts = {{}, {{1000, 2100}, {4000, 1518}}};
  for (const auto& segments : layouts) {
    std::vector<float> m_mem, m_file;
    const auto mem = run(segments, nullptr, 0, &m_mem);
    for (std::int64_t chunk : {1024, 2048, 1 << 20}) {  // chunks cut through pieces, or one chunk
      const auto file = run(segments, &dir.path, chunk, &m_file);
      EXPECT_TRUE(same_bits(mem, file)) << "chunk " << chunk << " segments " << segments.size();
      EXPECT_TRUE(same_bits(m_mem, m_file)) << "chunk " << chunk;
      EXPECT_TRUE(fs::is_empty(dir.path)) << "the offload file outlived its optimizer";
    }
  }
}

TEST(Offload, StreamsEveryChunkOnceEachWay) {
  TempDir dir;
  OffloadFile f((dir.path / "y.adamw").string(), 5000, 1024);  // 5 chunks
  std::vector<std::int64_t> firsts;
  f.stream([&](std::int64_t first, std::int64_t count, float* m, float* v) {
    firsts.push_back(first);
    for (std::int64_t i = 0; i < count; ++i) m[i] = static_cast<float>(first + i), v[i] = -m[i];
  });
  EXPECT_EQ(firsts, (std::vector<std::int64_t>{0, 1024, 2048, 3072, 4096}));
  EXPECT_EQ(f.bytes_read(), 5 * 2 * 1024 * 4);
  EXPECT_EQ(f.bytes_written(), f.bytes_read());
  EXPECT_EQ(f.window_bytes(), 3 * 2 * 1024 * 4);
  std::vector<float> m(5000), v(5000);
  f.read_all(m.data(), v.data());
  for (std::size_t i = 0; i < m.size(); ++i) {
    ASSERT_EQ(m[i], static_cast<float>(i));
    ASSERT_EQ(v[i], -m[i]);
  }
  EXPECT_EQ(find_stale_offload(dir.path.string()), std::vector<std::string>{"y.adamw"});
}

// OffloadArray (--offload optimizer+params): ranges that start and end inside 4 KiB pages
// keep the elements beside them; it reads back what was written; the file goes at the end.
TEST(Offload, AnArrayReadsAndWritesRangesAcrossPageEdges) {
  TempDir dir;
  const std::int64_t n = 5000;  // 5 pages, the last one partial
  std::vector<float> want(static_cast<std::size_t>(n), 0.0f);
  {
    OffloadArray a((dir.path / "p.params.adamw").string(), n);
    std::vector<float> got(static_cast<std::size_t>(n), -1.0f);
    a.read(0, n, got.data());
    EXPECT_EQ(got, want);  // zero-filled
    // Ranges: whole, inside one page, across two edges, up to the end, one element.
    for (auto [first, count] : std::vector<std::pair<std::int64_t, std::int64_t>>{
             {0, n}, {10, 20}, {1000, 2100}, {4090, 910}, {1024, 1}, {3, 1021}}) {
      std::vector<float> in(static_cast<std::size_t>(count));
      for (std::int64_t i = 0; i < count; ++i)
        in[static_cast<std::size_t>(i)] = static_cast<float>(first * 7 + i);
      a.write(first, count, in.data());
      std::copy(in.begin(), in.end(), want.begin() + first);
      a.read(0, n, got.data());
      ASSERT_EQ(got, want) << "after writing [" << first << ", " << first + count << ")";
      std::vector<float> part(static_cast<std::size_t>(count));
      a.read(first, count, part.data());
      ASSERT_EQ(part, in);
    }
    EXPECT_THROW(a.read(n - 1, 2, got.data()), InternalError);
    EXPECT_EQ(find_stale_offload(dir.path.string()), std::vector<std::string>{"p.params.adamw"});
  }
  EXPECT_TRUE(find_stale_offload(dir.path.string()).empty());
  EXPECT_THROW(OffloadArray("/nonexistent-ndmesh-dir/p.adamw", 10), IoError);
}

TEST(Offload, AFileThatCannotBeCreatedIsAnIoError) {
  EXPECT_THROW(OffloadFile("/nonexistent-ndmesh-dir/z.adamw", 10), IoError);
}

}  // namespace
}  // namespace ndmesh::nn
