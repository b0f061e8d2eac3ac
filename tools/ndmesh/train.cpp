// `ndmesh train`: trains the GPT model, alone or under a launcher (mpirun, srun, ndmesh
// launch, torchrun) with the layout flags of `ndmesh mesh` (--dp N, --cp N, --tp N). A layout
// of size 1 is the serial run, on the same code path. With no data flag it trains on a
// seeded Markov chain whose entropy rate is known exactly, so the printout shows how far the
// loss is from the best possible.
//
// This file binds the flags onto the library's run options; the loop, its checks, what it
// prints and the --json report are train::run (include/ndmesh/train/run.hpp).
#include "train.hpp"

#include <algorithm>
#include <string>

#include "ndmesh/config/presets.hpp"
#include "ndmesh/train/run.hpp"
#include "subcommand.hpp"

namespace ndmesh::cli {
namespace {

// The model: a preset or the defaults, changed by the flags given (train::resolve_model).
void add_model_flags(CLI::App& app, train::RunOptions& o) {
  ModelSpec& m = o.train.model;
  const char* group = "Model";
  // A field of the description: its flag writes into it and names its key (the flag's name with
  // underscores), so that a value given wins over the preset's, the config's and --arch's.
  auto field = [&](const std::string& flag, auto& value, const std::string& help) {
    std::string key = flag.substr(2);
    std::replace(key.begin(), key.end(), '-', '_');
    return app.add_option(flag, value, help)
        ->each([&o, key](const std::string&) { o.model_given.push_back(key); })
        ->group(group);
  };
  app.add_option("--model", o.model_preset,
                 "start from this preset (" + model_preset_names() +
                     "); the other model flags change it (docs/models.md)")
      ->group(group);
  app.add_option(
         "--arch", o.arch,
         "the layers of a family over the sizes: gpt2 (LayerNorm, GELU, learned positions, biases, tied "
         "head) or llama (RMSNorm, SwiGLU, rotary positions, no biases, untied head)")
      ->group(group);
  field("--layers", m.layers, "transformer blocks")->capture_default_str();
  field("--hidden", m.hidden, "model width")->capture_default_str();
  field("--heads", m.heads, "attention heads (divides --hidden)")->capture_default_str();
  field("--kv-heads", m.kv_heads, "key/value heads (divides --heads; 0: same as --heads)")
      ->capture_default_str();
  field("--head-dim", m.head_dim, "the size of each attention head (0: hidden / heads)");
  field("--ffn", m.ffn,
        "MLP width (0: 4 * hidden with GELU, Llama's 8/3 * hidden rounded to 256 with SwiGLU)")
      ->capture_default_str();
  field("--seq", m.seq, "tokens per sequence")->capture_default_str();
  field("--vocab", m.vocab,
        "vocabulary (0: the data's: --markov-vocab, or 256 for a text --data; token files need it)")
      ->capture_default_str();
  field("--vocab-multiple", m.vocab_multiple,
        "pad the vocabulary's rows to a multiple of this (and of --tp); the padding is never a target")
      ->capture_default_str();
  app.add_option("--norm", o.norm, "layernorm (GPT-2) or rmsnorm (Llama)")->group(group);
  field("--norm-eps", m.norm_eps, "the norms' epsilon")->capture_default_str();
  app.add_option("--mlp", o.mlp, "gelu (GPT-2, 2 matrices) or swiglu (Llama, 3 matrices)")->group(group);
  app.add_option("--positions", o.positions, "learned (a position table, GPT-2) or rope (rotary, Llama)")
      ->group(group);
  field("--rope-theta", m.rope_theta, "the rotary base (Llama 2: 10000, Llama 3: 500000)");
  app.add_flag("--bias,!--no-bias", m.biases, "the linear layers carry biases (GPT-2) or not (Llama)")
      ->each([&o](const std::string&) { o.model_given.emplace_back("biases"); })
      ->group(group);
  app.add_flag("--untied", o.untied, "give the LM head its own weight instead of the token embedding")
      ->group(group);
  // Mixture of experts (docs/models.md).
  field("--experts", m.experts, "routed experts per MoE block (0: dense)")->capture_default_str();
  field("--top-k", m.top_k, "experts each token is routed to (1..--experts)")->capture_default_str();
  field("--shared-experts", m.shared_experts, "experts every token goes through beside the routed ones")
      ->capture_default_str();
  field("--expert-ffn", m.expert_ffn, "each expert's MLP width (0: --ffn's)")->capture_default_str();
  field("--moe-every", m.moe_every, "every n-th block (after the dense ones) is MoE")->capture_default_str();
  field("--moe-first-dense", m.moe_first_dense, "the first k blocks stay dense")->capture_default_str();
  app.add_option("--router", o.router,
                 "softmax (top-k of the softmax, Mixtral) or sigmoid (top-k of sigmoid scores plus a balancing "
                 "bias, DeepSeek-V3)")
      ->group(group);
  field("--aux-loss", m.aux_loss, "coefficient of the load-balancing loss (0: none)")->capture_default_str();
  field("--capacity-factor", m.capacity_factor,
        "tokens an expert takes, as a multiple of its even share; the rest are dropped in token order (0: dropless)")
      ->capture_default_str();
}

// The strategies' flags (Parallel and Memory groups).
void add_parallel_flags(CLI::App& app, train::RunOptions& o) {
  parallel::TrainOptions& t = o.train;
  train::Given& given = o.given;
  auto mark = [](bool& flag) { return [&flag](const std::string&) { flag = true; }; };
  app.add_option(
         "--micro-batch", t.micro_batch,
         "sequences per micro-batch per data-parallel rank (0: the whole local batch, no accumulation)")
      ->capture_default_str()
      ->group("Parallel");
  app.add_option("--bucket-mb", t.dp.bucket_mb, "gradient bucket size in MiB for the data-parallel reduction")
      ->capture_default_str()
      ->group("Parallel");
  app.add_flag("--no-overlap", o.no_overlap,
               "reduce gradients after the whole backward instead of overlapping it (the baseline)")
      ->group("Parallel");
  app.add_option("--grad-dtype", o.grad_dtype,
                 "element type of the gradient reduction: fp32, or bf16 (half the bytes; fp32 master weights "
                 "and optimizer state)")
      ->capture_default_str()
      ->group("Parallel");
  app.add_flag("--no-progress-thread", o.no_progress_thread,
               "with overlap: advance the buckets in flight from the backward itself (between sub-layers) "
               "instead of from a helper thread")
      ->group("Parallel");
  app.add_flag(
         "--sequence-parallel", t.sequence_parallel,
         "with --tp: norms and residuals hold 1/tp of the tokens (all-gather before the column-parallel "
         "linears, reduce-scatter after the row-parallel ones)")
      ->group("Parallel");
  app.add_option(
         "--zero", t.dp.zero,
         "ZeRO stage over dp (x cp): 0, 1 (shard optimizer state), 2 (and gradients) or 3 (and parameters: "
         "each block, the embedding and the head gathered before use and freed after)")
      ->capture_default_str()
      ->each(mark(given.zero))
      ->group("Parallel");
  app.add_option(
         "--zero3-reshard-after-forward", t.dp.zero3.reshard_after_forward,
         "with --zero 3: free a unit's gathered parameters after its forward and gather them again for "
         "its backward (true), or keep them until the backward (false: less communication, more memory)")
      ->capture_default_str()
      ->group("Parallel");
  app.add_option(
         "--zero3-prefetch", t.dp.zero3.prefetch,
         "with --zero 3: start gathering the next unit while the current one computes (true), or only "
         "when it is needed (false: the baseline the prefetch is measured against)")
      ->capture_default_str()
      ->group("Parallel");
  app.add_option(
         "--offload", o.offload,
         "keep state in files under --offload-dir instead of memory: none, optimizer (the AdamW moments, "
         "streamed through the step in chunks; the same results bit for bit) or optimizer+params (with "
         "--zero 3: the rank's parameter shard too, read back around each gather)")
      ->capture_default_str()
      ->each(mark(given.offload))
      ->group("Memory");
  app.add_option(
         "--offload-dir", o.offload_dir,
         "folder for the offload files (a local disk; one file per rank; removed at the end, and files "
         "left by a killed run are refused)")
      ->each(mark(given.offload_dir))
      ->group("Memory");
  app.add_option(
         "--offload-chunk-mb", o.offload_chunk_mb,
         "MiB of optimizer state (both moments) per streamed chunk; three chunks are in memory at once")
      ->capture_default_str()
      ->group("Memory");
  app.add_option("--allreduce", o.allreduce, "gradient all-reduce: mpi, ring, tree, hierarchical or adaptive")
      ->capture_default_str()
      ->group("Parallel");
  app.add_option("--schedule", o.schedule, "pipeline schedule: gpipe, 1f1b, interleaved or zb-h1")
      ->capture_default_str()
      ->group("Parallel");
  app.add_option(
         "--device", o.device,
         "where the model runs: cpu (the fp32 reference) or cuda (one GPU per rank; built where the CUDA "
         "toolkit is found; several ranks talk over NCCL, or over NDMESH_BACKEND=gloo|mpi staged "
         "through host memory: docs/gpu.md)")
      ->capture_default_str();
  app.add_option("--precision", o.precision,
                 "fp32, or bf16: mixed precision (bf16 products with fp32 accumulation, the activations "
                 "they read kept in bf16; fp32 master weights, AdamW moments, residual stream, norms and "
                 "loss; checkpoints stay fp32)")
      ->capture_default_str();
  app.add_option(
         "--recompute", o.recompute,
         "activation recompute: none, selective (the backward re-runs the attention core; its "
         "output and log-sum-exp are not kept) or full (a block keeps only its input and the backward "
         "re-runs its forward); the losses are the same bit for bit")
      ->capture_default_str()
      ->each(mark(given.recompute))
      ->group("Parallel");
  app.add_option("--vpp,--virtual-stages", t.pp.virtual_stages,
                 "virtual stages: model chunks per pipeline rank (--schedule interleaved)")
      ->capture_default_str()
      ->group("Parallel");
  app.add_option("--pp-layers", t.pp.layers,
                 "blocks per pipeline chunk, e.g. 3,3,2 (pp x virtual-stages entries; default: balanced)")
      ->group("Parallel");
  app.add_option(
         "--trace", o.trace,
         "write every pipeline action of every rank with start and end as Chrome trace-event JSON (the "
         "last --trace-steps steps)")
      ->group("Parallel");
  app.add_option("--trace-steps", t.pp.trace_steps,
                 "steps each rank keeps in its pipeline trace, the latest (the bubble is measured over them)")
      ->capture_default_str()
      ->group("Parallel");
  app.add_option("--pp-drop-action", t.pp.drop_action,
                 "testing: stage STAGE skips action INDEX of its list (STAGE:INDEX), a mismatched schedule")
      ->group("Testing");
  app.add_option(
         "--cp-layout", o.cp_layout,
         "chunks of each sequence a context-parallel rank holds: zigzag (chunks i and 2cp-1-i of 2cp, "
         "balanced causal work) or contiguous (chunk i of cp)")
      ->capture_default_str()
      ->group("Parallel");
}

// The run: optimisation, data, evaluation, checkpoints and what is written while training.
void add_run_flags(CLI::App& app, train::RunOptions& o) {
  parallel::TrainOptions& t = o.train;
  train::Given& given = o.given;
  auto mark = [](bool& flag) { return [&flag](const std::string&) { flag = true; }; };
  app.add_option("--global-batch,--batch", t.batch, "sequences per step over all ranks")
      ->capture_default_str();
  app.add_option("--steps", t.steps, "total steps (a --load run continues up to this step)")
      ->capture_default_str();
  app.add_option("--lr", t.lr, "peak learning rate")->capture_default_str();
  app.add_option(
         "--lr-schedule", o.lr_schedule,
         "learning rate after --warmup: cosine (to --min-lr-ratio at --steps), linear (likewise), wsd "
         "(constant, then linear to --min-lr-ratio over the last --decay-fraction of --steps) or constant")
      ->capture_default_str();
  app.add_option("--warmup", t.warmup, "linear warmup steps")->capture_default_str();
  app.add_option("--min-lr-ratio", t.min_lr_ratio,
                 "where the decay ends (cosine, linear, wsd), as a fraction of --lr")
      ->capture_default_str();
  app.add_option("--decay-fraction", t.decay_fraction,
                 "with --lr-schedule wsd: the share of --steps the final decay takes")
      ->capture_default_str();
  app.add_option("--weight-decay", t.adamw.weight_decay, "AdamW weight decay (matrices only)")
      ->capture_default_str();
  app.add_option("--clip", t.adamw.clip_norm, "global gradient-norm clip (0: off)")->capture_default_str();
  app.add_option("--seed", t.seed, "model initialisation seed")->capture_default_str();
  app.add_option(
         "--data", o.data,
         "train on this file: bytes of a text file, or tokens of a .bin file or glob of .bin shards (llm.c's "
         "shards, nanoGPT's uint16 train.bin; give --vocab); default: the Markov source")
      ->each(mark(given.data));
  app.add_option(
         "--data-format", o.data_format,
         "how --data is read: auto (.bin: llm.c shard when its header says so, else raw uint16 tokens; other "
         "files: bytes), bytes, llmc or uint16")
      ->capture_default_str();
  app.add_option("--markov-vocab", o.markov_vocab, "states of the Markov source")->capture_default_str();
  app.add_option("--markov-sharpness", o.markov_sharpness,
                 "how peaked the Markov transitions are (0: uniform, larger: lower entropy)")
      ->capture_default_str();
  app.add_option("--data-seed", o.data_seed, "seed of the data (Markov chain and sampling, or byte windows)")
      ->capture_default_str();
  app.add_option("--threads", o.threads, "BLAS threads (0: NDMESH_THREADS, else the core count)")
      ->capture_default_str();
  app.add_option(
         "--val-data", o.val_data,
         "held-out data for every evaluation (any format --data reads, with --data-format and --vocab)")
      ->each(mark(given.val_data))
      ->group("Evaluation");
  app.add_option("--val-fraction", o.val_fraction,
                 "or hold out this share at the end of --data, in (0, 1): training never reads it")
      ->each(mark(given.val_fraction))
      ->group("Evaluation");
  app.add_option(
         "--eval-every", o.eval_every,
         "evaluate after steps N, 2N, ... and after the last (val_loss in --metrics); default: only the "
         "final loss")
      ->each(mark(given.eval_every))
      ->group("Evaluation");
  app.add_option(
         "--eval-batches", o.eval_batches,
         "batches of every evaluation and of the final loss, the same ones each time (of the held-out data "
         "when given, else a sampling stream of the training data apart from training)")
      ->capture_default_str()
      ->group("Evaluation");
  app.add_option(
         "--until", o.until,
         "stop after this step (0: --steps); the learning-rate schedule still spans --steps, so a run "
         "resumed with --load continues exactly")
      ->capture_default_str()
      ->group("Checkpoints");
  app.add_option(
         "--save", o.save,
         "write a checkpoint directory here at the end: a manifest and one shard file per stage and tp "
         "rank, replacing the previous one atomically; it loads under any layout")
      ->each(mark(given.save))
      ->group("Checkpoints");
  app.add_option(
         "--save-every", o.save_every,
         "also checkpoint to --save every N steps, written by a thread while training goes on (0: only at "
         "the end)")
      ->capture_default_str()
      ->group("Checkpoints");
  app.add_option("--keep", o.keep,
                 "checkpoints kept: --save DIR and the K-1 before it, as DIR.step-N beside it")
      ->capture_default_str()
      ->group("Checkpoints");
  app.add_option("--load", o.load,
                 "continue from this checkpoint directory (any layout; same model and data flags), or start "
                 "from the weights of an import-hf checkpoint or a Hugging Face folder (config.json + "
                 "safetensors; step 0, any --data)")
      ->each(mark(given.load))
      ->group("Checkpoints");
  app.add_flag("--json", o.json, "print one JSON summary object as the last line")->group("Output");
  app.add_option(
         "--metrics", o.metrics,
         "write one JSON line per step to this file (step, loss, lr, grad_norm, tokens_per_second, mfu, "
         "peak_memory_bytes, elapsed_s, val_loss); appended by a --load run; 'ndmesh plot' draws it")
      ->each(mark(given.metrics))
      ->group("Output");
  app.add_option("--tensorboard", o.tensorboard,
                 "write the same numbers as TensorBoard event files into this folder")
      ->each(mark(given.tensorboard))
      ->group("Output");
  app.add_option("--hardware", o.hardware,
                 "a preset (h100, ...) or a file of 'ndmesh calibrate': its peak FLOP/s per rank gives mfu")
      ->each(mark(given.hardware))
      ->group("Output");
  app.add_option("--log-every", o.log_every, "a progress line every N steps (and after the last)")
      ->capture_default_str()
      ->group("Output");
  app.add_flag("--kernel-times", o.kernel_times,
               "with --device cuda: where rank 0's GPU time goes, per kernel, matrix product (by shape) and "
               "copy, over every step after the first (an event after each operation; docs/gpu.md)")
      ->group("Output");
  app.add_option("--coordinator", o.coordinator,
                 "HOST:PORT of an 'ndmesh coordinator': run as one replica of elastic data parallelism "
                 "(docs/elastic.md; NDMESH_COORDINATOR)")
      ->group("Elastic");
  app.add_option(
         "--replica-id", o.replica_id,
         "with --coordinator: this replica's id, 0..R-1, the same across restarts (NDMESH_REPLICA_ID)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 20))
      ->group("Elastic");
  app.add_option(
         "--memory", o.memory,
         "memory strategy, expanded to flags (printed): basic (nothing), standard (--recompute selective), "
         "aggressive (--recompute full --zero 2), extreme (--recompute full --zero 3 --offload optimizer "
         "--offload-dir $TMPDIR); a flag given explicitly wins")
      ->group("Memory");
}

}  // namespace

void add_train_flags(CLI::App& app, const std::shared_ptr<TrainFlags>& flags) {
  train::RunOptions& o = flags->options;
  flags->layout.add_to(app);
  add_parallel_flags(app, o);
  add_model_flags(app, o);
  add_run_flags(app, o);
  app.footer(
      "Examples:\n"
      "  ndmesh train                                   # small model on the Markov source, about a minute\n"
      "  ndmesh train --data README.md --vocab 256 --steps 200\n"
      "  ndmesh train --model llama-tiny --steps 200            # a small Llama: RMSNorm, SwiGLU, rotary\n"
      "  ndmesh train --steps 200 --until 100 --save run.ckpt && ndmesh train --steps 200 --load run.ckpt\n"
      "  ndmesh train --data tokens.bin --vocab 50257 --val-fraction 0.05 --eval-every 100 --metrics "
      "run.jsonl\n"
      "  mpirun -np 4 ndmesh train --dp 4                # data parallel: the same losses as the serial run\n"
      "  mpirun -np 2 ndmesh train --dp 2 --micro-batch 2 --zero 1 --allreduce ring\n"
      "  mpirun -np 4 ndmesh train --cp 2 --dp 2 --seq 64  # context parallel: ring attention over --cp "
      "ranks\n"
      "  mpirun -np 4 ndmesh train --dp 2 --tp 2 --sequence-parallel   # tensor parallel: the same losses "
      "too\n"
      "  mpirun -np 4 ndmesh train --pp 4 --schedule 1f1b --batch 8 --micro-batch 1 --layers 4 --trace "
      "pp.json");
}

train::RunOptions parsed_train_options(const std::shared_ptr<TrainFlags>& flags) {
  train::RunOptions o = flags->options;
  o.config_path = flags->layout.config_path();
  // Under a launcher with no layout flag every rank is data-parallel.
  flags->layout.set_default_sizes({{"dp", -1}});
  // --ep is a MoE model's expert parallelism, folded into dp x cp (a dense model refuses it).
  flags->layout.set_fold_ep(true);
  o.layout = [flags](std::int64_t world) { return flags->layout.resolve(world).config; };
  return o;
}

namespace {

Action setup(CLI::App& app) {
  auto flags = std::make_shared<TrainFlags>();
  add_train_flags(app, flags);
  return [flags] {
    train::run(parsed_train_options(flags));
    return 0;
  };
}

const Subcommand kTrain{
    "train",
    "Train the GPT model, alone or data-, context- and tensor-parallel under mpirun (Markov source "
    "or a file)",
    setup};

}  // namespace
}  // namespace ndmesh::cli
