// ConsecutiveSource (model/data.hpp): the first tokens of a file, in order, for evaluation.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/core.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/model/data.hpp"

namespace ndmesh::model {

ConsecutiveSource::ConsecutiveSource(const std::string& path, DataFormat format, std::int64_t vocab,
                                     std::int64_t batch, std::int64_t seq, std::int64_t batches)
    : DataSource(0), path_(path), vocab_(vocab), batch_(batch) {
  NDMESH_CHECK_CONFIG(batch > 0 && seq > 0 && batches > 0, "eval",
                      "--batch={}, --seq={} and --batches={} must be positive", batch, seq, batches);
  const std::int64_t need = batches * batch * seq + 1;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    fail<ConfigError>("eval", "--data={}: not a readable file; pass a token file (.bin) or a text file",
                      path);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail<ConfigError>("eval", "--data={}: cannot read it; check its permissions", path);
  const auto file_bytes = static_cast<std::int64_t>(std::filesystem::file_size(path, ec));
  const bool bin = path.size() >= 4 && path.compare(path.size() - 4, 4, ".bin") == 0;
  const bool bytes = format == DataFormat::kBytes || (format == DataFormat::kAuto && !bin);
  std::int64_t available = 0, offset = 0, width = 1;
  std::string kind = "bytes";
  if (bytes) {
    available = file_bytes;
  } else {
    std::int32_t header[kLlmcHeaderInts] = {};
    in.read(reinterpret_cast<char*>(header), sizeof header);
    const bool llmc = format == DataFormat::kLlmc || (format == DataFormat::kAuto && in &&
                                                      (header[0] == kLlmcMagic || header[0] == kLlmcMagic32));
    width = 2;
    if (llmc) {
      if (!in) header[0] = 0;  // shorter than the header: not an llm.c shard
      width = llmc_token_bytes(header, file_bytes, "--data", path, /*exact=*/false);
      offset = static_cast<std::int64_t>(sizeof header);
      available = header[2];
      kind = width == 4 ? "llm.c uint32 tokens" : "llm.c tokens";
    } else {
      available = file_bytes / 2;
      kind = "uint16 tokens";
    }
  }
  if (available < need)
    fail<ConfigError>(
        "eval",
        "--data={} holds {} {} but {} batches of {} x {} need {} (N x B x T + 1); pass fewer --batches "
        "or a longer file",
        path, available, kind, batches, batch, seq, need);
  std::vector<unsigned char> raw(static_cast<std::size_t>(need * width));
  in.clear();
  in.seekg(offset);
  in.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(raw.size()));
  if (!in) fail<ConfigError>("eval", "--data={}: cannot read its first {} tokens", path, need);
  tokens_.resize(static_cast<std::size_t>(need));
  for (std::size_t i = 0; i < tokens_.size(); ++i) {
    std::uint32_t t = 0;
    for (std::int64_t b = width - 1; b >= 0; --b)
      t = t << 8 | raw[i * static_cast<std::size_t>(width) + static_cast<std::size_t>(b)];
    if (t >= static_cast<std::uint64_t>(vocab))
      fail<ConfigError>(
          "eval",
          "--data={}: token {} at position {} is outside the model's vocabulary of {}; the file "
          "was made by another tokenizer",
          path, t, i, vocab);
    tokens_[i] = static_cast<std::int32_t>(t);
  }
}

void ConsecutiveSource::sequence(std::uint64_t, std::int64_t step, std::int64_t index, std::int64_t seq,
                                 std::int32_t* tokens, std::int32_t* targets) const {
  const std::int64_t at = (step * batch_ + index) * seq;
  NDMESH_CHECK(at >= 0 && at + seq + 1 <= static_cast<std::int64_t>(tokens_.size()), "eval",
               "sequence {} of batch {} is past the {} tokens read", index, step, tokens_.size());
  std::memcpy(tokens, tokens_.data() + at, static_cast<std::size_t>(seq) * sizeof(std::int32_t));
  std::memcpy(targets, tokens_.data() + at + 1, static_cast<std::size_t>(seq) * sizeof(std::int32_t));
}

std::string ConsecutiveSource::describe() const {
  return fmt::format("{} (the first {} tokens, in order)", path_, tokens_.size());
}

}  // namespace ndmesh::model
