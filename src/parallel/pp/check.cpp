// Schedule checker: static counting, then a step-by-step run of every stage with
// blocking rendezvous point-to-point. Compute actions only depend on what their own
// stage did before (data arrives through that stage's own receives), so a compute
// action whose input is missing is an error at once; a send or receive waits until its
// peer reaches the matching receive or send. When no stage can move and some have not
// finished, the waits form a cycle (or end at a finished stage), which is reported.
#include "ndmesh/parallel/pp/check.hpp"

#include <fmt/core.h>

#include "ndmesh/core/error.hpp"

namespace ndmesh::pp {

namespace {

struct Where {
  int stage = -1;
  std::size_t index = 0;
};

// What a virtual stage's holder has for one micro-batch.
struct State {
  int forwards = 0, backwards = 0, inputs = 0, weights = 0;
  int send_act = 0, send_grad = 0, recv_act = 0, recv_grad = 0;
  Where forward_at;
  bool forward_done = false, input_grad_done = false, activation_in = false, gradient_in = false;
};

std::string at(int stage, std::size_t index, const Action& a) {
  return fmt::format("stage {} action {} ({})", stage, index, to_string(a));
}

class Checker {
 public:
  explicit Checker(const PipelineSchedule& s)
      : s_(s), p_(s.stages), m_(s.microbatches), nv_(s.stages * s.chunks) {}

  std::optional<std::string> run() {
    if (p_ < 1 || m_ < 1 || s_.chunks < 1)
      return fmt::format("pp={} microbatches={} vpp={} must all be at least 1", p_, m_, s_.chunks);
    if (static_cast<int>(s_.actions.size()) != p_)
      return fmt::format("the schedule lists actions for {} stages but pp={}", s_.actions.size(), p_);
    state_.assign(static_cast<std::size_t>(nv_) * m_, State{});
    if (auto e = fields()) return e;
    if (auto e = counts()) return e;
    return simulate();
  }

 private:
  State& st(int mb, int v) { return state_[static_cast<std::size_t>(v) * m_ + mb]; }

  std::optional<std::string> fields() {
    for (int r = 0; r < p_; ++r)
      for (std::size_t i = 0; i < s_.actions[r].size(); ++i) {
        const Action& a = s_.actions[r][i];
        if (a.microbatch < 0 || a.microbatch >= m_)
          return fmt::format("{}: micro-batch out of range; expected 0..{}", at(r, i, a), m_ - 1);
        if (a.chunk < 0 || a.chunk >= s_.chunks)
          return fmt::format("{}: chunk out of range; expected 0..{}", at(r, i, a), s_.chunks - 1);
        if (!is_p2p(a.kind)) {
          if (a.peer != -1)
            return fmt::format("{}: a compute action has peer {}; expected -1", at(r, i, a), a.peer);
          continue;
        }
        const int v = s_.virtual_stage(r, a.chunk);
        const bool towards_next =
            a.kind == ActionKind::kSendActivation || a.kind == ActionKind::kRecvGradient;
        const int other = towards_next ? v + 1 : v - 1;
        if (other < 0 || other >= nv_)
          return fmt::format("{}: virtual stage {} has no {} virtual stage to exchange with", at(r, i, a), v,
                             towards_next ? "next" : "previous");
        if (s_.stage_of(other) == r)
          return fmt::format("{}: virtual stage {} is on this same stage; expected no transfer", at(r, i, a),
                             other);
        if (a.peer != s_.stage_of(other))
          return fmt::format("{}: wrong peer; virtual stage {} is on stage {}", at(r, i, a), other,
                             s_.stage_of(other));
      }
    return std::nullopt;
  }

  std::optional<std::string> counts() {
    for (int r = 0; r < p_; ++r)
      for (std::size_t i = 0; i < s_.actions[r].size(); ++i) {
        const Action& a = s_.actions[r][i];
        State& x = st(a.microbatch, s_.virtual_stage(r, a.chunk));
        int* n = nullptr;
        switch (a.kind) {
          case ActionKind::kForward:
            n = &x.forwards;
            break;
          case ActionKind::kBackward:
            n = &x.backwards;
            break;
          case ActionKind::kBackwardInput:
            n = &x.inputs;
            break;
          case ActionKind::kBackwardWeight:
            n = &x.weights;
            break;
          case ActionKind::kSendActivation:
            n = &x.send_act;
            break;
          case ActionKind::kRecvActivation:
            n = &x.recv_act;
            break;
          case ActionKind::kSendGradient:
            n = &x.send_grad;
            break;
          case ActionKind::kRecvGradient:
            n = &x.recv_grad;
            break;
        }
        if (++*n > 1)
          return fmt::format("{}: repeated; each micro-batch runs each action once per chunk", at(r, i, a));
        if (a.kind == ActionKind::kForward) x.forward_at = {r, i};
        if (x.backwards > 0 && x.inputs + x.weights > 0)
          return fmt::format(
              "{}: mixes a full backward with split backward-input/backward-weight; expected one style",
              at(r, i, a));
      }
    for (int v = 0; v < nv_; ++v)
      for (int mb = 0; mb < m_; ++mb) {
        const State& x = st(mb, v);
        const int r = s_.stage_of(v), c = s_.chunk_of(v);
        if (x.forwards == 0)
          return fmt::format("stage {} never runs the forward of mb {} chunk {}; expected one", r, mb, c);
        if (x.backwards + x.inputs == 0)
          return fmt::format(
              "stage {} never runs the backward of mb {} chunk {} (its forward is action {}); expected a "
              "backward "
              "or a backward-input after it",
              r, mb, c, x.forward_at.index);
        if (x.inputs != x.weights)
          return fmt::format(
              "stage {} runs {} backward-input but {} backward-weight of mb {} chunk {}; expected one "
              "of each",
              r, x.inputs, x.weights, mb, c);
      }
    return std::nullopt;
  }

  // Runs compute and checks its inputs until the stage reaches a send/receive or ends.
  std::optional<std::string> advance(int r) {
    const auto& list = s_.actions[r];
    for (; pc_[r] < list.size() && !is_p2p(list[pc_[r]].kind); ++pc_[r]) {
      const std::size_t i = pc_[r];
      const Action& a = list[i];
      const int v = s_.virtual_stage(r, a.chunk);
      State& x = st(a.microbatch, v);
      switch (a.kind) {
        case ActionKind::kForward:
          if (v > 0 && !x.activation_in)
            return fmt::format(
                "{}: its input has not arrived; expected {} of mb {} earlier on stage {}", at(r, i, a),
                s_.stage_of(v - 1) == r ? "the forward of chunk " + std::to_string(s_.chunk_of(v - 1))
                                        : "recv-activation chunk " + std::to_string(a.chunk),
                a.microbatch, r);
          x.forward_done = true;
          if (v + 1 < nv_ && s_.stage_of(v + 1) == r) st(a.microbatch, v + 1).activation_in = true;
          break;
        case ActionKind::kBackward:
        case ActionKind::kBackwardInput:
          if (!x.forward_done)
            return fmt::format(
                "{}: runs before its forward; expected forward mb {} chunk {} earlier on stage {}",
                at(r, i, a), a.microbatch, a.chunk, r);
          if (v + 1 < nv_ && !x.gradient_in)
            return fmt::format(
                "{}: its output gradient has not arrived; expected {} of mb {} earlier on stage {}",
                at(r, i, a),
                s_.stage_of(v + 1) == r ? "the backward of chunk " + std::to_string(s_.chunk_of(v + 1))
                                        : "recv-gradient chunk " + std::to_string(a.chunk),
                a.microbatch, r);
          x.input_grad_done = true;
          if (v > 0 && s_.stage_of(v - 1) == r) st(a.microbatch, v - 1).gradient_in = true;
          break;
        case ActionKind::kBackwardWeight:
          if (!x.input_grad_done)
            return fmt::format(
                "{}: runs before its backward-input; expected backward-input mb {} chunk {} earlier "
                "on stage {}",
                at(r, i, a), a.microbatch, a.chunk, r);
          break;
        default:
          break;
      }
    }
    if (pc_[r] < list.size()) return unproduced_send(r);
    return std::nullopt;
  }

  // A send must come after the compute that produces its data.
  std::optional<std::string> unproduced_send(int r) {
    const std::size_t i = pc_[r];
    const Action& a = s_.actions[r][i];
    const State& x = st(a.microbatch, s_.virtual_stage(r, a.chunk));
    if (a.kind == ActionKind::kSendActivation && !x.forward_done)
      return fmt::format(
          "{}: sends before the forward that produces it; expected forward mb {} chunk {} earlier",
          at(r, i, a), a.microbatch, a.chunk);
    if (a.kind == ActionKind::kSendGradient && !x.input_grad_done)
      return fmt::format(
          "{}: sends before the backward that produces it; expected backward mb {} chunk {} earlier",
          at(r, i, a), a.microbatch, a.chunk);
    return std::nullopt;
  }

  std::optional<std::string> simulate() {
    pc_.assign(p_, 0);
    for (bool progress = true; progress;) {
      progress = false;
      for (int r = 0; r < p_; ++r)
        if (auto e = advance(r)) return e;
      for (int r = 0; r < p_; ++r) {
        if (pc_[r] >= s_.actions[r].size()) continue;
        const Action& a = s_.actions[r][pc_[r]];
        if (!is_send(a.kind)) continue;
        if (auto e = unproduced_send(r)) return e;
        const int q = a.peer;
        if (pc_[q] >= s_.actions[q].size()) continue;
        const Action& b = s_.actions[q][pc_[q]];
        if (!is_recv(b.kind) || b.peer != r) continue;
        const bool act = a.kind == ActionKind::kSendActivation;
        const int v = s_.virtual_stage(r, a.chunk);
        const int w = act ? v + 1 : v - 1;
        const Action want{.kind = act ? ActionKind::kRecvActivation : ActionKind::kRecvGradient,
                          .microbatch = a.microbatch,
                          .chunk = s_.chunk_of(w),
                          .peer = r};
        if (!(b == want))
          return fmt::format(
              "{} meets {}: sends and receives between stages {} and {} are out of order; expected stage {} "
              "to "
              "post {} here",
              at(r, pc_[r], a), at(q, pc_[q], b), r, q, q, to_string(want));
        State& x = st(a.microbatch, w);
        (act ? x.activation_in : x.gradient_in) = true;
        ++pc_[r];
        ++pc_[q];
        progress = true;
      }
    }
    std::vector<int> blocked;
    for (int r = 0; r < p_; ++r)
      if (pc_[r] < s_.actions[r].size()) blocked.push_back(r);
    if (blocked.empty()) return std::nullopt;
    // Follow "waits for" from the first blocked stage until it repeats or ends.
    std::string chain;
    std::vector<bool> seen(p_, false);
    for (int r = blocked[0];;) {
      const Action& a = s_.actions[r][pc_[r]];
      if (!chain.empty()) chain += ", ";
      chain += fmt::format("{} waits for stage {}", at(r, pc_[r], a), a.peer);
      seen[r] = true;
      r = a.peer;
      if (pc_[r] >= s_.actions[r].size()) {
        chain += fmt::format(", which has finished all its actions (a send or receive without its match)");
        break;
      }
      if (seen[r]) {
        chain += " (a cycle)";
        break;
      }
    }
    return "deadlock with blocking point-to-point: " + chain;
  }

  const PipelineSchedule& s_;
  int p_, m_, nv_;
  std::vector<State> state_;
  std::vector<std::size_t> pc_;
};

}  // namespace

std::optional<std::string> schedule_problem(const PipelineSchedule& schedule) {
  return Checker(schedule).run();
}

void check_schedule(const PipelineSchedule& schedule) {
  if (auto e = schedule_problem(schedule)) fail("pp", "{}", *e);
}

}  // namespace ndmesh::pp
