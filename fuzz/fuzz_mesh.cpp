// Mesh strings: Mesh::parse ("dp=2,tp=4"), Mesh::from_order (fastest first), layout_dims
// (--order / --megatron-order / --dims and the size flags) and Mesh::dims_of ("dp,tp").
// The first byte picks the parser; the first line is the main string, the second line
// (when present) the group spec or sizes.
#include <map>

#include "fuzz_common.hpp"
#include "ndmesh/config/config.hpp"
#include "ndmesh/core/error.hpp"
#include "ndmesh/core/strings.hpp"
#include "ndmesh/mesh/mesh.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ndmesh;
  if (size < 1) return 0;
  const int mode = data[0] % 4;
  auto [line, rest] = fuzz::first_line(fuzz::text(data + 1, size - 1));
  auto [second, third] = fuzz::first_line(rest);
  try {
    switch (mode) {
      case 0: {
        Mesh m = Mesh::parse(line);
        (void)m.to_string();
        if (!second.empty()) {
          DimSet set = m.dims_of(second);
          if (m.world_size() <= 4096) {
            (void)m.group(m.world_size() - 1, set);
            (void)m.key_name(set);
          }
        }
        break;
      }
      case 1: {
        // sizes from the second line: "dp=2,tp=4"
        std::map<std::string, std::int64_t> sizes;
        if (!second.empty()) {
          const Mesh given = Mesh::parse(second);  // keep it alive: dims() is a reference into it
          for (const auto& d : given.dims()) sizes[d.name] = d.size;
        }
        (void)Mesh::from_order(line, sizes).to_string();
        break;
      }
      default: {
        LayoutSpec spec;
        if (mode == 2)
          spec.order = std::string(line);
        else if (third.empty())
          spec.megatron_order = std::string(line);
        else
          spec.dims = std::string(line);
        if (!second.empty()) {
          const Mesh given = Mesh::parse(second);
          for (const auto& d : given.dims()) spec.sizes[d.name] = d.size;
        }
        auto dims = layout_dims(spec);
        ParallelConfig c;
        c.dims = dims;
        (void)problems(c);
        break;
      }
    }
  } catch (const ConfigError&) {
  }
  return 0;
}
