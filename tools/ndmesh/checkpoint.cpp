// ndmesh checkpoint inspect DIR: what a checkpoint directory holds (its manifest), and
// with --verify whether every slice still matches its checksum.
// ndmesh checkpoint convert FILE DIR: a single-file checkpoint (format 2, written by ndmesh
// before checkpoint directories) as a checkpoint directory, which train --load reads.
#include <memory>
#include <set>
#include <string>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/model/checkpoint.hpp"
#include "ndmesh/model/checkpoint_dir.hpp"
#include "subcommand.hpp"

namespace ndmesh::cli {
namespace {

struct Options {
  std::string dir;
  bool json = false;
  bool verify = false;
  std::string file;  // convert
};

// A path that is not a readable checkpoint is bad input to this command (exit 2).
[[noreturn]] void bad_input(const IoError& e) {
  const std::string what = e.what();  // "[checkpoint] ...": keep one prefix
  throw ConfigError("checkpoint", what.substr(what.find("] ") + 2));
}

int convert(const Options& o) {
  try {
    model::convert_to_checkpoint_dir(o.file, o.dir);
  } catch (const IoError& e) {
    bad_input(e);
  }
  const model::Manifest m = model::read_manifest(o.dir);
  fmt::print("converted {} (format 2, step {}) into checkpoint directory {} ({} tensors); load it with "
             "ndmesh train --load {} under any layout\n",
             o.file, m.step, o.dir, m.tensors.size(), o.dir);
  return 0;
}

int inspect(const Options& o) {
  model::Manifest m;
  try {
    m = model::read_manifest(o.dir);
  } catch (const IoError& e) {
    bad_input(e);
  }
  if (o.json) {
    fmt::print("{}", model::manifest_json(m));
  } else {
    const ModelSpec& s = m.spec;
    fmt::print("checkpoint {} (format {})\n", o.dir, m.version);
    fmt::print("model: {}layers={} hidden={} heads={} kv_heads={} ffn={} seq={} vocab={}{}\n",
               s.name.empty() ? "" : s.name + " ", s.layers, s.hidden, s.heads, s.kv_heads_or_heads(),
               s.ffn_or_default(), s.seq, s.vocab, s.tied_embeddings ? ", tied embeddings" : ", untied embeddings");
    fmt::print("step {} (AdamW step {}); data: {}, position {}\n", m.step, m.adam_steps, m.data, m.step);
    const model::CheckpointLayout& l = m.layout;
    fmt::print("written by {} ({} ranks), ZeRO {}, blocks per chunk {}{}{}{}\n", l.mesh, l.world, l.zero,
               fmt::join(l.partition, ","), l.virtual_stages > 1 ? fmt::format(", {} virtual stages", l.virtual_stages) : "",
               l.sequence_parallel ? ", sequence parallel" : "",
               l.cp_layout.empty() ? "" : fmt::format(", cp layout {}", l.cp_layout));
    if (const model::ScheduleRecord& r = m.schedule; !r.name.empty())
      fmt::print("learning rate: --lr-schedule {} --lr {} --warmup {} --steps {} --min-lr-ratio {} --decay-fraction {}\n",
                 r.name, r.lr, r.warmup, r.steps, r.min_lr_ratio, r.decay_fraction);
    std::int64_t bytes = 0;
    for (const model::FileRecord& f : m.files) bytes += f.bytes;
    fmt::print("files: {} shard files, {} bytes\n", m.files.size(), bytes);
    for (const model::FileRecord& f : m.files) fmt::print("  {:<28} {:>12} bytes\n", f.name, f.bytes);
    std::int64_t params = 0;
    for (const model::TensorRecord& t : m.tensors) {
      std::int64_t n = 1;
      for (std::int64_t d : t.shape) n *= d;
      params += n;
    }
    fmt::print("tensors: {} ({} parameters, each with AdamW m and v)\n", m.tensors.size(), params);
    for (const model::TensorRecord& t : m.tensors) {
      std::set<std::string> files;
      for (const model::SliceRecord& sl : t.slices) files.insert(sl.file);
      const int dim = t.slices.front().dim;
      fmt::print("  {:<28} [{}]  {}  in {}\n", t.name, fmt::join(t.shape, ", "),
                 dim < 0 ? std::string("whole")
                         : fmt::format("{} slices along dim {}", t.slices.size(), dim),
                 fmt::join(files, ", "));
    }
  }
  if (o.verify) {
    const std::int64_t read = model::verify_checkpoint_dir(o.dir, m);  // IoError (exit 1) naming the file
    if (!o.json)
      fmt::print("verified: {} bytes in {} files, every slice matches its checksum\n", read, m.files.size());
  }
  return 0;
}

Action setup(CLI::App& app) {
  auto o = std::make_shared<Options>();
  app.require_subcommand(1);
  CLI::App* in = app.add_subcommand("inspect", "Print what a checkpoint directory holds (its manifest)");
  in->add_option("dir", o->dir, "checkpoint directory written by ndmesh train --save")->required();
  in->add_flag("--json", o->json, "print the manifest itself (JSON)");
  in->add_flag("--verify", o->verify,
               "also read every slice and check its checksum (exit 1 naming the file when one fails)");
  in->footer("Example: ndmesh train --steps 20 --save run.ckpt && ndmesh checkpoint inspect run.ckpt --verify");
  CLI::App* cv = app.add_subcommand(
      "convert", "Write a single-file checkpoint (format 2, from ndmesh before checkpoint directories) as a "
                 "checkpoint directory");
  cv->add_option("file", o->file, "single-file checkpoint (format 2)")->required();
  cv->add_option("dir", o->dir, "checkpoint directory to write (replaced if it exists)")->required();
  cv->footer("Example: ndmesh checkpoint convert old.ckpt run.ckpt && ndmesh train --load run.ckpt --steps 200");
  return [o, in] { return in->parsed() ? inspect(*o) : convert(*o); };
}

const Subcommand kCheckpoint{"checkpoint", "Inspect, verify and convert checkpoints", setup};

}  // namespace
}  // namespace ndmesh::cli
