// The options of one training run: what `ndmesh train`'s flags and ndmesh.train()'s keyword
// arguments set (the same names: --eval-every is eval_every). The numbers the runtime reads
// are bound straight into `train` (parallel::TrainOptions); the rest are the run's own: the
// data and the held-out data, the modes given by name, checkpoints, what is written while
// training (console, metrics, TensorBoard) and the elastic replica.
//
// check_run_options() is the validation `ndmesh train` does before any rank starts: one
// ConfigError per bad value, naming the flag, the value and a fix.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "ndmesh/config/config.hpp"
#include "ndmesh/parallel/train_options.hpp"

namespace ndmesh::train {

/// Which of the flags whose default another choice may override were given explicitly.
struct Given {
  bool zero = false, recompute = false, offload = false, offload_dir = false;  ///< --memory leaves these
  bool data = false, save = false, load = false;  ///< an empty value given must not switch a feature off
  bool val_data = false, metrics = false, tensorboard = false, hardware = false;  ///< likewise
  bool val_fraction = false, eval_every = false;  ///< 0 given is refused (0 is also "none")
};

/// `ndmesh train`'s defaults for the numbers the runtime reads (a small GPT on the Markov
/// source: 2 layers, hidden 64, 4 heads over 2 key/value heads, seq 64, batch 16, 1000
/// steps, warmup 20, lr 6e-4).
parallel::TrainOptions default_train_options();

/// Everything one run is told.
struct RunOptions {
  parallel::TrainOptions train =
      default_train_options();  ///< model (vocab 0: the data's), batch, steps, lr, ...
  bool untied = false;          ///< --untied (train.model.tied_embeddings = false)

  // The model's description (resolve_model()): --model NAME (a preset, config/presets.hpp) or
  // the defaults above is the base; the config file's [model] keys change it, then --arch (a
  // family's layers over the sizes), then every model flag given. The sizes' flags write into
  // train.model and name their key in model_given.
  std::string model_preset;              ///< --model
  std::string arch;                      ///< --arch: gpt2 or llama
  std::string norm, mlp, positions;      ///< --norm, --mlp, --positions (empty: the description's)
  std::string router;                    ///< --router (empty: the description's)
  std::vector<std::string> model_given;  ///< model keys (config.hpp: model_keys) given as flags

  /// The resolved layout of a world of the given size; empty: every rank data-parallel.
  std::function<ParallelConfig(std::int64_t world)> layout;
  std::string config_path;  ///< --config (its [training] memory, when --memory is not given)

  // Modes by name (checked by check_run_options(), turned into `train` by train_options()).
  std::string allreduce = "mpi";
  std::string grad_dtype = "fp32";
  std::string schedule = "1f1b";
  std::string cp_layout = "zigzag";
  std::string recompute = "none";
  std::string device = "cpu";
  std::string precision = "fp32";
  std::string offload = "none";
  std::string offload_dir;
  std::string lr_schedule = "cosine";
  double offload_chunk_mb = 32;
  bool no_overlap = false;
  bool no_progress_thread = false;
  std::string memory;  ///< --memory: a strategy that sets --recompute, --zero and --offload (given ones win)
  std::string memory_choice;  ///< what expand_memory() chose, printed by rank 0
  Given given;

  // Data.
  std::string data;  ///< empty: the Markov source
  std::string data_format = "auto";
  std::int64_t markov_vocab = 32;
  double markov_sharpness = 2.5;
  std::uint64_t data_seed = 1;
  std::string val_data;         ///< held-out data (any format --data reads)
  double val_fraction = 0;      ///< or this last share of --data, which training never reads
  std::int64_t eval_every = 0;  ///< evaluate after steps N, 2N, ... and the last; 0: only at the end
  std::int64_t eval_batches = 8;

  // Checkpoints.
  std::string save, load;
  std::int64_t until = 0;       ///< stop after this step (0: --steps); the schedule still spans --steps
  std::int64_t save_every = 0;  ///< also save every N steps, written in the background
  std::int64_t keep = 1;        ///< checkpoints kept: DIR and the keep - 1 before it (DIR.step-N)

  // Output.
  bool json = false;
  bool kernel_times = false;
  std::string trace;
  std::string metrics;      ///< --metrics FILE.jsonl
  std::string tensorboard;  ///< --tensorboard DIR
  std::string hardware;     ///< --hardware NAME|FILE: the peak for mfu
  std::int64_t log_every = 1;
  std::int64_t threads = 0;

  // Elastic data parallelism.
  std::string coordinator;  ///< HOST:PORT (or NDMESH_COORDINATOR)
  std::int64_t replica_id = -1;
};

/// The model's description: the base (--model's preset, or default_train_options()'s), the
/// --config file's [model] keys over it, --arch, then the model flags given (model_given,
/// --norm, --mlp, --positions, --untied). ConfigError naming the flag or key, the value and the
/// names it takes.
void resolve_model(RunOptions& o);

/// --memory (or the --config file's [training] memory): the strategy's --recompute, --zero
/// and --offload, except those given explicitly; records what it chose in memory_choice.
void expand_memory(RunOptions& o);

/// The elastic options from the environment (NDMESH_COORDINATOR, NDMESH_REPLICA_ID), and
/// the ConfigError of a --replica-id without a coordinator.
void resolve_elastic(RunOptions& o);

/// Every check `ndmesh train` makes before a rank starts (ConfigError, the first problem):
/// the flags' values and rules, the model's shape (config's model_problems, named as the
/// flags), parallel::train_option_problems(), the files of --data, --val-data, --load,
/// --save, --metrics, --tensorboard and --hardware.
void check_run_options(const RunOptions& o);

/// The runtime's options: `train` with the named modes, `vocab` and `ranks_per_node` filled in.
parallel::TrainOptions train_options(const RunOptions& o, std::int64_t vocab, std::int64_t ranks_per_node);

/// Elastic data parallelism (docs/elastic.md): what cannot live in one replica of a mesh is
/// refused (ConfigError); an elastic run's micro-batch defaults to 1.
void check_elastic(RunOptions& o, const Mesh& mesh);

}  // namespace ndmesh::train
