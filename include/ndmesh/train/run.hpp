// The training loop of a pre-training run, in the library: what `ndmesh train` and
// ndmesh.train() in Python both call.
//
// run() takes the options (train/options.hpp) from flags to report: it checks them, starts
// the world (one rank, or every rank of mpirun, srun, torchrun or ndmesh launch), resolves
// the layout, opens the data and the held-out data, refuses a run that would not fit in the
// node's memory, builds the parallel::Trainer, loads --load, and then owns the steps:
//
//   each step       trainer.step() (or, in an elastic replica, the replica's committed step)
//   evaluation      after steps N, 2N, ... and the last (--eval-every N), on the held-out data
//   checkpoints     every --save-every steps in the background (parallel::BackgroundSave),
//                   the last --keep kept, and at the end
//   what it writes  the console (progress, summary, --json), --metrics JSONL and --tensorboard
//                   event files on world rank 0, and what the caller's observers add
//   the report      the --json object: losses, timings, memory, pipeline, layout, ...
//
// An error on any rank of several ends the whole job at once (printed with its rank, exit 2
// for bad input), as `ndmesh train` always did; on one rank it is thrown.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ndmesh/mesh/mesh.hpp"
#include "ndmesh/parallel/trainer.hpp"
#include "ndmesh/train/options.hpp"

namespace ndmesh::train {

/// What the run knows once the trainer is built (observers' on_start).
struct RunStart {
  const RunOptions& options;
  parallel::Trainer& trainer;
  const Mesh& mesh;
  int rank = 0;  ///< world rank
  int world_size = 1;
  bool lead = false;                     ///< world rank 0: the one that prints and writes files
  std::int64_t first = 0;                ///< steps done before this run (--load)
  std::int64_t stop = 0;                 ///< the last step this run does (--until, else --steps)
  int threads = 1;                       ///< BLAS threads per rank
  std::int64_t parameters = 0;           ///< of the logical (serial) model
  std::int64_t parameters_per_rank = 0;  ///< this rank's share
  std::string data;                      ///< the training data's describe()
  std::string val_data;                  ///< the held-out data's describe(); empty: none
  std::optional<double> entropy_rate;    ///< of the training data, when known
  std::optional<model::ScheduleRecord>
      loaded_schedule;  ///< --load: the schedule that checkpoint was saved with
};

/// What one step did, for observers (every rank; the numbers of world rank 0's clock).
struct StepRecord {
  parallel::StepStats stats;         ///< step (1-based), loss, grad_norm, lr, seconds, ...
  double tokens_per_second = 0;      ///< this step's tokens over its wall time
  std::optional<double> mfu;         ///< model FLOPs per second / (ranks x the hardware's peak); --hardware
  double peak_memory_bytes = 0;      ///< this rank's peak: resident set on the CPU, device memory on CUDA
  double elapsed_s = 0;              ///< since the first step of this run started
  std::optional<double> val_loss;    ///< on evaluation steps (--eval-every)
  std::int64_t first = 0, stop = 0;  ///< as in RunStart
  bool lead = false;
};

/// What the run returns.
struct RunReport {
  std::string json;            ///< the --json object, one line
  double final_loss = 0;       ///< mean of the final evaluation (held-out when given)
  std::vector<double> losses;  ///< every step of this run
  std::vector<std::int64_t> eval_steps;
  std::vector<double> val_losses;  ///< at eval_steps
  bool lead = false;               ///< world rank 0 (the report's numbers of other ranks are partial)
};

/// What a caller adds to the loop. Called on every rank, in order: on_start once, on_step
/// after every step (after its evaluation and its checkpoint, if any), on_end with the
/// report. An exception thrown from an observer ends the run as any error does.
class RunObserver {
 public:
  virtual ~RunObserver() = default;
  virtual void on_start(const RunStart& start) { (void)start; }
  virtual void on_step(const StepRecord& step) { (void)step; }
  virtual void on_end(const RunReport& report) { (void)report; }
};

/// What evaluate() measured.
struct EvalReport {
  double loss = 0;        ///< mean next-token loss (nats) over every token of the batches
  double perplexity = 0;  ///< exp(loss)
  std::int64_t tokens = 0;
  std::string json;  ///< {"loss": ..., "perplexity": ..., "tokens": ...} on one line
  bool lead = false;  ///< world rank 0
};

/// `ndmesh eval`: the mean next-token loss of checkpoint options.load (its description, the
/// run's seq) over `batches` consecutive global batches of options.train.batch x seq tokens
/// read from the start of options.data (model::ConsecutiveSource), under the layout of
/// options.layout; every layout reads the same tokens. The checkpoint's training data is
/// not compared. Collective over the world; errors as run().
EvalReport evaluate(RunOptions options, std::int64_t batches);

/// Trains as `options` say (see the file comment); collective over the world. Prints what
/// `ndmesh train` prints (world rank 0). ConfigError for bad options (before any rank
/// starts), IoError for files, Error for a diverged loss.
RunReport run(RunOptions options, const std::vector<RunObserver*>& observers = {});

}  // namespace ndmesh::train
