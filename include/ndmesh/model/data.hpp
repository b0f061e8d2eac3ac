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
// A sequence is a pure function of (seed, stream, step, index), so a checkpoint needs only
// the step to continue with the same batches.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ndmesh/tensor/rng.hpp"

namespace ndmesh::model {

/// Where batches come from. Every sequence is a pure function of (the source's seed, a
/// stream, a step and the sequence's index in that step's global batch): any rank reads
/// exactly its slice of step s without reading the rest, every layout reads the same
/// global batch, and a resumed run needs only the step to continue.
class DataSource {
 public:
  /// The stream of training batches and the stream evaluation batches come from.
  static constexpr std::uint64_t kTrainStream = 0;
  static constexpr std::uint64_t kEvalStream = 1;

  virtual ~DataSource() = default;
  /// Tokens are in [0, vocab).
  virtual std::int64_t vocab() const = 0;
  /// Sequence `index` of step `step` of `stream`: tokens[seq] and targets[seq] (targets[t]
  /// is the token after tokens[t]).
  virtual void sequence(std::uint64_t stream, std::int64_t step, std::int64_t index, std::int64_t seq,
                        std::int32_t* tokens, std::int32_t* targets) const = 0;
  /// Sequences first .. first+count-1 of step `step` one after another: tokens[count, seq].
  void batch(std::uint64_t stream, std::int64_t step, std::int64_t first, std::int64_t count, std::int64_t seq,
             std::int32_t* tokens, std::int32_t* targets) const;
  /// ConfigError naming the fix when sequences of `seq` tokens cannot be drawn.
  virtual void check_seq(std::int64_t seq) const { (void)seq; }
  /// One line naming the source and its parameters (checked when a checkpoint is loaded).
  virtual std::string describe() const = 0;
  /// The best achievable mean loss in nats per token, when known.
  virtual std::optional<double> entropy_rate() const = 0;

 protected:
  explicit DataSource(std::uint64_t seed) : seed_(seed) {}
  /// The generator of one sequence: seeded by a hash of (seed, stream, step, index).
  Rng sequence_rng(std::uint64_t stream, std::int64_t step, std::int64_t index) const;
  std::uint64_t seed_;
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
  void sequence(std::uint64_t stream, std::int64_t step, std::int64_t index, std::int64_t seq, std::int32_t* tokens,
                std::int32_t* targets) const override;
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
  std::int32_t draw(Rng& rng, const double* cumulative) const;

  MarkovOptions options_;
  std::vector<double> transition_;  ///< [vocab, vocab]
  std::vector<double> cumulative_;  ///< row-wise running sums, for sampling
  std::vector<double> stationary_, stationary_cumulative_;
  double entropy_rate_ = 0;
};

/// Byte-level windows of a file.
class ByteSource : public DataSource {
 public:
  /// The most bytes a --data file may have (the whole file is read into memory).
  static constexpr std::int64_t kMaxBytes = std::int64_t{1} << 32;

  /// Reads the whole file. ConfigError naming the path and the fix when it is missing, not
  /// a regular file (a directory, a device such as /dev/zero), unreadable, empty or larger
  /// than kMaxBytes.
  ByteSource(const std::string& path, std::uint64_t seed);

  std::int64_t vocab() const override { return 256; }
  void sequence(std::uint64_t stream, std::int64_t step, std::int64_t index, std::int64_t seq, std::int32_t* tokens,
                std::int32_t* targets) const override;
  /// ConfigError when the file is too short for one window of seq + 1 bytes.
  void check_seq(std::int64_t seq) const override;
  std::string describe() const override;
  std::optional<double> entropy_rate() const override { return std::nullopt; }
  std::int64_t bytes() const { return static_cast<std::int64_t>(bytes_.size()); }

 private:
  std::string path_;
  std::vector<unsigned char> bytes_;
};

}  // namespace ndmesh::model
