// The embedding kernels against nn::Embedding<float>::forward_at / backward_at, with
// positions that are not 0..seq-1 (an offset, a zigzag order, repeats), a vocabulary shard
// (a fake tp group of 3 whose collectives are the group of one's), a sequence-parallel
// slice of rows for the position part (first_row != 0), and a determinism check. Copies
// and adds in the CPU's order: every comparison is bit for bit.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "gpu_test.hpp"
#include "ndmesh/nn/cuda_ops.hpp"
#include "ndmesh/nn/embedding.hpp"

namespace ndmesh {
namespace {

using namespace testing;  // gpu_test.hpp

// Rank `rank` of a tp group of `size` that communicates with nobody: the layer embeds its
// vocabulary shard only (zeros elsewhere) and keeps its own partial sums, which is what
// the CUDA functions compute before any collective. reduce_scatter keeps block rank().
class LonelyTp final : public nn::TpComm<float> {
 public:
  LonelyTp(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void reduce_scatter(const float* in, float* out, std::int64_t n) override {
    std::copy(in + rank_ * n, in + (rank_ + 1) * n, out);
  }

 private:
  int rank_, size_;
};

struct Case {
  std::int64_t batch, seq, vocab, channels, max_seq;
  int tp_rank, tp_size;
  bool sequence_parallel;
  std::vector<std::int64_t> positions;  // [seq]
};

std::vector<Case> cases() {
  std::vector<std::int64_t> zigzag = {0, 1, 2, 3, 12, 13, 14, 15, 4, 5, 6, 7, 8, 9, 10, 11, 16};
  std::vector<std::int64_t> offset(100), repeats(33);
  for (std::int64_t t = 0; t < 100; ++t) offset[static_cast<std::size_t>(t)] = 7 + t;
  for (std::int64_t t = 0; t < 33; ++t)
    repeats[static_cast<std::size_t>(t)] = (t * 5) % 11;  // each used 3 times
  return {
      {.batch = 2,
       .seq = 17,
       .vocab = 13,
       .channels = 5,
       .max_seq = 17,
       .tp_rank = 0,
       .tp_size = 1,
       .sequence_parallel = false,
       .positions = zigzag},
      {.batch = 3,
       .seq = 100,
       .vocab = 1031,
       .channels = 96,
       .max_seq = 129,
       .tp_rank = 0,
       .tp_size = 1,
       .sequence_parallel = false,
       .positions = offset},
      {.batch = 4,
       .seq = 33,
       .vocab = 1032,
       .channels = 771,
       .max_seq = 40,
       .tp_rank = 1,
       .tp_size = 3,
       .sequence_parallel = false,
       .positions = repeats},
      {.batch = 2,
       .seq = 17,
       .vocab = 39,
       .channels = 96,
       .max_seq = 17,
       .tp_rank = 2,
       .tp_size = 3,
       .sequence_parallel = true,
       .positions = zigzag},
  };
}

struct Tables {
  ParamStore<float> store;
  std::unique_ptr<nn::Embedding<float>> embed;
  std::vector<std::int32_t> tokens;
  explicit Tables(const Case& c) {
    nn::TpContext<float> tp{.comm = std::make_shared<LonelyTp>(c.tp_rank, c.tp_size),
                            .sequence_parallel = c.sequence_parallel};
    embed = std::make_unique<nn::Embedding<float>>(
        store, nn::EmbeddingOptions{.vocab = c.vocab, .channels = c.channels, .max_seq = c.max_seq}, tp);
    store.allocate();
    const auto p = normal(static_cast<std::size_t>(store.size()), 11), g = normal(p.size(), 12);
    std::copy(p.begin(), p.end(), store.params().begin());
    std::copy(g.begin(), g.end(), store.grads().begin());
    // Few distinct tokens (many repeats) over the whole vocabulary, so that every shard
    // sees some and rows outside it exist.
    Rng rng(13);
    tokens.resize(static_cast<std::size_t>(c.batch * c.seq));
    for (auto& t : tokens) t = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(c.vocab)));
  }
  std::vector<float> table(int id, bool grad) const {
    const ParamView& v = store.view(id);
    const float* base = (grad ? store.grads() : store.params()).data() + v.offset;
    return {base, base + v.numel};
  }
};

TEST(CudaEmbedding, ForwardIsForwardAt) {
  NDMESH_GPU_OR_SKIP();
  for (const Case& c : cases()) {
    Tables s(c);
    const std::int64_t n = c.batch * c.seq, rows = c.sequence_parallel ? n / c.tp_size : n;
    const std::int64_t first = c.sequence_parallel ? rows * c.tp_rank : 0;
    std::vector<float> ref(static_cast<std::size_t>(rows * c.channels));
    s.embed->forward_at(s.tokens.data(), ref.data(), c.batch, c.seq, c.positions.data());

    DeviceBuffer tokens = to_device(s.tokens), positions = to_device(c.positions);
    DeviceBuffer wte = to_device(s.table(s.embed->token_weight_id(), false));
    DeviceBuffer wpe = to_device(s.table(s.embed->position_weight_id(), false));
    DeviceBuffer part = to_device(nans(static_cast<std::size_t>(n * c.channels)));
    cuda::embedding_tokens_forward(ptr<float>(part), ptr<std::int32_t>(tokens), ptr<float>(wte), n,
                                   c.channels, s.embed->vocab_start(), s.embed->local_vocab());
    // The rank's rows of the (here unreduced) token part, then its positions.
    float* out = ptr<float>(part) + first * c.channels;
    cuda::embedding_positions_forward(out, ptr<float>(wpe), ptr<std::int64_t>(positions), first, rows, c.seq,
                                      c.channels);
    const auto all = to_host<float>(part, static_cast<std::size_t>(n * c.channels));
    const std::vector<float> got(all.begin() + first * c.channels, all.begin() + (first + rows) * c.channels);
    EXPECT_TRUE(same_bits(got, ref)) << "batch=" << c.batch << " seq=" << c.seq << " C=" << c.channels
                                     << " tp rank " << c.tp_rank << "/" << c.tp_size
                                     << (c.sequence_parallel ? " sequence-parallel" : "");
  }
}

TEST(CudaEmbedding, BackwardIsBackwardAtAndDeterministic) {
  NDMESH_GPU_OR_SKIP();
  for (const Case& c : cases()) {
    if (c.sequence_parallel) continue;  // the backward takes the full d output either way
    Tables s(c);
    const std::int64_t n = c.batch * c.seq;
    const auto dout = normal(static_cast<std::size_t>(n * c.channels), 14);
    const int wte_id = s.embed->token_weight_id(), wpe_id = s.embed->position_weight_id();
    const auto dwte0 = s.table(wte_id, true), dwpe0 = s.table(wpe_id, true);
    s.embed->backward_at(dout.data(), s.tokens.data(), c.batch, c.seq, c.positions.data());

    DeviceBuffer d = to_device(dout);
    std::vector<float> first_wte, first_wpe;
    for (int run = 0; run < 2; ++run) {
      DeviceBuffer dwte = to_device(dwte0), dwpe = to_device(dwpe0);
      // Tokens and positions in host memory (the buckets are made there).
      cuda::embedding_backward(ptr<float>(dwte), ptr<float>(dwpe), ptr<float>(d), s.tokens.data(),
                               c.positions.data(), n, c.seq, c.channels, s.embed->vocab_start(),
                               s.embed->local_vocab());
      const auto got_wte = to_host<float>(dwte, dwte0.size()), got_wpe = to_host<float>(dwpe, dwpe0.size());
      if (run == 0) {
        // The same adds in the same (row) order as the CPU: the same bits.
        EXPECT_TRUE(same_bits(got_wte, s.table(wte_id, true)))
            << "token table, seq=" << c.seq << " C=" << c.channels;
        EXPECT_TRUE(same_bits(got_wpe, s.table(wpe_id, true)))
            << "position table, seq=" << c.seq << " C=" << c.channels;
        first_wte = got_wte, first_wpe = got_wpe;
      } else {
        EXPECT_TRUE(same_bits(got_wte, first_wte)) << "token table differs between two runs";
        EXPECT_TRUE(same_bits(got_wpe, first_wpe)) << "position table differs between two runs";
      }
    }
  }
}

}  // namespace
}  // namespace ndmesh
