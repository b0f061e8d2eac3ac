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

std::vector<Entry>& registry() {
  static std::vector<Entry> entries;
  return entries;
}

Subcommand::Subcommand(std::string name, std::string description, Setup setup) {
  registry().push_back({std::move(name), std::move(description), std::move(setup)});
}

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

// The command and the subcommands given, outermost first ("ndmesh", "plan", "memory").
std::vector<const CLI::App*> given_commands(const CLI::App& app) {
  std::vector<const CLI::App*> chain{&app};
  while (!chain.back()->get_subcommands().empty()) chain.push_back(chain.back()->get_subcommands().front());
  return chain;
}

// CLI11's "Could not convert: --steps = abc" as one line that says what the flag takes and
// what a good value looks like ("--steps=abc is not a whole number; e.g. --steps 1000"). The
// flag is looked up in the innermost command given first (plan memory's --tp is not plan's).
std::string conversion_message(const CLI::App& app, const CLI::ConversionError& e) {
  const std::string_view what = e.what();
  constexpr std::string_view kHead = "Could not convert: ";
  const auto eq = what.find(" = ");
  if (!what.starts_with(kHead) || eq == std::string_view::npos) return std::string(what);
  const std::string name(what.substr(kHead.size(), eq - kHead.size()));
  const std::string_view value = what.substr(eq + 3);
  const CLI::Option* opt = nullptr;
  const std::vector<const CLI::App*> chain = given_commands(app);
  for (auto it = chain.rbegin(); it != chain.rend() && opt == nullptr; ++it)
    opt = (*it)->get_option_no_throw(name);
  if (opt == nullptr) return std::string(what);
  std::string type = opt->get_type_name();
  type = type.substr(0, type.find_first_of(": "));
  if (type.empty() && opt->get_expected_max() == 0)  // a flag given a value: --untied=maybe
    return fmt::format("{}={} is not true or false; give the flag alone ({}) or leave it out", name, value,
                       name);
  const std::string takes = type == "INT"       ? "a whole number"
                            : type == "UINT"    ? "a whole number >= 0"
                            : type == "FLOAT"   ? "a number"
                            : type == "BOOLEAN" ? "true or false (also 1/0, yes/no, on/off)"
                            : type.empty()      ? "a value this flag takes"
                                                : "a valid " + type;
  std::string example = opt->get_default_str();
  if (type == "BOOLEAN" && (example == "1" || example == "0")) example = example == "1" ? "true" : "false";
  return fmt::format("{}={} is not {}{}", name, value, takes,
                     example.empty() ? std::string() : fmt::format("; e.g. {} {}", name, example));
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
