// Fixtures for component tests of multi-rank training code on in-process jobs
// (comm/inproc.hpp): the gradient reducer, the pipeline executor and ring attention here,
// and the components of issue 23 (parallelize, gradient sync, sharded state dict, batch
// source) as they come. The shape of such a test:
//
//   const ModelSpec spec = tiny_spec();
//   const Batch batch = make_batch(spec, /*sequences=*/4, /*seed=*/7);
//   const SerialReference ref(spec, batch);           // the serial model's loss and gradients
//   comm::inproc::run(2, [&](const comm::Communicator& world) {
//     single_blas_thread();
//     model::Decoder chunk(spec, {.batch = 2, ...});  // this rank's part of the model
//     ... run the component on this rank's part of `batch` (batch.slice(first, count)) ...
//     EXPECT_TRUE(same_by_name(chunk.params(), chunk.params().grads(), ref.model().params(),
//                              ref.model().params().grads(), {}))
//         << "rank " << world.rank();
//   });
//
// same_by_name() names the first differing tensor (parameter name, element, both values)
// and reads tensor-parallel slices and pipeline stages (parameters of a subset of blocks)
// against the full serial parameter of the same name.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "ndmesh/model/decoder.hpp"
#include "ndmesh/tensor/blas.hpp"
#include "ndmesh/tensor/params.hpp"
#include "ndmesh/tensor/rng.hpp"

namespace ndmesh::testing_support {

/// A model small enough that one rank's forward and backward take microseconds, with
/// grouped-query attention, an MLP width that is not 4 * hidden, and odd sizes where the
/// layouts allow (heads, kv heads, ffn and vocab stay divisible by 2 for tp = 2).
inline ModelSpec tiny_spec(std::int64_t layers = 2, bool tied = true) {
  return {.name = "tiny",
          .layers = layers,
          .hidden = 16,
          .heads = 4,
          .kv_heads = 2,
          .ffn = 24,
          .seq = 8,
          .vocab = 14,
          .tied_embeddings = tied};
}

/// Rank threads share the process's BLAS: one BLAS thread each (call on every rank).
inline void single_blas_thread() {
  if (blas_threads() != 1) set_blas_threads(1);
}

/// Tokens and next-token targets of `sequences` sequences of spec.seq tokens.
struct Batch {
  std::int64_t sequences = 0, seq = 0;
  std::vector<std::int32_t> tokens, targets;  ///< [sequences, seq]
  /// Sequences [first, first + count) as a batch of its own (a dp rank's or micro-batch's part).
  Batch slice(std::int64_t first, std::int64_t count) const {
    Batch b{.sequences = count, .seq = seq};
    const auto from = static_cast<std::size_t>(first * seq), n = static_cast<std::size_t>(count * seq);
    b.tokens.assign(tokens.begin() + static_cast<std::ptrdiff_t>(from),
                    tokens.begin() + static_cast<std::ptrdiff_t>(from + n));
    b.targets.assign(targets.begin() + static_cast<std::ptrdiff_t>(from),
                     targets.begin() + static_cast<std::ptrdiff_t>(from + n));
    return b;
  }
  /// The tokens at positions `pos` of every sequence (a context-parallel rank's part).
  Batch at_positions(const std::vector<std::int64_t>& pos) const {
    Batch b{.sequences = sequences, .seq = static_cast<std::int64_t>(pos.size())};
    for (std::int64_t s = 0; s < sequences; ++s)
      for (std::int64_t p : pos) {
        b.tokens.push_back(tokens[static_cast<std::size_t>(s * seq + p)]);
        b.targets.push_back(targets[static_cast<std::size_t>(s * seq + p)]);
      }
    return b;
  }
};

/// A deterministic batch: the same on every rank for the same arguments.
inline Batch make_batch(const ModelSpec& spec, std::int64_t sequences, std::uint64_t seed) {
  Batch b{.sequences = sequences, .seq = spec.seq};
  Rng rng(seed);
  for (std::int64_t i = 0; i < sequences * (spec.seq + 1); ++i)
    b.tokens.push_back(static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(spec.vocab))));
  // Next-token targets: each sequence is a window of seq + 1 tokens.
  std::vector<std::int32_t> stream = std::move(b.tokens);
  b.tokens.clear();
  for (std::int64_t s = 0; s < sequences; ++s)
    for (std::int64_t t = 0; t < spec.seq; ++t) {
      const auto at = static_cast<std::size_t>(s * (spec.seq + 1) + t);
      b.tokens.push_back(stream[at]);
      b.targets.push_back(stream[at + 1]);
    }
  return b;
}

/// The serial model (same spec and seed) after one forward and backward over the whole
/// batch, with the loss weight of a run whose global batch it is: the gradients every
/// layout must reproduce.
class SerialReference {
 public:
  SerialReference(const ModelSpec& spec, const Batch& batch, std::uint64_t seed = 1)
      : model_(spec, {.seed = seed, .batch = batch.sequences, .seq = batch.seq}) {
    single_blas_thread();
    model_.params().zero_grad();
    loss_ = model_.forward(batch.tokens.data(), batch.targets.data());
    model_.backward();
  }
  const model::Decoder& model() const { return model_; }
  /// The mean loss over the batch.
  double loss() const { return loss_; }

 private:
  model::Decoder model_;
  double loss_ = 0;
};

/// Element tolerance of same_by_name(): |got - want| <= abs + rel * |want| + scale * max |want|
/// of the tensor (the last term absorbs cancellation in elements near zero).
struct Tolerance {
  double rel = 1e-5;
  double abs = 0;
  double scale = 1e-5;
};

/// Compares every parameter of `got` (views of `got_store`, values `got`) with the one of
/// the same name in `want_store` (values `want`): a tensor-parallel slice against the slice
/// of the full parameter, a pipeline stage's parameters against those of the full model.
/// Fails naming the first differing tensor, its element and both values, and how many of
/// its elements differ; or a parameter the reference lacks.
inline ::testing::AssertionResult same_by_name(const ParamStore<float>& got_store, std::span<const float> got,
                                               const ParamStore<float>& want_store,
                                               std::span<const float> want, Tolerance tol = {}) {
  std::vector<float> slice;
  for (const ParamView& v : got_store.views()) {
    const int id = want_store.find(v.name);
    if (id < 0) return ::testing::AssertionFailure() << "parameter " << v.name << " is not in the reference";
    const ParamView& w = want_store.view(id);
    slice.resize(static_cast<std::size_t>(v.numel));
    std::vector<float> full(want.begin() + w.offset, want.begin() + w.offset + w.numel);
    copy_shard(v.shard, v.shape, slice.data(), full.data(), false);
    double max_want = 0;
    for (float x : slice) max_want = std::max(max_want, static_cast<double>(std::abs(x)));
    std::int64_t bad = 0, first = -1;
    for (std::int64_t i = 0; i < v.numel; ++i) {
      const double g = got[static_cast<std::size_t>(v.offset + i)], x = slice[static_cast<std::size_t>(i)];
      const bool ok = std::abs(g - x) <= tol.abs + tol.rel * std::abs(x) + tol.scale * max_want;
      if (!ok && bad++ == 0) first = i;
    }
    if (bad > 0) {
      const double g = got[static_cast<std::size_t>(v.offset + first)],
                   x = slice[static_cast<std::size_t>(first)];
      return ::testing::AssertionFailure() << fmt::format(
                 "first differing tensor {}: element {} of {} is {:.9g} but the reference has {:.9g} "
                 "(difference {:.3g}, max |reference| {:.3g}); {} element(s) of it differ",
                 v.name, first, v.numel, g, x, g - x, max_want, bad);
    }
  }
  return ::testing::AssertionSuccess();
}

/// The same for two models' gradients.
inline ::testing::AssertionResult same_grads(const model::Model& got, const model::Model& want,
                                             Tolerance tol = {}) {
  return same_by_name(got.params(), got.params().grads(), want.params(), want.params().grads(), tol);
}

}  // namespace ndmesh::testing_support
