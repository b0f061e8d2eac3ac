// How a pipeline splits the decoder blocks over its stages: the one partition function the
// planner and the pipeline executor share, so what is planned is what runs.
//
// A pipeline of p ranks with v virtual stages each has p*v chunks; chunk k runs on rank
// k mod p (Narayanan et al. 2021, section 2.2.2), chunk 0 also holds the embedding and chunk
// p*v-1 the output layer and the loss. Blocks are contiguous: chunk k holds the blocks after
// those of chunks 0..k-1. The balanced partition minimises the most expensive chunk, where
// a chunk costs its block count plus the embedding cost (chunk 0) and the head cost (last
// chunk), both in units of one decoder block; among the partitions with that maximum it
// takes blocks away from the most expensive chunks, the later ones first, so 8 blocks over
// 3 equal stages are 3,3,2 and a heavy head gives the last chunk fewer blocks.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace ndmesh {

/// What the ends of the pipeline cost besides their blocks, in units of one decoder block.
struct StageExtras {
  double embedding = 0;  ///< chunk 0: token (and position) embedding
  double head = 0;       ///< last chunk: final norm, output projection and loss
};

/// Blocks per chunk, p*v entries (chunk k on rank k mod p), balanced as described above.
/// ConfigError when `layers` < p*v (every chunk needs one block), or p, v < 1, or an
/// extra is negative.
std::vector<std::int64_t> balanced_partition(std::int64_t layers, std::int64_t pp, std::int64_t vpp = 1,
                                             StageExtras extras = {});

/// Parses an explicit partition "3,3,2" (blocks per chunk, p*v entries). ConfigError naming
/// `flag`, the value and the fix for a wrong count, a sum other than `layers`, an entry
/// that is zero, negative or not a number.
std::vector<std::int64_t> parse_partition(std::string_view text, std::int64_t layers, std::int64_t pp,
                                          std::int64_t vpp = 1, std::string_view flag = "--pp-layers");

/// Blocks each rank holds (the sum of its chunks k, k+p, k+2p, ...), p entries.
std::vector<std::int64_t> blocks_per_rank(const std::vector<std::int64_t>& chunks, std::int64_t pp);

/// The largest chunk cost of a partition (blocks plus the extras of the end chunks).
double max_chunk_cost(const std::vector<std::int64_t>& chunks, StageExtras extras = {});

}  // namespace ndmesh
