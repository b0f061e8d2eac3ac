// Mesh: the one owner of the rank layout.
//
// A mesh is an ordered list of named dims, outermost first and innermost (fastest
// varying) last, like the shape of a row-major array: mesh {dp=2, pp=2, cp=1, tp=2}
// puts rank r at coordinates (r / 4, r / 2 % 2, 0, r % 2). Every other piece of ndmesh
// asks the mesh for coordinates, group members, split colors/keys and neighbours; no
// one else computes `rank % tp`.
//
// A group over a subset S of the dims is the set of ranks that share the coordinates of
// every dim not in S. Its members are listed row-major over S in mesh order (the
// innermost chosen dim varies fastest); a rank's "key" is its index in that list and its
// "color" is the row-major index of its group over the dims not in S.
//
// All per-rank queries are O(number of dims) and allocate nothing.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ndmesh {

/// The most dims a mesh may have.
inline constexpr int kMaxDims = 8;

/// One named dimension of a mesh.
struct Dim {
  std::string name;
  std::int64_t size = 1;
  bool operator==(const Dim&) const = default;
};

/// A subset of a mesh's dims, as a bit mask over dim indices (bit i = dim i of the mesh).
class DimSet {
 public:
  constexpr DimSet() = default;
  constexpr explicit DimSet(std::uint32_t bits) : bits_(bits) {}
  /// The set holding only dim index `i`.
  static constexpr DimSet single(int i) { return DimSet(1u << i); }

  constexpr bool contains(int i) const { return (bits_ >> i) & 1u; }
  constexpr bool empty() const { return bits_ == 0; }
  constexpr int count() const { return __builtin_popcount(bits_); }
  constexpr std::uint32_t bits() const { return bits_; }
  constexpr DimSet operator|(DimSet o) const { return DimSet(bits_ | o.bits_); }
  constexpr DimSet operator&(DimSet o) const { return DimSet(bits_ & o.bits_); }
  constexpr bool operator==(const DimSet&) const = default;

 private:
  std::uint32_t bits_ = 0;
};

/// Coordinates of a rank: one entry per dim, in mesh order (outer first).
struct Coords {
  std::array<std::int64_t, kMaxDims> value{};
  int ndims = 0;
  std::int64_t operator[](int i) const { return value[i]; }
  std::int64_t& operator[](int i) { return value[i]; }
  bool operator==(const Coords& o) const {
    if (ndims != o.ndims) return false;
    for (int i = 0; i < ndims; ++i)
      if (value[i] != o.value[i]) return false;
    return true;
  }
};

/// How a neighbour query treats the ends of a dim.
enum class Edge {
  kRing,  ///< wraps around (ring attention, ring all-reduce)
  kLine,  ///< no neighbour past the ends (pipeline stages)
};

/// The members of one group, computed on demand without allocation. Iterating visits
/// members row-major over the chosen dims (innermost fastest).
class GroupView {
 public:
  class Iterator {
   public:
    using iterator_category = std::forward_iterator_tag;
    using value_type = std::int64_t;
    using difference_type = std::ptrdiff_t;
    using pointer = void;
    using reference = std::int64_t;

    Iterator() = default;
    std::int64_t operator*() const { return rank_; }
    Iterator& operator++();
    Iterator operator++(int) {
      Iterator old = *this;
      ++*this;
      return old;
    }
    bool operator==(const Iterator& o) const { return index_ == o.index_; }

   private:
    friend class GroupView;
    const GroupView* view_ = nullptr;
    std::int64_t index_ = 0;
    std::int64_t rank_ = 0;
    std::array<std::int64_t, kMaxDims> digit_{};
  };

  /// Number of members.
  std::int64_t size() const { return size_; }
  /// The i-th member (0 <= i < size()), O(number of chosen dims).
  std::int64_t operator[](std::int64_t i) const;
  /// The first and last members.
  std::int64_t front() const { return base_; }
  std::int64_t back() const;
  Iterator begin() const;
  Iterator end() const;
  /// Calls f(rank) for every member in order: a tight loop along the innermost chosen
  /// dim, the fastest way to visit all members.
  template <typename F>
  void for_each(F&& f) const {
    if (nchosen_ == 0) {
      f(base_);
      return;
    }
    std::array<std::int64_t, kMaxDims> digit{};
    const std::int64_t inner_size = sizes_[0], inner_stride = strides_[0];
    std::int64_t row = base_;
    for (std::int64_t done = 0; done < size_; done += inner_size) {
      std::int64_t r = row;
      for (std::int64_t k = 0; k < inner_size; ++k, r += inner_stride) f(r);
      for (int j = 1; j < nchosen_; ++j) {  // odometer over the outer chosen dims
        if (++digit[j] < sizes_[j]) {
          row += strides_[j];
          break;
        }
        digit[j] = 0;
        row -= (sizes_[j] - 1) * strides_[j];
      }
    }
  }
  /// True when `rank` is a member, O(number of dims).
  bool contains(std::int64_t rank) const;
  /// The members as a vector (allocates; for printing and tests).
  std::vector<std::int64_t> to_vector() const;

 private:
  friend class Mesh;
  std::int64_t base_ = 0;  // the member with all chosen coordinates 0
  std::int64_t size_ = 1;
  int nchosen_ = 0;
  // chosen dims, innermost first: their sizes and strides in the rank space
  std::array<std::int64_t, kMaxDims> sizes_{};
  std::array<std::int64_t, kMaxDims> strides_{};
  // all dims, for contains(): stride and size of every mesh dim and whether it is chosen
  std::array<std::int64_t, kMaxDims> mesh_sizes_{};
  std::array<std::int64_t, kMaxDims> mesh_strides_{};
  int mesh_ndims_ = 0;
  DimSet chosen_{};
};

/// Where a rank sits on the machines: node index and rank within the node.
struct Placement {
  std::int64_t node = 0;
  std::int64_t local_rank = 0;
};

/// For a set of dims, how its groups sit on the nodes.
struct GroupPlacement {
  DimSet dims;
  std::int64_t groups = 0;             ///< number of groups of this kind
  std::int64_t groups_crossing = 0;    ///< groups whose members span more than one node
  std::int64_t max_nodes_spanned = 0;  ///< nodes touched by the group with the widest rank span
};

/// The named rank layout. Immutable after construction; cheap to copy.
class Mesh {
 public:
  /// The empty mesh (no dims, one rank).
  Mesh() = default;
  /// Dims outermost first. Throws ConfigError on an empty or duplicate name, a size < 1,
  /// more than kMaxDims dims, or a world of more than 2^62 ranks.
  explicit Mesh(std::vector<Dim> dims);
  Mesh(std::initializer_list<Dim> dims) : Mesh(std::vector<Dim>(dims)) {}

  /// From an order string written fastest-varying first, Megatron's convention
  /// ("tp-cp-ep-dp-pp"), and the size of each named dim. Dims in `sizes` that the order
  /// does not name are an error, and so are names in the order without a size.
  static Mesh from_order(std::string_view fastest_first, const std::map<std::string, std::int64_t>& sizes);

  /// Parses the text form "dp=2,pp=2,cp=1,tp=2" (outer to inner).
  static Mesh parse(std::string_view text);

  /// The text form "dp=2,pp=2,cp=1,tp=2" (outer to inner); parse(to_string()) == *this.
  std::string to_string() const;
  /// The order string fastest-varying first, "tp-cp-pp-dp".
  std::string order_string() const;

  int ndims() const { return ndims_; }
  std::int64_t world_size() const { return world_; }
  const Dim& dim(int i) const { return dims_[i]; }
  const std::vector<Dim>& dims() const { return dims_; }
  std::int64_t size(int i) const { return sizes_[i]; }
  /// Size of the named dim; 1 when the mesh has no such dim (a dim of size 1 is absent
  /// and present at once).
  std::int64_t size_of(std::string_view name) const;
  /// Index of a named dim, or nullopt.
  std::optional<int> find(std::string_view name) const;
  /// Index of a named dim; ConfigError naming the dim and the mesh's dims otherwise.
  int index(std::string_view name) const;
  /// Row-major stride of dim i in rank space (the innermost dim has stride 1).
  std::int64_t stride(int i) const { return strides_[i]; }

  /// The set of the named dims. `spec` joins names with '-' or ',' in any order
  /// ("dp-cp", "cp,dp"). Unknown or repeated names: ConfigError.
  DimSet dims_of(std::string_view spec) const;
  /// Like dims_of, but names the mesh lacks are skipped rather than rejected: an absent
  /// dim is a dim of size 1 and adds no one to a group. For the fixed vocabularies of
  /// the seed views ("cp-dp" on a mesh without cp).
  DimSet dims_present(std::string_view spec) const;
  /// The set of every dim.
  DimSet all() const { return DimSet((1u << ndims_) - 1u); }
  /// Every dim except those in `s`.
  DimSet complement(DimSet s) const { return DimSet(all().bits() & ~s.bits()); }
  /// Names of the dims in `s` joined by '-' in mesh order ("dp-cp"): the group key.
  std::string key_name(DimSet s) const;

  /// Coordinates of `rank`; ConfigError if rank is outside [0, world).
  Coords coords(std::int64_t rank) const;
  /// Coordinate of `rank` along dim i.
  std::int64_t coord(std::int64_t rank, int i) const { return rank / strides_[i] % sizes_[i]; }
  /// Coordinate of `rank` along the named dim; 0 when the mesh has no such dim.
  std::int64_t coord_of(std::int64_t rank, std::string_view name) const {
    auto i = find(name);
    return i ? coord(rank, *i) : 0;
  }
  /// The rank at `c`; ConfigError when a coordinate is out of range.
  std::int64_t rank(const Coords& c) const;

  /// Members of the group of `s` that holds `rank`.
  GroupView group(std::int64_t rank, DimSet s) const;
  /// Members of the group of `s` with the given color (0 <= color < num_groups(s)).
  GroupView group_by_color(DimSet s, std::int64_t color) const;
  /// Calls f(color, const GroupView&) for every group of `s` in color order. Walks the
  /// colors with an odometer, so each group costs O(1) amortised, no division: the way
  /// to enumerate all groups of a kind.
  template <typename F>
  void for_each_group(DimSet s, F&& f) const {
    GroupView g = group(0, s);
    std::array<std::int64_t, kMaxDims> sizes{}, strides{}, digit{};
    int n = 0;
    for (int i = ndims_ - 1; i >= 0; --i)  // dims outside s, innermost first
      if (!s.contains(i)) sizes[n] = sizes_[i], strides[n] = strides_[i], ++n;
    const std::int64_t groups = num_groups(s);
    for (std::int64_t color = 0; color < groups; ++color) {
      f(color, static_cast<const GroupView&>(g));
      for (int j = 0; j < n; ++j) {
        if (++digit[j] < sizes[j]) {
          g.base_ += strides[j];
          break;
        }
        digit[j] = 0;
        g.base_ -= (sizes[j] - 1) * strides[j];
      }
    }
  }
  /// Size of every group of `s`.
  std::int64_t group_size(DimSet s) const;
  /// A readable id of the group of `s` holding `rank`: the key name, "_group_", then the
  /// other dims with their coordinates in mesh order ("dp_group_tp1_pp0", seed 002).
  std::string group_label(std::int64_t rank, DimSet s) const;
  /// How many groups `s` partitions the world into.
  std::int64_t num_groups(DimSet s) const { return world_ / group_size(s); }
  /// Index of the group of `s` holding `rank`: row-major over the other dims.
  std::int64_t color(std::int64_t rank, DimSet s) const;
  /// Index of `rank` inside its group of `s`.
  std::int64_t key(std::int64_t rank, DimSet s) const;

  /// Expert parallelism folded into a group kind (Megatron-core, torchtitan): every group
  /// of `s` (dp-cp), its members in group order, is cut into blocks of `inner` consecutive
  /// members. Fold::kInner is the block holding `rank` (the expert group: the ranks that
  /// exchange tokens); Fold::kOuter is the member at `rank`'s place in every block of its
  /// group (the expert-data-parallel group: the ranks that hold the same experts).
  /// ConfigError when `inner` does not divide the group size.
  enum class Fold { kInner, kOuter };
  std::vector<std::int64_t> fold_group(std::int64_t rank, DimSet s, std::int64_t inner, Fold part) const;
  /// The split color of `rank`'s fold_group (groups of one part numbered 0.. over the world).
  std::int64_t fold_color(std::int64_t rank, DimSet s, std::int64_t inner, Fold part) const;
  /// Index of `rank` inside its fold_group.
  std::int64_t fold_key(std::int64_t rank, DimSet s, std::int64_t inner, Fold part) const;

  /// The rank `offset` steps along dim i from `rank`; with Edge::kLine, nullopt past
  /// the ends.
  std::optional<std::int64_t> neighbour(std::int64_t rank, int i, std::int64_t offset, Edge edge) const;
  /// The rank with coordinate 0 (first) or size-1 (last) along dim i, others as `rank`.
  std::int64_t first(std::int64_t rank, int i) const;
  std::int64_t last(std::int64_t rank, int i) const;

  /// Node and local rank of `rank` when consecutive ranks fill nodes of `ranks_per_node`.
  static Placement placement(std::int64_t rank, std::int64_t ranks_per_node);
  /// Whether every group of `s` lies inside one node, O(num_groups * ndims).
  bool groups_within_node(DimSet s, std::int64_t ranks_per_node) const;
  /// Counts of groups of `s` that cross node boundaries.
  GroupPlacement group_placement(DimSet s, std::int64_t ranks_per_node) const;

  /// For two meshes over the same dims (same names and sizes) in different orders:
  /// perm[r] is the rank in `to` that has the same named coordinates as rank r of
  /// `from`. ConfigError when the dims differ.
  static std::vector<std::int64_t> permutation(const Mesh& from, const Mesh& to);

  /// Same dims in the same order.
  bool operator==(const Mesh& o) const { return dims_ == o.dims_; }

 private:
  std::vector<Dim> dims_;
  int ndims_ = 0;
  std::int64_t world_ = 1;
  std::array<std::int64_t, kMaxDims> sizes_{};
  std::array<std::int64_t, kMaxDims> strides_{};
};

}  // namespace ndmesh
