// ndmesh checkpoint inspect DIR: what a checkpoint directory holds (its manifest), and
// with --verify whether every slice still matches its checksum.
// ndmesh checkpoint convert FILE DIR: a single-file checkpoint (format 2, written by ndmesh
// before checkpoint directories) as a checkpoint directory, which train --load reads.
// ndmesh checkpoint import-hf HF_DIR DIR / export-hf DIR HF_DIR: Hugging Face folders
// (config.json + safetensors, GPT-2 and Llama) in and out (model/hf.hpp).
#include <memory>
#include <set>
#include <string>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/model/checkpoint.hpp"
#include "ndmesh/model/checkpoint_dir.hpp"
#include "ndmesh/model/hf.hpp"
#include "ndmesh/model/safetensors.hpp"
#include "subcommand.hpp"

// Its own namespace: the tool compiles as a unity build (CMakeLists.txt), where every
// subcommand's file shares one translation unit with the others.
namespace ndmesh::cli::checkpoint_command {
namespace {

struct Options {
  std::string dir;
  bool json = false;
  bool verify = false;
  std::string file;  // convert
  std::string hf;    // import-hf, export-hf
  std::string dtype = "fp32";
  bool force = false;
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
  fmt::print(
      "converted {} (format 2, step {}) into checkpoint directory {} ({} tensors); load it with "
      "ndmesh train --load {} under any layout\n",
      o.file, m.step, o.dir, m.tensors.size(), o.dir);
  return 0;
}

int import_hf(const Options& o) {
  const model::HfImportReport r = model::import_hf(o.hf, o.dir, o.force);
  for (const std::string& name : r.ignored)
    fmt::print("note: '{}' holds '{}', which no ndmesh parameter reads (ignored)\n", o.hf, name);
  const ModelSpec& s = r.spec;
  fmt::print(
      "imported {} ({} layers, hidden {}, heads {}/{} kv, vocab {}, {} head; {} tensors, {} parameters) into "
      "checkpoint directory {}, weights only: ndmesh train --load {} starts a fresh run from it on any "
      "--data, under any layout\n",
      o.hf, s.layers, s.hidden, s.heads, s.kv_heads_or_heads(), s.vocab,
      s.tied_embeddings ? "tied" : "untied", r.tensors, r.parameters, o.dir, o.dir);
  return 0;
}

int export_hf(const Options& o) {
  const model::HfExportReport r = model::export_hf(o.dir, o.hf, {.dtype = o.dtype, .force = o.force});
  fmt::print(
      "exported {} as Hugging Face {} folder {} ({} {}, {} bytes of {}); load it with "
      "transformers' AutoModelForCausalLM.from_pretrained(\"{}\")\n",
      o.dir, arch_name(r.spec), o.hf, r.files, r.files == 1 ? model::kSafetensorsFile : "shards", r.bytes,
      o.dtype, o.hf);
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
               s.ffn_or_default(), s.seq, s.vocab,
               s.tied_embeddings ? ", tied embeddings" : ", untied embeddings");
    fmt::print("step {} (AdamW step {}); data: {}, position {}\n", m.step, m.adam_steps, m.data, m.step);
    const model::CheckpointLayout& l = m.layout;
    fmt::print("written by {} ({} ranks), ZeRO {}, blocks per chunk {}{}{}{}\n", l.mesh, l.world, l.zero,
               fmt::join(l.partition, ","),
               l.virtual_stages > 1 ? fmt::format(", {} virtual stages", l.virtual_stages) : "",
               l.sequence_parallel ? ", sequence parallel" : "",
               l.cp_layout.empty() ? "" : fmt::format(", cp layout {}", l.cp_layout));
    if (const model::ScheduleRecord& r = m.schedule; !r.name.empty())
      fmt::print(
          "learning rate: --lr-schedule {} --lr {} --warmup {} --steps {} --min-lr-ratio {} --decay-fraction "
          "{}\n",
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
                 dim < 0 ? std::string("whole") : fmt::format("{} slices along dim {}", t.slices.size(), dim),
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
  in->footer(
      "Example: ndmesh train --steps 20 --save run.ckpt && ndmesh checkpoint inspect run.ckpt --verify");
  CLI::App* cv = app.add_subcommand(
      "convert",
      "Write a single-file checkpoint (format 2, from ndmesh before checkpoint directories) as a "
      "checkpoint directory");
  cv->add_option("file", o->file, "single-file checkpoint (format 2)")->required();
  cv->add_option("dir", o->dir, "checkpoint directory to write (replaced if it exists)")->required();
  cv->footer(
      "Example: ndmesh checkpoint convert old.ckpt run.ckpt && ndmesh train --load run.ckpt --steps 200");
  CLI::App* im = app.add_subcommand(
      "import-hf",
      "Write a Hugging Face folder (config.json + safetensors; gpt2 or llama) as a checkpoint "
      "directory that ndmesh train --load starts a fresh run from (docs/finetune-hf.md)");
  im->add_option("hf_dir", o->hf, "folder written by transformers' save_pretrained")->required();
  im->add_option("dir", o->dir, "checkpoint directory to write (appears only when complete)")->required();
  im->add_flag("--force", o->force, "replace DIR if it exists");
  im->footer(
      "Example: ndmesh checkpoint import-hf gpt2-hf gpt2.ckpt && ndmesh train --load gpt2.ckpt --data "
      "tokens.bin --vocab 50257 --steps 100 --save tuned.ckpt");
  CLI::App* ex = app.add_subcommand(
      "export-hf",
      "Write a checkpoint directory as a Hugging Face folder (config.json + model.safetensors) that "
      "transformers' from_pretrained loads");
  ex->add_option("dir", o->dir, "checkpoint directory written by ndmesh train --save or import-hf")
      ->required();
  ex->add_option("hf_dir", o->hf, "folder to write (appears only when complete)")->required();
  ex->add_option("--dtype", o->dtype, "element type of the tensors: fp32 or bf16")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  ex->add_flag("--force", o->force, "replace HF_DIR if it exists");
  ex->footer("Example: ndmesh checkpoint export-hf tuned.ckpt tuned-hf --dtype bf16");
  return [o, in, cv, im] {
    if (in->parsed()) return inspect(*o);
    if (cv->parsed()) return convert(*o);
    if (im->parsed()) return import_hf(*o);
    return export_hf(*o);
  };
}

const Subcommand kCheckpoint{
    "checkpoint", "Inspect, verify and convert checkpoints; Hugging Face folders in and out", setup};

}  // namespace
}  // namespace ndmesh::cli::checkpoint_command
