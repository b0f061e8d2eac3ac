#include "ndmesh/core/recompute.hpp"

#include "ndmesh/core/error.hpp"

namespace ndmesh {

std::string_view recompute_name(Recompute r) {
  switch (r) {
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
    case Recompute::kNone:
      break;
  }
  return "none";
}

Recompute parse_recompute(std::string_view name, std::string_view flag) {
  for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull})
    if (name == recompute_name(r)) return r;
  fail<ConfigError>("config", "{}={} is not a recompute mode (none, selective, full); e.g. {} selective",
                    flag, name, flag);
}

}  // namespace ndmesh
