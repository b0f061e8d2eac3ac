// Launcher environment variables: LaunchEnv::detect(lookup) over "NAME=value" lines.
#include <map>

#include "fuzz_common.hpp"
#include "ndmesh/core/error.hpp"
#include "ndmesh/launch/launch_env.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ndmesh;
  std::map<std::string, std::string, std::less<>> vars;
  std::string_view rest = fuzz::text(data, size);
  while (!rest.empty()) {
    auto [line, next] = fuzz::first_line(rest);
    rest = next;
    auto eq = line.find('=');
    if (eq == std::string_view::npos) continue;
    vars[std::string(line.substr(0, eq))] = std::string(line.substr(eq + 1));
  }
  EnvLookup lookup = [&](std::string_view name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end() || it->second.empty()) return std::nullopt;
    return it->second;
  };
  try {
    LaunchEnv env = LaunchEnv::detect(lookup);
    (void)env.describe();
    (void)env.has_mpi_world();
  } catch (const ConfigError&) {
  }
  return 0;
}
