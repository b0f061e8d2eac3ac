// Registry of `ndmesh` subcommands. Each subcommand lives in its own file in this folder
// and registers itself with a static Subcommand object:
//
//   static ndmesh::cli::Subcommand kMesh{"mesh", "Show the rank layout", setup_mesh};
//
// where setup_mesh(CLI::App&) adds the options and returns the function to run. The run
// function returns the process exit code. Errors derived from ndmesh::ConfigError (bad
// input) exit with code 2, other ndmesh::Error with code 1; main() prints them.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace ndmesh::cli {

/// What a subcommand's setup returns: the action run after parsing.
using Action = std::function<int()>;
/// Adds options to the subcommand's CLI::App and returns its action.
using Setup = std::function<Action(CLI::App&)>;

/// A registered subcommand; construct one at namespace scope in the subcommand's file.
struct Subcommand {
  Subcommand(std::string name, std::string description, Setup setup);
};

struct Entry {
  std::string name;
  std::string description;
  Setup setup;
};

/// Every registered subcommand, sorted by name.
std::vector<Entry>& registry();

/// The command and the subcommands given, outermost first ("ndmesh", "plan", "memory").
std::vector<const CLI::App*> given_commands(const CLI::App& app);

/// CLI11's "Could not convert: --steps = abc" as one line that says what the flag takes and
/// what a good value looks like ("--steps=abc is not a whole number; e.g. --steps 1000"). The
/// flag is looked up in the innermost command given first (plan memory's --tp is not plan's).
std::string conversion_message(const CLI::App& app, const CLI::ConversionError& e);

/// A flag given a value other than true or false (`--json=3`, `--untied=maybe`), which CLI11
/// would take as a count or refuse in its own words: the one-line message, or empty. The
/// subcommands are found from the arguments' leading words; nothing after "--" is looked at.
std::string flag_value_problem(const CLI::App& app, const std::vector<std::string>& args);

/// Exit code for bad input (flags, files, environment).
inline constexpr int kExitUsage = 2;

}  // namespace ndmesh::cli
