#include "ndmesh/parallel/checkpoint_io.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ndmesh/comm/tags.hpp"
#include "ndmesh/core/env.hpp"
#include "ndmesh/core/error.hpp"
#include "ndmesh/model/checkpoint.hpp"
#include "ndmesh/model/hf.hpp"

namespace ndmesh::parallel {

namespace {
// A string carried in int64 words (the communicator moves numbers), and back.
std::vector<std::int64_t> to_words(const std::string& text) {
  std::vector<std::int64_t> words((text.size() + 7) / 8 + 1, 0);
  words[0] = static_cast<std::int64_t>(text.size());
  std::memcpy(words.data() + 1, text.data(), text.size());
  return words;
}
std::string from_words(const std::vector<std::int64_t>& words) {
  return std::string(reinterpret_cast<const char*>(words.data() + 1), static_cast<std::size_t>(words[0]));
}

constexpr int kManifestPartTag = comm::tags::kCheckpointParts;  // the writers' manifest parts, to rank 0

// A block of a local slice and where it is in the logical (serial) tensor, both seen as
// matrices [shape[0], numel / shape[0]] (a vector: [n, 1]).
struct HfBlock {
  std::int64_t row = 0, col = 0;            // in the local slice
  std::int64_t full_row = 0, full_col = 0;  // in the logical tensor
  std::int64_t rows = 0, cols = 0;
};

// Appends the blocks of the logical tensor that fill elements [begin, end) of the local
// slice `v`: the range cut into a partial first row, whole rows and a partial last row, each
// piece of it mapped through the tp split (a piece of rows along dim 0, of columns along dim
// 1; padding rows past the tensor's end map to nothing).
void hf_blocks(const ParamView& v, std::int64_t begin, std::int64_t end, std::vector<HfBlock>& out) {
  const ParamShard& sh = v.shard;
  const std::int64_t ld = v.numel / v.shape[0];
  NDMESH_CHECK(sh.dim < 1 || (sh.dim == 1 && v.shape.size() == 2), "checkpoint",
               "'{}' is split along dim {} of {}; a Hugging Face load reads row or column slices of matrices",
               v.name, sh.dim, v.shape.size());
  auto rect = [&](std::int64_t r0, std::int64_t r1, std::int64_t c0, std::int64_t c1) {
    if (sh.dim < 0) {
      out.push_back({r0, c0, r0, c0, r1 - r0, c1 - c0});
      return;
    }
    const std::int64_t full_along = sh.full_shape[static_cast<std::size_t>(sh.dim)];
    std::int64_t at = 0;  // along the split dim, in the local slice
    for (const ParamShard::Piece& p : sh.pieces) {
      const std::int64_t start = p.start + static_cast<std::int64_t>(sh.rank) * p.length;
      const std::int64_t valid = std::clamp<std::int64_t>(full_along - start, 0, p.length);
      const std::int64_t a0 = sh.dim == 0 ? r0 : c0, a1 = sh.dim == 0 ? r1 : c1;
      const std::int64_t lo = std::max(a0, at), hi = std::min(a1, at + valid);
      if (lo < hi) {
        if (sh.dim == 0)
          out.push_back({lo, c0, start + lo - at, c0, hi - lo, c1 - c0});
        else
          out.push_back({r0, lo, r0, start + lo - at, r1 - r0, hi - lo});
      }
      at += p.length;
    }
  };
  for (std::int64_t a = begin; a < end;) {
    const std::int64_t r = a / ld, c = a % ld;
    if (c != 0 || end - a < ld) {  // part of one row
      const std::int64_t e = std::min(end, (r + 1) * ld);
      rect(r, r + 1, c, c + (e - a));
      a = e;
    } else {  // whole rows
      const std::int64_t rows = (end - a) / ld;
      rect(r, r + rows, 0, ld);
      a += rows * ld;
    }
  }
}
}  // namespace

void agree_or_throw(const comm::Communicator& world, const std::string& what, const std::function<void()>& work,
                    const std::function<void()>& on_failure) {
  std::exception_ptr error;
  try {
    work();
  } catch (...) {  // any exception: a peer must not be left waiting in the all-reduce below
    error = std::current_exception();
  }
  std::int64_t failed = error ? 1 : 0;
  world.all_reduce(std::span<std::int64_t>(&failed, 1));
  if (failed > 0 && on_failure) {
    // Every rank knows now. The clean-up is done before any rank throws: among several ranks
    // the first to report ends the job (MPI_Abort), which would cut it short; the barrier
    // holds the others until it is done.
    try {
      on_failure();
    } catch (...) {  // the clean-up's own failure must not leave the others in the barrier
    }
    world.barrier();
  }
  if (error) std::rethrow_exception(error);
  if (failed > 0)
    fail<PeersFailed>("checkpoint", "{}: {} other rank(s) failed (their errors above say why)", what, failed);
}

namespace {
// A failed save's clean-up (agree_or_throw's on_failure): rank 0, which prepared the temporary
// directory, removes it; a full disk keeps no half-written copy, the previous checkpoint stays.
std::function<void()> discarding(const std::string& tmp, const comm::Communicator& world) {
  return [&tmp, &world] {
    if (world.rank() == 0) model::discard_checkpoint_temp_dir(tmp);
  };
}

// Phase 1 (collective): rank 0 prepares the temporary directory.
void prepare(const std::string& tmp, const std::string& what, const comm::Communicator& world) {
  agree_or_throw(
      world, what, [&] {
        if (world.rank() == 0) model::prepare_checkpoint_temp_dir(tmp);
      },
      discarding(tmp, world));
}

// Phase 2 (this rank alone, no communication): its shard file; its manifest part (empty when
// it writes none). `cancel` stops it between slices.
std::string write_shard(const std::string& tmp, const StateDict& state, int rank,
                        const std::atomic<bool>* cancel = nullptr) {
  if (state.file().empty()) return {};
  model::ShardFileWriter writer(tmp, state.file(), rank);
  std::vector<model::TensorRecord> records;
  for (const StateEntry& e : state.entries()) {
    if (!e.writes) continue;
    if (cancel != nullptr && cancel->load()) fail<IoError>("checkpoint", "the save into '{}' was stopped", tmp);
    const ParamView& view = *e.view;
    model::TensorRecord r{view.name, view.shard.dim >= 0 ? view.shard.full_shape : view.shape, {}};
    if (auto slice = writer.append(view.shard, view.shape, e.params, e.m, e.v)) r.slices.push_back(*slice);
    records.push_back(std::move(r));
  }
  return model::manifest_part(records, writer.close());
}

// A test hook: a kill during this pause must leave the previous checkpoint in place.
void test_pause(const std::atomic<bool>* cancel = nullptr) {
  if (!env::raw("NDMESH_CHECKPOINT_PAUSE_S")) return;
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                         std::chrono::duration<double>(env::seconds("NDMESH_CHECKPOINT_PAUSE_S", 0)));
  while (std::chrono::steady_clock::now() < until && !(cancel != nullptr && cancel->load()))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

// Phase 3 (collective): the parts travel to rank 0, which writes the manifest, checks it and
// swaps the directory in.
void commit_parts(const std::string& tmp, const std::string& dir, const std::string& part,
                  const CheckpointInfo& info, int keep, const comm::Communicator& world) {
  const std::string what = fmt::format("saving '{}'", dir);
  std::vector<std::int64_t> words = part.empty() ? std::vector<std::int64_t>{} : to_words(part);
  const auto mine = static_cast<std::int64_t>(words.size());
  std::vector<std::int64_t> counts(static_cast<std::size_t>(world.size()));
  world.all_gather(std::span<const std::int64_t>(&mine, 1), std::span<std::int64_t>(counts));
  if (world.rank() != 0 && mine > 0) world.send(std::span<const std::int64_t>(words), 0, {.tag = kManifestPartTag});
  std::vector<std::string> parts;  // rank 0: every writer's part (received before any can fail)
  if (world.rank() == 0) {
    if (mine > 0) parts.push_back(part);
    for (int k = 1; k < world.size(); ++k) {
      const std::int64_t count = counts[static_cast<std::size_t>(k)];
      if (count == 0) continue;
      std::vector<std::int64_t> theirs(static_cast<std::size_t>(count));
      world.recv(std::span<std::int64_t>(theirs), k, {.tag = kManifestPartTag});
      parts.push_back(from_words(theirs));
    }
  }
  agree_or_throw(world, what, [&] {
    if (world.rank() != 0) return;
    model::Manifest manifest;
    manifest.spec = info.spec;
    manifest.step = info.step;
    manifest.adam_steps = info.adam_steps;
    manifest.data = info.data;
    manifest.layout = info.layout;
    manifest.schedule = info.schedule;
    for (const std::string& p : parts) model::add_manifest_part(manifest, p);
    model::write_manifest(tmp, manifest);
    model::commit_checkpoint_dir(tmp, dir, keep);
  }, discarding(tmp, world));
}

void save_into(const std::string& tmp, const std::string& dir, const StateDict& state,
               const CheckpointInfo& info, const comm::Communicator& world, int keep) {
  const std::string what = fmt::format("saving '{}'", dir);
  prepare(tmp, what, world);
  std::string part;
  agree_or_throw(world, what, [&] { part = write_shard(tmp, state, world.rank()); }, discarding(tmp, world));
  test_pause();
  commit_parts(tmp, dir, part, info, keep, world);
}
}  // namespace

void save_checkpoint_dir(const std::string& dir, const StateDict& state, const CheckpointInfo& info,
                         const comm::Communicator& world, int keep) {
  const std::string tmp = model::checkpoint_temp_dir(dir);
  try {
    save_into(tmp, dir, state, info, world, keep);
  } catch (...) {
    // An agreed failure was cleaned up before anyone threw (discarding); this is for the
    // others (a communication failure): rank 0, which prepared it, removes it.
    if (world.rank() == 0) model::discard_checkpoint_temp_dir(tmp);
    throw;
  }
}

BackgroundSave::BackgroundSave(std::string dir, std::unique_ptr<StateDict> state, CheckpointInfo info, int keep,
                               comm::Communicator world)
    : dir_(std::move(dir)),
      tmp_(model::checkpoint_temp_dir(dir_)),
      state_(std::move(state)),
      info_(std::move(info)),
      keep_(keep),
      world_(std::move(world)) {
  prepare(tmp_, fmt::format("saving '{}'", dir_), world_);
  // The parameters the entries point at may be the live ones: copied, so that training can go on.
  for (StateEntry& e : state_->entries()) {
    if (!e.writes) continue;
    params_.emplace_back(e.params, e.params + e.view->numel);
    e.params = params_.back().data();
  }
  thread_ = std::thread([this] {
    try {
      part_ = write_shard(tmp_, *state_, world_.rank(), &cancel_);
      test_pause(&cancel_);
    } catch (...) {
      error_ = std::current_exception();
    }
    done_.store(true);
  });
}

BackgroundSave::~BackgroundSave() {
  cancel_.store(true);
  if (thread_.joinable()) thread_.join();
}

bool BackgroundSave::try_finish() {
  if (committed_) return true;
  std::int64_t writing = done_.load() ? 0 : 1;
  world_.all_reduce(std::span<std::int64_t>(&writing, 1));
  if (writing > 0) return false;
  thread_.join();
  commit();
  return true;
}

void BackgroundSave::finish() {
  while (!try_finish()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

void BackgroundSave::commit() {
  const std::string what = fmt::format("saving '{}'", dir_);
  try {
    agree_or_throw(
        world_, what, [&] {
          if (error_) std::rethrow_exception(error_);
        },
        discarding(tmp_, world_));
    commit_parts(tmp_, dir_, part_, info_, keep_, world_);
  } catch (...) {
    committed_ = true;  // failed for good: nothing more to do
    if (world_.rank() == 0) model::discard_checkpoint_temp_dir(tmp_);  // as in save_checkpoint_dir
    throw;
  }
  committed_ = true;
  state_.reset();
  params_.clear();
}

CheckpointInfo load_checkpoint_dir(const std::string& dir, StateDict& state, const ModelSpec& spec,
                                   const std::string& data, const comm::Communicator& world, bool any_data) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(dir, ec)) {
    // A file: a single-file checkpoint (format 2) gets the conversion command; anything else
    // the reader's own message (not a checkpoint, another version, truncated, ...).
    char magic[8] = {};
    std::ifstream(dir, std::ios::binary).read(magic, sizeof magic);
    if (std::string_view(magic, sizeof magic) != "NDMESHCK") model::load_checkpoint(dir);
    fail<ConfigError>("checkpoint",
                      "'{}' is a single-file checkpoint (format 2), which ndmesh train no longer reads; convert it "
                      "once with: ndmesh checkpoint convert {} DIR, then pass --load DIR",
                      dir, dir);
  }
  CheckpointInfo info;
  if (model::is_hf_dir(dir)) {
    // A Hugging Face folder: weights only (step 0, zero moments, any data). Each rank reads
    // only what it keeps: its tp slice (a range of rows, or of columns, of the logical
    // tensor), under ZeRO-3 only its blocks of it, and on a pipeline stage only its units'
    // tensors (the entries it has).
    agree_or_throw(world, fmt::format("loading '{}'", dir), [&] {
      model::HfFolder folder(dir);
      const auto diffs = model::spec_differences(folder.spec(), spec);
      if (!diffs.empty())
        fail<ConfigError>("checkpoint",
                          "Hugging Face folder '{}' does not match this run ({}); leave out the flags "
                          "that change its config.json's model",
                          dir, fmt::join(diffs, "; "));
      std::vector<HfBlock> blocks;
      for (StateEntry& e : state.entries()) {
        const ParamView& local = *e.view;
        const model::NdTensor* t = folder.find(local.name);
        const std::vector<std::int64_t>& full_shape =
            local.shard.dim >= 0 ? local.shard.full_shape : local.shape;
        if (t == nullptr || t->shape != full_shape)
          fail<IoError>("checkpoint", "'{}': the model's tensor '{}' [{}] is not in its Hugging Face mapping",
                        dir, local.name, fmt::join(full_shape, ", "));
        // Only the kept ranges are written: their padding rows zeroed here; under ZeRO-3 the
        // rest of the host copy (what others keep) and the moments are the state dict's
        // untouched zero pages (a load's StateDict), which stay out of the resident set.
        const std::int64_t ld = local.numel / local.shape[0];
        for (const auto& [begin, end] : e.keeps) {
          std::fill(e.params + begin, e.params + end, 0.0f);
          blocks.clear();
          hf_blocks(local, begin, end, blocks);
          for (const HfBlock& b : blocks)
            folder.read_block(*t, b.full_row, b.rows, b.full_col, b.cols, e.params + b.row * ld + b.col, ld);
        }
      }
      state.commit();
      info = {.spec = folder.spec(), .step = 0, .adam_steps = 0, .bytes_read = folder.bytes_read()};
    });
    return info;
  }
  agree_or_throw(world, fmt::format("loading '{}'", dir), [&] {
    const model::Manifest manifest = model::read_manifest(dir);
    auto diffs = model::spec_differences(manifest.spec, spec);
    // Weights without training state (an import) start a fresh run on any data.
    if (manifest.data != data && !manifest.weights_only() && !any_data)
      diffs.push_back(fmt::format("data: checkpoint has '{}', the run has '{}'", manifest.data, data));
    if (!diffs.empty())
      fail<ConfigError>("checkpoint", "'{}' does not match this run ({}); pass the flags it was saved with", dir,
                        fmt::join(diffs, "; "));
    for (StateEntry& e : state.entries()) {
      const model::TensorRecord* t = manifest.find(e.view->name);
      if (t == nullptr)
        fail<IoError>("checkpoint",
                      "'{}/{}' has no tensor '{}' although its model spec matches; the checkpoint is corrupt", dir,
                      model::kManifestFile, e.view->name);
      model::read_tensor(dir, manifest, *t, *e.view, e.params, e.m, e.v);
    }
    state.commit();
    info = {.spec = manifest.spec,
            .step = manifest.step,
            .adam_steps = manifest.adam_steps,
            .data = manifest.data,
            .layout = manifest.layout,
            .schedule = manifest.schedule};
  });
  return info;
}

}  // namespace ndmesh::parallel
