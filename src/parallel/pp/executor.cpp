// The executor walks one stage's action list. Data of a (micro-batch, chunk) moves
// through four places: the receive buffers (posted ahead, keyed by the receive's kind,
// micro-batch and chunk), the live activations (from its forward to its backward), the
// outbox (what a forward or backward produced for a later send action) and the send
// copies in flight. A forward on virtual stage k reads the tokens (k = 0), the output of
// the local forward of k - 1 (when the same rank holds it) or its received input; a
// backward reads the gradient of the loss (last virtual stage), the local input gradient
// of k + 1, or its received output gradient.
#include "ndmesh/parallel/pp/executor.hpp"

#include <algorithm>
#include <thread>

#include <fmt/format.h>

#include "ndmesh/comm/tags.hpp"
#include "ndmesh/core/error.hpp"
#include "ndmesh/parallel/pp/check.hpp"
#include "ndmesh/tensor/ops.hpp"

namespace ndmesh::pp {

PipelineSchedule forward_only(const PipelineSchedule& s) {
  PipelineSchedule out = s;
  for (auto& list : out.actions)
    std::erase_if(list, [](const Action& a) {
      return a.kind != ActionKind::kForward && a.kind != ActionKind::kSendActivation &&
             a.kind != ActionKind::kRecvActivation;
    });
  return out;
}

Executor::Executor(PipelineSchedule schedule, comm::Communicator pp, std::vector<model::Model*> chunks,
                   ExecutorOptions options)
    : schedule_(std::move(schedule)), pp_(std::move(pp)), chunks_(std::move(chunks)), options_(options) {
  check_schedule(schedule_);
  forward_schedule_ = forward_only(schedule_);
  NDMESH_CHECK(pp_.valid() && pp_.size() == schedule_.stages, "pp",
               "the schedule has pp={} stages but the pipeline group {} has {} ranks", schedule_.stages,
               pp_.name(), pp_.size());
  pp_ = pp_.dup();  // the transfers' own message space (comm/tags.hpp)
  stage_ = pp_.rank();
  // Both directions with every neighbour connected before the first transfer
  // (Communicator::connect_peers: NCCL's first exchange with a peer must mirror its).
  std::vector<int> peers;
  for (const Action& a : schedule_.actions[stage_])
    if (is_p2p(a.kind) && a.peer != stage_) peers.push_back(a.peer);
  std::sort(peers.begin(), peers.end());
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
  pp_.connect_peers(peers);
  NDMESH_CHECK(static_cast<int>(chunks_.size()) == schedule_.chunks, "pp",
               "the schedule has {} chunks per rank but stage {} holds {} model chunks", schedule_.chunks,
               stage_, chunks_.size());
  const model::Model& first = *chunks_.front();
  for (int c = 0; c < schedule_.chunks; ++c) {
    const int v = schedule_.virtual_stage(stage_, c);
    NDMESH_CHECK(chunks_[c]->batch() == first.batch() && chunks_[c]->seq() == first.seq(), "pp",
                 "stage {} chunk {} runs batch {} x seq {} but chunk 0 runs {} x {}", stage_, c,
                 chunks_[c]->batch(), chunks_[c]->seq(), first.batch(), first.seq());
    NDMESH_CHECK(chunks_[c]->has_embedding() == (v == 0) &&
                     chunks_[c]->has_head() == (v + 1 == schedule_.virtual_stages()),
                 "pp", "stage {} chunk {} (virtual stage {} of {}) {} the embedding and {} the head", stage_,
                 c, v, schedule_.virtual_stages(), chunks_[c]->has_embedding() ? "has" : "lacks",
                 chunks_[c]->has_head() ? "has" : "lacks");
  }
  // What crosses a stage boundary: the residual stream of a micro-batch (this rank's rows of
  // it under sequence parallelism).
  hidden_elems_ = first.tp().local_rows(first.batch() * first.seq()) * first.spec().hidden;
  device_ = first.device();
  tokens_.resize(static_cast<std::size_t>(first.batch() * first.seq()));
  targets_.resize(tokens_.size());
  free_acts_.resize(chunks_.size());
  for (const Action& a : schedule_.actions[stage_]) split_ = split_ || a.kind == ActionKind::kBackwardInput;
  origin_ = std::chrono::steady_clock::now();
}

Executor::~Executor() = default;

void Executor::drop_action(int index) { dropped_.push_back(index); }

std::int64_t Executor::key(ActionKind kind, int mb, int chunk, int m) {
  return (static_cast<std::int64_t>(kind) * 4096 + chunk) * (static_cast<std::int64_t>(m) + 1) + mb;
}

int Executor::tag(ActionKind kind, int mb, int chunk) const {
  // Both sides name a transfer by the virtual stage that receives it (the sender's chunk
  // index differs from the receiver's in interleaved schedules). Tags must stay below
  // MPI's guaranteed bound of 32767 (comm/tags.hpp); the (micro-batch, stage) part wraps
  // for very long schedules, where the in-order matching of MPI still pairs them.
  const bool gradient = kind == ActionKind::kSendGradient || kind == ActionKind::kRecvGradient;
  int vs = schedule_.virtual_stage(stage_, chunk);
  if (kind == ActionKind::kSendActivation) ++vs;
  if (kind == ActionKind::kSendGradient) --vs;
  const std::int64_t slot = static_cast<std::int64_t>(vs) * schedule_.microbatches + mb;
  constexpr int kSpan = comm::tags::kPipelineGradientFirst;
  return (gradient ? kSpan : 0) + static_cast<int>(slot % kSpan);
}

double Executor::now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - origin_).count();
}

Tensor<float> Executor::take_buffer() {
  if (free_buffers_.empty()) return Tensor<float>({hidden_elems_}, device_);
  Tensor<float> b = std::move(free_buffers_.back());
  free_buffers_.pop_back();
  return b;
}

void Executor::poll() {
  for (auto& [k, t] : recvs_)
    if (t.posted) t.work.test();
  for (Transfer& t : sends_) t.work.test();
}

void Executor::post_receives(const PipelineSchedule& s, std::size_t upto) {
  const auto& list = s.actions[stage_];
  upto = std::min(upto, list.size());
  for (; posted_upto_ < upto; ++posted_upto_) {
    const Action& a = list[posted_upto_];
    if (!is_recv(a.kind) || std::find(dropped_.begin(), dropped_.end(), posted_upto_) != dropped_.end())
      continue;
    Transfer t;
    t.buffer = take_buffer();
    t.index = static_cast<int>(posted_upto_);
    // The transfer's own deadline lies past ours, so that wait() reports the action first.
    const double timeout = options_.timeout_s > 0 ? options_.timeout_s : comm::default_timeout_s();
    t.work = pp_.recv_async(std::span<float>(t.buffer.data(), static_cast<std::size_t>(hidden_elems_)), a.peer,
                            {.timeout_s = 2 * timeout + 60, .tag = tag(a.kind, a.microbatch, a.chunk)});
    t.posted = true;
    recvs_[key(a.kind, a.microbatch, a.chunk, s.microbatches)] = std::move(t);
  }
}

void Executor::wait(Transfer& t, const Action& a) {
  if (t.work.test()) return;
  const double timeout = options_.timeout_s > 0 ? options_.timeout_s : comm::default_timeout_s();
  const auto start = std::chrono::steady_clock::now();
  auto pause = std::chrono::microseconds(10);
  while (!t.work.test()) {
    poll();
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited > timeout)
      pp_.abort_job(comm::kTimeoutExitCode, "pp",
                    fmt::format("{}: the peer stage never posted the matching transfer; do all stages run the "
                                "same schedule?",
                                pp_.timeout_line(fmt::format("stage {} action {} ({})", stage_, t.index, to_string(a)),
                                                 timeout)));
    if (waited < 0.05) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(500));
    }
  }
}

WalkResult Executor::walk(const PipelineSchedule& s, const StageHooks& hooks, bool train) {
  WalkResult out;
  const auto& list = s.actions[stage_];
  const int m = s.microbatches, nv = s.virtual_stages();
  std::vector<int> backwards(chunks_.size(), 0), weights(chunks_.size(), 0);
  int live = 0;  // activations between their forward and their backward (or backward-input)
  recvs_.clear();
  posted_upto_ = 0;
  out.timings.reserve(list.size());

  // Receives are posted up to the second compute action ahead of the one running.
  auto post_ahead = [&](std::size_t i) {
    int computes = 0;
    std::size_t j = i;
    for (; j < list.size() && computes < 2; ++j) computes += is_p2p(list[j].kind) ? 0 : 1;
    post_receives(s, j + 1);
  };
  auto take_acts = [&](int mb, int c) -> Acts& {
    auto& pool = free_acts_[static_cast<std::size_t>(c)];
    std::unique_ptr<Acts> a;
    if (pool.empty()) {
      a = chunks_[c]->make_activations({.deferred_weight_grads = split_});
      ++allocated_;
    } else {
      a = std::move(pool.back());
      pool.pop_back();
    }
    auto& slot = live_[key(ActionKind::kForward, mb, c, m)];
    NDMESH_CHECK(slot == nullptr, "pp", "stage {}: a second forward of micro-batch {} chunk {}", stage_, mb,
                 c);
    slot = std::move(a);
    live_bytes_ += slot->bytes();
    if (train) {
      peak_live_ = std::max(peak_live_, ++live);
      peak_live_bytes_ = std::max(peak_live_bytes_, live_bytes_);
    }
    return *slot;
  };
  auto live_acts = [&](int mb, int c, const Action& a, std::size_t i) -> Acts& {
    auto it = live_.find(key(ActionKind::kForward, mb, c, m));
    NDMESH_CHECK(it != live_.end(), "pp",
                 "stage {} action {} ({}): micro-batch {} chunk {} has no activations", stage_, i,
                 to_string(a), mb, c);
    return *it->second;
  };
  auto release_acts = [&](int mb, int c) {
    auto it = live_.find(key(ActionKind::kForward, mb, c, m));
    if (it == live_.end()) return;
    live_bytes_ -= it->second->bytes();
    free_acts_[static_cast<std::size_t>(c)].push_back(std::move(it->second));
    live_.erase(it);
  };
  // The posted receive that holds a compute action's input (or output gradient).
  auto received = [&](ActionKind kind, const Action& a, std::size_t i) -> Transfer& {
    auto it = recvs_.find(key(kind, a.microbatch, a.chunk, m));
    NDMESH_CHECK(it != recvs_.end(), "pp",
                 "stage {} action {} ({}): its {} was never received; the schedule has no receive for it",
                 stage_, i, to_string(a), kind == ActionKind::kRecvActivation ? "input" : "output gradient");
    return it->second;
  };
  auto finish_recv = [&](ActionKind kind, const Action& a) {
    auto it = recvs_.find(key(kind, a.microbatch, a.chunk, m));
    free_buffers_.push_back(std::move(it->second.buffer));
    recvs_.erase(it);
  };
  auto outbox = [&](ActionKind send_kind, int mb, int c, const float* data) {
    Tensor<float> b = take_buffer();
    ops::copy(b.data(), data, hidden_elems_, device_);
    outbox_[key(send_kind, mb, c, m)] = std::move(b);
  };

  for (std::size_t i = 0; i < list.size(); ++i) {
    if (std::find(dropped_.begin(), dropped_.end(), static_cast<int>(i)) != dropped_.end()) continue;
    const Action& a = list[i];
    post_ahead(i);
    const int c = a.chunk, mb = a.microbatch, v = s.virtual_stage(stage_, c);
    model::Model& chunk = *chunks_[static_cast<std::size_t>(c)];
    ActionTiming timing{.action = a, .index = static_cast<int>(i), .start = now()};
    switch (a.kind) {
      case ActionKind::kForward: {
        if (v == 0 || v + 1 == nv) hooks.data(mb, tokens_.data(), targets_.data());
        const float* input = nullptr;
        bool from_recv = false;
        if (v > 0) {
          if (s.stage_of(v - 1) == stage_) {
            input = chunk.output(live_acts(mb, c - 1, a, i));  // same rank: only with one stage
          } else {
            Transfer& t = received(ActionKind::kRecvActivation, a, i);
            NDMESH_CHECK(t.work.done(), "pp", "stage {} action {} ({}) runs before its receive", stage_, i,
                         to_string(a));
            input = t.buffer.data();
            from_recv = true;
          }
        }
        Acts& acts = take_acts(mb, c);
        // The loss stays where it is computed (on the device on CUDA) until the walk ends.
        chunk.forward_summed(acts, v == 0 ? tokens_.data() : nullptr, input, v + 1 == nv ? targets_.data() : nullptr);
        if (from_recv) finish_recv(ActionKind::kRecvActivation, a);
        if (v + 1 < nv && s.stage_of(v + 1) != stage_)
          outbox(ActionKind::kSendActivation, mb, c, chunk.output(acts));
        if (!train && (v + 1 == nv || s.stage_of(v + 1) != stage_)) release_acts(mb, c);
        break;
      }
      case ActionKind::kBackward:
      case ActionKind::kBackwardInput: {
        const float* dout = nullptr;
        bool from_recv = false;
        if (v + 1 < nv) {
          if (s.stage_of(v + 1) == stage_) {
            // (Adjacent virtual stages share a rank only with one stage, where nothing runs
            // between the backward of c + 1 and this one.)
            dout = chunks_[static_cast<std::size_t>(c + 1)]->input_grad().data();
          } else {
            Transfer& t = received(ActionKind::kRecvGradient, a, i);
            NDMESH_CHECK(t.work.done(), "pp", "stage {} action {} ({}) runs before its receive", stage_, i,
                         to_string(a));
            dout = t.buffer.data();
            from_recv = true;
          }
        }
        Acts& acts = live_acts(mb, c, a, i);
        const bool split = a.kind == ActionKind::kBackwardInput;
        if (split) {
          // The input half: its gradients are completed by the weight half, which reduces them.
          nn::DeferWeightGrads<float> defer(deferred_[key(ActionKind::kForward, mb, c, m)]);
          chunk.backward(acts, dout);
        } else {
          const bool last = ++backwards[static_cast<std::size_t>(c)] == m;
          if (hooks.before_backward) hooks.before_backward(c, last);
          chunk.backward(acts, dout);
          if (hooks.after_backward) hooks.after_backward(c);
        }
        --live;
        if (from_recv) finish_recv(ActionKind::kRecvGradient, a);
        if (v > 0 && s.stage_of(v - 1) != stage_)
          outbox(ActionKind::kSendGradient, mb, c, chunk.input_grad().data());
        // The next virtual stage's activations were kept for their input gradient.
        if (v + 1 < nv && s.stage_of(v + 1) == stage_) release_acts(mb, c + 1);
        // A split backward's weight half still reads the layer inputs in the activations.
        if (!split && (v + 1 == nv || s.stage_of(v + 1) != stage_)) release_acts(mb, c);
        break;
      }
      case ActionKind::kBackwardWeight: {
        auto it = deferred_.find(key(ActionKind::kForward, mb, c, m));
        NDMESH_CHECK(it != deferred_.end(), "pp", "stage {} action {} ({}) comes before its backward-input",
                     stage_, i, to_string(a));
        const bool last = ++weights[static_cast<std::size_t>(c)] == m;
        if (hooks.before_backward) hooks.before_backward(c, last);
        // Each weight gradient done finalises a suffix of the flat buffer: the reductions
        // start as in a whole backward.
        it->second.run([&chunk](std::int64_t from) { chunk.report_grads_final(from); },
                       [&chunk](std::int64_t at) { chunk.report_grads_write(at); });
        if (hooks.after_backward) hooks.after_backward(c);
        deferred_.erase(it);
        release_acts(mb, c);
        break;
      }
      case ActionKind::kSendActivation:
      case ActionKind::kSendGradient: {
        auto it = outbox_.find(key(a.kind, mb, c, m));
        NDMESH_CHECK(it != outbox_.end(), "pp", "stage {} action {} ({}) sends data no compute produced",
                     stage_, i, to_string(a));
        Transfer t;
        t.buffer = std::move(it->second);
        outbox_.erase(it);
        t.index = static_cast<int>(i);
        const double timeout = options_.timeout_s > 0 ? options_.timeout_s : comm::default_timeout_s();
        t.work = pp_.send_async(std::span<const float>(t.buffer.data(), static_cast<std::size_t>(hidden_elems_)), a.peer,
                                {.timeout_s = 2 * timeout + 60, .tag = tag(a.kind, mb, c)});
        t.posted = true;
        sends_.push_back(std::move(t));
        break;
      }
      case ActionKind::kRecvActivation:
      case ActionKind::kRecvGradient: {
        auto it = recvs_.find(key(a.kind, mb, c, m));
        NDMESH_CHECK(it != recvs_.end(), "pp", "stage {} action {} ({}) was not posted", stage_, i,
                     to_string(a));
        wait(it->second, a);
        break;
      }
    }
    // Sends that completed give their buffers back.
    for (std::size_t k = 0; k < sends_.size();) {
      if (sends_[k].work.test()) {
        free_buffers_.push_back(std::move(sends_[k].buffer));
        sends_[k] = std::move(sends_.back());
        sends_.pop_back();
      } else {
        ++k;
      }
    }
    timing.end = now();
    out.timings.push_back(timing);
  }
  for (Transfer& t : sends_) wait(t, s.actions[stage_][static_cast<std::size_t>(t.index)]);
  for (Transfer& t : sends_) free_buffers_.push_back(std::move(t.buffer));
  sends_.clear();
  NDMESH_CHECK(recvs_.empty(), "pp", "stage {}: {} received transfers were never used by a compute action",
               stage_, recvs_.size());
  NDMESH_CHECK(outbox_.empty(), "pp", "stage {}: {} computed results were never sent", stage_,
               outbox_.size());
  for (int c = 0; c < static_cast<int>(chunks_.size()); ++c)
    for (int mb = 0; mb < m; ++mb) release_acts(mb, c);
  // The per-token losses of every micro-batch this rank's head saw, read back once (or left
  // to the caller).
  if (hooks.take_loss)
    for (model::Model* c : chunks_)
      if (c->has_head()) out.loss_sum += c->take_loss_sum();
  return out;
}

}  // namespace ndmesh::pp
