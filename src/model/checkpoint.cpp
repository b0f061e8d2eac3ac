#include "ndmesh/model/checkpoint.hpp"

#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <fmt/core.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/model/checkpoint_dir.hpp"
#include "ndmesh/model/decoder.hpp"

namespace ndmesh::model {

namespace {

constexpr char kMagic[8] = {'N', 'D', 'M', 'E', 'S', 'H', 'C', 'K'};
constexpr std::size_t kHeaderBytes = 8 + 4 + 4 + 8 + 4;

std::uint32_t crc32_of(const unsigned char* data, std::size_t n) {
  uLong crc = crc32(0L, Z_NULL, 0);
  // zlib takes uInt lengths; feed large buffers in pieces.
  while (n > 0) {
    uInt chunk = static_cast<uInt>(std::min<std::size_t>(n, 1u << 30));
    crc = crc32(crc, data, chunk);
    data += chunk;
    n -= chunk;
  }
  return static_cast<std::uint32_t>(crc);
}

class Writer {
 public:
  template <typename V>
  void pod(V v) {
    const auto* p = reinterpret_cast<const unsigned char*>(&v);
    bytes_.insert(bytes_.end(), p, p + sizeof(V));
  }
  void str(const std::string& s) {
    pod<std::uint32_t>(static_cast<std::uint32_t>(s.size()));
    bytes_.insert(bytes_.end(), s.begin(), s.end());
  }
  void floats(const std::vector<float>& v) {
    const auto* p = reinterpret_cast<const unsigned char*>(v.data());
    bytes_.insert(bytes_.end(), p, p + v.size() * sizeof(float));
  }
  std::vector<unsigned char>& bytes() { return bytes_; }

 private:
  std::vector<unsigned char> bytes_;
};

class Reader {
 public:
  Reader(const std::string& path, const unsigned char* data, std::size_t n)
      : path_(path), data_(data), n_(n) {}
  template <typename V>
  V pod() {
    need(sizeof(V));
    V v;
    std::memcpy(&v, data_ + at_, sizeof(V));
    at_ += sizeof(V);
    return v;
  }
  std::string str() {
    auto len = pod<std::uint32_t>();
    need(len);
    std::string s(reinterpret_cast<const char*>(data_ + at_), len);
    at_ += len;
    return s;
  }
  std::vector<float> floats(std::size_t count) {
    need(count * sizeof(float));
    std::vector<float> v(count);
    std::memcpy(v.data(), data_ + at_, count * sizeof(float));
    at_ += count * sizeof(float);
    return v;
  }
  bool at_end() const { return at_ == n_; }

 private:
  void need(std::size_t k) const {
    if (n_ - at_ < k) fail<IoError>("checkpoint", "'{}' is malformed: its body ends early", path_);
  }
  const std::string& path_;
  const unsigned char* data_;
  std::size_t n_;
  std::size_t at_ = 0;
};

}  // namespace

void save_checkpoint(const std::string& path, const Checkpoint& c) {
  NDMESH_CHECK(c.params.size() == c.adam_m.size() && c.params.size() == c.adam_v.size(), "checkpoint",
               "params ({}), m ({}) and v ({}) differ in size", c.params.size(), c.adam_m.size(),
               c.adam_v.size());
  Writer body;
  for (std::int64_t v : {c.spec.layers, c.spec.hidden, c.spec.heads, c.spec.kv_heads, c.spec.ffn, c.spec.seq,
                         c.spec.vocab, c.spec.experts})
    body.pod(v);
  body.pod<std::uint8_t>(c.spec.tied_embeddings ? 1 : 0);
  body.str(c.spec.name);
  body.pod(c.step);
  body.str(c.data);
  body.pod(c.adam_steps);
  body.pod<std::uint64_t>(c.params.size());
  body.floats(c.params);
  body.floats(c.adam_m);
  body.floats(c.adam_v);

  Writer header;
  for (char ch : kMagic) header.pod(ch);
  header.pod(kCheckpointVersion);
  const std::uint64_t body_bytes = body.bytes().size();
  const std::uint32_t body_crc = crc32_of(body.bytes().data(), body.bytes().size());
  // The header crc covers the version, the body size and the body crc.
  Writer covered;
  covered.pod(kCheckpointVersion);
  covered.pod(body_bytes);
  covered.pod(body_crc);
  header.pod(crc32_of(covered.bytes().data(), covered.bytes().size()));
  header.pod(body_bytes);
  header.pod(body_crc);

  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr)
    fail<IoError>("checkpoint", "cannot create '{}': {}; check that the folder exists and is writable", tmp,
                  std::strerror(errno));
  bool ok = std::fwrite(header.bytes().data(), 1, header.bytes().size(), f) == header.bytes().size() &&
            std::fwrite(body.bytes().data(), 1, body.bytes().size(), f) == body.bytes().size() &&
            std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  const int write_errno = errno;
  ok = std::fclose(f) == 0 && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = ok ? errno : write_errno;
    std::remove(tmp.c_str());
    fail<IoError>("checkpoint", "cannot write '{}': {}", path, std::strerror(err));
  }
}

Checkpoint load_checkpoint(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (!fs::exists(st)) fail<IoError>("checkpoint", "'{}' does not exist; check the path", path);
  if (!fs::is_regular_file(st))
    fail<IoError>("checkpoint", "'{}' is not a regular file ({}); pass a checkpoint file written with --save",
                  path, fs::is_directory(st) ? "a directory" : "a device, pipe or socket");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail<IoError>("checkpoint", "cannot open '{}'; check its permissions", path);
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() < kHeaderBytes || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0)
    fail<IoError>("checkpoint", "'{}' is not an ndmesh checkpoint (no NDMESHCK header)", path);
  Reader header(path, bytes.data() + sizeof(kMagic), kHeaderBytes - sizeof(kMagic));
  const auto version = header.pod<std::uint32_t>();
  const auto header_crc = header.pod<std::uint32_t>();
  const auto body_bytes = header.pod<std::uint64_t>();
  const auto body_crc = header.pod<std::uint32_t>();
  Writer covered;
  covered.pod(version);
  covered.pod(body_bytes);
  covered.pod(body_crc);
  if (crc32_of(covered.bytes().data(), covered.bytes().size()) != header_crc)
    fail<IoError>("checkpoint", "'{}' has a corrupt header (checksum mismatch)", path);
  if (version != kCheckpointVersion)
    fail<IoError>("checkpoint",
                  "'{}' has format version {} but this build reads version {}{}", path, version,
                  kCheckpointVersion,
                  version == 1 ? " (version 1 predates indexable batches; retrain, or resume with the ndmesh that wrote it)"
                               : "");
  if (bytes.size() - kHeaderBytes != body_bytes)
    fail<IoError>("checkpoint",
                  "'{}' is truncated or padded: the header promises {} body bytes, the file has {}", path,
                  body_bytes, bytes.size() - kHeaderBytes);
  const unsigned char* body_data = bytes.data() + kHeaderBytes;
  if (crc32_of(body_data, body_bytes) != body_crc)
    fail<IoError>("checkpoint", "'{}' is corrupt: body checksum mismatch", path);

  Reader body(path, body_data, body_bytes);
  Checkpoint c;
  for (std::int64_t* field : {&c.spec.layers, &c.spec.hidden, &c.spec.heads, &c.spec.kv_heads, &c.spec.ffn,
                              &c.spec.seq, &c.spec.vocab, &c.spec.experts})
    *field = body.pod<std::int64_t>();
  c.spec.tied_embeddings = body.pod<std::uint8_t>() != 0;
  c.spec.name = body.str();
  c.step = body.pod<std::int64_t>();
  c.data = body.str();
  c.adam_steps = body.pod<std::int64_t>();
  const auto count = body.pod<std::uint64_t>();
  // Every field is checked: a crafted file with valid checksums is still untrusted input.
  if (c.step < 0 || c.adam_steps < 0 || c.adam_steps > c.step)
    fail<IoError>("checkpoint", "'{}' is malformed: step {} and optimizer step {} are not 0 <= optimizer <= step",
                  path, c.step, c.adam_steps);
  for (std::int64_t v : {c.spec.layers, c.spec.hidden, c.spec.heads, c.spec.seq, c.spec.vocab})
    if (v <= 0 || v > (std::int64_t{1} << 40))
      fail<IoError>("checkpoint", "'{}' is malformed: its model spec has a size {} outside [1, 2^40]", path, v);
  if (count > body_bytes / (3 * sizeof(float)))
    fail<IoError>("checkpoint", "'{}' is malformed: {} parameters do not fit its {} body bytes", path, count,
                  body_bytes);
  c.params = body.floats(count);
  c.adam_m = body.floats(count);
  c.adam_v = body.floats(count);
  if (!body.at_end()) fail<IoError>("checkpoint", "'{}' is malformed: bytes left after the body", path);
  return c;
}

std::vector<std::string> spec_differences(const ModelSpec& a, const ModelSpec& b) {
  std::vector<std::string> out;
  auto cmp = [&](const char* field, std::int64_t x, std::int64_t y) {
    if (x != y) out.push_back(fmt::format("{}: checkpoint has {}, the run has {}", field, x, y));
  };
  auto cmp_name = [&](const char* field, std::string_view x, std::string_view y) {
    if (x != y) out.push_back(fmt::format("{}: checkpoint has {}, the run has {}", field, x, y));
  };
  auto cmp_real = [&](const char* field, double x, double y) {
    if (x != y) out.push_back(fmt::format("{}: checkpoint has {}, the run has {}", field, x, y));
  };
  cmp("layers", a.layers, b.layers);
  cmp("hidden", a.hidden, b.hidden);
  cmp("heads", a.heads, b.heads);
  cmp("kv_heads", a.kv_heads_or_heads(), b.kv_heads_or_heads());
  cmp("head_dim", a.head_dim_or_default(), b.head_dim_or_default());
  cmp("ffn", a.ffn_or_default(), b.ffn_or_default());
  cmp("vocab", a.vocab, b.vocab);
  cmp("experts", a.experts, b.experts);
  if (a.experts > 0 && b.experts > 0) {  // the layers that hold expert parameters, and their shapes
    cmp("shared_experts", a.shared_experts, b.shared_experts);
    cmp("expert_ffn", a.expert_ffn_or_default(), b.expert_ffn_or_default());
    cmp("moe_every", a.moe_every, b.moe_every);
    cmp("moe_first_dense", a.moe_first_dense, b.moe_first_dense);
    cmp_name("router", router_name(a.router), router_name(b.router));
  }
  cmp("tied_embeddings", a.tied_embeddings, b.tied_embeddings);
  cmp_name("norm", norm_name(a.norm), norm_name(b.norm));
  cmp_real("norm_eps", a.norm_eps, b.norm_eps);
  cmp_name("mlp", mlp_name(a.mlp), mlp_name(b.mlp));
  cmp_name("positions", positions_name(a.positions), positions_name(b.positions));
  cmp("biases", a.biases, b.biases);
  // The run's seq is not a shape: any length the position table holds (any with rotary ones).
  if (a.positions == PositionsKind::kLearned && b.positions == PositionsKind::kLearned)
    cmp("max_positions", a.position_rows(), b.position_rows());
  if (a.positions == PositionsKind::kRope && b.positions == PositionsKind::kRope) {
    cmp_real("rope_theta", a.rope_theta, b.rope_theta);
    if (!(a.rope_scaling == b.rope_scaling))
      out.push_back(fmt::format("rope scaling: checkpoint has factor {}, the run has {}", a.rope_scaling.factor,
                                b.rope_scaling.factor));
  }
  return out;
}

void convert_to_checkpoint_dir(const std::string& file, const std::string& dir) {
  const Checkpoint c = load_checkpoint(file);
  // The serial model's views say where each parameter lives in the logical flat buffer the
  // file holds (ZeRO may have padded it: the padding is zero, and past the logical end).
  const Decoder serial(c.spec, ModelOptions{.batch = 1});
  std::int64_t logical = 0;
  const std::vector<std::int64_t> offsets = serial.params().logical_offsets(&logical);
  if (c.params.size() < static_cast<std::size_t>(logical) || c.adam_m.size() != c.params.size() ||
      c.adam_v.size() != c.params.size())
    fail<IoError>("checkpoint", "'{}' holds {} parameters but its model has {}; the file is corrupt", file,
                  c.params.size(), logical);
  const std::string tmp = checkpoint_temp_dir(dir);
  prepare_checkpoint_temp_dir(tmp);
  Manifest m;
  m.spec = c.spec;
  m.step = c.step;
  m.adam_steps = c.adam_steps;
  m.data = c.data;
  m.layout = {.mesh = "dp=1 pp=1 cp=1 tp=1 (converted from a single-file checkpoint)", .world = 1};
  {
    ShardFileWriter writer(tmp, "shard-pp000-tp000.bin");
    const auto& views = serial.params().views();
    for (std::size_t i = 0; i < views.size(); ++i) {
      const auto at = static_cast<std::size_t>(offsets[i]);
      // The file holds each logical tensor whole (a padded vocabulary's rows are in none).
      const auto& shape = views[i].shard.dim >= 0 ? views[i].shard.full_shape : views[i].shape;
      TensorRecord r{views[i].name, shape, {}};
      if (auto slice = writer.append(ParamShard{}, shape, c.params.data() + at, c.adam_m.data() + at,
                                     c.adam_v.data() + at))
        r.slices.push_back(*slice);
      m.tensors.push_back(std::move(r));
    }
    m.files.push_back(writer.close());
  }
  write_manifest(tmp, m);
  read_manifest(tmp);
  commit_checkpoint_dir(tmp, dir);
}

}  // namespace ndmesh::model
