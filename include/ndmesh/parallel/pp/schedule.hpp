// Pipeline schedules as plain data.
//
// A schedule says, for every pipeline stage (pp rank), the ordered list of actions that
// stage runs in one training step: forward and backward passes of micro-batches on its
// model chunks, and the point-to-point sends and receives of activations (forward
// direction) and gradients (backward direction) to and from the neighbouring stages.
// The same data is checked (check.hpp), simulated (simulate.hpp), drawn (render.hpp)
// and, later, executed unchanged by the pipeline runtime: every action carries all it
// needs (kind, micro-batch, local model chunk, peer stage).
//
// Model chunks: with v virtual stages per rank (interleaved 1F1B) the model is cut into
// p*v chunks; stage r holds chunks r, r+p, r+2p, ... and calls them local chunks
// 0..v-1. Virtual stage s = chunk*p + stage, so the last stage of chunk c hands its
// activations to stage 0 of chunk c+1. Non-interleaved schedules have v = 1.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ndmesh/config/config.hpp"
#include "ndmesh/config/training.hpp"

namespace ndmesh::pp {

/// What one action does.
enum class ActionKind : std::uint8_t {
  kForward,         ///< forward pass of (micro-batch, chunk)
  kBackward,        ///< full backward (input and weight gradients) of (micro-batch, chunk)
  kBackwardInput,   ///< "B" of zero-bubble schedules: gradient w.r.t. the chunk's input
  kBackwardWeight,  ///< "W" of zero-bubble schedules: gradient w.r.t. the chunk's weights
  kSendActivation,  ///< send the output of this chunk's forward to the next virtual stage
  kRecvActivation,  ///< receive this chunk's forward input from the previous virtual stage
  kSendGradient,    ///< send the gradient w.r.t. this chunk's input to the previous virtual stage
  kRecvGradient,    ///< receive the gradient w.r.t. this chunk's output from the next virtual stage
};

/// True for the four point-to-point kinds.
constexpr bool is_p2p(ActionKind k) { return k >= ActionKind::kSendActivation; }
/// True for sends.
constexpr bool is_send(ActionKind k) {
  return k == ActionKind::kSendActivation || k == ActionKind::kSendGradient;
}
/// True for receives.
constexpr bool is_recv(ActionKind k) {
  return k == ActionKind::kRecvActivation || k == ActionKind::kRecvGradient;
}

/// Short name: "forward", "backward", "backward-input", "backward-weight",
/// "send-activation", "recv-activation", "send-gradient", "recv-gradient".
std::string_view action_kind_name(ActionKind k);
/// One letter: F (forward), B (backward, or its input half), W (weight half), S (send),
/// R (receive): what the timelines draw and the traces name actions with ("F3", "B3.1").
char action_kind_letter(ActionKind k);

/// One step of one stage.
struct Action {
  ActionKind kind = ActionKind::kForward;
  int microbatch = 0;  ///< 0 .. microbatches-1
  int chunk = 0;       ///< local model chunk on this stage, 0 .. chunks-1
  int peer = -1;       ///< the other stage of a send or receive; -1 for compute
  bool operator==(const Action&) const = default;
};

/// "forward mb 3 chunk 0", "send-activation mb 3 chunk 0 to stage 2", ...
std::string to_string(const Action& a);

/// The actions of every stage for one training step.
struct PipelineSchedule {
  Schedule kind = Schedule::k1F1B;
  int stages = 1;                            ///< p: pipeline ranks
  int microbatches = 1;                      ///< m: micro-batches per step
  int chunks = 1;                            ///< v: model chunks (virtual stages) per rank
  std::vector<std::vector<Action>> actions;  ///< actions[stage], in execution order

  /// p * v: the number of model chunks.
  int virtual_stages() const { return stages * chunks; }
  /// The virtual stage (position in the model) of a stage's local chunk.
  int virtual_stage(int stage, int chunk) const { return chunk * stages + stage; }
  /// The stage that holds virtual stage s.
  int stage_of(int virtual_stage) const { return virtual_stage % stages; }
  /// The local chunk index of virtual stage s on its stage.
  int chunk_of(int virtual_stage) const { return virtual_stage / stages; }
};

/// What to generate.
struct ScheduleOptions {
  Schedule schedule = Schedule::k1F1B;
  int stages = 1;        ///< pp
  int microbatches = 1;  ///< micro-batches per step
  int chunks = 1;        ///< virtual stages per rank; > 1 only for kInterleaved
};

/// The most pipeline stages accepted (state per pair of stages grows with pp^2); the limit
/// training_problems() (config/training.hpp) applies for `ndmesh train` and the planner.
inline constexpr int kMaxScheduleStages = static_cast<int>(kMaxPipelineStages);

/// The largest stages * microbatches * chunks accepted (keeps schedules in memory small).
inline constexpr std::int64_t kMaxScheduleWork = kMaxPipelineWork;

/// Every problem with the options, one line each, naming the field, the value and a
/// valid choice. Empty when valid.
std::vector<std::string> schedule_option_problems(const ScheduleOptions& options);

/// Builds the schedule; ConfigError listing every problem with the options. The result
/// always passes check_schedule().
///  - kGpipe: every forward, then every backward.
///  - k1F1B: Megatron's non-interleaved 1F1B: stage r runs min(p-r-1, m) warm-up
///    forwards, then alternates one forward and one backward, then drains the backwards.
///  - kInterleaved: Megatron's interleaved 1F1B with `chunks` virtual stages per rank;
///    microbatches must be a multiple of stages.
///  - kZbH1: Qi et al. 2023 zero-bubble H1: backward split into input gradient (B) and
///    weight gradient (W); same in-flight activations as 1F1B, W fills the bubbles.
PipelineSchedule make_schedule(const ScheduleOptions& options);

/// Builds a schedule from per-stage compute-only action lists (forward/backward kinds),
/// inserting the sends and receives between stages in an order that cannot deadlock
/// with blocking (rendezvous) point-to-point: the transfers of every stage follow one
/// global order taken from a unit-cost timing of the compute. Used by the generators;
/// public so that tests and custom schedules can build on it. Error when a stage's
/// compute order cannot run (e.g. a backward before its forward).
PipelineSchedule with_communication(Schedule kind, int stages, int microbatches, int chunks,
                                    std::vector<std::vector<Action>> compute);

}  // namespace ndmesh::pp
