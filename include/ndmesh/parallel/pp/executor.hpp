// Pipeline executor: runs a PipelineSchedule unchanged on real processes.
//
// Each pp rank walks its own action list (schedule.actions[stage]) in order, so any
// schedule the generator makes (or a hand-built one that passes check_schedule) runs
// without changes here. Compute actions call the rank's model chunks (one model::Model per local
// chunk, a contiguous block range each) with per-micro-batch activations taken from a
// pool: a forward takes one, the backward (or backward-input) of the same (micro-batch,
// chunk) gives it back, so the pool's size is the measured peak of live activations.
// Sends and receives of hidden states (forward) and their gradients (backward) are
// asynchronous point-to-point over the pp group: receives are posted ahead of the action
// that waits for them (while the compute before it runs), sends copy their data into a
// buffer of their own and are waited for at the end of the walk. The transfers run on the
// executor's own duplicate of the pp group (comm/tags.hpp), tagged with (kind, micro-batch,
// chunk), so a schedule whose stages disagree waits instead of mixing data up, and a wait
// that outlives the timeout ends the job with a message naming the pp group, the stage and
// the action.
//
// The zero-bubble schedules' split backward: backward-input runs the chunk's backward
// with the linear layers' weight gradients deferred (nn::DeferWeightGrads: each records
// its output gradient), backward-weight computes them. Norms and the embedding still get
// their (cheap) weight gradients in the first half. The activations of a split backward
// stay in the pool until its weight half (the layers' inputs live there); the live count
// that the peak measures ends at backward-input, as in simulate().
//
// Buffers: a posted receive's buffer belongs to the transfer until the receive action
// has waited for it; a send's copy belongs to the transfer until the end of the walk.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "ndmesh/comm/communicator.hpp"
#include "ndmesh/model/model.hpp"
#include "ndmesh/nn/linear.hpp"
#include "ndmesh/parallel/pp/schedule.hpp"
#include "ndmesh/tensor/tensor.hpp"

namespace ndmesh::pp {

/// When one action ran on this rank, in seconds since the executor's origin.
struct ActionTiming {
  Action action;
  int index = 0;  ///< position in the stage's action list
  double start = 0, end = 0;
};

/// What one walk of the schedule did on this rank.
struct WalkResult {
  double loss_sum = 0;  ///< sum of the per-token losses of the micro-batches this rank's head saw
  std::vector<ActionTiming> timings;  ///< every action, in execution order
};

/// What the runtime provides to a walk.
struct StageHooks {
  /// Fills tokens and targets (micro-batch * seq each) of micro-batch `mb` of the step.
  std::function<void(int mb, std::int32_t* tokens, std::int32_t* targets)> data;
  /// Around each backward of local chunk `chunk` that completes a micro-batch's gradients:
  /// a whole backward, or the weight half of a split one (the input half only adds the
  /// cheap norm and embedding gradients, which the weight half's reduction takes along).
  /// `last` marks the chunk's last of the step, after which its gradients are final (where
  /// data parallelism reduces them). The weight half reports its finished suffixes through
  /// the chunk's grads-final hook, as a whole backward does.
  std::function<void(int chunk, bool last)> before_backward;
  std::function<void(int chunk)> after_backward;
  /// false: the walk leaves the heads' loss sums in their chunks (model::Model::take_loss_sum,
  /// take_loss_sum_into) and WalkResult::loss_sum is 0, so that its end does not wait for
  /// the device.
  bool take_loss = true;
};

/// Options of the executor.
struct ExecutorOptions {
  double timeout_s = 0;  ///< a receive or send not done after this long ends the job; 0: NDMESH_TIMEOUT_S
};

/// The schedule with only its forward passes and activation transfers (evaluation).
PipelineSchedule forward_only(const PipelineSchedule& schedule);

/// Runs one stage of a schedule. Not thread-safe; one per rank.
class Executor {
 public:
  /// `chunks[c]` is local chunk c (virtual stage c * stages + stage); every chunk has
  /// the same batch and seq. `pp` is the pipeline group (its rank is the stage). Error
  /// when the schedule fails check_schedule() or does not fit the chunks or the group.
  /// Collective over `pp` (duplicates it).
  Executor(PipelineSchedule schedule, comm::Communicator pp, std::vector<model::Model*> chunks,
           ExecutorOptions options = {});
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  /// One training step: every action of this stage (collective over the pp group).
  WalkResult train_step(const StageHooks& hooks) { return walk(schedule_, hooks, true); }
  /// Forward passes only (losses, no gradients), over forward_only(schedule).
  WalkResult evaluate(const StageHooks& hooks) { return walk(forward_schedule_, hooks, false); }

  /// Polls the transfers in flight (call between layers to move data during compute).
  void poll();

  const PipelineSchedule& schedule() const { return schedule_; }
  int stage() const { return stage_; }
  /// Activations ever allocated for training walks: the most (micro-batch, chunk)
  /// activations that were live at once on this stage.
  int peak_live_activations() const { return peak_live_; }
  /// Bytes of the micro-batch activations (model::Activations of every chunk) alive at once at
  /// the peak of the training walks so far: what the schedule really held.
  std::int64_t peak_live_activation_bytes() const { return peak_live_bytes_; }
  /// Times are measured from this moment (set it after a barrier to line ranks up).
  void set_origin(std::chrono::steady_clock::time_point t) { origin_ = t; }

  /// Test hook: the stage leaves out this action of its list (a mismatched schedule).
  void drop_action(int index);

 private:
  struct Transfer {
    Tensor<float> buffer;  // hidden_elems_ elements where the chunks live (device memory on CUDA)
    comm::Work work;
    int index = -1;  // action index, for messages
    bool posted = false;
  };
  using Acts = model::Activations;
  // (kind, micro-batch, chunk) of an action, as a map key.
  static std::int64_t key(ActionKind kind, int mb, int chunk, int m);
  int tag(ActionKind kind, int mb, int chunk) const;
  WalkResult walk(const PipelineSchedule& s, const StageHooks& hooks, bool train);
  void post_receives(const PipelineSchedule& s, std::size_t upto);
  void wait(Transfer& t, const Action& a);
  Tensor<float> take_buffer();
  double now() const;

  PipelineSchedule schedule_, forward_schedule_;
  comm::Communicator pp_;
  std::vector<model::Model*> chunks_;
  // The schedule splits backwards (zb-h1): activations keep what the deferred weight half reads.
  bool split_ = false;
  ExecutorOptions options_;
  int stage_ = 0;
  std::int64_t hidden_elems_ = 0;
  Device device_ = Device::kCpu;  // of the chunks: where the transfer buffers live
  std::chrono::steady_clock::time_point origin_;
  // Per walk.
  std::map<std::int64_t, Transfer> recvs_;  // by key(recv kind, mb, chunk)
  std::size_t posted_upto_ = 0;             // receives of actions below this index are posted
  std::vector<Transfer> sends_;
  std::map<std::int64_t, Tensor<float>> outbox_;  // data produced for a later send
  std::vector<Tensor<float>> free_buffers_;
  // Activation pools, per local chunk; live ones by key(forward, mb, chunk).
  std::vector<std::vector<std::unique_ptr<Acts>>> free_acts_;
  std::map<std::int64_t, std::unique_ptr<Acts>> live_;
  std::map<std::int64_t, nn::DeferredWeightGrads<float>> deferred_;  // split backwards awaiting their W
  int allocated_ = 0, peak_live_ = 0;
  std::int64_t live_bytes_ = 0, peak_live_bytes_ = 0;
  std::vector<std::int32_t> tokens_, targets_;
  std::vector<int> dropped_;
};

}  // namespace ndmesh::pp
