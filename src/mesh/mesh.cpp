// Mesh arithmetic. A mesh with sizes (n_0, ..., n_{d-1}), outer first, is the shape of a
// row-major array over the ranks: dim i has stride prod_{j>i} n_j. A group over a subset
// S holds the ranks that agree on every coordinate outside S; its members are the base
// (coordinates in S zeroed) plus every combination of c_i * stride_i for i in S. Colors
// enumerate groups row-major over the dims outside S and keys enumerate members
// row-major over S, so both are mixed-radix numbers computed in O(d).
#include "ndmesh/mesh/mesh.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <limits>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/core/strings.hpp"

namespace ndmesh {
namespace {

constexpr std::int64_t kMaxWorld = std::int64_t{1} << 62;

std::string dim_names(const std::vector<Dim>& dims) {
  std::string out;
  for (const auto& d : dims) {
    if (!out.empty()) out += ',';
    out += d.name;
  }
  return out;
}

bool valid_name(std::string_view name) {
  if (name.empty()) return false;
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

}  // namespace

// ---------------------------------------------------------------------------- GroupView

std::int64_t GroupView::operator[](std::int64_t i) const {
  std::int64_t rank = base_;
  for (int j = 0; j < nchosen_; ++j) {
    rank += (i % sizes_[j]) * strides_[j];
    i /= sizes_[j];
  }
  return rank;
}

std::int64_t GroupView::back() const {
  std::int64_t rank = base_;
  for (int j = 0; j < nchosen_; ++j) rank += (sizes_[j] - 1) * strides_[j];
  return rank;
}

GroupView::Iterator GroupView::begin() const {
  Iterator it;
  it.view_ = this;
  it.index_ = 0;
  it.rank_ = base_;
  return it;
}

GroupView::Iterator GroupView::end() const {
  Iterator it;
  it.view_ = this;
  it.index_ = size_;
  return it;
}

GroupView::Iterator& GroupView::Iterator::operator++() {
  ++index_;
  // Odometer over the chosen dims, innermost first: amortised O(1) per step.
  for (int j = 0; j < view_->nchosen_; ++j) {
    if (++digit_[j] < view_->sizes_[j]) {
      rank_ += view_->strides_[j];
      return *this;
    }
    digit_[j] = 0;
    rank_ -= (view_->sizes_[j] - 1) * view_->strides_[j];
  }
  return *this;
}

bool GroupView::contains(std::int64_t rank) const {
  if (rank < 0) return false;
  for (int i = 0; i < mesh_ndims_; ++i) {
    if (chosen_.contains(i)) continue;
    if (rank / mesh_strides_[i] % mesh_sizes_[i] != base_ / mesh_strides_[i] % mesh_sizes_[i]) return false;
  }
  std::int64_t world = mesh_ndims_ == 0 ? 1 : mesh_sizes_[0] * mesh_strides_[0];
  return rank < world;
}

std::vector<std::int64_t> GroupView::to_vector() const {
  std::vector<std::int64_t> out;
  out.reserve(static_cast<std::size_t>(size_));
  for (std::int64_t r : *this) out.push_back(r);
  return out;
}

// ------------------------------------------------------------------------- construction

Mesh::Mesh(std::vector<Dim> dims) : dims_(std::move(dims)) {
  NDMESH_CHECK_CONFIG(static_cast<int>(dims_.size()) <= kMaxDims, "mesh",
                      "{} dims ({}) but a mesh has at most {}; merge or drop dims", dims_.size(),
                      dim_names(dims_), kMaxDims);
  ndims_ = static_cast<int>(dims_.size());
  std::set<std::string_view> seen;
  for (const auto& d : dims_) {
    NDMESH_CHECK_CONFIG(valid_name(d.name), "mesh",
                        "dim name '{}' is not valid; use letters, digits and '_' (e.g. tp, dp, expert)",
                        d.name);
    NDMESH_CHECK_CONFIG(seen.insert(d.name).second, "mesh",
                        "dim '{}' appears twice in {}; name each dim once", d.name, dim_names(dims_));
    NDMESH_CHECK_CONFIG(d.size >= 1, "mesh",
                        "{}={} but a dim size must be at least 1; use {}=1 for an unused dim", d.name, d.size,
                        d.name);
  }
  std::int64_t stride = 1;
  for (int i = ndims_ - 1; i >= 0; --i) {
    sizes_[i] = dims_[i].size;
    strides_[i] = stride;
    NDMESH_CHECK_CONFIG(stride <= kMaxWorld / sizes_[i], "mesh", "the world of {} has more than 2^62 ranks",
                        to_string());
    stride *= sizes_[i];
  }
  world_ = stride;
}

Mesh Mesh::from_order(std::string_view fastest_first, const std::map<std::string, std::int64_t>& sizes) {
  auto names = split_list(fastest_first, "-");
  std::vector<Dim> dims;
  for (auto it = names.rbegin(); it != names.rend(); ++it) {
    NDMESH_CHECK_CONFIG(
        !it->empty(), "mesh",
        "order '{}' has an empty name; write names joined by '-', fastest first, e.g. tp-cp-dp-pp",
        fastest_first);
    auto found = sizes.find(std::string(*it));
    NDMESH_CHECK_CONFIG(found != sizes.end(), "mesh",
                        "order '{}' names '{}' but no size was given for it; give --{}", fastest_first, *it,
                        *it);
    dims.push_back({std::string(*it), found->second});
  }
  for (const auto& [name, size] : sizes) {
    bool named = std::find(names.begin(), names.end(), name) != names.end();
    NDMESH_CHECK_CONFIG(named, "mesh", "{}={} is not in order '{}'; add {} to the order", name, size,
                        fastest_first, name);
  }
  return Mesh(std::move(dims));
}

Mesh Mesh::parse(std::string_view text) {
  std::vector<Dim> dims;
  if (trim(text).empty()) return Mesh();
  for (auto part : split_list(text, ",")) {
    auto eq = part.find('=');
    NDMESH_CHECK_CONFIG(eq != std::string_view::npos, "mesh",
                        "'{}' in '{}' is not name=size; write e.g. dp=2,pp=2,cp=1,tp=2", part, text);
    auto name = trim(part.substr(0, eq));
    auto value = trim(part.substr(eq + 1));
    std::int64_t size = 0;
    auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), size);
    NDMESH_CHECK_CONFIG(ec == std::errc() && ptr == value.data() + value.size(), "mesh",
                        "size '{}' of dim '{}' is not an integer; write e.g. {}=2", value, name, name);
    dims.push_back({std::string(name), size});
  }
  return Mesh(std::move(dims));
}

std::string Mesh::to_string() const {
  std::string out;
  for (const auto& d : dims_) {
    if (!out.empty()) out += ',';
    out += fmt::format("{}={}", d.name, d.size);
  }
  return out;
}

std::string Mesh::order_string() const {
  std::string out;
  for (int i = ndims_ - 1; i >= 0; --i) {
    if (!out.empty()) out += '-';
    out += dims_[i].name;
  }
  return out;
}

// -------------------------------------------------------------------------------- dims

std::int64_t Mesh::size_of(std::string_view name) const {
  auto i = find(name);
  return i ? sizes_[*i] : 1;
}

std::optional<int> Mesh::find(std::string_view name) const {
  for (int i = 0; i < ndims_; ++i)
    if (dims_[i].name == name) return i;
  return std::nullopt;
}

int Mesh::index(std::string_view name) const {
  auto i = find(name);
  NDMESH_CHECK_CONFIG(i.has_value(), "mesh", "no dim '{}' in mesh {}; use one of {}", name, to_string(),
                      dim_names(dims_));
  return *i;
}

DimSet Mesh::dims_of(std::string_view spec) const {
  DimSet set;
  if (trim(spec).empty()) return set;
  for (auto name : split_list(spec, "-,")) {
    NDMESH_CHECK_CONFIG(!name.empty(), "mesh",
                        "group '{}' has an empty name; join dim names with '-', e.g. dp-cp", spec);
    int i = index(name);
    NDMESH_CHECK_CONFIG(!set.contains(i), "mesh", "group '{}' names '{}' twice; name each dim once", spec,
                        name);
    set = set | DimSet::single(i);
  }
  return set;
}

DimSet Mesh::dims_present(std::string_view spec) const {
  DimSet set;
  for (auto name : split_list(spec, "-,"))
    if (auto i = find(name)) set = set | DimSet::single(*i);
  return set;
}

std::string Mesh::key_name(DimSet s) const {
  std::string out;
  for (int i = 0; i < ndims_; ++i) {
    if (!s.contains(i)) continue;
    if (!out.empty()) out += '-';
    out += dims_[i].name;
  }
  return out;
}

// ------------------------------------------------------------------------------ coords

Coords Mesh::coords(std::int64_t rank) const {
  NDMESH_CHECK_CONFIG(rank >= 0 && rank < world_, "mesh", "rank {} is outside the world of {} ranks (0..{})",
                      rank, world_, world_ - 1);
  Coords c;
  c.ndims = ndims_;
  for (int i = 0; i < ndims_; ++i) c[i] = rank / strides_[i] % sizes_[i];
  return c;
}

std::int64_t Mesh::rank(const Coords& c) const {
  NDMESH_CHECK_CONFIG(c.ndims == ndims_, "mesh", "{} coordinates given for a mesh of {} dims ({})", c.ndims,
                      ndims_, dim_names(dims_));
  std::int64_t r = 0;
  for (int i = 0; i < ndims_; ++i) {
    NDMESH_CHECK_CONFIG(c[i] >= 0 && c[i] < sizes_[i], "mesh", "coordinate {}={} is outside 0..{}",
                        dims_[i].name, c[i], sizes_[i] - 1);
    r += c[i] * strides_[i];
  }
  return r;
}

// ------------------------------------------------------------------------------ groups

std::int64_t Mesh::group_size(DimSet s) const {
  std::int64_t n = 1;
  for (int i = 0; i < ndims_; ++i)
    if (s.contains(i)) n *= sizes_[i];
  return n;
}

GroupView Mesh::group(std::int64_t rank, DimSet s) const {
  NDMESH_CHECK_CONFIG(rank >= 0 && rank < world_, "mesh", "rank {} is outside the world of {} ranks (0..{})",
                      rank, world_, world_ - 1);
  GroupView g;
  g.base_ = rank;
  g.mesh_ndims_ = ndims_;
  g.chosen_ = s;
  for (int i = ndims_ - 1; i >= 0; --i) {  // innermost first
    g.mesh_sizes_[i] = sizes_[i];
    g.mesh_strides_[i] = strides_[i];
    if (!s.contains(i)) continue;
    g.base_ -= (rank / strides_[i] % sizes_[i]) * strides_[i];
    g.sizes_[g.nchosen_] = sizes_[i];
    g.strides_[g.nchosen_] = strides_[i];
    g.size_ *= sizes_[i];
    ++g.nchosen_;
  }
  return g;
}

std::string Mesh::group_label(std::int64_t rank, DimSet s) const {
  std::string out = key_name(s) + "_group";
  for (int i = 0; i < ndims_; ++i)
    if (!s.contains(i)) out += fmt::format("_{}{}", dims_[i].name, coord(rank, i));
  return out;
}

GroupView Mesh::group_by_color(DimSet s, std::int64_t color) const {
  std::int64_t groups = num_groups(s);
  NDMESH_CHECK_CONFIG(color >= 0 && color < groups, "mesh", "color {} of group kind '{}' is outside 0..{}",
                      color, key_name(s), groups - 1);
  // Decode the color row-major over the dims outside s (innermost fastest).
  std::int64_t rank = 0;
  for (int i = ndims_ - 1; i >= 0; --i) {
    if (s.contains(i)) continue;
    rank += (color % sizes_[i]) * strides_[i];
    color /= sizes_[i];
  }
  return group(rank, s);
}

std::int64_t Mesh::color(std::int64_t rank, DimSet s) const {
  std::int64_t c = 0;
  for (int i = 0; i < ndims_; ++i)
    if (!s.contains(i)) c = c * sizes_[i] + rank / strides_[i] % sizes_[i];
  return c;
}

std::int64_t Mesh::key(std::int64_t rank, DimSet s) const {
  std::int64_t k = 0;
  for (int i = 0; i < ndims_; ++i)
    if (s.contains(i)) k = k * sizes_[i] + rank / strides_[i] % sizes_[i];
  return k;
}

namespace {
void check_fold(std::int64_t group, std::int64_t inner, const std::string& kind) {
  NDMESH_CHECK_CONFIG(
      inner >= 1 && group % inner == 0, "mesh",
      "ep={} does not divide the {} group of {} ranks that it folds into; use an ep that divides {}", inner,
      kind, group, group);
}
}  // namespace

std::vector<std::int64_t> Mesh::fold_group(std::int64_t rank, DimSet s, std::int64_t inner, Fold part) const {
  const GroupView g = group(rank, s);
  check_fold(g.size(), inner, key_name(s));
  const std::int64_t k = key(rank, s);
  std::vector<std::int64_t> out;
  if (part == Fold::kInner)
    for (std::int64_t i = k / inner * inner; i < k / inner * inner + inner; ++i) out.push_back(g[i]);
  else
    for (std::int64_t i = k % inner; i < g.size(); i += inner) out.push_back(g[i]);
  return out;
}

std::int64_t Mesh::fold_color(std::int64_t rank, DimSet s, std::int64_t inner, Fold part) const {
  const std::int64_t size = group_size(s);
  check_fold(size, inner, key_name(s));
  const std::int64_t k = key(rank, s);
  return part == Fold::kInner ? color(rank, s) * (size / inner) + k / inner
                              : color(rank, s) * inner + k % inner;
}

std::int64_t Mesh::fold_key(std::int64_t rank, DimSet s, std::int64_t inner, Fold part) const {
  check_fold(group_size(s), inner, key_name(s));
  const std::int64_t k = key(rank, s);
  return part == Fold::kInner ? k % inner : k / inner;
}

std::optional<std::int64_t> Mesh::neighbour(std::int64_t rank, int i, std::int64_t offset, Edge edge) const {
  std::int64_t c = coord(rank, i);
  std::int64_t n = sizes_[i];
  std::int64_t target = c + offset;
  if (edge == Edge::kLine) {
    if (target < 0 || target >= n) return std::nullopt;
  } else {
    target %= n;
    if (target < 0) target += n;
  }
  return rank + (target - c) * strides_[i];
}

std::int64_t Mesh::first(std::int64_t rank, int i) const { return rank - coord(rank, i) * strides_[i]; }

std::int64_t Mesh::last(std::int64_t rank, int i) const {
  return rank + (sizes_[i] - 1 - coord(rank, i)) * strides_[i];
}

// --------------------------------------------------------------------------- placement

Placement Mesh::placement(std::int64_t rank, std::int64_t ranks_per_node) {
  NDMESH_CHECK_CONFIG(ranks_per_node >= 1, "mesh", "ranks_per_node={} must be at least 1", ranks_per_node);
  return {rank / ranks_per_node, rank % ranks_per_node};
}

GroupPlacement Mesh::group_placement(DimSet s, std::int64_t ranks_per_node) const {
  NDMESH_CHECK_CONFIG(ranks_per_node >= 1, "mesh", "ranks_per_node={} must be at least 1", ranks_per_node);
  GroupPlacement p;
  p.dims = s;
  p.groups = num_groups(s);
  // Node index is monotone in rank, so a group stays in one node iff its smallest and
  // largest members (front and back) do; it touches at most node(back)-node(front)+1.
  std::int64_t span = 0;
  for (int i = 0; i < ndims_; ++i)
    if (s.contains(i)) span += (sizes_[i] - 1) * strides_[i];
  std::int64_t widest = -1, widest_nodes = 0;
  for_each_group(s, [&](std::int64_t, const GroupView& g) {
    std::int64_t front = g.front();
    std::int64_t nodes = (front + span) / ranks_per_node - front / ranks_per_node + 1;
    if (nodes > 1) ++p.groups_crossing;
    if (nodes > widest_nodes) widest = front, widest_nodes = nodes;
  });
  // Members can skip whole nodes, so count the distinct nodes of the widest group.
  p.max_nodes_spanned = 1;
  std::int64_t previous = -1;
  for (std::int64_t r : group(widest, s)) {
    std::int64_t node = r / ranks_per_node;
    if (previous >= 0 && node != previous) ++p.max_nodes_spanned;
    previous = node;
  }
  return p;
}

bool Mesh::groups_within_node(DimSet s, std::int64_t ranks_per_node) const {
  return group_placement(s, ranks_per_node).groups_crossing == 0;
}

std::vector<std::int64_t> Mesh::permutation(const Mesh& from, const Mesh& to) {
  auto sorted = [](std::vector<Dim> d) {
    std::sort(d.begin(), d.end(), [](const Dim& a, const Dim& b) { return a.name < b.name; });
    return d;
  };
  NDMESH_CHECK_CONFIG(sorted(from.dims_) == sorted(to.dims_), "mesh",
                      "cannot map {} onto {}: the meshes must have the same dims and sizes", from.to_string(),
                      to.to_string());
  std::array<int, kMaxDims> where{};
  for (int i = 0; i < from.ndims_; ++i) where[i] = to.index(from.dims_[i].name);
  std::vector<std::int64_t> perm(static_cast<std::size_t>(from.world_));
  for (std::int64_t r = 0; r < from.world_; ++r) {
    std::int64_t target = 0;
    for (int i = 0; i < from.ndims_; ++i) target += from.coord(r, i) * to.strides_[where[i]];
    perm[static_cast<std::size_t>(r)] = target;
  }
  return perm;
}

}  // namespace ndmesh
