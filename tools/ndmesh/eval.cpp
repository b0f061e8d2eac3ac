// `ndmesh eval`: the mean next-token loss (and perplexity) of a checkpoint over consecutive
// batches read from the start of a token file, under any layout (train::evaluate).
#include <memory>
#include <string>

#include <fmt/core.h>

#include "mesh_flags.hpp"
#include "ndmesh/train/run.hpp"
#include "subcommand.hpp"

// Its own namespace: the tool compiles as a unity build (CMakeLists.txt), where every
// subcommand's file shares one translation unit with the others.
namespace ndmesh::cli::eval_command {
namespace {

struct EvalFlags {
  train::RunOptions options;
  MeshFlags layout;
  std::int64_t batches = 0;
  bool json = false;
};

Action setup(CLI::App& app) {
  auto f = std::make_shared<EvalFlags>();
  train::RunOptions& o = f->options;
  f->layout.add_to(app);
  app.add_option(
         "--load", o.load,
         "checkpoint directory (ndmesh train --save, or ndmesh checkpoint import-hf) or Hugging Face folder "
         "(config.json + safetensors); its description is the model")
      ->required();
  app.add_option("--data", o.data,
                 "token file: an llm.c shard or raw uint16 tokens (.bin), or the bytes of any other file")
      ->required();
  app.add_option("--data-format", o.data_format, "how --data is read: auto, bytes, llmc or uint16")
      ->capture_default_str();
  app.add_option("--seq", o.train.model.seq, "tokens per sequence (T)")->required();
  app.add_option("--batch", o.train.batch, "sequences per batch over all ranks (B, the global batch)")
      ->required();
  app.add_option("--batches", f->batches, "batches (N): the first N x B x T + 1 tokens of --data are read")
      ->required();
  app.add_option("--micro-batch", o.train.micro_batch,
                 "sequences per micro-batch per data-parallel rank (0: the whole local batch)")
      ->capture_default_str();
  app.add_option("--device", o.device, "cpu or cuda")->capture_default_str();
  app.add_option("--threads", o.threads, "BLAS threads (0: NDMESH_THREADS, else the core count)")
      ->capture_default_str();
  app.add_flag("--json", f->json, "print {\"loss\": ..., \"perplexity\": ..., \"tokens\": ...} on one line");
  app.footer(
      "Examples:\n"
      "  ndmesh eval --load run.ckpt --data val.bin --seq 64 --batch 8 --batches 4\n"
      "  mpirun -np 2 ndmesh eval --load run.ckpt --data val.bin --seq 64 --batch 8 --batches 4 --tp 2 "
      "--json");
  return [f] {
    train::RunOptions run = f->options;
    run.model_given = {"seq"};
    run.config_path = f->layout.config_path();
    f->layout.set_default_sizes({{"dp", -1}});
    f->layout.set_fold_ep(true);  // as in train: a MoE model's expert parallelism
    run.layout = [f](std::int64_t world) { return f->layout.resolve(world).config; };
    const train::EvalReport r = train::evaluate(run, f->batches);
    if (!r.lead) return 0;
    if (f->json)
      fmt::print("{}\n", r.json);
    else
      fmt::print("eval {} on {}: loss {:.6f}, perplexity {:.4f} over {} tokens ({} batches of {} x {})\n",
                 run.load, run.data, r.loss, r.perplexity, r.tokens, f->batches, run.train.batch,
                 run.train.model.seq);
    return 0;
  };
}

const Subcommand kEval{
    "eval",
    "Mean next-token loss and perplexity of a checkpoint on the first batches of a token file, "
    "under any layout",
    setup};

}  // namespace
}  // namespace ndmesh::cli::eval_command
