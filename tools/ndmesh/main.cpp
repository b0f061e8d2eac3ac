// The ndmesh command: dispatches to the subcommands registered in this folder.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <map>

#include <fmt/core.h>

#include "ndmesh/core/error.hpp"
#include "subcommand.hpp"

namespace ndmesh::cli {

std::vector<Entry>& registry() {
  static std::vector<Entry> entries;
  return entries;
}

Subcommand::Subcommand(std::string name, std::string description, Setup setup) {
  registry().push_back({std::move(name), std::move(description), std::move(setup)});
}

}  // namespace ndmesh::cli

int main(int argc, char** argv) {
  using namespace ndmesh;
  CLI::App app{
      "ndmesh: N-dimensional parallel training.\n"
      "Lay ranks out on a named mesh, build communicators, train, and plan layouts.\n"
      "Run 'ndmesh <command> --help' for the options of a command."};
  app.name("ndmesh");
  app.require_subcommand(1);
  app.set_version_flag("--version", "ndmesh 0.1.0");

  auto& entries = cli::registry();
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  std::map<CLI::App*, cli::Action> actions;
  for (auto& entry : entries) {
    CLI::App* sub = app.add_subcommand(entry.name, entry.description);
    actions[sub] = entry.setup(*sub);
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line: what is wrong, and where the options are described.
    std::string where = "ndmesh";
    for (const auto* sub : app.get_subcommands()) where += " " + sub->get_name();
    fmt::print(stderr, "ndmesh: {}; see '{} --help'\n", e.what(), where);
    return cli::kExitUsage;
  } catch (const ConfigError& e) {
    fmt::print(stderr, "ndmesh: {}\n", e.what());
    return cli::kExitUsage;
  }

  try {
    for (auto* sub : app.get_subcommands()) return actions.at(sub)();
  } catch (const ConfigError& e) {
    fmt::print(stderr, "ndmesh: {}\n", e.what());
    return cli::kExitUsage;
  } catch (const InternalError& e) {
    fmt::print(stderr, "ndmesh: internal error: {}\n", e.what());
    return 1;
  } catch (const Error& e) {
    fmt::print(stderr, "ndmesh: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "ndmesh: internal error: {}\n", e.what());
    return 1;
  }
  return 0;
}
