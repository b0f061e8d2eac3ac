// ProcessGroups. Agreement: each rank all_gathers a fixed record (a 64-bit value and up
// to 120 bytes of text saying what it holds); ranks are grouped by value and, when there
// is more than one value, every rank throws the same ConfigError listing each value's
// ranks and text. Splits: color and key of the kind come from the mesh, so a group's
// communicator ranks follow the mesh's member order, and the members MPI reports are
// compared with the mesh's before the communicator is handed out.
#include "ndmesh/comm/process_groups.hpp"

#include <array>
#include <cstring>
#include <optional>

#include <fmt/format.h>

#include "ndmesh/core/error.hpp"

namespace ndmesh {
namespace {

constexpr std::size_t kTextWords = 15;  // 120 bytes of text per record
constexpr std::size_t kRecordWords = 1 + kTextWords;

std::int64_t fnv1a(std::string_view text) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return static_cast<std::int64_t>(h);
}

// "0-3,5" style list of ranks.
std::string rank_list(const std::vector<std::int64_t>& ranks) {
  std::string out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += j > i ? fmt::format("{}-{}", ranks[i], ranks[j]) : fmt::format("{}", ranks[i]);
    i = j + 1;
  }
  return out;
}

}  // namespace

ProcessGroups::ProcessGroups(const Mesh& mesh, comm::Communicator world, std::span<const DimSet> kinds,
                             const comm::Options& opts)
    : mesh_(mesh),
      world_(std::move(world)),
      rank_(world_.rank()),
      view_(mesh_, 0),
      opts_{.timeout_s = opts.timeout_s} {
  NDMESH_CHECK(world_.valid(), "comm", "ProcessGroups needs a world communicator; got the empty handle");
  std::string text = mesh_.to_string();
  std::string agreed = text;
  if (!kinds.empty()) {
    agreed += " groups ";
    for (std::size_t i = 0; i < kinds.size(); ++i) {
      if (i > 0) agreed.push_back(',');
      agreed.append(kinds[i].empty() ? std::string("self") : mesh_.key_name(kinds[i]));
    }
  }
  agree(kinds.empty() ? "mesh" : "mesh and groups", fnv1a(agreed), agreed);
  NDMESH_CHECK_CONFIG(mesh_.world_size() == world_.size(), "comm",
                      "mesh {} has {} ranks but the job has {}; launch {} processes or change the sizes",
                      text, mesh_.world_size(), world_.size(), mesh_.world_size());
  view_ = GroupManagerView(mesh_, rank_);
  for (DimSet k : kinds) create_one(k);
}

void ProcessGroups::agree(std::string_view what, std::int64_t value, const std::string& mine) {
  std::array<std::int64_t, kRecordWords> record{};
  record[0] = value;
  std::memcpy(&record[1], mine.data(), std::min(mine.size(), kTextWords * 8 - 1));
  std::vector<std::int64_t> all(kRecordWords * static_cast<std::size_t>(world_.size()));
  world_.all_gather(std::span<const std::int64_t>(record), std::span<std::int64_t>(all), opts_);
  // Distinct values in order of first appearance, with their ranks and text.
  std::vector<std::int64_t> values;
  std::vector<std::vector<std::int64_t>> ranks;
  std::vector<std::string> texts;
  for (std::int64_t r = 0; r < world_.size(); ++r) {
    const std::int64_t* rec = &all[static_cast<std::size_t>(r) * kRecordWords];
    std::size_t k = 0;
    while (k < values.size() && values[k] != rec[0]) ++k;
    if (k == values.size()) {
      values.push_back(rec[0]);
      ranks.emplace_back();
      const char* chars = reinterpret_cast<const char*>(rec + 1);
      texts.emplace_back(chars, strnlen(chars, kTextWords * 8));
    }
    ranks[k].push_back(r);
  }
  if (values.size() == 1) return;
  std::vector<std::string> parts;
  for (std::size_t k = 0; k < values.size(); ++k)
    parts.push_back(fmt::format("rank{} {} {} {}", ranks[k].size() > 1 ? "s" : "", rank_list(ranks[k]),
                                ranks[k].size() > 1 ? "have" : "has", texts[k]));
  fail<ConfigError>(
      "comm", "the ranks disagree on the {}: {}; start every rank with the same layout flags and config",
      what, fmt::join(parts, " but "));
}

DimSet ProcessGroups::canonical(DimSet dims) const {
  std::uint32_t bits = 0;
  for (int i = 0; i < mesh_.ndims(); ++i)
    if (dims.contains(i) && mesh_.size(i) > 1) bits |= 1u << i;
  return DimSet(bits);
}

const comm::Communicator& ProcessGroups::group(DimSet dims) {
  auto it = by_kind_.find(dims.bits());
  if (it != by_kind_.end()) return it->second;
  std::string name = dims.empty() ? "self" : mesh_.key_name(dims);
  agree("next group to create", static_cast<std::int64_t>(dims.bits()), name);
  return create_one(dims);
}

void ProcessGroups::create(std::span<const DimSet> kinds) {
  std::vector<DimSet> missing;
  std::string names;
  // Unsigned arithmetic: the hash wraps by design (a signed overflow would be UB).
  std::uint64_t h = 0;
  for (DimSet k : kinds) {
    if (by_kind_.count(k.bits())) continue;
    missing.push_back(k);
    if (!names.empty()) names.push_back(',');
    names.append(k.empty() ? std::string("self") : mesh_.key_name(k));
    h = h * 1000003u + static_cast<std::uint64_t>(k.bits()) + 1u;
  }
  // Ranks that already hold some kinds still agree on what is left to create.
  agree("group kinds to create", static_cast<std::int64_t>(h), names.empty() ? "(none)" : names);
  for (DimSet k : missing) create_one(k);
}

const comm::Communicator& ProcessGroups::create_one(DimSet dims) {
  if (auto it = by_kind_.find(dims.bits()); it != by_kind_.end()) return it->second;
  std::string name = dims.empty() ? "self" : mesh_.key_name(dims);
  DimSet key = canonical(dims);
  auto shared = by_canonical_.find(key.bits());
  if (shared == by_canonical_.end()) {
    comm::Communicator made;
    if (key == canonical(mesh_.all())) {
      made = world_.named(name);  // the whole world, in rank order: no split needed
    } else if (key.empty()) {
      made = world_.self(name);  // every group has one member: no communication needed
    } else {
      made = world_.split(mesh_.color(rank_, key), mesh_.key(rank_, key), name, opts_);
      ++splits_;
    }
    GroupView expected = mesh_.group(rank_, key);
    bool same = made.size() == expected.size() && made.rank() == mesh_.key(rank_, key);
    for (std::int64_t i = 0; same && i < expected.size(); ++i)
      same = made.members()[static_cast<std::size_t>(i)] == expected[i];
    NDMESH_CHECK(same, "comm", "the {} communicator of rank {} holds {} but the mesh says ranks {}", name,
                 rank_, made.members_string(), fmt::join(expected.to_vector(), ","));
    shared = by_canonical_.emplace(key.bits(), made).first;
  }
  return by_kind_.emplace(dims.bits(), shared->second.named(name)).first->second;
}

const comm::Communicator& ProcessGroups::folded(std::int64_t ep, Mesh::Fold part) {
  const auto k = std::make_pair(ep, static_cast<int>(part));
  if (auto it = folded_.find(k); it != folded_.end()) return it->second;
  const DimSet dp_cp = mesh_.dims_present("dp-cp");
  const std::string name = part == Mesh::Fold::kInner ? "ep" : "edp";
  const std::vector<std::int64_t> expected = mesh_.fold_group(rank_, dp_cp, ep, part);
  comm::Communicator made = expected.size() == 1
                                ? world_.self(name)
                                : world_.split(mesh_.fold_color(rank_, dp_cp, ep, part),
                                               mesh_.fold_key(rank_, dp_cp, ep, part), name, opts_);
  NDMESH_CHECK(made.members() == expected, "comm",
               "the {} communicator of rank {} holds {} but the mesh says ranks {}", name, rank_,
               made.members_string(), fmt::join(expected, ","));
  return folded_.emplace(k, made).first->second;
}

const comm::Communicator& ProcessGroups::embedding() {
  if (have_embedding_) return embedding_;
  const DimSet pp = mesh_.dims_present("pp");
  const std::int64_t stages = mesh_.size_of("pp");
  const std::int64_t at = mesh_.coord_of(rank_, "pp");
  std::optional<std::int64_t> color;
  if (at == 0 || at == stages - 1) color = mesh_.color(rank_, pp);
  if (stages <= 1) {
    embedding_ = world_.self("embedding");
  } else {
    embedding_ = world_.split(color, mesh_.key(rank_, pp), "embedding", opts_);
    ++splits_;
  }
  have_embedding_ = true;
  return embedding_;
}

}  // namespace ndmesh
