// The ndmesh command: dispatches to the subcommands registered in this folder.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <map>
#include <string_view>
#include <vector>

#include <fmt/core.h>

#include "ndmesh/core/env.hpp"
#include "ndmesh/core/error.hpp"
#include "subcommand.hpp"

namespace ndmesh::cli {

namespace {

// Error messages echo the user's values; a 6 MB value must not become a 6 MB line. Each
// line longer than kLongLine keeps its start and end and says how much was cut.
std::string shorten(std::string_view message) {
  constexpr std::size_t kLongLine = 600, kHead = 400, kTail = 150;
  std::string out;
  while (true) {
    auto nl = message.find('\n');
    std::string_view line = message.substr(0, nl);
    if (line.size() > kLongLine)
      out += fmt::format("{}...({} characters cut)...{}", line.substr(0, kHead), line.size() - kHead - kTail,
                         line.substr(line.size() - kTail));
    else
      out += line;
    if (nl == std::string_view::npos) break;
    out += '\n';
    message.remove_prefix(nl + 1);
  }
  return out;
}

void print_error(std::string_view prefix, std::string_view what) {
  fmt::print(stderr, "ndmesh: {}{}\n", prefix, shorten(what));
}

}  // namespace
}  // namespace ndmesh::cli

int main(int argc, char** argv) {
  using namespace ndmesh;
  CLI::App app{
      "ndmesh: N-dimensional parallel training.\n"
      "Lay ranks out on a named mesh, build communicators, train, and plan layouts.\n"
      "Run 'ndmesh <command> --help' for the options of a command."};
  app.name("ndmesh");
  app.require_subcommand(1);
  app.set_version_flag("--version", "ndmesh " NDMESH_VERSION);

  auto& entries = cli::registry();
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  std::map<CLI::App*, cli::Action> actions;
  for (auto& entry : entries) {
    CLI::App* sub = app.add_subcommand(entry.name, entry.description);
    actions[sub] = entry.setup(*sub);
  }

  // "ndmesh meshx": say the command is unknown (CLI11 would only say one is required).
  if (argc > 1 && argv[1][0] != '-' &&
      std::none_of(entries.begin(), entries.end(), [&](const auto& e) { return e.name == argv[1]; })) {
    std::string names;
    for (const auto& e : entries) names += (names.empty() ? "" : ", ") + e.name;
    cli::print_error("", fmt::format("unknown command '{}'; use one of {} (see 'ndmesh --help')", argv[1], names));
    return cli::kExitUsage;
  }

  // "ndmesh launch -np 4 ...": mpirun's spelling, which CLI11 would read as -n p. Only before
  // the first "--" (what follows is mpirun's or the program's).
  // The pointer in argv is replaced (argv's array is the program's to change); no copy of
  // the arguments is made.
  static char long_np[] = "--np";
  if (argc > 1 && std::string_view(argv[1]) == "launch")
    for (int i = 2; i < argc && std::string_view(argv[i]) != "--"; ++i)
      if (std::string_view(argv[i]) == "-np") argv[i] = long_np;

  // A flag given a value (--json=3): CLI11 would count it as given three times.
  if (const std::string problem = cli::flag_value_problem(app, std::vector<std::string>(argv + 1, argv + argc));
      !problem.empty()) {
    std::string where = "ndmesh";
    if (argc > 1 && argv[1][0] != '-') where += std::string(" ") + argv[1];
    cli::print_error("", fmt::format("{}; see '{} --help'", problem, where));
    return cli::kExitUsage;
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
    std::string where;
    for (const CLI::App* command : cli::given_commands(app))
      where += (where.empty() ? "" : " ") + command->get_name();
    const auto* conversion = dynamic_cast<const CLI::ConversionError*>(&e);
    cli::print_error("",
                     fmt::format("{}; see '{} --help'",
                                 conversion ? cli::conversion_message(app, *conversion) : e.what(), where));
    return cli::kExitUsage;
  } catch (const ConfigError& e) {
    cli::print_error("", e.what());
    return cli::kExitUsage;
  }

  try {
    env::check_all();
    for (auto* sub : app.get_subcommands()) return actions.at(sub)();
  } catch (const ConfigError& e) {
    cli::print_error("", e.what());
    return cli::kExitUsage;
  } catch (const InternalError& e) {
    cli::print_error("internal error: ", e.what());
    return 1;
  } catch (const Error& e) {
    cli::print_error("", e.what());
    return 1;
  } catch (const std::exception& e) {
    cli::print_error("internal error: ", e.what());
    return 1;
  }
  return 0;
}
