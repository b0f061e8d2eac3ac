// The all-reduce programs. A program is a list of steps per rank; a step's sends and
// receives are posted together and its reductions run after all of them completed, so a
// rank never reads a buffer a transfer still owns. Every reducer sends on its own
// duplicate of its group (comm/tags.hpp), and concurrent all-reduces of a reducer use
// distinct tags from that communicator's sequence of starts (every member starts them in
// the same order, so they agree on it), which keeps MPI's in-order matching
// unambiguous. A sequence shared by several groups would not: a rank that runs more
// all-reduces on one group than its peers would disagree with them on the next tag of
// another group.
//
// Adaptive's table (documented choice, from the step counts): below 64 KiB latency
// dominates and the tree's 2 log2(p) steps beat the ring's 2(p-1); from 64 KiB the ring's
// 2(p-1)/p n bytes per rank win; a group spanning nodes with several ranks per node runs
// hierarchical, which sends each element across the network once per node.
#include "ndmesh/comm/allreduce.hpp"

#include "ndmesh/comm/tags.hpp"

#include <algorithm>
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
  std::vector<Step> steps;
  std::vector<Work> works;
  std::size_t next = 0;
  bool posted = false;
  int tag = 0;

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

  // Runs steps while their transfers are complete; true when the program is done.
  bool advance() {
    while (next < steps.size()) {
      Step& step = steps[next];
      if (!posted) {
        works.clear();
        for (const Post& p : step.posts) works.push_back(post(p));
        posted = true;
      }
      for (Work& w : works)
        if (!w.test()) return false;
      for (const Reduce& r : step.reduces) reduce(r);
      ++next;
      posted = false;
    }
    return true;
  }

  void wait() {
    while (!advance()) wait_all(works);
  }
};

namespace {

// Start of chunk i when n elements are cut into p chunks differing by at most one.
std::size_t chunk_start(std::size_t n, std::size_t p, std::size_t i) { return i * (n / p) + std::min(i, n % p); }

void add_ring(AllReduceProgram& prog, const Communicator& g, std::size_t n) {
  const auto p = static_cast<std::size_t>(g.size());
  if (p <= 1) return;
  const auto r = static_cast<std::size_t>(g.rank());
  const int next = static_cast<int>((r + 1) % p), prev = static_cast<int>((r + p - 1) % p);
  auto chunk = [&](std::size_t i) { return std::pair{chunk_start(n, p, i), chunk_start(n, p, i + 1) - chunk_start(n, p, i)}; };
  prog.scratch.resize(std::max(prog.scratch.size(), (n / p + 1) * dtype_size(prog.data.dtype)));
  for (std::size_t s = 0; s + 1 < p; ++s) {  // reduce-scatter
    auto [so, sc] = chunk((r + p - s) % p);
    auto [ro, rc] = chunk((r + 2 * p - s - 1) % p);
    prog.steps.push_back({{{&g, next, true, false, so, sc}, {&g, prev, false, true, 0, rc}}, {{ro, 0, rc}}});
  }
  for (std::size_t s = 0; s + 1 < p; ++s) {  // all-gather of the reduced chunks
    auto [so, sc] = chunk((r + 1 + p - s) % p);
    auto [ro, rc] = chunk((r + p - s) % p);
    prog.steps.push_back({{{&g, next, true, false, so, sc}, {&g, prev, false, false, ro, rc}}, {}});
  }
}

// Binary tree over group ranks rooted at 0: children 2r+1, 2r+2. The message is cut
// into segments that flow through the tree as a pipeline: in step k a rank receives its
// children's segment k while it sends its parent segment k-1 (already reduced), so for
// large messages every link is busy at once and the time tends to n / bandwidth instead
// of log2(p) n / bandwidth.
constexpr std::size_t kTreeSegmentBytes = 256 * 1024;

std::size_t tree_segment(const AllReduceProgram& prog, std::size_t n) {
  return std::max<std::size_t>(1, std::min(n, kTreeSegmentBytes / dtype_size(prog.data.dtype)));
}

void add_tree_reduce(AllReduceProgram& prog, const Communicator& g, std::size_t n) {
  const int p = g.size(), r = g.rank();
  if (p <= 1 || n == 0) return;
  const std::size_t seg = tree_segment(prog, n), nseg = (n + seg - 1) / seg;
  std::vector<int> children;
  for (int c : {2 * r + 1, 2 * r + 2})
    if (c < p) children.push_back(c);
  prog.scratch.resize(std::max(prog.scratch.size(), children.size() * seg * dtype_size(prog.data.dtype)));
  auto piece = [&](std::size_t k) { return std::pair{k * seg, std::min(seg, n - k * seg)}; };
  for (std::size_t k = 0; k <= nseg; ++k) {
    Step step;
    if (k < nseg) {
      auto [off, cnt] = piece(k);
      for (std::size_t i = 0; i < children.size(); ++i) {
        step.posts.push_back({&g, children[i], false, true, i * seg, cnt});
        step.reduces.push_back({off, i * seg, cnt});
      }
    }
    if (k > 0 && r != 0) {
      auto [off, cnt] = piece(k - 1);
      step.posts.push_back({&g, (r - 1) / 2, true, false, off, cnt});
    }
    if (!step.posts.empty()) prog.steps.push_back(std::move(step));
  }
}

void add_tree_broadcast(AllReduceProgram& prog, const Communicator& g, std::size_t n) {
  const int p = g.size(), r = g.rank();
  if (p <= 1 || n == 0) return;
  const std::size_t seg = tree_segment(prog, n), nseg = (n + seg - 1) / seg;
  auto piece = [&](std::size_t k) { return std::pair{k * seg, std::min(seg, n - k * seg)}; };
  for (std::size_t k = 0; k <= nseg; ++k) {
    Step step;
    if (k < nseg && r != 0) {
      auto [off, cnt] = piece(k);
      step.posts.push_back({&g, (r - 1) / 2, false, false, off, cnt});
    }
    if (k > 0) {
      auto [off, cnt] = piece(k - 1);
      for (int c : {2 * r + 1, 2 * r + 2})
        if (c < p) step.posts.push_back({&g, c, true, false, off, cnt});
    }
    if (!step.posts.empty()) prog.steps.push_back(std::move(step));
  }
}

}  // namespace
}  // namespace detail

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
  if (program_) return program_->next == program_->steps.size();
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
      detail::add_ring(*prog, group_, n);
      break;
    case AllReduceAlgorithm::kTree:
      detail::add_tree_reduce(*prog, group_, n);
      detail::add_tree_broadcast(*prog, group_, n);
      break;
    case AllReduceAlgorithm::kHierarchical:
      detail::add_tree_reduce(*prog, intra_, n);
      if (leaders_) detail::add_ring(*prog, leaders_, n);
      detail::add_tree_broadcast(*prog, intra_, n);
      break;
    default:
      break;
  }
  PendingAllReduce out(std::move(prog));
  out.test();
  return out;
}

}  // namespace ndmesh::comm
