// Training data: batches of token sequences with next-token targets.
//
// MarkovSource: a seeded random first-order Markov chain over a small vocabulary. Its
// entropy rate H = -sum_i pi_i sum_j P_ij ln P_ij (pi the stationary distribution) is
// computed exactly, so the best achievable loss is known. Sequences start from pi, so
// every target is a draw from the chain in its stationary regime.
//
// ByteSource: byte-level language modelling on any file (vocab 256); each sequence is a
// window at a random offset.
//
// A source's whole position is one Rng state, saved in checkpoints so that a resumed run
// reads the same batches as an uninterrupted one.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ndmesh/tensor/rng.hpp"

namespace ndmesh::model {

/// Where batches come from.
class DataSource {
 public:
  virtual ~DataSource() = default;
  /// Tokens are in [0, vocab).
  virtual std::int64_t vocab() const = 0;
  /// Fills tokens[batch, seq] and targets[batch, seq] (targets[t] = tokens[t + 1] of the
  /// same window).
  virtual void next_batch(std::int64_t batch, std::int64_t seq, std::int32_t* tokens,
                          std::int32_t* targets) = 0;
  /// One line naming the source and its parameters (checked when a checkpoint is loaded).
  virtual std::string describe() const = 0;
  /// The best achievable mean loss in nats per token, when known.
  virtual std::optional<double> entropy_rate() const = 0;

  /// The position in the stream (the Rng state).
  std::uint64_t position() const { return rng_.state(); }
  void set_position(std::uint64_t p) { rng_.set_state(p); }

 protected:
  explicit DataSource(std::uint64_t seed) : rng_(seed) {}
  Rng rng_;
};

/// Parameters of a MarkovSource.
struct MarkovOptions {
  std::int64_t vocab = 32;
  std::uint64_t seed = 1;  ///< seeds both the chain and the sampling stream
  double sharpness = 2.5;  ///< P_ij proportional to exp(sharpness * z_ij), z standard normal
};

/// A random Markov chain with a known entropy rate.
class MarkovSource : public DataSource {
 public:
  /// ConfigError when vocab < 2 or sharpness < 0.
  explicit MarkovSource(MarkovOptions options);

  std::int64_t vocab() const override { return options_.vocab; }
  void next_batch(std::int64_t batch, std::int64_t seq, std::int32_t* tokens, std::int32_t* targets) override;
  std::string describe() const override;
  std::optional<double> entropy_rate() const override { return entropy_rate_; }

  /// P(next = j | current = i).
  double transition(std::int64_t i, std::int64_t j) const {
    return transition_[static_cast<std::size_t>(i * options_.vocab + j)];
  }
  /// The stationary distribution pi.
  const std::vector<double>& stationary() const { return stationary_; }

  /// Stationary distribution of a row-stochastic matrix [n, n] with positive entries
  /// (power iteration to machine precision).
  static std::vector<double> stationary_of(const std::vector<double>& transition, std::int64_t n);
  /// Entropy rate in nats of a chain given its transition matrix and stationary distribution.
  static double entropy_rate_of(const std::vector<double>& transition, const std::vector<double>& pi,
                                std::int64_t n);

 private:
  std::int32_t draw(const double* cumulative);

  MarkovOptions options_;
  std::vector<double> transition_;  ///< [vocab, vocab]
  std::vector<double> cumulative_;  ///< row-wise running sums, for sampling
  std::vector<double> stationary_, stationary_cumulative_;
  double entropy_rate_ = 0;
};

/// Byte-level windows of a file.
class ByteSource : public DataSource {
 public:
  /// Reads the whole file. IoError when unreadable; ConfigError when it is too short for
  /// one window of seq + 1 bytes (checked at the first batch).
  ByteSource(const std::string& path, std::uint64_t seed);

  std::int64_t vocab() const override { return 256; }
  void next_batch(std::int64_t batch, std::int64_t seq, std::int32_t* tokens, std::int32_t* targets) override;
  std::string describe() const override;
  std::optional<double> entropy_rate() const override { return std::nullopt; }
  std::int64_t bytes() const { return static_cast<std::int64_t>(bytes_.size()); }

 private:
  std::string path_;
  std::vector<unsigned char> bytes_;
};

}  // namespace ndmesh::model
