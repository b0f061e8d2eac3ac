#include "ndmesh/model/data.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>

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

ByteSource::ByteSource(const std::string& path, std::uint64_t seed) : DataSource(seed), path_(path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (path.empty()) fail<ConfigError>("data", "--data is empty; pass a text file, or leave --data out for the Markov source");
  if (!fs::exists(st))
    fail<ConfigError>("data", "--data={}: no such file; pass an existing text file", path);
  if (!fs::is_regular_file(st))
    fail<ConfigError>("data", "--data={}: not a regular file ({}); pass a text file", path,
                      fs::is_directory(st) ? "a directory" : "a device, pipe or socket");
  const auto size = fs::file_size(path, ec);
  if (ec || size > static_cast<std::uintmax_t>(kMaxBytes))
    fail<ConfigError>("data", "--data={}: {} bytes is more than the {} bytes ndmesh reads into memory; pass a smaller file",
                      path, size, kMaxBytes);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail<ConfigError>("data", "--data={}: cannot open the file for reading; check its permissions", path);
  bytes_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  if (in.bad()) fail<IoError>("data", "error while reading '{}'", path);
  if (bytes_.empty()) fail<ConfigError>("data", "--data={}: the file is empty; pass a text file", path);
}

void ByteSource::check_seq(std::int64_t seq) const {
  const std::int64_t size = bytes();
  NDMESH_CHECK_CONFIG(
      size >= seq + 1, "data",
      "--data={} has {} bytes but one training window needs --seq + 1 = {}; use a larger file or --seq {}",
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

std::string ByteSource::describe() const { return fmt::format("bytes file={} size={}", path_, bytes()); }

}  // namespace ndmesh::model
