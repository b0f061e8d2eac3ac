// Activation recomputation modes: one enum and one parser for the model layers
// (nn::Block, which documents what each mode keeps), the runtime (--recompute) and the
// planner (Korthikanti et al. 2022's activation terms).
#pragma once

#include <string_view>

namespace ndmesh {

/// What a block's forward keeps for its backward.
enum class Recompute {
  kNone,       ///< keep every activation
  kSelective,  ///< recompute the attention core in the backward pass
  kFull,       ///< keep only each block's input, recompute the whole block
};

/// "none", "selective" or "full".
std::string_view recompute_name(Recompute r);
/// Parses a recompute name; ConfigError "<flag>=<name> is not a recompute mode (none,
/// selective, full); e.g. <flag> selective" otherwise.
Recompute parse_recompute(std::string_view name, std::string_view flag = "--recompute");

}  // namespace ndmesh
