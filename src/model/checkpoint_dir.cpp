#include "ndmesh/model/checkpoint_dir.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include <fmt/core.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "ndmesh/core/error.hpp"
#include "ndmesh/tensor/tensor.hpp"
#include "ndmesh/core/log.hpp"

namespace ndmesh::model {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace {

constexpr const char* kFormat = "ndmesh checkpoint";

std::uint32_t crc_update(std::uint32_t crc, const void* data, std::size_t n) {
  uLong c = crc;
  const auto* p = static_cast<const unsigned char*>(data);
  while (n > 0) {  // zlib takes uInt lengths
    const auto chunk = static_cast<uInt>(std::min<std::size_t>(n, 1u << 30));
    c = ::crc32(c, p, chunk);
    p += chunk;
    n -= chunk;
  }
  return static_cast<std::uint32_t>(c);
}

// The product of the dims, or nullopt when it does not fit 64 bits (a manifest is
// untrusted: a wrapped count would pass every bounds check after it).
std::optional<std::int64_t> checked_numel(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape)
    if (__builtin_mul_overflow(n, d, &n)) return std::nullopt;
  return n;
}

std::string join_path(const std::string& dir, const std::string& file) { return (fs::path(dir) / file).string(); }

// This machine's host name (the node a shard file is written on).
std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "";
  return name;
}

// "rank 3 on node1", as far as the file's record knows.
std::string writer_of(const FileRecord& f) {
  if (f.rank < 0 && f.host.empty()) return "an unrecorded rank";
  if (f.host.empty()) return fmt::format("rank {}", f.rank);
  if (f.rank < 0) return fmt::format("a rank on {}", f.host);
  return fmt::format("rank {} on {}", f.rank, f.host);
}

json file_json(const FileRecord& f) {
  json j = {{"name", f.name}, {"bytes", f.bytes}};
  if (f.rank >= 0) j["rank"] = f.rank;
  if (!f.host.empty()) j["host"] = f.host;
  return j;
}

// Syncs a directory's entries to disk (after creating or renaming in it); best effort.
void sync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// A shard file name is a plain name inside the directory (no separators, no "..").
bool plain_name(const std::string& name) {
  return !name.empty() && name.size() < 256 && name.find('/') == std::string::npos && name != "." && name != "..";
}

// The manifest's fields are untrusted input: every access checks type and range and
// names the manifest in its error.
class Fields {
 public:
  explicit Fields(std::string path) : path_(std::move(path)) {}
  [[noreturn]] void bad(const std::string& what) const {
    fail<IoError>("checkpoint", "'{}' is malformed: {}; the checkpoint is corrupt or was not written by ndmesh", path_,
                  what);
  }
  const json& at(const json& j, const char* key, const std::string& where) const {
    if (!j.is_object() || !j.contains(key)) bad(fmt::format("{} has no \"{}\"", where, key));
    return j.at(key);
  }
  std::int64_t integer(const json& j, const char* key, const std::string& where, std::int64_t lo,
                       std::int64_t hi) const {
    const json& v = at(j, key, where);
    if (!v.is_number_integer()) bad(fmt::format("{}.{} is not an integer", where, key));
    const auto x = v.get<std::int64_t>();
    if (x < lo || x > hi) bad(fmt::format("{}.{} = {} is outside [{}, {}]", where, key, x, lo, hi));
    return x;
  }
  std::string string(const json& j, const char* key, const std::string& where) const {
    const json& v = at(j, key, where);
    if (!v.is_string()) bad(fmt::format("{}.{} is not a string", where, key));
    return v.get<std::string>();
  }
  bool boolean(const json& j, const char* key, const std::string& where) const {
    const json& v = at(j, key, where);
    if (!v.is_boolean()) bad(fmt::format("{}.{} is not true or false", where, key));
    return v.get<bool>();
  }
  double number(const json& j, const char* key, const std::string& where, double lo, double hi) const {
    const json& v = at(j, key, where);
    if (!v.is_number()) bad(fmt::format("{}.{} is not a number", where, key));
    const auto x = v.get<double>();
    if (!(x >= lo && x <= hi)) bad(fmt::format("{}.{} = {} is outside [{}, {}]", where, key, x, lo, hi));
    return x;
  }
  std::vector<std::int64_t> integers(const json& j, const char* key, const std::string& where, std::int64_t lo,
                                     std::int64_t hi) const {
    const json& v = at(j, key, where);
    if (!v.is_array()) bad(fmt::format("{}.{} is not a list", where, key));
    std::vector<std::int64_t> out;
    for (const json& e : v) {
      if (!e.is_number_integer()) bad(fmt::format("{}.{} holds a non-integer", where, key));
      const auto x = e.get<std::int64_t>();
      if (x < lo || x > hi) bad(fmt::format("{}.{} holds {} outside [{}, {}]", where, key, x, lo, hi));
      out.push_back(x);
    }
    return out;
  }
  const json& array(const json& j, const char* key, const std::string& where) const {
    const json& v = at(j, key, where);
    if (!v.is_array()) bad(fmt::format("{}.{} is not a list", where, key));
    return v;
  }

 private:
  std::string path_;
};

constexpr std::int64_t kMaxSize = std::int64_t{1} << 40;

// Reads `bytes` bytes at `offset` of an open file descriptor.
void pread_all(int fd, void* out, std::size_t bytes, std::int64_t offset, const std::string& path) {
  auto* p = static_cast<char*>(out);
  while (bytes > 0) {
    const ssize_t got = ::pread(fd, p, bytes, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      fail<IoError>("checkpoint", "'{}': cannot read {} bytes at offset {}: {}; the checkpoint is incomplete", path,
                    bytes, offset, got < 0 ? std::strerror(errno) : "the file ends early");
    p += got;
    bytes -= static_cast<std::size_t>(got);
    offset += got;
  }
}

// Opens a shard file of the manifest and checks its size against the manifest's.
class ShardFile {
 public:
  ShardFile(const std::string& dir, const Manifest& manifest, const std::string& name)
      : path_(join_path(dir, name)) {
    std::int64_t expected = -1;
    for (const FileRecord& f : manifest.files)
      if (f.name == name) expected = f.bytes;
    fd_ = ::open(path_.c_str(), O_RDONLY);
    if (fd_ < 0)
      fail<IoError>("checkpoint", "'{}': {}; the checkpoint is incomplete (a shard file is missing)", path_,
                    std::strerror(errno));
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd_);
      fail<IoError>("checkpoint", "'{}' is not a regular file; the checkpoint is corrupt", path_);
    }
    if (st.st_size != expected) {
      ::close(fd_);
      fail<IoError>("checkpoint", "'{}' has {} bytes but the manifest says {}; the shard file is truncated or was "
                    "replaced",
                    path_, static_cast<std::int64_t>(st.st_size), expected);
    }
  }
  ~ShardFile() { ::close(fd_); }
  ShardFile(const ShardFile&) = delete;
  ShardFile& operator=(const ShardFile&) = delete;
  // Reads a slice's parameters, m and v (elements each), checking its checksum.
  void read(const SliceRecord& s, const std::string& tensor, float* params, float* m, float* v) const {
    const auto n = static_cast<std::size_t>(s.elements());
    pread_all(fd_, params, n * sizeof(float), s.offset, path_);
    pread_all(fd_, m, n * sizeof(float), s.offset + static_cast<std::int64_t>(n * sizeof(float)), path_);
    pread_all(fd_, v, n * sizeof(float), s.offset + static_cast<std::int64_t>(2 * n * sizeof(float)), path_);
    std::uint32_t crc = crc_update(0, nullptr, 0);
    crc = crc_update(crc, params, n * sizeof(float));
    crc = crc_update(crc, m, n * sizeof(float));
    crc = crc_update(crc, v, n * sizeof(float));
    if (crc != s.crc32)
      fail<IoError>("checkpoint", "'{}' is corrupt: the slice of '{}' at byte {} fails its checksum", path_, tensor,
                    s.offset);
  }

 private:
  std::string path_;
  int fd_ = -1;
};

// The shard descriptor of a stored slice, for copy_shard (rank 0, absolute starts).
ParamShard slice_shard(const SliceRecord& s, const std::vector<std::int64_t>& full_shape) {
  ParamShard sh;
  sh.dim = s.dim;
  sh.full_shape = full_shape;
  sh.pieces = s.pieces;
  return sh;
}

// The absolute ranges along `dim` that a local view holds.
std::vector<ParamShard::Piece> local_ranges(const ParamShard& shard) {
  std::vector<ParamShard::Piece> out;
  for (const auto& p : shard.pieces)
    out.push_back({p.start + static_cast<std::int64_t>(shard.rank) * p.length, p.length});
  return out;
}

// local_ranges() cut at the full tensor's end (a padded vocabulary's rows past it are in no
// logical tensor); a range may become empty.
std::vector<ParamShard::Piece> held_ranges(const ParamShard& shard) {
  std::vector<ParamShard::Piece> out = local_ranges(shard);
  const std::int64_t end = shard.full_shape[static_cast<std::size_t>(shard.dim)];
  for (auto& p : out) p.length = std::clamp<std::int64_t>(end - p.start, 0, p.length);
  return out;
}

std::int64_t held_along(const std::vector<ParamShard::Piece>& pieces) {
  std::int64_t n = 0;
  for (const auto& p : pieces) n += p.length;
  return n;
}

// out (shape `held_shape`) = the rows of `local` that `pieces_in_local` (starts within the local
// tensor, rank 0, full_shape the local shape) name, in order.
void copy_held(const ParamShard& pieces_in_local, const std::vector<std::int64_t>& held_shape, float* out,
               const float* local) {
  const auto d = static_cast<std::size_t>(pieces_in_local.dim);
  std::int64_t outer = 1, inner = 1;
  for (std::size_t i = 0; i < d; ++i) outer *= held_shape[i];
  for (std::size_t i = d + 1; i < held_shape.size(); ++i) inner *= held_shape[i];
  const std::int64_t local_along = pieces_in_local.full_shape[d], held_along_d = held_shape[d];
  for (std::int64_t o = 0; o < outer; ++o) {
    std::int64_t at = 0;
    for (const auto& p : pieces_in_local.pieces) {
      std::copy_n(local + (o * local_along + p.start) * inner, p.length * inner,
                  out + (o * held_along_d + at) * inner);
      at += p.length;
    }
  }
}

bool overlaps(const std::vector<ParamShard::Piece>& a, const std::vector<ParamShard::Piece>& b) {
  for (const auto& x : a)
    for (const auto& y : b)
      if (x.start < y.start + y.length && y.start < x.start + x.length) return true;
  return false;
}

}  // namespace

namespace {
json tensor_json(const TensorRecord& t) {
  json slices = json::array();
  for (const SliceRecord& sl : t.slices) {
    json pieces = json::array();
    for (const auto& p : sl.pieces) pieces.push_back({p.start, p.length});
    slices.push_back({{"file", sl.file},
                      {"offset", sl.offset},
                      {"shape", sl.shape},
                      {"dim", sl.dim},
                      {"pieces", pieces},
                      {"crc32", sl.crc32}});
  }
  return {{"name", t.name}, {"shape", t.shape}, {"slices", slices}};
}
}  // namespace

std::int64_t SliceRecord::elements() const { return shape_numel(shape); }

const TensorRecord* Manifest::find(const std::string& name) const {
  for (const TensorRecord& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

std::string manifest_json(const Manifest& m) {
  json j;
  j["format"] = kFormat;
  j["version"] = m.version;
  // The whole architecture description (config.hpp: model_keys), kv_heads and ffn resolved.
  ModelSpec s = m.spec;
  s.kv_heads = s.kv_heads_or_heads();
  s.ffn = s.ffn_or_default();
  json model = json::object();
  for (const auto& [key, value] : model_values(s))
    std::visit([&, &key = key](const auto& x) { model[key] = x; }, value);
  j["model"] = model;
  j["step"] = m.step;
  j["adam_steps"] = m.adam_steps;
  j["data"] = {{"source", m.data}, {"position", m.step}};
  const CheckpointLayout& l = m.layout;
  j["layout"] = {{"mesh", l.mesh},
                 {"world", l.world},
                 {"zero", l.zero},
                 {"virtual_stages", l.virtual_stages},
                 {"partition", l.partition},
                 {"sequence_parallel", l.sequence_parallel},
                 {"cp_layout", l.cp_layout}};
  if (!m.schedule.name.empty()) {
    const ScheduleRecord& r = m.schedule;
    j["lr_schedule"] = {{"name", r.name},
                        {"lr", r.lr},
                        {"warmup", r.warmup},
                        {"steps", r.steps},
                        {"min_lr_ratio", r.min_lr_ratio},
                        {"decay_fraction", r.decay_fraction}};
  }
  json tensors = json::array();
  for (const TensorRecord& t : m.tensors) tensors.push_back(tensor_json(t));
  j["tensors"] = tensors;
  json files = json::array();
  for (const FileRecord& f : m.files) files.push_back(file_json(f));
  j["files"] = files;
  return j.dump(1) + "\n";
}

void write_manifest(const std::string& dir, const Manifest& manifest) {
  const std::string path = join_path(dir, kManifestFile);
  const std::string text = manifest_json(manifest);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) fail<IoError>("checkpoint", "cannot create '{}': {}", path, std::strerror(errno));
  bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fflush(f) == 0 &&
            ::fsync(::fileno(f)) == 0;
  const int err = errno;
  ok = std::fclose(f) == 0 && ok;
  if (!ok) fail<IoError>("checkpoint", "cannot write '{}': {} (disk full?)", path, std::strerror(err));
}

bool is_checkpoint_dir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::is_regular_file(fs::path(path) / kManifestFile, ec);
}

Manifest read_manifest(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) fail<IoError>("checkpoint", "'{}' does not exist; check the path", dir);
  if (!fs::is_directory(dir, ec))
    fail<IoError>("checkpoint", "'{}' is not a directory; a checkpoint is a directory written by ndmesh train --save",
                  dir);
  const std::string path = join_path(dir, kManifestFile);
  if (!fs::exists(path, ec))
    fail<IoError>("checkpoint",
                  "'{}' has no {}: it is not a checkpoint, or an incomplete one (a save that did not finish "
                  "leaves the previous checkpoint in place, never a directory without a manifest)",
                  dir, kManifestFile);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail<IoError>("checkpoint", "cannot read '{}'; check its permissions", path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    fail<IoError>("checkpoint", "'{}' is not valid JSON; the checkpoint is corrupt", path);
  Fields f(path);
  if (f.string(j, "format", "the manifest") != kFormat) f.bad("\"format\" is not \"ndmesh checkpoint\"");
  Manifest m;
  const auto version = f.integer(j, "version", "the manifest", 0, 1 << 30);
  if (version != kCheckpointDirVersion)
    fail<IoError>("checkpoint", "'{}' has format version {} but this build reads version {}", path, version,
                  kCheckpointDirVersion);
  const json& model = f.at(j, "model", "the manifest");
  m.spec.name = f.string(model, "name", "model");
  m.spec.layers = f.integer(model, "layers", "model", 1, kMaxSize);
  m.spec.hidden = f.integer(model, "hidden", "model", 1, kMaxSize);
  m.spec.heads = f.integer(model, "heads", "model", 1, kMaxSize);
  m.spec.kv_heads = f.integer(model, "kv_heads", "model", 1, kMaxSize);
  m.spec.ffn = f.integer(model, "ffn", "model", 1, kMaxSize);
  m.spec.seq = f.integer(model, "seq", "model", 1, kMaxSize);
  m.spec.vocab = f.integer(model, "vocab", "model", 1, kMaxSize);
  m.spec.experts = f.integer(model, "experts", "model", 0, kMaxSize);
  m.spec.tied_embeddings = f.boolean(model, "tied_embeddings", "model");
  // The architecture's other keys (manifests before them describe GPT-2's layers, the defaults).
  std::vector<std::pair<std::string, ModelValue>> arch;
  for (const std::string& key : model_keys()) {
    if (!model.contains(key)) continue;
    const json& v = model[key];
    if (key == "arch" || key == "name" || key == "layers" || key == "hidden" || key == "heads" ||
        key == "kv_heads" || key == "ffn" || key == "seq" || key == "vocab" || key == "experts" ||
        key == "tied_embeddings")
      continue;  // read above (arch is what the kinds below say)
    if (v.is_boolean())
      arch.emplace_back(key, v.get<bool>());
    else if (v.is_number_integer())
      arch.emplace_back(key, v.get<std::int64_t>());
    else if (v.is_number())
      arch.emplace_back(key, v.get<double>());
    else if (v.is_string())
      arch.emplace_back(key, v.get<std::string>());
    else
      f.bad(fmt::format("model.{} is not a number, boolean or name", key));
  }
  try {
    set_model_keys(m.spec, arch, "the manifest's model");
  } catch (const ConfigError& e) {
    fail<IoError>("checkpoint", "'{}': {}; the checkpoint is corrupt or from a newer ndmesh", path, e.what());
  }
  m.step = f.integer(j, "step", "the manifest", 0, kMaxSize);
  m.adam_steps = f.integer(j, "adam_steps", "the manifest", 0, m.step);
  const json& data = f.at(j, "data", "the manifest");
  m.data = f.string(data, "source", "data");
  if (f.integer(data, "position", "data", 0, kMaxSize) != m.step) f.bad("data.position differs from step");
  const json& layout = f.at(j, "layout", "the manifest");
  m.layout.mesh = f.string(layout, "mesh", "layout");
  m.layout.world = f.integer(layout, "world", "layout", 1, kMaxSize);
  m.layout.zero = static_cast<int>(f.integer(layout, "zero", "layout", 0, 3));
  m.layout.virtual_stages = f.integer(layout, "virtual_stages", "layout", 1, kMaxSize);
  m.layout.partition = f.integers(layout, "partition", "layout", 0, kMaxSize);
  m.layout.sequence_parallel = f.boolean(layout, "sequence_parallel", "layout");
  m.layout.cp_layout = f.string(layout, "cp_layout", "layout");
  if (j.contains("lr_schedule")) {  // informative; absent from older manifests
    const json& r = f.at(j, "lr_schedule", "the manifest");
    m.schedule.name = f.string(r, "name", "lr_schedule");
    m.schedule.lr = f.number(r, "lr", "lr_schedule", 0, 1e30);
    m.schedule.warmup = f.integer(r, "warmup", "lr_schedule", 0, kMaxSize);
    m.schedule.steps = f.integer(r, "steps", "lr_schedule", 0, kMaxSize);
    m.schedule.min_lr_ratio = f.number(r, "min_lr_ratio", "lr_schedule", 0, 1);
    m.schedule.decay_fraction = f.number(r, "decay_fraction", "lr_schedule", 0, 1);
  }

  std::map<std::string, std::int64_t> file_bytes;
  for (const json& e : f.array(j, "files", "the manifest")) {
    FileRecord r{f.string(e, "name", "files[]"), f.integer(e, "bytes", "files[]", 0, kMaxSize * 16)};
    if (!plain_name(r.name)) f.bad(fmt::format("files[] names '{}', which is not a file name", r.name));
    // Who wrote it (informative, absent from older manifests).
    if (e.contains("rank")) r.rank = f.integer(e, "rank", "files[]", 0, kMaxSize);
    if (e.contains("host")) r.host = f.string(e, "host", "files[]");
    if (!file_bytes.emplace(r.name, r.bytes).second) f.bad(fmt::format("file '{}' is listed twice", r.name));
    m.files.push_back(std::move(r));
  }
  std::set<std::string> names;
  for (const json& e : f.array(j, "tensors", "the manifest")) {
    TensorRecord t;
    t.name = f.string(e, "name", "tensors[]");
    const std::string where = fmt::format("tensor '{}'", t.name);
    if (!names.insert(t.name).second) f.bad(fmt::format("{} is listed twice", where));
    t.shape = f.integers(e, "shape", where, 1, kMaxSize);
    if (t.shape.empty() || t.shape.size() > 8) f.bad(fmt::format("{} has {} dimensions", where, t.shape.size()));
    if (!checked_numel(t.shape))
      f.bad(fmt::format("{} has shape [{}], whose element count does not fit 64 bits", where,
                        fmt::join(t.shape, ", ")));
    const json& slices = f.array(e, "slices", where);
    // The slices tile the tensor: one whole slice, or disjoint pieces along one dim
    // covering it.
    std::vector<std::pair<std::int64_t, std::int64_t>> covered;
    int dim = -2;
    for (const json& se : slices) {
      SliceRecord s;
      s.file = f.string(se, "file", where);
      s.offset = f.integer(se, "offset", where, 0, kMaxSize * 16);
      s.shape = f.integers(se, "shape", where, 1, kMaxSize);
      s.dim = static_cast<int>(f.integer(se, "dim", where, -1, static_cast<std::int64_t>(t.shape.size()) - 1));
      s.crc32 = static_cast<std::uint32_t>(f.integer(se, "crc32", where, 0, 0xffffffffll));
      if (dim != -2 && dim != s.dim) f.bad(fmt::format("{} has slices split along different dimensions", where));
      dim = s.dim;
      std::int64_t along = 0;
      for (const json& pe : f.array(se, "pieces", where)) {
        if (!pe.is_array() || pe.size() != 2 || !pe[0].is_number_integer() || !pe[1].is_number_integer())
          f.bad(fmt::format("{} has a piece that is not [start, length]", where));
        const ParamShard::Piece p{pe[0].get<std::int64_t>(), pe[1].get<std::int64_t>()};
        if (s.dim < 0 || p.start < 0 || p.length <= 0 || p.start + p.length > t.shape[static_cast<std::size_t>(s.dim)])
          f.bad(fmt::format("{} has a piece [{}, {}) outside the tensor", where, p.start, p.start + p.length));
        covered.emplace_back(p.start, p.length);
        along += p.length;
        s.pieces.push_back(p);
      }
      std::vector<std::int64_t> expected = t.shape;
      if (s.dim >= 0) expected[static_cast<std::size_t>(s.dim)] = along;
      if (s.shape != expected) f.bad(fmt::format("{} has a slice whose shape does not match its pieces", where));
      const auto it = file_bytes.find(s.file);
      if (it == file_bytes.end()) f.bad(fmt::format("{} names the file '{}', which the manifest does not list", where, s.file));
      // 3 x elements float32 values from the offset, every product checked.
      const std::optional<std::int64_t> elements = checked_numel(s.shape);
      std::int64_t bytes = 0, end = 0;
      if (!elements ||
          __builtin_mul_overflow(*elements, 3 * static_cast<std::int64_t>(sizeof(float)), &bytes) ||
          __builtin_add_overflow(s.offset, bytes, &end))
        f.bad(fmt::format("{} has a slice of shape [{}] whose size does not fit 64 bits", where,
                          fmt::join(s.shape, ", ")));
      if (end > it->second) f.bad(fmt::format("{} has a slice past the end of '{}'", where, s.file));
      t.slices.push_back(std::move(s));
    }
    if (t.slices.empty()) f.bad(fmt::format("{} has no slices", where));
    if (dim == -1) {
      if (t.slices.size() != 1) f.bad(fmt::format("{} has a whole slice and others", where));
    } else {
      std::sort(covered.begin(), covered.end());
      std::int64_t at = 0;
      for (auto [start, length] : covered) {
        if (start != at) f.bad(fmt::format("{}: its slices do not tile it (gap or overlap at {})", where, at));
        at += length;
      }
      if (at != t.shape[static_cast<std::size_t>(dim)]) f.bad(fmt::format("{}: its slices do not cover it", where));
    }
    m.tensors.push_back(std::move(t));
  }
  return m;
}

ShardFileWriter::ShardFileWriter(std::string dir, std::string file, std::int64_t rank)
    : dir_(std::move(dir)), file_(std::move(file)), rank_(rank) {
  const std::string path = join_path(dir_, file_);
  f_ = std::fopen(path.c_str(), "wb");
  if (f_ == nullptr && errno == ENOENT)  // the directory a rank elsewhere created is not here
    fail<IoError>(
        "checkpoint",
        "cannot create '{}' on {}: the folder does not exist here, although the rank that prepares the "
        "save created it on its node; the ranks do not share this folder (node-local disks?), and a "
        "multi-node save needs a shared file system",
        path, host_name().empty() ? "this node" : host_name());
  if (f_ == nullptr) fail<IoError>("checkpoint", "cannot create '{}': {}", path, std::strerror(errno));
}

ShardFileWriter::~ShardFileWriter() {
  if (f_ != nullptr) std::fclose(static_cast<std::FILE*>(f_));
}

std::optional<SliceRecord> ShardFileWriter::append(const ParamShard& shard,
                                                   const std::vector<std::int64_t>& local_shape, const float* params,
                                                   const float* m, const float* v) {
  SliceRecord s;
  s.file = file_;
  s.offset = bytes_;
  s.shape = local_shape;
  // Rows of a padded vocabulary past the logical tensor are in no slice: the pieces are cut at
  // its end (a rank whose rows are all padding writes nothing).
  const std::vector<ParamShard::Piece> held = shard.dim >= 0 ? held_ranges(shard) : std::vector<ParamShard::Piece>{};
  const bool padded = shard.dim >= 0 && held_along(held) != local_shape[static_cast<std::size_t>(shard.dim)];
  if (shard.sharded() || padded) {
    s.dim = shard.dim;
    s.pieces = held;
    s.shape[static_cast<std::size_t>(shard.dim)] = held_along(held);
  }
  const auto n = static_cast<std::size_t>(shape_numel(s.shape));
  if (n == 0) return std::nullopt;
  std::vector<float> cut;  // the held rows of each of the three, one after another
  if (padded) {
    ParamShard full = shard;
    full.full_shape = local_shape;  // the local tensor as the "full" one: take its held rows
    full.pieces.clear();
    std::int64_t at = 0;
    for (std::size_t i = 0; i < shard.pieces.size(); ++i) {
      full.pieces.push_back({at, held[i].length});
      at += shard.pieces[i].length;
    }
    full.rank = 0;
    cut.resize(3 * n);
    for (std::size_t a = 0; a < 3; ++a) {
      const float* src = a == 0 ? params : (a == 1 ? m : v);
      copy_held(full, s.shape, cut.data() + a * n, src);
    }
  }
  auto* f = static_cast<std::FILE*>(f_);
  std::uint32_t crc = crc_update(0, nullptr, 0);
  for (std::size_t a = 0; a < 3; ++a) {
    const float* p = padded ? cut.data() + a * n : (a == 0 ? params : (a == 1 ? m : v));
    if (std::fwrite(p, sizeof(float), n, f) != n)
      fail<IoError>("checkpoint", "cannot write '{}': {} (disk full?)", join_path(dir_, file_), std::strerror(errno));
    crc = crc_update(crc, p, n * sizeof(float));
  }
  s.crc32 = crc;
  bytes_ += static_cast<std::int64_t>(3 * n * sizeof(float));
  return s;
}

FileRecord ShardFileWriter::close() {
  auto* f = static_cast<std::FILE*>(f_);
  f_ = nullptr;
  bool ok = std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  const int err = errno;
  ok = std::fclose(f) == 0 && ok;
  if (!ok)
    fail<IoError>("checkpoint", "cannot write '{}': {} (disk full?)", join_path(dir_, file_), std::strerror(err));
  return {file_, bytes_, rank_, host_name()};
}


std::string manifest_part(const std::vector<TensorRecord>& tensors, const FileRecord& file) {
  json j;
  j["file"] = file_json(file);
  j["tensors"] = json::array();
  for (const TensorRecord& t : tensors) j["tensors"].push_back(tensor_json(t));
  return j.dump();
}

void add_manifest_part(Manifest& manifest, const std::string& part) {
  // Parts come from the ranks of the same job (not from disk); the merged manifest is
  // checked by read_manifest() before the checkpoint is committed.
  const json j = json::parse(part, nullptr, false);
  NDMESH_CHECK(!j.is_discarded() && j.contains("file") && j.contains("tensors"), "checkpoint",
               "a rank sent a malformed manifest part");
  const json& file = j["file"];
  manifest.files.push_back({file["name"].get<std::string>(), file["bytes"].get<std::int64_t>(),
                            file.value("rank", std::int64_t{-1}), file.value("host", std::string())});
  for (const json& t : j["tensors"]) {
    const auto name = t["name"].get<std::string>();
    auto it = std::find_if(manifest.tensors.begin(), manifest.tensors.end(),
                           [&](const TensorRecord& r) { return r.name == name; });
    if (it == manifest.tensors.end()) {
      manifest.tensors.push_back({name, t["shape"].get<std::vector<std::int64_t>>(), {}});
      it = std::prev(manifest.tensors.end());
    }
    for (const json& sl : t["slices"]) {
      SliceRecord s;
      s.file = sl["file"].get<std::string>();
      s.offset = sl["offset"].get<std::int64_t>();
      s.shape = sl["shape"].get<std::vector<std::int64_t>>();
      s.dim = sl["dim"].get<int>();
      for (const json& p : sl["pieces"]) s.pieces.push_back({p[0].get<std::int64_t>(), p[1].get<std::int64_t>()});
      s.crc32 = sl["crc32"].get<std::uint32_t>();
      it->slices.push_back(std::move(s));
    }
  }
}

void read_tensor(const std::string& dir, const Manifest& manifest, const TensorRecord& tensor,
                 const ParamView& local, float* params, float* m, float* v) {
  // read_manifest() made sure the slices tile the tensor and fit their files.
  const std::vector<std::int64_t>& full_shape = local.shard.dim >= 0 ? local.shard.full_shape : local.shape;
  if (full_shape != tensor.shape)
    fail<IoError>("checkpoint", "'{}': tensor '{}' has shape [{}] in the checkpoint but [{}] in the model", dir,
                  tensor.name, fmt::join(tensor.shape, ", "), fmt::join(full_shape, ", "));
  const ParamShard& ls = local.shard;
  const bool padded =
      ls.dim >= 0 && ls.held_along(local.shape[static_cast<std::size_t>(ls.dim)]) !=
                         local.shape[static_cast<std::size_t>(ls.dim)];
  const std::vector<ParamShard::Piece> mine = ls.dim >= 0 ? held_ranges(ls) : std::vector<ParamShard::Piece>{};
  auto same = [](const ParamShard::Piece& a, const ParamShard::Piece& b) {
    return a.start == b.start && a.length == b.length;
  };
  // Whole tensor stored and wanted, or the same split: read just that slice (not into a
  // padded view, whose rows the general path below places).
  for (const SliceRecord& s : tensor.slices) {
    if (padded) break;
    const bool whole = !ls.sharded() && s.dim < 0;
    const bool same_split = ls.sharded() && s.dim == ls.dim && s.pieces.size() == mine.size() &&
                            std::equal(mine.begin(), mine.end(), s.pieces.begin(), same);
    if (whole || same_split) {
      ShardFile(dir, manifest, s.file).read(s, tensor.name, params, m, v);
      return;
    }
  }
  // Another split: assemble the full tensor from the slices that overlap this rank's
  // part (along the same dim; all of them otherwise), then take the part.
  const auto n = static_cast<std::size_t>(shape_numel(tensor.shape));
  std::vector<float> full(3 * n), part;
  std::map<std::string, std::unique_ptr<ShardFile>> open;
  for (const SliceRecord& s : tensor.slices) {
    if (ls.dim >= 0 && s.dim == ls.dim && !overlaps(s.pieces, mine)) continue;
    auto& file = open[s.file];
    if (!file) file = std::make_unique<ShardFile>(dir, manifest, s.file);
    const auto k = static_cast<std::size_t>(s.elements());
    part.resize(3 * k);
    file->read(s, tensor.name, part.data(), part.data() + k, part.data() + 2 * k);
    const ParamShard sh = slice_shard(s, tensor.shape);
    for (std::size_t a = 0; a < 3; ++a) copy_shard(sh, s.shape, part.data() + a * k, full.data() + a * n, true, 0);
  }
  float* out[3] = {params, m, v};
  for (std::size_t a = 0; a < 3; ++a) copy_shard(ls, local.shape, out[a], full.data() + a * n, false);
}

std::int64_t verify_checkpoint_dir(const std::string& dir, const Manifest& manifest) {
  std::int64_t bytes = 0;
  std::map<std::string, std::unique_ptr<ShardFile>> open;
  std::vector<float> buf;
  for (const TensorRecord& t : manifest.tensors)
    for (const SliceRecord& s : t.slices) {
      auto& file = open[s.file];
      if (!file) file = std::make_unique<ShardFile>(dir, manifest, s.file);
      const auto k = static_cast<std::size_t>(s.elements());
      buf.resize(3 * k);
      file->read(s, t.name, buf.data(), buf.data() + k, buf.data() + 2 * k);
      bytes += static_cast<std::int64_t>(3 * k * sizeof(float));
    }
  for (const FileRecord& f : manifest.files) open.try_emplace(f.name, std::make_unique<ShardFile>(dir, manifest, f.name));
  return bytes;
}

std::string checkpoint_temp_dir(const std::string& dir) {
  fs::path p(dir);
  while (!p.empty() && p.filename().empty()) p = p.parent_path();  // "ck/" -> "ck"
  return (p.parent_path() / fmt::format(".{}.saving", p.filename().string())).string();
}

void prepare_checkpoint_temp_dir(const std::string& tmp) {
  std::error_code ec;
  if (fs::exists(fs::symlink_status(tmp, ec)))
    log::warn("[checkpoint] removing '{}', left behind by a save that was interrupted", tmp);
  fs::remove_all(tmp, ec);
  if (ec) fail<IoError>("checkpoint", "cannot remove the leftover '{}': {}", tmp, ec.message());
  if (!fs::create_directory(tmp, ec) || ec)
    fail<IoError>("checkpoint", "cannot create '{}': {}; check that the folder exists and is writable", tmp,
                  ec ? ec.message() : "it exists");
}

void discard_checkpoint_temp_dir(const std::string& tmp) {
  std::error_code ec;
  fs::remove_all(tmp, ec);
  if (ec)
    log::warn("[checkpoint] cannot remove '{}' after the failed save: {}; remove it by hand", tmp,
              ec.message());
}

void check_shard_files(const std::string& dir, const Manifest& manifest) {
  std::string here = host_name();
  if (here.empty()) here = "this node";
  for (const FileRecord& f : manifest.files) {
    const std::string path = join_path(dir, f.name);
    std::error_code ec;
    const auto status = fs::status(path, ec);
    if (!fs::exists(status))
      fail<IoError>(
          "checkpoint",
          "'{}' is missing on {}, where the manifest is written, but {} wrote it: the ranks do not share "
          "this folder (node-local disks?), and a multi-node save needs a shared file system; the "
          "previous checkpoint is kept",
          path, here, writer_of(f));
    if (!fs::is_regular_file(status))
      fail<IoError>("checkpoint",
                    "'{}' on {} is not a regular file but {} wrote one there; the previous "
                    "checkpoint is kept",
                    path, here, writer_of(f));
    const auto size = static_cast<std::int64_t>(fs::file_size(path, ec));
    if (ec || size != f.bytes)
      fail<IoError>(
          "checkpoint",
          "'{}' has {} bytes on {}, where the manifest is written, but {} wrote {}: the ranks do not see "
          "the same folder, or it changed meanwhile; the previous checkpoint is kept",
          path, size, here, writer_of(f), f.bytes);
  }
}

std::string retired_checkpoint_dir(const std::string& dir, std::int64_t step) {
  fs::path p(dir);
  while (!p.empty() && p.filename().empty()) p = p.parent_path();  // "ck/" -> "ck"
  return (p.parent_path() / fmt::format("{}.step-{:06}", p.filename().string(), step)).string();
}

namespace {
// --keep: the previous checkpoint (now at `old`) under its retired name, then the retired
// siblings of DIR beyond the newest keep - 1 removed. Best effort: the new checkpoint is in
// place already, so a failure here is a warning.
void retire(const std::string& old, const std::string& dir, int keep) {
  std::error_code ec;
  if (!is_checkpoint_dir(old)) {
    fs::remove_all(old, ec);
    return;
  }
  std::int64_t step = 0;
  try {
    step = read_manifest(old).step;
  } catch (const Error&) {
    fs::remove_all(old, ec);
    return;
  }
  const std::string retired = retired_checkpoint_dir(dir, step);
  fs::remove_all(retired, ec);  // a checkpoint of the same step from an earlier run
  if (std::rename(old.c_str(), retired.c_str()) != 0) {
    log::warn("[checkpoint] cannot keep the previous checkpoint as '{}': {}; it is removed", retired,
              std::strerror(errno));
    fs::remove_all(old, ec);
    return;
  }
  fs::path p(dir);
  while (!p.empty() && p.filename().empty()) p = p.parent_path();
  const fs::path parent = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  const std::string prefix = p.filename().string() + ".step-";
  std::vector<std::pair<std::int64_t, fs::path>> kept;
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with(prefix) || name.size() == prefix.size()) continue;
    const std::string digits = name.substr(prefix.size());
    if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 18) continue;
    if (!is_checkpoint_dir(e.path().string())) continue;
    kept.emplace_back(std::stoll(digits), e.path());
  }
  std::sort(kept.begin(), kept.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (std::size_t i = static_cast<std::size_t>(std::max(keep - 1, 0)); i < kept.size(); ++i) {
    fs::remove_all(kept[i].second, ec);
    if (ec) log::warn("[checkpoint] cannot remove '{}' (--keep {}): {}", kept[i].second.string(), keep, ec.message());
  }
}
}  // namespace

void commit_checkpoint_dir(const std::string& tmp, const std::string& dir, int keep) {
  check_shard_files(tmp, read_manifest(tmp));
  sync_dir(tmp);
  std::error_code ec;
  const bool replace = fs::exists(dir, ec);
  if (!replace) {
    if (std::rename(tmp.c_str(), dir.c_str()) != 0)
      fail<IoError>("checkpoint", "cannot rename '{}' to '{}': {}", tmp, dir, std::strerror(errno));
  } else if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) != 0) {
    // A file system without the atomic exchange: move the old one aside first (a crash
    // between the two renames leaves it under the aside name, which the error of the
    // next --load names).
    if (errno != EINVAL && errno != ENOSYS)
      fail<IoError>("checkpoint", "cannot replace '{}' with '{}': {}", dir, tmp, std::strerror(errno));
    const std::string aside = tmp + ".previous";
    fs::remove_all(aside, ec);
    if (std::rename(dir.c_str(), aside.c_str()) != 0 || std::rename(tmp.c_str(), dir.c_str()) != 0)
      fail<IoError>("checkpoint", "cannot replace '{}' with '{}': {}", dir, tmp, std::strerror(errno));
    if (keep > 1)
      retire(aside, dir, keep);
    else
      fs::remove_all(aside, ec);
  } else if (keep > 1) {
    retire(tmp, dir, keep);  // the previous checkpoint, swapped out
  } else {
    fs::remove_all(tmp, ec);  // the previous checkpoint, swapped out
  }
  sync_dir(fs::path(dir).parent_path().empty() ? "." : fs::path(dir).parent_path().string());
}

}  // namespace ndmesh::model
