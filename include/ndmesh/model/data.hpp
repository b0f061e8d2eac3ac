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
// TokenFileSource: tokenized datasets as GPU users keep them, memory-mapped: llm.c's `.bin`
// shards (a header of 256 int32: magic, version, the token count; then the tokens: GPT-2's
// format, magic 20240520 version 1, uint16 tokens; Llama 3's, magic 20240801 version 7,
// uint32 tokens) and nanoGPT's raw uint16 `train.bin`, one file or a glob of shards; the
// vocabulary comes from the flags. Each sequence is a window at a random offset of one
// shard (windows never cross shards).
//
// A sequence is a pure function of (seed, stream, step, index), so a checkpoint needs only
// the step to continue with the same batches.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
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

/// Which part of a data file a source reads, and the flag that named the file (in messages).
/// A part is a range of the file's tokens (of all shards one after another), as fractions:
/// `--val-fraction F` trains on [0, 1 - F) and evaluates on [1 - F, 1), so training never
/// reads a held-out token. Windows never cross the range's ends.
struct DataPart {
  double begin = 0;
  double end = 1;
  std::string flag = "--data";  ///< "--data" or "--val-data"
  bool whole() const { return begin == 0 && end == 1; }
};

/// Byte-level windows of a file.
class ByteSource : public DataSource {
 public:
  /// The most bytes a --data file may have (the whole file is read into memory).
  static constexpr std::int64_t kMaxBytes = std::int64_t{1} << 32;

  /// Reads the whole file. ConfigError naming the path and the fix when it is missing, not
  /// a regular file (a directory, a device such as /dev/zero), unreadable, empty or larger
  /// than kMaxBytes.
  ByteSource(const std::string& path, std::uint64_t seed, DataPart part = {});

  std::int64_t vocab() const override { return 256; }
  void sequence(std::uint64_t stream, std::int64_t step, std::int64_t index, std::int64_t seq, std::int32_t* tokens,
                std::int32_t* targets) const override;
  /// ConfigError when the file is too short for one window of seq + 1 bytes.
  void check_seq(std::int64_t seq) const override;
  std::string describe() const override;
  std::optional<double> entropy_rate() const override { return std::nullopt; }
  /// Bytes of the part read.
  std::int64_t bytes() const { return static_cast<std::int64_t>(bytes_.size()); }

 private:
  std::string path_;
  DataPart part_;
  std::int64_t file_bytes_ = 0;
  std::vector<unsigned char> bytes_;
};

/// How a --data file is read.
enum class DataFormat {
  kAuto,   ///< a file or glob ending in .bin: tokens (llm.c when the header's magic is there, else raw
           ///< uint16); else bytes
  kBytes,  ///< byte-level (ByteSource)
  kLlmc,   ///< llm.c shards: 256-int32 header, uint16 (20240520, 1) or uint32 (20240801, 7) tokens
  kUint16  ///< raw uint16 tokens (nanoGPT's train.bin)
};
/// "auto", "bytes", "llmc" or "uint16"; ConfigError naming --data-format otherwise.
DataFormat parse_data_format(std::string_view name);

/// The magic and version of an llm.c shard's header: GPT-2's (uint16 tokens) and Llama 3's
/// (uint32 tokens); the header is 256 int32 (magic, version, token count, zeros).
inline constexpr std::int32_t kLlmcMagic = 20240520;
inline constexpr std::int32_t kLlmcVersion = 1;
inline constexpr std::int32_t kLlmcMagic32 = 20240801;
inline constexpr std::int32_t kLlmcVersion32 = 7;
inline constexpr std::int64_t kLlmcHeaderInts = 256;

/// The bytes per token (2 or 4) of an llm.c shard `path` (named by `flag` in messages) of
/// `file_bytes` bytes whose header starts with header[0..2] (magic, version, count).
/// ConfigError naming the file and the fix: a magic of neither format (or a file shorter
/// than the header), a version that does not go with the magic, a token count that does not
/// match the file's size (`exact`: equal; else at least the count).
int llmc_token_bytes(const std::int32_t* header, std::int64_t file_bytes, const std::string& flag,
                     const std::string& path, bool exact = true);

/// Memory-mapped token shards (see the file comment).
class TokenFileSource : public DataSource {
 public:
  static constexpr std::int32_t kLlmcMagic = model::kLlmcMagic;
  static constexpr std::int32_t kLlmcVersion = model::kLlmcVersion;
  static constexpr std::int64_t kLlmcHeaderInts = model::kLlmcHeaderInts;

  /// Maps every file `pattern` names (a path, or a glob: *, ?, [...]) in name order.
  /// `format` kLlmc, kUint16 or kAuto (per file: llm.c when either header's magic is there).
  /// ConfigError naming the file and the fix: no file matches, a file is not a regular
  /// file, is empty or cannot be read, an llm.c header with another magic or version, a
  /// token count that does not match the file's size, an odd size of raw uint16, vocab < 2,
  /// vocab > 65536 when every shard holds uint16 tokens.
  TokenFileSource(const std::string& pattern, DataFormat format, std::int64_t vocab, std::uint64_t seed,
                  DataPart part = {});
  ~TokenFileSource() override;
  TokenFileSource(const TokenFileSource&) = delete;
  TokenFileSource& operator=(const TokenFileSource&) = delete;

  std::int64_t vocab() const override { return vocab_; }
  /// ConfigError naming the file, the position and --vocab for a token >= vocab.
  void sequence(std::uint64_t stream, std::int64_t step, std::int64_t index, std::int64_t seq, std::int32_t* tokens,
                std::int32_t* targets) const override;
  /// ConfigError when no shard holds seq + 1 tokens.
  void check_seq(std::int64_t seq) const override;
  std::string describe() const override;
  std::optional<double> entropy_rate() const override { return std::nullopt; }
  /// Tokens of the part read.
  std::int64_t tokens() const;
  std::size_t shards() const { return shards_.size(); }

 private:
  struct Shard {
    std::string path;
    const unsigned char* tokens = nullptr;  // into the mapping: the first token of the part read
    std::int64_t count = 0;                 // tokens of the part read
    void* map = nullptr;
    std::size_t map_bytes = 0;
    bool llmc = false;
    int width = 2;  // bytes per token: 2 (uint16) or 4 (uint32, llm.c's Llama 3 shards)
    std::uint32_t at(std::int64_t i) const;
  };
  std::string pattern_;
  std::int64_t vocab_;
  DataPart part_;
  std::vector<Shard> shards_;
};

/// The first batches x batch x seq + 1 tokens of a file, read in order (`ndmesh eval`):
/// sequence `index` of step b is the window starting at token (b * batch + index) * seq, its
/// targets the tokens one further, as llm.c's loader reads them, so every layout reads the
/// same tokens; the stream is ignored. The file is read as --data reads it with `format`
/// (kAuto: llm.c shards and raw uint16 for .bin, bytes otherwise); only the tokens needed.
/// ConfigError naming the file when it is shorter than batches x batch x seq + 1 tokens or
/// holds a token >= vocab (with its position), or as TokenFileSource says.
class ConsecutiveSource : public DataSource {
 public:
  ConsecutiveSource(const std::string& path, DataFormat format, std::int64_t vocab, std::int64_t batch,
                    std::int64_t seq, std::int64_t batches);
  std::int64_t vocab() const override { return vocab_; }
  void sequence(std::uint64_t stream, std::int64_t step, std::int64_t index, std::int64_t seq, std::int32_t* tokens,
                std::int32_t* targets) const override;
  std::string describe() const override;
  std::optional<double> entropy_rate() const override { return std::nullopt; }
  /// The tokens read (batches x batch x seq + 1).
  std::int64_t tokens() const { return static_cast<std::int64_t>(tokens_.size()); }

 private:
  std::string path_;
  std::int64_t vocab_, batch_;
  std::vector<std::int32_t> tokens_;
};

/// The source of --data `path`: ByteSource or TokenFileSource as `format` says (kAuto: see
/// DataFormat). `vocab` (0: none given) is a token file's vocabulary; ConfigError asking for
/// --vocab when a token file has none.
std::unique_ptr<DataSource> open_data_file(const std::string& path, DataFormat format, std::int64_t vocab,
                                           std::uint64_t seed, DataPart part = {});

}  // namespace ndmesh::model
