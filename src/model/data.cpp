#include "ndmesh/model/data.hpp"

#include <algorithm>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <unistd.h>

#include <fmt/core.h>

#include "ndmesh/core/error.hpp"

namespace ndmesh::model {

void DataSource::batch(std::uint64_t stream, std::int64_t step, std::int64_t first, std::int64_t count,
                       std::int64_t seq, std::int32_t* tokens, std::int32_t* targets) const {
  for (std::int64_t i = 0; i < count; ++i) sequence(stream, step, first + i, seq, tokens + i * seq, targets + i * seq);
}

Rng DataSource::sequence_rng(std::uint64_t stream, std::int64_t step, std::int64_t index) const {
  // Each field goes through a SplitMix64 finaliser before the next is mixed in, so nearby
  // (step, index) pairs get unrelated streams.
  std::uint64_t h = Rng(seed_ ^ 0x6e646d657368ull).next();  // "ndmesh"
  for (std::uint64_t v : {stream, static_cast<std::uint64_t>(step), static_cast<std::uint64_t>(index)})
    h = Rng(h ^ v).next();
  return Rng(h);
}

MarkovSource::MarkovSource(MarkovOptions options) : DataSource(options.seed), options_(options) {
  const std::int64_t n = options_.vocab;
  NDMESH_CHECK_CONFIG(n >= 2 && n <= 1024, "data",
                      "markov vocab={} must be in [2, 1024]; e.g. --markov-vocab 32", n);
  NDMESH_CHECK_CONFIG(options_.sharpness >= 0 && std::isfinite(options_.sharpness), "data",
                      "markov sharpness={} must be a finite number >= 0", options_.sharpness);
  // The chain comes from its own stream, so the sampling stream starts at `seed` itself.
  Rng chain_rng(options_.seed ^ 0x6d61726b6f76ull);  // "markov"
  transition_.resize(static_cast<std::size_t>(n * n));
  cumulative_.resize(transition_.size());
  for (std::int64_t i = 0; i < n; ++i) {
    double* row = transition_.data() + i * n;
    double sum = 0;
    for (std::int64_t j = 0; j < n; ++j) sum += row[j] = std::exp(options_.sharpness * chain_rng.normal());
    double run = 0;
    for (std::int64_t j = 0; j < n; ++j) {
      row[j] /= sum;
      cumulative_[static_cast<std::size_t>(i * n + j)] = run += row[j];
    }
  }
  stationary_ = stationary_of(transition_, n);
  stationary_cumulative_.resize(stationary_.size());
  double run = 0;
  for (std::size_t j = 0; j < stationary_.size(); ++j) stationary_cumulative_[j] = run += stationary_[j];
  entropy_rate_ = entropy_rate_of(transition_, stationary_, n);
}

std::vector<double> MarkovSource::stationary_of(const std::vector<double>& p, std::int64_t n) {
  std::vector<double> pi(static_cast<std::size_t>(n), 1.0 / static_cast<double>(n)), next(pi.size());
  for (int iter = 0; iter < 100000; ++iter) {
    std::fill(next.begin(), next.end(), 0.0);
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < n; ++j) next[j] += pi[i] * p[static_cast<std::size_t>(i * n + j)];
    double total = 0, change = 0;
    for (double x : next) total += x;
    for (std::size_t j = 0; j < pi.size(); ++j) {
      next[j] /= total;
      change += std::abs(next[j] - pi[j]);
    }
    pi.swap(next);
    if (change < 1e-15) break;
  }
  return pi;
}

double MarkovSource::entropy_rate_of(const std::vector<double>& p, const std::vector<double>& pi,
                                     std::int64_t n) {
  double h = 0;
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double pij = p[static_cast<std::size_t>(i * n + j)];
      if (pij > 0) h -= pi[static_cast<std::size_t>(i)] * pij * std::log(pij);
    }
  return h;
}

std::int32_t MarkovSource::draw(Rng& rng, const double* cumulative) const {
  const double u = rng.uniform();
  const double* end = cumulative + options_.vocab;
  const double* it = std::upper_bound(cumulative, end, u);
  // Rounding can leave the last running sum a hair below 1.
  return static_cast<std::int32_t>(it == end ? options_.vocab - 1 : it - cumulative);
}

void MarkovSource::sequence(std::uint64_t stream, std::int64_t step, std::int64_t index, std::int64_t seq,
                            std::int32_t* tokens, std::int32_t* targets) const {
  Rng rng = sequence_rng(stream, step, index);
  std::int32_t cur = draw(rng, stationary_cumulative_.data());
  for (std::int64_t t = 0; t < seq; ++t) {
    std::int32_t next = draw(rng, cumulative_.data() + cur * options_.vocab);
    tokens[t] = cur;
    targets[t] = next;
    cur = next;
  }
}

std::string MarkovSource::describe() const {
  return fmt::format("markov vocab={} seed={} sharpness={}", options_.vocab, options_.seed,
                     options_.sharpness);
}

namespace {
// "" for the whole file, else " range=0..0.9" (describe(): a checkpoint of one part does not
// load into a run of another).
std::string part_text(const DataPart& part) {
  return part.whole() ? std::string() : fmt::format(" range={:g}..{:g}", part.begin, part.end);
}
// [first, last) of n items for a part.
std::pair<std::int64_t, std::int64_t> part_range(const DataPart& part, std::int64_t n) {
  const auto at = [n](double f) {
    return std::clamp(static_cast<std::int64_t>(std::floor(f * static_cast<double>(n))), std::int64_t{0}, n);
  };
  return {at(part.begin), part.end >= 1 ? n : at(part.end)};
}
}  // namespace

ByteSource::ByteSource(const std::string& path, std::uint64_t seed, DataPart part)
    : DataSource(seed), path_(path), part_(std::move(part)) {
  namespace fs = std::filesystem;
  const std::string& flag = part_.flag;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (path.empty()) fail<ConfigError>("data", "{} is empty; pass a text file, or leave {} out{}", part_.flag, part_.flag,
                      part_.flag == "--data" ? " for the Markov source" : "");
  if (!fs::exists(st))
    fail<ConfigError>("data", "{}={}: no such file; pass an existing text file", flag, path);
  if (!fs::is_regular_file(st))
    fail<ConfigError>("data", "{}={}: not a regular file ({}); pass a text file", flag, path,
                      fs::is_directory(st) ? "a directory" : "a device, pipe or socket");
  const auto size = fs::file_size(path, ec);
  if (ec || size > static_cast<std::uintmax_t>(kMaxBytes))
    fail<ConfigError>("data", "{}={}: {} bytes is more than the {} bytes ndmesh reads into memory; pass a smaller file", flag,
                      path, size, kMaxBytes);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail<ConfigError>("data", "{}={}: cannot open the file for reading; check its permissions", flag, path);
  bytes_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  if (in.bad()) fail<IoError>("data", "error while reading '{}'", path);
  if (bytes_.empty()) fail<ConfigError>("data", "{}={}: the file is empty; pass a text file", flag, path);
  file_bytes_ = static_cast<std::int64_t>(bytes_.size());
  if (!part_.whole()) {
    const auto [first, last] = part_range(part_, file_bytes_);
    bytes_ = std::vector<unsigned char>(bytes_.begin() + first, bytes_.begin() + last);
  }
}

void ByteSource::check_seq(std::int64_t seq) const {
  const std::string& flag = part_.flag;
  const std::int64_t size = bytes();
  NDMESH_CHECK_CONFIG(
      size >= seq + 1, "data",
      "{}={} has {} bytes but one training window needs --seq + 1 = {}; use a larger file or --seq {}", flag,
      path_, size, seq + 1, std::max<std::int64_t>(1, size - 1));
}

void ByteSource::sequence(std::uint64_t stream, std::int64_t step, std::int64_t index, std::int64_t seq,
                          std::int32_t* tokens, std::int32_t* targets) const {
  check_seq(seq);
  Rng rng = sequence_rng(stream, step, index);
  const auto start = static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(bytes() - seq)));
  for (std::int64_t t = 0; t < seq; ++t) {
    tokens[t] = bytes_[static_cast<std::size_t>(start + t)];
    targets[t] = bytes_[static_cast<std::size_t>(start + t + 1)];
  }
}

std::string ByteSource::describe() const {
  return fmt::format("bytes file={} size={}{}", path_, file_bytes_, part_text(part_));
}

DataFormat parse_data_format(std::string_view name) {
  if (name == "auto") return DataFormat::kAuto;
  if (name == "bytes") return DataFormat::kBytes;
  if (name == "llmc") return DataFormat::kLlmc;
  if (name == "uint16") return DataFormat::kUint16;
  fail<ConfigError>("data", "--data-format={} is not a data format (auto, bytes, llmc, uint16); e.g. --data-format llmc",
                    name);
}

namespace {
bool is_glob(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

std::vector<std::string> expand(const std::string& pattern, const std::string& flag) {
  if (!is_glob(pattern)) return {pattern};
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0)
    for (std::size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  NDMESH_CHECK_CONFIG(!out.empty(), "data", "{}={}: no file matches the pattern; check the path and the glob", flag,
                      pattern);
  std::sort(out.begin(), out.end());
  return out;
}
}  // namespace

int llmc_token_bytes(const std::int32_t* header, std::int64_t file_bytes, const std::string& flag,
                     const std::string& path, bool exact) {
  const std::int64_t header_bytes = kLlmcHeaderInts * static_cast<std::int64_t>(sizeof(std::int32_t));
  const bool gpt2 = header[0] == kLlmcMagic, llama3 = header[0] == kLlmcMagic32;
  NDMESH_CHECK_CONFIG(
      file_bytes >= header_bytes && (gpt2 || llama3), "data",
      "{}={}: not an llm.c token shard (no header with magic {} or {}); use --data-format uint16 "
      "for raw tokens",
      flag, path, kLlmcMagic, kLlmcMagic32);
  const std::int32_t want = gpt2 ? kLlmcVersion : kLlmcVersion32;
  NDMESH_CHECK_CONFIG(
      header[1] == want, "data",
      "{}={}: llm.c shard version {} with magic {}; ndmesh reads version {} ({} tokens) with that "
      "magic; re-export the shard in llm.c's current format",
      flag, path, header[1], header[0], want, gpt2 ? "uint16" : "uint32");
  const int width = gpt2 ? 2 : 4;
  const std::int64_t expected = header_bytes + std::int64_t{std::max(header[2], 0)} * width;
  NDMESH_CHECK_CONFIG(
      header[2] > 0 && (exact ? file_bytes == expected : file_bytes >= expected), "data",
      "{}={}: the header says {} tokens ({} bytes with the header) but the file has {} bytes; "
      "the shard is truncated or not an llm.c shard",
      flag, path, header[2], expected, file_bytes);
  return width;
}

std::uint32_t TokenFileSource::Shard::at(std::int64_t i) const {
  if (width == 2) {
    std::uint16_t t;
    std::memcpy(&t, tokens + i * 2, 2);
    return t;
  }
  std::uint32_t t;
  std::memcpy(&t, tokens + i * 4, 4);
  return t;
}

TokenFileSource::TokenFileSource(const std::string& pattern, DataFormat format, std::int64_t vocab,
                                 std::uint64_t seed, DataPart part)
    : DataSource(seed), pattern_(pattern), vocab_(vocab), part_(std::move(part)) {
  const std::string& flag = part_.flag;
  NDMESH_CHECK_CONFIG(
      vocab >= 2, "data",
      "{}={} holds token ids: give the vocabulary with --vocab (e.g. --vocab 50257 for GPT-2's "
      "tokenizer); now {}",
      flag, pattern, vocab);
  for (const std::string& path : expand(pattern, flag)) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::file_status st = fs::status(path, ec);
    if (!fs::exists(st)) fail<ConfigError>("data", "{}={}: no such file; pass a token file or a glob of shards", flag, path);
    if (!fs::is_regular_file(st))
      fail<ConfigError>("data", "{}={}: not a regular file; pass a token file or a glob of shards", flag, path);
    const auto size = static_cast<std::size_t>(fs::file_size(path, ec));
    if (ec || size == 0) fail<ConfigError>("data", "{}={}: the file is empty; pass a token file", flag, path);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail<ConfigError>("data", "{}={}: cannot open the file for reading; check its permissions", flag, path);
    void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (map == MAP_FAILED) fail<IoError>("data", "cannot map '{}' ({} bytes): {}", path, size, std::strerror(errno));
    ::madvise(map, size, MADV_RANDOM);
    shards_.push_back({.path = path, .map = map, .map_bytes = size});
    Shard& sh = shards_.back();
    const auto* bytes = static_cast<const unsigned char*>(map);
    std::int32_t header[3] = {0, 0, 0};
    if (size >= sizeof(header)) std::memcpy(header, bytes, sizeof(header));
    const std::size_t header_bytes = kLlmcHeaderInts * sizeof(std::int32_t);
    sh.llmc = format == DataFormat::kLlmc ||
              (format == DataFormat::kAuto && (header[0] == kLlmcMagic || header[0] == kLlmcMagic32));
    if (sh.llmc) {
      sh.width = llmc_token_bytes(header, static_cast<std::int64_t>(size), flag, path);
      sh.tokens = bytes + header_bytes;
      sh.count = header[2];
    } else {
      NDMESH_CHECK_CONFIG(size % 2 == 0, "data",
                          "{}={}: {} bytes is not a whole number of uint16 tokens; pass a token file (nanoGPT's "
                          "train.bin) or --data-format bytes", flag,
                          path, size);
      sh.tokens = bytes;
      sh.count = static_cast<std::int64_t>(size / 2);
    }
  }
  const bool wide =
      std::any_of(shards_.begin(), shards_.end(), [](const Shard& sh) { return sh.width == 4; });
  NDMESH_CHECK_CONFIG(
      wide || vocab <= 65536, "data",
      "--vocab={} but the tokens of {}={} are uint16 (at most 65536 ids); use --vocab 65536 or less, "
      "or llm.c's uint32 (Llama 3) shards",
      vocab, part_.flag, pattern);
  if (!part_.whole()) {  // each shard keeps its tokens inside the part of the concatenation
    const auto [first, last] = part_range(part_, tokens());
    std::int64_t at = 0;  // the shard's first token in the concatenation
    for (Shard& sh : shards_) {
      const std::int64_t lo = std::clamp(first - at, std::int64_t{0}, sh.count);
      const std::int64_t hi = std::clamp(last - at, std::int64_t{0}, sh.count);
      at += sh.count;
      sh.tokens += lo * sh.width;
      sh.count = hi - lo;
    }
  }
}

TokenFileSource::~TokenFileSource() {
  for (Shard& sh : shards_) ::munmap(sh.map, sh.map_bytes);
}

std::int64_t TokenFileSource::tokens() const {
  std::int64_t n = 0;
  for (const Shard& sh : shards_) n += sh.count;
  return n;
}

void TokenFileSource::check_seq(std::int64_t seq) const {
  const std::string& flag = part_.flag;
  std::int64_t longest = 0;
  for (const Shard& sh : shards_) longest = std::max(longest, sh.count);
  NDMESH_CHECK_CONFIG(longest >= seq + 1, "data",
                      "{}={}: its longest shard has {} tokens but one training window needs --seq + 1 = {}; use "
                      "larger shards or --seq {}", flag,
                      pattern_, longest, seq + 1, std::max<std::int64_t>(1, longest - 1));
}

void TokenFileSource::sequence(std::uint64_t stream, std::int64_t step, std::int64_t index, std::int64_t seq,
                               std::int32_t* tokens, std::int32_t* targets) const {
  const std::string& flag = part_.flag;
  check_seq(seq);
  // A window start over all shards' windows (count - seq each), then its shard.
  std::int64_t windows = 0;
  for (const Shard& sh : shards_) windows += std::max<std::int64_t>(0, sh.count - seq);
  Rng rng = sequence_rng(stream, step, index);
  auto start = static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(windows)));
  const Shard* sh = nullptr;
  for (const Shard& s : shards_) {
    const std::int64_t w = std::max<std::int64_t>(0, s.count - seq);
    if (start < w) {
      sh = &s;
      break;
    }
    start -= w;
  }
  for (std::int64_t t = 0; t <= seq; ++t) {
    const std::uint32_t tok = sh->at(start + t);
    NDMESH_CHECK_CONFIG(
        tok < static_cast<std::uint64_t>(vocab_), "data",
        "{}={}: token {} at position {} is not below --vocab={}; give the tokenizer's vocabulary, "
        "e.g. --vocab {}",
        flag, sh->path, tok, start + t, vocab_, std::max<std::int64_t>(std::int64_t{tok} + 1, 50257));
    if (t < seq) tokens[t] = static_cast<std::int32_t>(tok);
    if (t > 0) targets[t - 1] = static_cast<std::int32_t>(tok);
  }
}

std::string TokenFileSource::describe() const {
  return fmt::format("tokens files={} shards={} tokens={} format={}{}", pattern_, shards_.size(), tokens(),
                     shards_.empty() || !shards_.front().llmc ? "uint16"
                     : shards_.front().width == 4             ? "llmc-uint32"
                                                              : "llmc",
                     part_text(part_));
}

std::unique_ptr<DataSource> open_data_file(const std::string& path, DataFormat format, std::int64_t vocab,
                                           std::uint64_t seed, DataPart part) {
  const bool bin = path.size() >= 4 && path.compare(path.size() - 4, 4, ".bin") == 0;
  if (format == DataFormat::kBytes || (format == DataFormat::kAuto && !bin))
    return std::make_unique<ByteSource>(path, seed, std::move(part));
  return std::make_unique<TokenFileSource>(path, format, vocab, seed, std::move(part));
}

}  // namespace ndmesh::model
