#include "ndmesh/parallel/optimizer.hpp"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <memory>

#include <fmt/format.h>

#include "ndmesh/core/error.hpp"

namespace ndmesh::parallel {

Optimizer::Optimizer(RankModel& model, GradSync& sync, const nn::AdamWOptions& options,
                     const OffloadOptions& offload, int world_rank)
    : sync_(sync) {
  const std::string prefix = fmt::format("rank{:05}-", world_rank);
  // --offload optimizer on a GPU: pinned host memory, no files.
  const bool pinned = offload.what == Offload::kOptimizer && model.plan.device == Device::kCuda;
  if (offload.what != Offload::kNone && !pinned) {
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
        std::make_unique<nn::AdamW<float>>(model.chunks[c]->params(), options, sync.owned_segments(c)));
    if (pinned)
      adams_.back()->offload_to_host(offload.chunk_elements > 0 ? offload.chunk_elements
                                                                : nn::PinnedOffload::kDefaultChunk);
    else if (offload.what != Offload::kNone)
      adams_.back()->offload_to(
          (std::filesystem::path(offload.dir) / fmt::format("{}chunk{}.adamw", prefix, c)).string(),
          offload.chunk_elements > 0 ? offload.chunk_elements : nn::OffloadFile::kDefaultChunk);
    if (offload.what == Offload::kOptimizerParams) {
      // The shard of the parameters in a file beside the moments: gathered units read their
      // own block from it, the step streams it with the moments (same state order).
      ParamGatherer* g = sync.gatherer(c);
      NDMESH_CHECK_CONFIG(g != nullptr, "offload",
                          "--offload=optimizer+params needs ZeRO-3 over a gradient group of 2 or more ranks "
                          "(--zero 3 with --dp or --cp above 1); use --offload optimizer");
      std::int64_t elements = 0;
      for (const nn::Segment& seg : g->shard()) elements += seg.count;
      params_files_.push_back(std::make_unique<nn::OffloadArray>(
          (std::filesystem::path(offload.dir) / fmt::format("{}chunk{}.params.adamw", prefix, c)).string(),
          elements));
      nn::OffloadArray* file = params_files_.back().get();
      g->offload_to(file);
      float* params = model.chunks[c]->params().params().data();
      const std::vector<nn::Segment>& shard = g->shard();
      auto staging = std::make_shared<std::vector<float>>();
      // Runs of the flat buffer holding state elements [first, first + count).
      auto each_run = [&shard](std::int64_t first, std::int64_t count, auto&& f) {
        std::int64_t at = 0;
        for (const nn::Segment& seg : shard) {
          const std::int64_t lo = std::max(first, at), hi = std::min(first + count, at + seg.count);
          if (lo < hi) f(seg.offset + (lo - at), hi - lo, lo - first);
          at += seg.count;
        }
      };
      adams_.back()->set_chunk_hook(
          [file, params, staging, each_run](std::int64_t first, std::int64_t count, bool done) {
            std::vector<float>& buf = *staging;
            buf.resize(static_cast<std::size_t>(count));
            if (!done) {
              file->read(first, count, buf.data());
              each_run(first, count, [&](std::int64_t flat, std::int64_t n, std::int64_t at) {
                std::copy_n(buf.data() + at, n, params + flat);
              });
              return;
            }
            each_run(first, count, [&](std::int64_t flat, std::int64_t n, std::int64_t at) {
              std::copy_n(params + flat, n, buf.data() + at);
              release_memory(params + flat, n, std::numeric_limits<float>::quiet_NaN());
            });
            file->write(first, count, buf.data());
            std::vector<float>().swap(buf);
          });
    }
  }
}

std::int64_t Optimizer::offloaded_param_elements() const {
  std::int64_t n = 0;
  for (const auto& f : params_files_) n += f->elements();
  return n;
}

std::int64_t Optimizer::offload_window_bytes() const {
  std::int64_t n = 0;
  for (const auto& a : adams_)
    if (a->offload()) n += a->offload()->window_bytes();
  return n;
}

std::int64_t Optimizer::pinned_host_bytes() const {
  std::int64_t n = 0;
  for (const auto& a : adams_)
    if (a->pinned()) n += a->pinned()->host_bytes();
  return n;
}

std::int64_t Optimizer::pinned_bytes_to_host() const {
  std::int64_t n = 0;
  for (const auto& a : adams_)
    if (a->pinned()) n += a->pinned()->bytes_to_host;
  return n;
}

std::int64_t Optimizer::pinned_bytes_to_device() const {
  std::int64_t n = 0;
  for (const auto& a : adams_)
    if (a->pinned()) n += a->pinned()->bytes_to_device;
  return n;
}

std::int64_t Optimizer::offload_bytes_read() const {
  std::int64_t n = 0;
  for (const auto& a : adams_)
    if (a->offload()) n += a->offload()->bytes_read();
  for (const auto& f : params_files_) n += f->bytes_read();
  return n;
}

std::int64_t Optimizer::offload_bytes_written() const {
  std::int64_t n = 0;
  for (const auto& a : adams_)
    if (a->offload()) n += a->offload()->bytes_written();
  for (const auto& f : params_files_) n += f->bytes_written();
  return n;
}

double Optimizer::offload_io_seconds() const {
  double s = 0;
  for (const auto& a : adams_)
    if (a->offload()) s += a->offload()->io_seconds();
  return s;
}

void Optimizer::step(double lr, nn::GradNorm grad_norm) {
  for (std::size_t c = 0; c < adams_.size(); ++c) {
    adams_[c]->update(chunks_[c]->params(), lr, grad_norm, sync_.owned_grads(c));
    sync_.gather_params(c, chunks_[c]->params());
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
