// The registry of `ndmesh` subcommands (subcommand.hpp), and the one-line message of a
// value CLI11 cannot convert, which `ndmesh` and ndmesh.train() in Python both print.
#include "subcommand.hpp"

#include <fmt/core.h>

namespace ndmesh::cli {

std::vector<Entry>& registry() {
  static std::vector<Entry> entries;
  return entries;
}

Subcommand::Subcommand(std::string name, std::string description, Setup setup) {
  registry().push_back({std::move(name), std::move(description), std::move(setup)});
}

std::vector<const CLI::App*> given_commands(const CLI::App& app) {
  std::vector<const CLI::App*> chain{&app};
  while (!chain.back()->get_subcommands().empty()) chain.push_back(chain.back()->get_subcommands().front());
  return chain;
}

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

std::string flag_value_problem(const CLI::App& app, const std::vector<std::string>& args) {
  std::vector<const CLI::App*> chain{&app};
  for (const std::string& a : args) {
    if (a == "--") break;
    if (!a.starts_with("--")) {
      // A subcommand's name descends; any other word (an option's value) is passed over.
      for (const CLI::App* sub : chain.back()->get_subcommands({}))
        if (sub->get_name() == a) {
          chain.push_back(sub);
          break;
        }
      continue;
    }
    const auto eq = a.find('=');
    if (eq == std::string::npos) continue;
    const std::string name = a.substr(0, eq), value = a.substr(eq + 1);
    const CLI::Option* opt = nullptr;
    for (auto it = chain.rbegin(); it != chain.rend() && opt == nullptr; ++it)
      opt = (*it)->get_option_no_throw(name);
    if (opt == nullptr || opt->get_expected_max() != 0 || value == "true" || value == "false") continue;
    return fmt::format("{}={} is not true or false; give the flag alone ({}) or leave it out", name, value, name);
  }
  return {};
}

}  // namespace ndmesh::cli
