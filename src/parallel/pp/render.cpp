// Timeline rendering. Time is cut into cells of the shortest compute action (scaled
// down when the chart would be wider than max_columns); each action covers the cells
// between its rounded start and end, so a 2-unit backward is two cells wide.
#include "ndmesh/parallel/pp/render.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/core.h>

#include "ndmesh/core/svg.hpp"

namespace ndmesh::pp {

namespace {

bool is_compute(ActionKind k) { return !is_p2p(k); }

// ANSI background colours: forward blue, backward green, weight gradient magenta; odd
// chunks use the bright variant.
int ansi_background(ActionKind k, int chunk) {
  int base = k == ActionKind::kForward ? 44 : k == ActionKind::kBackwardWeight ? 45 : 42;
  return chunk % 2 == 1 ? base + 60 : base;
}

int digits(int n) { return n < 10 ? 1 : 1 + digits(n / 10); }

struct Rgb {
  int r, g, b;
};

Rgb base_colour(ActionKind k) {
  if (k == ActionKind::kForward) return {76, 120, 168};
  if (k == ActionKind::kBackwardWeight) return {176, 122, 161};
  if (is_p2p(k)) return {160, 160, 160};
  return {89, 161, 79};
}

// Later chunks are drawn lighter: mixed with white by up to 55%.
std::string shade(Rgb c, int chunk, int chunks) {
  const double t = chunks > 1 ? 0.55 * chunk / (chunks - 1) : 0.0;
  auto mix = [&](int x) { return static_cast<int>(std::lround(x + (255 - x) * t)); };
  return fmt::format("#{:02x}{:02x}{:02x}", mix(c.r), mix(c.g), mix(c.b));
}

}  // namespace

std::string ascii_timeline(const PipelineSchedule& s, const Simulation& sim, const AsciiOptions& options) {
  double quantum = 0;
  for (int r = 0; r < s.stages; ++r)
    for (std::size_t i = 0; i < s.actions[r].size(); ++i) {
      const double d = sim.spans[r][i].end - sim.spans[r][i].start;
      if (is_compute(s.actions[r][i].kind) && d > 0 && (quantum == 0 || d < quantum)) quantum = d;
    }
  if (quantum == 0) return "";
  // Compare in double before converting: makespan/quantum can exceed int (--cost-p2p 1e12
  // with unit compute), and converting such a double to int is undefined.
  const double wanted = std::ceil(sim.makespan / quantum - 1e-9);
  int cells = 0;
  if (!(wanted <= options.max_columns)) {
    quantum = sim.makespan / options.max_columns;
    cells = options.max_columns;
  } else {
    cells = static_cast<int>(wanted);
  }
  const int width = 1 + digits(std::max(s.microbatches - 1, 0));
  const std::string label_pad(static_cast<std::size_t>(fmt::formatted_size("stage {} ", s.stages - 1)), ' ');

  std::string out;
  for (int r = 0; r < s.stages; ++r) {
    // owner[c] = index of the action drawn in cell c, or -1 when idle.
    std::vector<int> owner(cells, -1);
    for (std::size_t i = 0; i < s.actions[r].size(); ++i) {
      if (!is_compute(s.actions[r][i].kind)) continue;
      const Span& span = sim.spans[r][i];
      int c0 = static_cast<int>(std::lround(span.start / quantum));
      int c1 = std::max(c0 + 1, static_cast<int>(std::lround(span.end / quantum)));
      for (int c = c0; c < std::min(c1, cells); ++c) owner[c] = static_cast<int>(i);
    }
    std::string row = fmt::format("stage {:<{}}|", r, label_pad.size() - 6);
    for (int c = 0; c < cells; ++c) {
      const bool first = c == 0 || owner[c - 1] != owner[c];
      const bool last = c + 1 == cells || owner[c + 1] != owner[c];
      if (owner[c] < 0) {
        row += fmt::format("{:<{}}", ".", width);
        if (!last || c + 1 < cells) row += ' ';
        continue;
      }
      const Action& a = s.actions[r][owner[c]];
      char letter = action_kind_letter(a.kind);
      if (a.chunk % 2 == 1) letter = static_cast<char>(letter - 'A' + 'a');
      std::string text = first ? fmt::format("{}{}", letter, a.microbatch) : (options.color ? "" : "-");
      std::string cell = fmt::format("{:<{}}", text, width);
      if (!options.color) {
        if (!first) cell = std::string(static_cast<std::size_t>(width), '-');
        row += cell;
        if (c + 1 < cells) row += ' ';
      } else {
        // The separator inside an action keeps its colour so the block reads as one.
        row += fmt::format("\x1b[{};97m{}{}\x1b[0m", ansi_background(a.kind, a.chunk), cell, last ? "" : " ");
        if (last && c + 1 < cells) row += ' ';
      }
    }
    row += fmt::format("| in flight {:g}\n", sim.peak_in_flight[r]);
    out += row;
  }
  out += fmt::format("{}1 cell = {:g} time units; F forward, B backward{}{}, . idle{}\n", label_pad, quantum,
                     s.kind == Schedule::kZbH1 ? " (input gradient)" : "",
                     s.kind == Schedule::kZbH1 ? ", W weight gradient" : "",
                     s.chunks > 1 ? "; lower case = odd model chunk" : "");
  return out;
}

std::string svg_timeline(const PipelineSchedule& s, const Simulation& sim) {
  const double left = 70, top = 50, row_h = 30, gap = 6;
  // Pixels per time unit: about 1000 pixels wide, but wide enough for a label in the
  // shortest action as long as the picture stays under ~2400 pixels.
  double shortest = sim.makespan;
  for (int r = 0; r < s.stages; ++r)
    for (std::size_t i = 0; i < s.actions[r].size(); ++i)
      if (!is_p2p(s.actions[r][i].kind) && sim.spans[r][i].end > sim.spans[r][i].start)
        shortest = std::min(shortest, sim.spans[r][i].end - sim.spans[r][i].start);
  const double makespan = std::max(sim.makespan, 1e-9);
  double scale = std::clamp(1000.0 / makespan, 4.0, 48.0);
  if (shortest > 0) scale = std::max(scale, std::min(26.0 / shortest, 2400.0 / makespan));
  const double plot_w = sim.makespan * scale;
  const double width = left + plot_w + 20;
  const double legend_y = top + s.stages * (row_h + gap) + 34;
  const double height = legend_y + 30;
  std::string out = svg::open(width, height);
  std::string title =
      fmt::format("{}: pp={} microbatches={}{} | makespan {:g}, bubble {:.1f}%", schedule_name(s.kind),
                  s.stages, s.microbatches, s.chunks > 1 ? fmt::format(" vpp={}", s.chunks) : "",
                  sim.makespan, 100.0 * sim.bubble_fraction);
  out += fmt::format("<text x=\"{}\" y=\"24\" font-size=\"15\" font-weight=\"bold\">{}</text>\n", left,
                     svg::escape(title));

  // Time axis: a tick every `step` units, step chosen to give at most ~25 labels.
  const double step = svg::tick_step(sim.makespan, 25, 1);
  const double axis_y = top + s.stages * (row_h + gap) + 4;
  for (double t = 0; t <= sim.makespan + 1e-9; t += step) {
    const double x = left + t * scale;
    out += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#dddddd\"/>\n",
                       x, top - 4, x, axis_y);
    out += fmt::format(
        "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"10\" text-anchor=\"middle\" fill=\"#555\">{:g}</text>\n",
        x, axis_y + 12, t);
  }

  for (int r = 0; r < s.stages; ++r) {
    const double y = top + r * (row_h + gap);
    out +=
        fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"12\" text-anchor=\"end\">stage {}</text>\n",
                    left - 8, y + row_h / 2 + 4, r);
    out +=
        fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"#f4f4f4\"/>\n",
                    left, y, plot_w, row_h);
    for (std::size_t i = 0; i < s.actions[r].size(); ++i) {
      const Action& a = s.actions[r][i];
      const Span& span = sim.spans[r][i];
      const double w = (span.end - span.start) * scale;
      if (w <= 0 || is_recv(a.kind)) continue;
      const double x = left + span.start * scale;
      const bool send = is_send(a.kind);
      const double h = send ? row_h / 4 : row_h;
      out += fmt::format(
          "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\" stroke=\"white\" "
          "stroke-width=\"1\"><title>{}: {:g} to {:g}</title></rect>\n",
          x, y + row_h - h, w, h, shade(base_colour(a.kind), a.chunk, s.chunks), svg::escape(to_string(a)),
          span.start, span.end);
      if (send) continue;
      std::string label =
          s.chunks > 1 ? fmt::format("{}.{}", a.microbatch, a.chunk) : std::to_string(a.microbatch);
      const double text_w = 7.0 * label.size();
      if (w >= text_w + 2)
        out += fmt::format(
            "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"12\" text-anchor=\"middle\" "
            "fill=\"white\">{}</text>\n",
            x + w / 2, y + row_h / 2 + 4, label);
    }
  }

  // Legend.
  struct Item {
    ActionKind kind;
    const char* name;
  };
  std::vector<Item> items = {{ActionKind::kForward, "forward"}};
  if (s.kind == Schedule::kZbH1) {
    items.push_back({ActionKind::kBackwardInput, "backward: input gradient (B)"});
    items.push_back({ActionKind::kBackwardWeight, "backward: weight gradient (W)"});
  } else {
    items.push_back({ActionKind::kBackward, "backward"});
  }
  double x = left;
  for (const Item& item : items) {
    out += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"14\" height=\"14\" fill=\"{}\"/>\n", x,
                       legend_y - 11, shade(base_colour(item.kind), 0, 1));
    out += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"12\">{}</text>\n", x + 19, legend_y,
                       item.name);
    x += 34 + 7.2 * std::string_view(item.name).size();
  }
  const std::string note =
      s.chunks > 1 ? "labels: micro-batch.chunk (lighter = later chunk)" : "labels: micro-batch";
  out += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"12\" fill=\"#555\">{}</text>\n", x,
                     legend_y, note);
  out += "</svg>\n";
  return out;
}

}  // namespace ndmesh::pp
