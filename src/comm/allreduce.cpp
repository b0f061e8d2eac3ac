// The all-reduce programs. A program is one or more streams of steps per rank; a step's
// sends and receives are posted together and its reductions run after all of them
// completed, so a rank never reads a buffer a transfer still owns. Streams run side by
// side (the tree's reduce and broadcast; the hierarchical in-node reduce, ring across
// nodes and in-node broadcast), a step waiting where needed for the segment another
// stream produces: the in-node and across-node parts of different segments overlap
// instead of running one after the other. Every reducer sends on its own duplicate of its
// group (comm/tags.hpp), and concurrent all-reduces of a reducer use distinct tags from
// that communicator's sequence of starts (every member starts them in the same order, so
// they agree on it), which keeps MPI's in-order matching unambiguous. A sequence shared by
// several groups would not: a rank that runs more all-reduces on one group than its peers
// would disagree with them on the next tag of another group.
//
// Adaptive's table (documented choice, from the step counts): below 64 KiB latency
// dominates and the tree's 2 log2(p) steps beat the ring's 2(p-1); from 64 KiB the ring's
// 2(p-1)/p n bytes per rank win; a group spanning nodes with several ranks per node runs
// hierarchical, which sends each element across the network once per node. Measured on
// two real nodes joined by 1 Gbit/s (bench/bench_multinode.sh, 2x2 and 2x4 ranks): up to
// 256 KiB tree and hierarchical were within the noise of each other (either first,
// depending on the run), both ahead of the ring; from 1 MiB hierarchical was the fastest
// in every run (1.2-2.0x the ring), so the table stands.
#include "ndmesh/comm/allreduce.hpp"

#include "ndmesh/comm/tags.hpp"

#include <algorithm>
#include <array>
#include <cstring>

#include <fmt/format.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/core/log.hpp"
#include "ndmesh/core/strings.hpp"
#include "ndmesh/mesh/mesh.hpp"

namespace ndmesh::comm {

std::string_view algorithm_name(AllReduceAlgorithm a) {
  switch (a) {
    case AllReduceAlgorithm::kMpi:
      return "mpi";
    case AllReduceAlgorithm::kRing:
      return "ring";
    case AllReduceAlgorithm::kTree:
      return "tree";
    case AllReduceAlgorithm::kHierarchical:
      return "hierarchical";
    case AllReduceAlgorithm::kAdaptive:
      return "adaptive";
  }
  return "?";
}

AllReduceAlgorithm parse_algorithm(std::string_view name, std::string_view flag) {
  for (auto a : {AllReduceAlgorithm::kMpi, AllReduceAlgorithm::kRing, AllReduceAlgorithm::kTree,
                 AllReduceAlgorithm::kHierarchical, AllReduceAlgorithm::kAdaptive})
    if (algorithm_name(a) == name) return a;
  fail<ConfigError>("comm", "{}={} is not an all-reduce algorithm; use mpi, ring, tree, hierarchical or adaptive",
                    flag, name.size() > 64 ? std::string(name.substr(0, 64)) + "..." : std::string(name));
}

namespace detail {

struct Post {
  const Communicator* comm;
  int peer;
  bool send;
  bool scratch;  // the scratch buffer, else the data
  std::size_t offset, count;
};
struct Reduce {
  std::size_t dst, src, count;  // data[dst..] += scratch[src..]
};
struct Step {
  std::vector<Post> posts;
  std::vector<Reduce> reduces;
  // Posted only once stream `after_stream` has completed `after_steps` of its steps (-1:
  // no condition): how one stream waits for the segment another one produces.
  int after_stream = -1;
  std::size_t after_steps = 0;
};
// A sequence of steps run in order. The streams of a program run side by side, so the
// in-node and across-node parts of different segments overlap. Each directed pair of
// ranks on a communicator carries the messages of one stream only, so the order of its
// messages is the same on both sides whatever the interleaving of the streams.
struct Stream {
  std::vector<Step> steps;
  std::size_t next = 0;
  bool posted = false;
  std::vector<Work> works;
  bool done() const { return next == steps.size(); }
};

// Scratch space without zero-filling (a fresh zeroed 2n-byte vector per call was most of
// the cost of large all-reduces).
struct Scratch {
  std::unique_ptr<std::byte[]> bytes;
  std::size_t capacity = 0, used = 0;
  std::size_t size() const { return used; }
  std::byte* data() { return bytes.get(); }
  void resize(std::size_t n) {
    if (n > capacity) {
      bytes.reset(new std::byte[n]);
      capacity = n;
    }
    used = n;
  }
};

// What the copies of one AllReducer share: scratch buffers reused across calls and the
// tag sequence of its communicator.
struct ScratchPool {
  std::vector<Scratch> free;
  std::uint64_t sequence = 0;  // all-reduces started on the reducer's communicator
};

struct AllReduceProgram {
  ElementSpan data;
  Scratch scratch;
  std::shared_ptr<ScratchPool> pool;  // where the scratch goes back when the program ends
  ~AllReduceProgram() {
    if (pool && scratch.capacity > 0 && pool->free.size() < 16) pool->free.push_back(std::move(scratch));
  }
  std::vector<Stream> streams;
  std::size_t scratch_elements = 0;  // reserved so far by the builders
  int tag = 0;

  // Reserves `count` scratch elements for one stream; returns where they start.
  std::size_t reserve(std::size_t count) {
    std::size_t base = scratch_elements;
    scratch_elements += count;
    return base;
  }

  ElementSpan piece(bool in_scratch, std::size_t offset, std::size_t count) {
    char* base = in_scratch ? reinterpret_cast<char*>(scratch.data()) : static_cast<char*>(data.data);
    return {base + offset * dtype_size(data.dtype), count, data.dtype};
  }

  template <typename T>
  static Work post_typed(const Post& p, ElementSpan s, int tag) {
    std::span<T> span(static_cast<T*>(s.data), s.count);
    Options o{.tag = tag};
    if (p.send) return p.comm->send_async(std::span<const T>(span), p.peer, o);
    return p.comm->recv_async(span, p.peer, o);
  }

  Work post(const Post& p) {
    ElementSpan s = piece(p.scratch, p.offset, p.count);
    return visit_dtype(data.dtype, [&]<typename T>(T) { return post_typed<T>(p, s, tag); });
  }

  template <typename T>
  void add(const Reduce& r) {
    T* dst = static_cast<T*>(data.data) + r.dst;
    const T* src = reinterpret_cast<const T*>(scratch.data()) + r.src;
    if constexpr (std::is_same_v<T, BFloat16>) {
      for (std::size_t i = 0; i < r.count; ++i) dst[i] = BFloat16(static_cast<float>(dst[i]) + static_cast<float>(src[i]));
    } else {
      for (std::size_t i = 0; i < r.count; ++i) dst[i] += src[i];
    }
  }

  void reduce(const Reduce& r) {
    visit_dtype(data.dtype, [&]<typename T>(T) { add<T>(r); });
  }

  bool done() const {
    for (const Stream& s : streams)
      if (!s.done()) return false;
    return true;
  }

  // Runs the steps of every stream while their conditions hold and their transfers are
  // complete; true when the program is done.
  bool advance() {
    for (bool progress = true; progress;) {
      progress = false;
      for (Stream& s : streams) {
        while (!s.done()) {
          Step& step = s.steps[s.next];
          if (!s.posted) {
            if (step.after_stream >= 0 &&
                streams[static_cast<std::size_t>(step.after_stream)].next < step.after_steps)
              break;
            s.works.clear();
            for (const Post& p : step.posts) s.works.push_back(post(p));
            s.posted = true;
          }
          bool complete = true;
          for (Work& w : s.works) complete = w.test() && complete;
          if (!complete) break;
          for (const Reduce& r : step.reduces) reduce(r);
          ++s.next;
          s.posted = false;
          progress = true;
        }
      }
    }
    return done();
  }

  void wait() {
    std::vector<Work> pending;
    while (!advance()) {
      pending.clear();
      for (Stream& s : streams)
        for (Work& w : s.works)
          if (s.posted && !w.done()) pending.push_back(w);
      wait_any(pending);
    }
  }
};

namespace {

// Start of chunk i when n elements are cut into p chunks differing by at most one.
std::size_t chunk_start(std::size_t n, std::size_t p, std::size_t i) {
  return i * (n / p) + std::min(i, n % p);
}

// The scratch elements add_ring needs for n elements over g.
std::size_t ring_scratch(const Communicator& g, std::size_t n) {
  return g.size() > 1 ? n / static_cast<std::size_t>(g.size()) + 1 : 0;
}

// The ring's chunk c of n elements over p ranks: (start, count), chunks differing by at
// most one element.
std::pair<std::size_t, std::size_t> ring_chunk(std::size_t n, std::size_t p, std::size_t c) {
  return {chunk_start(n, p, c), chunk_start(n, p, c + 1) - chunk_start(n, p, c)};
}

// The chunk group rank r holds reduced after add_ring_reduce_scatter over p ranks (with
// the default `shift` of 1).
std::size_t ring_owned_chunk(std::size_t p, std::size_t r) { return (r + 1) % p; }

// Ring reduce-scatter of data[offset, offset + n) over g (p-1 steps), appended to stream
// `st`, receiving into the scratch elements from `scratch` (ring_scratch of them): rank r
// ends with chunk (r + shift) % p summed over the group: ring_owned_chunk(p, r) with the
// all-reduce's shift of 1 (its all-gather starts from there), chunk r with 0 (the
// reduce-scatter collective's layout).
void add_ring_reduce_scatter(Stream& st, const Communicator& g, std::size_t offset, std::size_t n,
                             std::size_t scratch, std::size_t shift = 1) {
  const auto p = static_cast<std::size_t>(g.size());
  if (p <= 1) return;
  const auto r = static_cast<std::size_t>(g.rank());
  const int next = static_cast<int>((r + 1) % p), prev = static_cast<int>((r + p - 1) % p);
  for (std::size_t s = 0; s + 1 < p; ++s) {
    auto [so, sc] = ring_chunk(n, p, (r + shift + 2 * p - 1 - s) % p);
    auto [ro, rc] = ring_chunk(n, p, (r + shift + 2 * p - 2 - s) % p);
    st.steps.push_back({{{&g, next, true, false, offset + so, sc}, {&g, prev, false, true, scratch, rc}},
                        {{offset + ro, scratch, rc}}});
  }
}

// Ring all-gather of the chunks add_ring_reduce_scatter left (p-1 steps).
void add_ring_all_gather(Stream& st, const Communicator& g, std::size_t offset, std::size_t n) {
  const auto p = static_cast<std::size_t>(g.size());
  if (p <= 1) return;
  const auto r = static_cast<std::size_t>(g.rank());
  const int next = static_cast<int>((r + 1) % p), prev = static_cast<int>((r + p - 1) % p);
  for (std::size_t s = 0; s + 1 < p; ++s) {
    auto [so, sc] = ring_chunk(n, p, (r + 1 + p - s) % p);
    auto [ro, rc] = ring_chunk(n, p, (r + p - s) % p);
    st.steps.push_back(
        {{{&g, next, true, false, offset + so, sc}, {&g, prev, false, false, offset + ro, rc}}, {}});
  }
}

// Ring all-reduce of data[offset, offset + n) over g: reduce-scatter, then all-gather.
void add_ring(Stream& st, const Communicator& g, std::size_t offset, std::size_t n, std::size_t scratch) {
  add_ring_reduce_scatter(st, g, offset, n, scratch);
  add_ring_all_gather(st, g, offset, n);
}

// Binary tree over group ranks rooted at 0: children 2r+1, 2r+2. The message is cut
// into segments that flow through the tree as a pipeline: in step k a rank receives its
// children's segment k while it sends its parent segment k-1 (already reduced), so for
// large messages every link is busy at once and the time tends to n / bandwidth instead
// of log2(p) n / bandwidth.
constexpr std::size_t kTreeSegmentBytes = 256 * 1024;

std::size_t tree_segment(DType t, std::size_t n) {
  return std::max<std::size_t>(1, std::min(n, kTreeSegmentBytes / dtype_size(t)));
}

std::vector<int> tree_children(const Communicator& g) {
  std::vector<int> children;
  for (int c : {2 * g.rank() + 1, 2 * g.rank() + 2})
    if (c < g.size()) children.push_back(c);
  return children;
}

// The tree reduce to group rank 0 as stream `st`, with its scratch from `scratch`
// (tree_scratch elements). Returns, per segment, how many steps of the stream must be
// complete for the segment to be finished here: reduced at the root, sent elsewhere.
std::size_t tree_scratch(const Communicator& g, DType t, std::size_t n) {
  return tree_children(g).size() * tree_segment(t, n);
}

std::vector<std::size_t> add_tree_reduce(Stream& st, const Communicator& g, DType t, std::size_t n,
                                         std::size_t scratch) {
  const int p = g.size(), r = g.rank();
  const std::size_t seg = tree_segment(t, n), nseg = n == 0 ? 0 : (n + seg - 1) / seg;
  std::vector<std::size_t> finished(nseg, 0);
  if (p <= 1 || n == 0) return finished;
  const std::vector<int> children = tree_children(g);
  auto piece = [&](std::size_t k) { return std::pair{k * seg, std::min(seg, n - k * seg)}; };
  for (std::size_t k = 0; k <= nseg; ++k) {
    Step step;
    if (k < nseg) {
      auto [off, cnt] = piece(k);
      for (std::size_t i = 0; i < children.size(); ++i) {
        step.posts.push_back({&g, children[i], false, true, scratch + i * seg, cnt});
        step.reduces.push_back({off, scratch + i * seg, cnt});
      }
    }
    if (k > 0 && r != 0) {
      auto [off, cnt] = piece(k - 1);
      step.posts.push_back({&g, (r - 1) / 2, true, false, off, cnt});
    }
    if (step.posts.empty()) continue;
    st.steps.push_back(std::move(step));
    if (r == 0 && k < nseg) finished[k] = st.steps.size();
    if (r != 0 && k > 0) finished[k - 1] = st.steps.size();
  }
  return finished;
}

// The tree broadcast from group rank 0 as stream `st`, segment by segment. The step that
// sends segment k from the root, or receives it elsewhere, first waits for `ready(k)`:
// the (stream, steps) that finish the segment's reduction at the root, or its send up
// the tree elsewhere (so that the value arriving never overwrites data being sent).
template <typename Ready>
void add_tree_broadcast(Stream& st, const Communicator& g, DType t, std::size_t n, Ready ready) {
  const int p = g.size(), r = g.rank();
  if (p <= 1 || n == 0) return;
  const std::size_t seg = tree_segment(t, n), nseg = (n + seg - 1) / seg;
  auto piece = [&](std::size_t k) { return std::pair{k * seg, std::min(seg, n - k * seg)}; };
  for (std::size_t k = 0; k <= nseg; ++k) {
    Step step;
    if (k < nseg && r != 0) {
      auto [off, cnt] = piece(k);
      step.posts.push_back({&g, (r - 1) / 2, false, false, off, cnt});
      std::tie(step.after_stream, step.after_steps) = ready(k);
    }
    if (k > 0) {
      auto [off, cnt] = piece(k - 1);
      for (int c : tree_children(g)) step.posts.push_back({&g, c, true, false, off, cnt});
      if (r == 0) std::tie(step.after_stream, step.after_steps) = ready(k - 1);
    }
    if (!step.posts.empty()) st.steps.push_back(std::move(step));
  }
}

// The pipeline unit of the ring across nodes, in tree segments (2 MiB): a message of n
// bytes crosses the inter-node link in ceil(n / 2 MiB) segments, each a full ring of
// 2(nodes-1) steps. Smaller segments overlap more but pay the per-step cost more often:
// on two nodes joined by a 1 Gbit/s link (tests/multinode), 256 KiB segments made the
// hierarchical all-reduce slower than unsegmented, 2-4 MiB ones about 1.45x faster than
// the flat ring at 4-16 MiB (docs/multinode.md).
constexpr std::size_t kRingSegmentTrees = 8;

// The pipeline unit of add_node_rings: 4 MiB. Each segment costs 2(M-1) steps inside the
// node and 2(N-1) across; on two nodes of 2 and of 4 ranks joined by 1 Gbit/s, 0.5-1 MiB
// segments were slower than none at 4-16 MiB, 2-4 MiB ones the fastest (docs/multinode.md).
constexpr std::size_t kNodeRingSegmentBytes = 4 << 20;

// The pipeline unit of add_node_rings.

// Tree reduce over `tree` to its rank 0, then (when `ring` is a group of several ranks) a
// ring all-reduce over `ring`, then a tree broadcast over `tree`: three streams cut into
// the same segments, so segment k crosses the ring while segment k+1 is being reduced and
// segment k-1 broadcast. tree = the group and no ring: the tree algorithm; tree = the
// node, ring = the node leaders: the hierarchical one.
void add_reduce_ring_broadcast(AllReduceProgram& prog, const Communicator& tree, const Communicator* ring,
                               std::size_t n) {
  const DType t = prog.data.dtype;
  prog.streams.resize(3);
  const std::vector<std::size_t> reduced =
      add_tree_reduce(prog.streams[0], tree, t, n, prog.reserve(tree_scratch(tree, t, n)));
  const std::size_t seg = tree_segment(t, n), nseg = reduced.size();
  std::vector<std::size_t> ringed;  // per ring segment: the steps of stream 1 that finish it
  if (ring != nullptr && ring->size() > 1 && n > 0) {
    const std::size_t rseg = seg * kRingSegmentTrees;
    const std::size_t scratch = prog.reserve(ring_scratch(*ring, rseg));
    Stream& st = prog.streams[1];
    for (std::size_t off = 0, j = 0; off < n; off += rseg, ++j) {
      const std::size_t first = st.steps.size();
      add_ring(st, *ring, off, std::min(rseg, n - off), scratch);
      st.steps[first].after_stream = 0;
      st.steps[first].after_steps = reduced[std::min((j + 1) * kRingSegmentTrees, nseg) - 1];
      ringed.push_back(st.steps.size());
    }
  }
  add_tree_broadcast(prog.streams[2], tree, t, n, [&](std::size_t k) -> std::pair<int, std::size_t> {
    if (tree.rank() == 0 && !ringed.empty()) return {1, ringed[k / kRingSegmentTrees]};
    return {0, reduced[k]};
  });
}

// The hierarchical all-reduce on nodes of equal size M: a ring reduce-scatter inside each
// node leaves local rank r with chunk ring_owned_chunk(M, r); all local ranks then
// all-reduce their chunk at once, each in a ring with the ranks of the same local rank on
// the other nodes (`cross`); a ring all-gather inside the node (`gather`, a second
// communicator of the node, so that each directed pair carries one stream) spreads the
// result. Across the link each node sends 2(N-1)/N n in all, as with one leader per node,
// but from all M ranks side by side, and every rank does the same share of the work in
// the node. Three streams over segments of kNodeRingSegmentBytes.
void add_node_rings(AllReduceProgram& prog, const Communicator& intra, const Communicator& cross,
                    const Communicator& gather, std::size_t n) {
  const std::size_t es = dtype_size(prog.data.dtype);
  const std::size_t seg = std::max<std::size_t>(1, kNodeRingSegmentBytes / es);
  const auto m = static_cast<std::size_t>(intra.size());
  const std::size_t own = ring_owned_chunk(m, static_cast<std::size_t>(intra.rank()));
  const std::size_t s0 = prog.reserve(ring_scratch(intra, std::min(seg, n)));
  const std::size_t s1 = prog.reserve(ring_scratch(cross, std::min(seg, n) / m + 1));
  prog.streams.resize(3);
  for (std::size_t off = 0; off < n; off += seg) {
    const std::size_t cnt = std::min(seg, n - off);
    add_ring_reduce_scatter(prog.streams[0], intra, off, cnt, s0);
    const std::size_t scattered = prog.streams[0].steps.size();
    const std::size_t first = prog.streams[1].steps.size();
    auto [co, cc] = ring_chunk(cnt, m, own);
    add_ring(prog.streams[1], cross, off + co, cc, s1);
    prog.streams[1].steps[first].after_stream = 0;
    prog.streams[1].steps[first].after_steps = scattered;
    const std::size_t reduced = prog.streams[1].steps.size();
    const std::size_t gathered = prog.streams[2].steps.size();
    add_ring_all_gather(prog.streams[2], gather, off, cnt);
    prog.streams[2].steps[gathered].after_stream = 1;
    prog.streams[2].steps[gathered].after_steps = reduced;
  }
}

}  // namespace
}  // namespace detail

void ring_reduce_scatter(const Communicator& group, ElementSpan data, int tag) {
  NDMESH_CHECK(group.valid(), "comm", "ring_reduce_scatter on the empty handle");
  const auto p = static_cast<std::size_t>(group.size());
  NDMESH_CHECK(data.count % p == 0, "comm", "ring_reduce_scatter on group {}: {} elements are not {} equal blocks",
               group.name(), data.count, p);
  detail::AllReduceProgram prog;
  prog.data = data;
  prog.tag = tag;
  prog.streams.resize(1);
  // Equal blocks: the ring's chunks are the blocks, and chunk r ends on rank r.
  detail::add_ring_reduce_scatter(prog.streams[0], group, 0, data.count,
                                  prog.reserve(detail::ring_scratch(group, data.count)), 0);
  prog.scratch.resize(prog.scratch_elements * dtype_size(data.dtype));
  prog.wait();
}

PendingAllReduce::PendingAllReduce(std::unique_ptr<detail::AllReduceProgram> program)
    : program_(std::move(program)) {}
PendingAllReduce::PendingAllReduce() = default;
PendingAllReduce::PendingAllReduce(PendingAllReduce&&) noexcept = default;
PendingAllReduce& PendingAllReduce::operator=(PendingAllReduce&&) noexcept = default;
PendingAllReduce::~PendingAllReduce() {
  if (done()) return;
  try {
    wait();  // the data must not be released while transfers still own it
  } catch (const TimeoutError&) {
    // An in-process job that ended (comm/inproc.hpp): its error reaches the caller elsewhere.
  } catch (const JobAborted&) {
  } catch (const std::exception& e) {
    log::error("{} (while finishing an unwaited all-reduce)", e.what());
  }
}

bool PendingAllReduce::test() {
  if (program_) return program_->advance();
  return mpi_.test();
}

void PendingAllReduce::wait() {
  if (program_)
    program_->wait();
  else
    mpi_.wait();
}

bool PendingAllReduce::done() const {
  if (program_) return program_->done();
  return mpi_.done();
}

AllReducer::AllReducer(Communicator group, AllReducerOptions options)
    : group_(std::move(group)), options_(options), pool_(std::make_shared<detail::ScratchPool>()) {
  NDMESH_CHECK(group_.valid(), "comm", "an AllReducer needs a group; got the empty handle");
  NDMESH_CHECK(options_.ranks_per_node >= 0, "comm", "ranks_per_node={} must be >= 0", options_.ranks_per_node);
  if (options_.algorithm == AllReduceAlgorithm::kMpi) return;  // the engine's collective: no messages of ours
  group_ = group_.dup();  // the algorithms' messages never meet another subsystem's
  if (options_.algorithm != AllReduceAlgorithm::kHierarchical && options_.algorithm != AllReduceAlgorithm::kAdaptive)
    return;
  // Node of each member: simulated (world rank / ranks_per_node) or the real one.
  std::int64_t node = 0;
  if (options_.ranks_per_node > 0) {
    node = Mesh::placement(group_.members()[static_cast<std::size_t>(group_.rank())], options_.ranks_per_node).node;
    intra_ = group_.split(node, group_.rank(), group_.name() + "/node");
  } else {
    intra_ = group_.split_node().named(group_.name() + "/node");
  }
  leaders_ = group_.split(intra_.rank() == 0 ? std::optional<std::int64_t>(0) : std::nullopt, group_.rank(),
                          group_.name() + "/leaders");
  // Every member learns the node count from its node's leader.
  std::int64_t count = leaders_ ? leaders_.size() : 0;
  intra_.broadcast(std::span<std::int64_t>(&count, 1), 0);
  nodes_ = count;
  // Nodes of equal size (several ranks each): the rings of add_node_rings.
  std::array<std::int64_t, 2> size_range = {intra_.size(), -static_cast<std::int64_t>(intra_.size())};
  group_.all_reduce(std::span<std::int64_t>(size_range), {.op = ReduceOp::kMax});
  if (nodes_ > 1 && size_range[0] == -size_range[1] && intra_.size() > 1) {
    cross_ = group_.split(intra_.rank(), group_.rank(), group_.name() + "/cross");
    gather_ = intra_.split(0, intra_.rank(), group_.name() + "/node-gather");
  }
}

AllReduceAlgorithm AllReducer::choose(std::size_t bytes) const {
  if (options_.algorithm != AllReduceAlgorithm::kAdaptive) return options_.algorithm;
  if (bytes < 64 * 1024) return AllReduceAlgorithm::kTree;
  if (nodes_ > 1 && nodes_ < group_.size()) return AllReduceAlgorithm::kHierarchical;
  return AllReduceAlgorithm::kRing;
}

PendingAllReduce AllReducer::start_impl(ElementSpan data) {
  NDMESH_CHECK(group_.valid(), "comm", "all_reduce on an empty AllReducer");
  const AllReduceAlgorithm algorithm = choose(data.bytes());
  if (algorithm == AllReduceAlgorithm::kMpi) {
    PendingAllReduce out;
    visit_dtype(data.dtype, [&]<typename T>(T) {
      out.mpi_ = group_.all_reduce_async(std::span<T>(static_cast<T*>(data.data), data.count));
    });
    return out;
  }
  auto prog = std::make_unique<detail::AllReduceProgram>();
  prog->data = data;
  prog->pool = pool_;
  if (!pool_->free.empty()) {
    prog->scratch = std::move(pool_->free.back());
    pool_->free.pop_back();
    prog->scratch.used = 0;
  }
  // The same on every member: starts on one communicator are collective.
  prog->tag = options_.tag + static_cast<int>(pool_->sequence++ % tags::kAllReduceSequences);
  const std::size_t n = data.count;
  switch (algorithm) {
    case AllReduceAlgorithm::kRing:
      prog->streams.resize(1);
      detail::add_ring(prog->streams[0], group_, 0, n, prog->reserve(detail::ring_scratch(group_, n)));
      break;
    case AllReduceAlgorithm::kTree:
      detail::add_reduce_ring_broadcast(*prog, group_, nullptr, n);
      break;
    case AllReduceAlgorithm::kHierarchical:
      if (cross_)
        detail::add_node_rings(*prog, intra_, cross_, gather_, n);
      else
        detail::add_reduce_ring_broadcast(*prog, intra_, leaders_ ? &leaders_ : nullptr, n);
      break;
    default:
      break;
  }
  prog->scratch.resize(prog->scratch_elements * dtype_size(data.dtype));
  PendingAllReduce out(std::move(prog));
  out.test();
  return out;
}

}  // namespace ndmesh::comm
