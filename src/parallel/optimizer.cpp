#include "ndmesh/parallel/optimizer.hpp"

#include <filesystem>

#include <fmt/format.h>

#include "ndmesh/core/error.hpp"

namespace ndmesh::parallel {

Optimizer::Optimizer(RankModel& model, GradSync& sync, const nn::AdamWOptions& options,
                     const OffloadOptions& offload, int world_rank)
    : sync_(sync) {
  const std::string prefix = fmt::format("rank{:05}-", world_rank);
  if (offload.what != Offload::kNone) {
    // The files are removed when the run ends, by an error too: any left are a killed run's.
    const auto stale = nn::find_stale_offload(offload.dir, prefix);
    if (!stale.empty())
      fail<ConfigError>(
          "offload",
          "--offload-dir={} holds {} offload file(s) of a run that was killed ({}{}); they are "
          "scratch state, not a checkpoint (resume with --load from the last --save): clear them "
          "with: rm -f {}/rank*.adamw",
          offload.dir, stale.size(), stale.front(), stale.size() > 1 ? ", ..." : "", offload.dir);
  }
  for (std::size_t c = 0; c < model.chunks.size(); ++c) {
    chunks_.push_back(model.chunks[c].get());
    adams_.push_back(
        std::make_unique<nn::AdamW<float>>(model.chunks[c]->params(), options, sync.reducer(c).shard()));
    if (offload.what != Offload::kNone)
      adams_.back()->offload_to(
          (std::filesystem::path(offload.dir) / fmt::format("{}chunk{}.adamw", prefix, c)).string(),
          offload.chunk_elements > 0 ? offload.chunk_elements : nn::OffloadFile::kDefaultChunk);
  }
}

std::int64_t Optimizer::offload_window_bytes() const {
  std::int64_t n = 0;
  for (const auto& a : adams_)
    if (a->offload()) n += a->offload()->window_bytes();
  return n;
}

std::int64_t Optimizer::offload_bytes_read() const {
  std::int64_t n = 0;
  for (const auto& a : adams_)
    if (a->offload()) n += a->offload()->bytes_read();
  return n;
}

std::int64_t Optimizer::offload_bytes_written() const {
  std::int64_t n = 0;
  for (const auto& a : adams_)
    if (a->offload()) n += a->offload()->bytes_written();
  return n;
}

double Optimizer::offload_io_seconds() const {
  double s = 0;
  for (const auto& a : adams_)
    if (a->offload()) s += a->offload()->io_seconds();
  return s;
}

void Optimizer::step(double lr, double grad_norm) {
  for (std::size_t c = 0; c < adams_.size(); ++c) {
    GradReducer& r = sync_.reducer(c);
    adams_[c]->update(chunks_[c]->params(), lr, grad_norm, r.shard_grads());
    r.gather_params(chunks_[c]->params().params().data());
  }
  sync_.params_updated();
}

void Optimizer::set_steps(std::int64_t steps) {
  for (auto& a : adams_) a->set_steps(steps);
}

std::int64_t Optimizer::state_elements() const {
  std::int64_t n = 0;
  for (const auto& a : adams_) n += 2 * a->state_elements();
  return n;
}

}  // namespace ndmesh::parallel
