// Pipeline schedule generators.
//
// Each generator first decides the compute order of every stage (the published shape of
// the schedule), then with_communication() inserts the sends and receives. Placing the
// transfers is the delicate part: with blocking point-to-point, a stage that sends an
// activation while its neighbour sends it a gradient deadlocks. We time the compute
// with unit costs (every dependency crossing stages becomes a transfer at the moment its
// data is produced), sort all transfers by that time into one global order, and place
// each on both of its stages at that time. Every stage then meets its transfers in the
// same global order, which is exactly the condition for rendezvous sends and receives
// to never deadlock, and every receive still precedes the compute that needs it.
#include "ndmesh/parallel/pp/schedule.hpp"

#include <algorithm>
#include <tuple>

#include <fmt/core.h>

#include "ndmesh/core/error.hpp"

namespace ndmesh::pp {

std::string_view action_kind_name(ActionKind k) {
  switch (k) {
    case ActionKind::kForward:
      return "forward";
    case ActionKind::kBackward:
      return "backward";
    case ActionKind::kBackwardInput:
      return "backward-input";
    case ActionKind::kBackwardWeight:
      return "backward-weight";
    case ActionKind::kSendActivation:
      return "send-activation";
    case ActionKind::kRecvActivation:
      return "recv-activation";
    case ActionKind::kSendGradient:
      return "send-gradient";
    case ActionKind::kRecvGradient:
      return "recv-gradient";
  }
  return "unknown";
}

char action_kind_letter(ActionKind k) {
  switch (k) {
    case ActionKind::kForward:
      return 'F';
    case ActionKind::kBackward:
    case ActionKind::kBackwardInput:
      return 'B';
    case ActionKind::kBackwardWeight:
      return 'W';
    case ActionKind::kSendActivation:
    case ActionKind::kSendGradient:
      return 'S';
    case ActionKind::kRecvActivation:
    case ActionKind::kRecvGradient:
      return 'R';
  }
  return '?';
}

std::string to_string(const Action& a) {
  std::string s = fmt::format("{} mb {} chunk {}", action_kind_name(a.kind), a.microbatch, a.chunk);
  if (is_send(a.kind)) s += fmt::format(" to stage {}", a.peer);
  if (is_recv(a.kind)) s += fmt::format(" from stage {}", a.peer);
  return s;
}

std::vector<std::string> schedule_option_problems(const ScheduleOptions& o) {
  std::vector<std::string> out;
  if (o.stages < 1) out.push_back(fmt::format("pp={} must be at least 1; use pp=1 or more", o.stages));
  // Generation and simulation keep per-pair state of the stages (memory grows with pp^2:
  // pp=1000 took 680 MB and 6 s even with one micro-batch; found by fuzz_schedule).
  if (o.stages > kMaxScheduleStages)
    out.push_back(fmt::format("pp={} is above the limit of {} pipeline stages; use pp={} or fewer", o.stages,
                              kMaxScheduleStages, kMaxScheduleStages));
  if (o.microbatches < 1)
    out.push_back(fmt::format("microbatches={} must be at least 1; use microbatches={}", o.microbatches,
                              std::max(o.stages, 1)));
  if (o.chunks < 1) out.push_back(fmt::format("vpp={} must be at least 1; use vpp=1", o.chunks));
  if (o.schedule == Schedule::kInterleaved) {
    if (o.chunks == 1)
      out.push_back("vpp=1 with the interleaved schedule has no virtual stages; use vpp=2 or more");
    if (o.stages == 1) out.push_back("the interleaved schedule needs pp > 1 (pp=1); use schedule=1f1b");
    if (o.stages >= 1 && o.microbatches >= 1 && o.microbatches % o.stages != 0) {
      // In 64 bits: microbatches near INT_MAX rounds up past int (found by fuzz_schedule).
      std::int64_t up = (std::int64_t{o.microbatches} / o.stages + 1) * o.stages;
      out.push_back(
          fmt::format("microbatches={} is not a multiple of pp={} as the interleaved schedule needs; use "
                      "microbatches={}",
                      o.microbatches, o.stages, up));
    }
  } else if (o.chunks > 1) {
    out.push_back(fmt::format(
        "vpp={} applies only to the interleaved schedule; use vpp=1 or schedule=interleaved", o.chunks));
  }
  if (out.empty() && std::int64_t{o.stages} * o.microbatches * o.chunks > kMaxScheduleWork)
    out.push_back(fmt::format("pp*microbatches*vpp = {}*{}*{} exceeds {}; use fewer micro-batches", o.stages,
                              o.microbatches, o.chunks, kMaxScheduleWork));
  return out;
}

namespace {

Action compute(ActionKind kind, int mb, int chunk = 0) {
  return Action{.kind = kind, .microbatch = mb, .chunk = chunk};
}

std::vector<std::vector<Action>> gpipe_order(int p, int m) {
  std::vector<std::vector<Action>> out(p);
  for (int r = 0; r < p; ++r) {
    for (int i = 0; i < m; ++i) out[r].push_back(compute(ActionKind::kForward, i));
    for (int i = 0; i < m; ++i) out[r].push_back(compute(ActionKind::kBackward, i));
  }
  return out;
}

// Megatron forward_backward_pipelining_without_interleaving.
std::vector<std::vector<Action>> one_f_one_b_order(int p, int m) {
  std::vector<std::vector<Action>> out(p);
  for (int r = 0; r < p; ++r) {
    int warmup = std::min(p - r - 1, m);
    int remaining = m - warmup;
    auto& ops = out[r];
    for (int i = 0; i < warmup; ++i) ops.push_back(compute(ActionKind::kForward, i));
    for (int i = 0; i < remaining; ++i) {
      ops.push_back(compute(ActionKind::kForward, warmup + i));
      ops.push_back(compute(ActionKind::kBackward, i));
    }
    for (int i = remaining; i < m; ++i) ops.push_back(compute(ActionKind::kBackward, i));
  }
  return out;
}

// Megatron forward_backward_pipelining_with_interleaving. Virtual micro-batch k (of m*v)
// walks the chunks in groups of p micro-batches: forward k runs chunk (k % pv) / p of
// micro-batch (k / pv) * p + k % p; backward k runs the chunks in reverse.
std::vector<std::vector<Action>> interleaved_order(int p, int m, int v) {
  std::vector<std::vector<Action>> out(p);
  const int total = m * v;
  auto mb_of = [&](int k) { return (k / (p * v)) * p + k % p; };
  auto fwd = [&](int k) { return compute(ActionKind::kForward, mb_of(k), (k % (p * v)) / p); };
  auto bwd = [&](int k) { return compute(ActionKind::kBackward, mb_of(k), v - 1 - (k % (p * v)) / p); };
  for (int r = 0; r < p; ++r) {
    int warmup = m == p ? total : std::min((p - r - 1) * 2 + (v - 1) * p, total);
    int remaining = total - warmup;
    auto& ops = out[r];
    for (int k = 0; k < warmup; ++k) ops.push_back(fwd(k));
    for (int k = 0; k < remaining; ++k) {
      ops.push_back(fwd(k + warmup));
      ops.push_back(bwd(k));
    }
    for (int k = remaining; k < total; ++k) ops.push_back(bwd(k));
  }
  return out;
}

// ZB-H1 (Qi et al. 2023, section 3.1): the backward is split into B (input gradient, on
// the critical path) and W (weight gradient, free to move). Like 1F1B, stage r holds at
// most min(p-r, m) micro-batches between their F and their B, so activation memory
// matches 1F1B; W passes fill the slots where 1F1B waits for gradients. The order comes
// from a unit-time list schedule: whenever a stage is free it runs the next B if its
// gradient has arrived, else the next F if it has arrived and memory allows, else the
// next pending W. With at least p micro-batches this reaches the paper's bubble of
// (p-1)(F+B-W) per stage instead of 1F1B's (p-1)(F+B+W).
std::vector<std::vector<Action>> zb_h1_order(int p, int m) {
  std::vector<std::vector<Action>> out(p);
  // end times (unit costs) of F and B of micro-batch i on stage r; -1 = not started
  std::vector<std::vector<int>> f_end(p, std::vector<int>(m, -1)), b_end = f_end;
  std::vector<int> next_f(p, 0), next_b(p, 0), next_w(p, 0), free_at(p, 0);
  auto done = [](int end, int t) { return end >= 0 && end <= t; };
  for (int t = 0, finished = 0; finished < p; ++t) {
    for (int r = 0; r < p; ++r) {
      if (free_at[r] > t || next_w[r] == m) continue;
      const int b = next_b[r], f = next_f[r];
      if (b < m && done(f_end[r][b], t) && (r == p - 1 || done(b_end[r + 1][b], t))) {
        out[r].push_back(compute(ActionKind::kBackwardInput, b));
        b_end[r][b] = t + 1;
        ++next_b[r];
      } else if (f < m && f - b < std::min(p - r, m) && (r == 0 || done(f_end[r - 1][f], t))) {
        out[r].push_back(compute(ActionKind::kForward, f));
        f_end[r][f] = t + 1;
        ++next_f[r];
      } else if (next_w[r] < b) {
        out[r].push_back(compute(ActionKind::kBackwardWeight, next_w[r]));
        finished += ++next_w[r] == m;
      } else {
        continue;
      }
      free_at[r] = t + 1;
    }
  }
  return out;
}

struct Transfer {
  std::int64_t time;
  int src, dst;
  ActionKind send_kind;
  int mb, src_chunk, dst_chunk;
};

}  // namespace

PipelineSchedule with_communication(Schedule kind, int stages, int microbatches, int chunks,
                                    std::vector<std::vector<Action>> compute_order) {
  PipelineSchedule s;
  s.kind = kind;
  s.stages = stages;
  s.microbatches = microbatches;
  s.chunks = chunks;
  NDMESH_CHECK(static_cast<int>(compute_order.size()) == stages, "pp",
               "compute order has {} stages but the schedule has pp={}", compute_order.size(), stages);
  const int p = stages, m = microbatches, nv = s.virtual_stages();
  for (int r = 0; r < p; ++r)
    for (std::size_t i = 0; i < compute_order[r].size(); ++i) {
      const Action& a = compute_order[r][i];
      NDMESH_CHECK(
          !is_p2p(a.kind) && a.microbatch >= 0 && a.microbatch < m && a.chunk >= 0 && a.chunk < chunks, "pp",
          "stage {} action {} ({}) is not a compute action within mb < {} and chunk < {}", r, i, to_string(a),
          m, chunks);
    }

  // Unit-cost timing: F 1, full backward 2, B 1, W 1. Dependencies: forward of virtual
  // stage v needs forward of v-1; backward (or B) of v needs backward of v+1, or on the
  // last virtual stage the forward of v; W needs B.
  auto key = [&](int mb, int v) { return static_cast<std::size_t>(v) * m + mb; };
  std::vector<std::int64_t> fwd_end(static_cast<std::size_t>(nv) * m, -1), bwd_end(fwd_end.size(), -1);
  std::vector<std::vector<std::int64_t>> start(p), end(p);
  std::vector<std::size_t> pc(p, 0);
  std::vector<std::int64_t> clock(p, 0);
  for (int r = 0; r < p; ++r) {
    start[r].assign(compute_order[r].size(), 0);
    end[r].assign(compute_order[r].size(), 0);
  }
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < p; ++r) {
      for (; pc[r] < compute_order[r].size(); ++pc[r]) {
        const Action& a = compute_order[r][pc[r]];
        const int v = s.virtual_stage(r, a.chunk);
        std::int64_t ready = 0, cost = 1;
        if (a.kind == ActionKind::kForward) {
          ready = v > 0 ? fwd_end[key(a.microbatch, v - 1)] : 0;
        } else if (a.kind == ActionKind::kBackwardWeight) {
          ready = bwd_end[key(a.microbatch, v)];
        } else {
          ready = v + 1 < nv ? bwd_end[key(a.microbatch, v + 1)] : fwd_end[key(a.microbatch, v)];
          if (a.kind == ActionKind::kBackward) cost = 2;
        }
        if (ready < 0) break;
        start[r][pc[r]] = std::max(clock[r], ready);
        clock[r] = end[r][pc[r]] = start[r][pc[r]] + cost;
        if (a.kind == ActionKind::kForward) fwd_end[key(a.microbatch, v)] = clock[r];
        if (a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardInput)
          bwd_end[key(a.microbatch, v)] = clock[r];
        progress = true;
      }
    }
  }
  for (int r = 0; r < p; ++r)
    NDMESH_CHECK(pc[r] == compute_order[r].size(), "pp",
                 "stage {} action {} ({}) can never run: the data it needs is never produced before it", r,
                 pc[r], to_string(compute_order[r][pc[r]]));

  std::vector<Transfer> transfers;
  for (int r = 0; r < p; ++r)
    for (std::size_t i = 0; i < compute_order[r].size(); ++i) {
      const Action& a = compute_order[r][i];
      const int v = s.virtual_stage(r, a.chunk);
      if (a.kind == ActionKind::kForward && v + 1 < nv && s.stage_of(v + 1) != r)
        transfers.push_back({end[r][i], r, s.stage_of(v + 1), ActionKind::kSendActivation, a.microbatch,
                             a.chunk, s.chunk_of(v + 1)});
      if ((a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardInput) && v > 0 &&
          s.stage_of(v - 1) != r)
        transfers.push_back({end[r][i], r, s.stage_of(v - 1), ActionKind::kSendGradient, a.microbatch,
                             a.chunk, s.chunk_of(v - 1)});
    }
  std::sort(transfers.begin(), transfers.end(), [](const Transfer& x, const Transfer& y) {
    return std::tie(x.time, x.src, x.dst, x.send_kind, x.mb, x.src_chunk) <
           std::tie(y.time, y.src, y.dst, y.send_kind, y.mb, y.src_chunk);
  });

  // Merge per stage. A compute action sorts at (start, 1, index); a transfer at
  // (time, 0, global index): after every compute that started before the data exists
  // and before every compute starting at or after that moment.
  using Key = std::tuple<std::int64_t, int, std::size_t>;
  std::vector<std::vector<std::pair<Key, Action>>> merged(p);
  for (int r = 0; r < p; ++r)
    for (std::size_t i = 0; i < compute_order[r].size(); ++i)
      merged[r].push_back({Key{start[r][i], 1, i}, compute_order[r][i]});
  for (std::size_t g = 0; g < transfers.size(); ++g) {
    const Transfer& t = transfers[g];
    const bool act = t.send_kind == ActionKind::kSendActivation;
    merged[t.src].push_back(
        {Key{t.time, 0, g},
         Action{.kind = t.send_kind, .microbatch = t.mb, .chunk = t.src_chunk, .peer = t.dst}});
    merged[t.dst].push_back(
        {Key{t.time, 0, g}, Action{.kind = act ? ActionKind::kRecvActivation : ActionKind::kRecvGradient,
                                   .microbatch = t.mb,
                                   .chunk = t.dst_chunk,
                                   .peer = t.src}});
  }
  s.actions.resize(p);
  for (int r = 0; r < p; ++r) {
    std::sort(merged[r].begin(), merged[r].end(),
              [](const auto& x, const auto& y) { return x.first < y.first; });
    for (auto& [k, a] : merged[r]) s.actions[r].push_back(a);
  }
  return s;
}

PipelineSchedule make_schedule(const ScheduleOptions& o) {
  auto problems = schedule_option_problems(o);
  if (!problems.empty()) {
    std::string msg = problems[0];
    for (std::size_t i = 1; i < problems.size(); ++i) msg += "; " + problems[i];
    fail<ConfigError>("pp", "{}", msg);
  }
  switch (o.schedule) {
    case Schedule::kGpipe:
      return with_communication(o.schedule, o.stages, o.microbatches, 1,
                                gpipe_order(o.stages, o.microbatches));
    case Schedule::k1F1B:
      return with_communication(o.schedule, o.stages, o.microbatches, 1,
                                one_f_one_b_order(o.stages, o.microbatches));
    case Schedule::kInterleaved:
      return with_communication(o.schedule, o.stages, o.microbatches, o.chunks,
                                interleaved_order(o.stages, o.microbatches, o.chunks));
    case Schedule::kZbH1:
      return with_communication(o.schedule, o.stages, o.microbatches, 1,
                                zb_h1_order(o.stages, o.microbatches));
  }
  fail("pp", "unknown schedule {}", static_cast<int>(o.schedule));
}

}  // namespace ndmesh::pp
