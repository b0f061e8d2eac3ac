// `ndmesh plot FILE.jsonl -o FILE.svg|png`: the loss, the held-out loss and the learning rate
// of a metrics file (ndmesh train --metrics) as a picture (train/plot.hpp). A .png goes
// through rsvg-convert (Debian librsvg2-bin), as the schedule pictures do.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "ndmesh/core/error.hpp"
#include "ndmesh/train/plot.hpp"
#include "subcommand.hpp"

extern char** environ;

// Its own namespace: the tool compiles as a unity build (CMakeLists.txt), where every
// subcommand's file shares one translation unit with the others.
namespace ndmesh::cli::plot_command {
namespace {

namespace fs = std::filesystem;

struct Options {
  std::string input, output;
};

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  if (!out)
    fail<ConfigError>("plot", "-o {}: cannot write the file; use a path in an existing writable folder",
                      path);
}

// rsvg-convert SVG -o PNG; ConfigError when it is missing or fails.
void svg_to_png(const std::string& svg, const std::string& png) {
  std::vector<std::string> args = {"rsvg-convert", svg, "-o", png};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = ::posix_spawnp(&pid, "rsvg-convert", nullptr, nullptr, argv.data(), environ);
  if (rc != 0)
    fail<ConfigError>(
        "plot",
        "-o {}: a .png needs rsvg-convert, which is not found ({}); install it (Debian: apt-get install "
        "librsvg2-bin) or write an .svg",
        png, std::strerror(rc));
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    fail<ConfigError>("plot", "-o {}: rsvg-convert failed (exit {}); write an .svg instead", png,
                      WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

int run(const Options& o) {
  const fs::path out(o.output);
  const std::string ext = out.extension().string();
  if (ext != ".svg" && ext != ".png")
    fail<ConfigError>("plot", "-o {}: the picture's name must end in .svg or .png; e.g. -o loss.svg",
                      o.output);
  const std::vector<train::MetricsRow> rows = train::read_metrics_file(o.input);
  const std::string svg = train::svg_metrics_plot(rows, fs::path(o.input).filename().string());
  if (ext == ".svg") {
    write_file(o.output, svg);
  } else {
    const std::string tmp = o.output + ".svg.tmp";
    write_file(tmp, svg);
    try {
      svg_to_png(tmp, o.output);
    } catch (...) {
      fs::remove(tmp);
      throw;
    }
    fs::remove(tmp);
  }
  fmt::print("wrote {} ({} steps)\n", o.output, rows.size());
  return 0;
}

Action setup(CLI::App& app) {
  auto o = std::make_shared<Options>();
  app.add_option("metrics", o->input, "metrics file written by ndmesh train --metrics FILE.jsonl")
      ->required();
  app.add_option("-o,--output", o->output, "the picture: FILE.svg, or FILE.png (through rsvg-convert)")
      ->required();
  app.footer(
      "Example: ndmesh train --steps 200 --eval-every 50 --metrics run.jsonl && ndmesh plot run.jsonl -o "
      "run.svg");
  return [o] { return run(*o); };
}

const Subcommand kPlot{
    "plot", "Draw a metrics file of ndmesh train: loss, held-out loss and learning rate per step", setup};

}  // namespace
}  // namespace ndmesh::cli::plot_command
