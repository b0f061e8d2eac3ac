#include "ndmesh/train/plot.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/core.h>

#include "ndmesh/core/svg.hpp"

namespace ndmesh::train {

namespace {

constexpr const char* kLossColour = "#4c78a8";
constexpr const char* kValColour = "#f58518";
constexpr const char* kLrColour = "#888888";

struct Range {
  double lo = std::numeric_limits<double>::infinity();
  double hi = -std::numeric_limits<double>::infinity();
  void add(double x) {
    if (!std::isfinite(x)) return;
    lo = std::min(lo, x);
    hi = std::max(hi, x);
  }
  bool empty() const { return lo > hi; }
};

// Ticks from the first multiple of `step` at or above lo to hi.
std::vector<double> ticks(double lo, double hi, double step) {
  std::vector<double> out;
  for (double t = std::ceil(lo / step - 1e-9) * step; t <= hi + 1e-9 * step; t += step) out.push_back(t);
  return out;
}

}  // namespace

std::string svg_metrics_plot(const std::vector<MetricsRow>& rows, const std::string& title) {
  const double width = 900, height = 500, left = 80, right = 90, top = 50, bottom = 80;
  const double plot_w = width - left - right, plot_h = height - top - bottom;

  Range steps, loss, lr;
  for (const MetricsRow& r : rows) {
    steps.add(static_cast<double>(r.step));
    loss.add(r.loss);
    if (r.val_loss) loss.add(*r.val_loss);
    if (r.lr) lr.add(*r.lr);
  }
  if (steps.lo == steps.hi) steps.hi = steps.lo + 1;
  if (loss.empty()) loss = {0, 1};
  if (loss.lo == loss.hi) loss = {loss.lo - 0.5, loss.hi + 0.5};
  const double pad = 0.05 * (loss.hi - loss.lo);
  loss.lo -= pad;
  loss.hi += pad;
  const bool has_lr = !lr.empty();
  const double lr_hi = has_lr && lr.hi > 0 ? lr.hi * 1.05 : 1;

  auto x_of = [&](double step) { return left + (step - steps.lo) / (steps.hi - steps.lo) * plot_w; };
  auto y_loss = [&](double v) { return top + (loss.hi - v) / (loss.hi - loss.lo) * plot_h; };
  auto y_lr = [&](double v) { return top + (lr_hi - v) / lr_hi * plot_h; };

  std::string out = svg::open(width, height);
  std::string heading = title;
  const MetricsRow& last = rows.back();
  heading += fmt::format(": {} steps, last loss {:.4f}", rows.size(), last.loss);
  for (auto it = rows.rbegin(); it != rows.rend(); ++it)
    if (it->val_loss) {
      heading += fmt::format(", val_loss {:.4f} at step {}", *it->val_loss, it->step);
      break;
    }
  out += fmt::format("<text x=\"{}\" y=\"28\" font-size=\"15\" font-weight=\"bold\">{}</text>\n", left,
                     svg::escape(heading));
  out += fmt::format(
      "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"#fafafa\" stroke=\"#cccccc\"/>\n", left, top,
      plot_w, plot_h);

  // Axes: the step below, the loss at the left, the learning rate at the right.
  for (double t : ticks(steps.lo, steps.hi, svg::tick_step(steps.hi - steps.lo, 10, 1))) {
    const double x = x_of(t);
    out += fmt::format("<line x1=\"{:.1f}\" y1=\"{}\" x2=\"{:.1f}\" y2=\"{}\" stroke=\"#e4e4e4\"/>\n", x, top,
                       x, top + plot_h);
    out += fmt::format(
        "<text x=\"{:.1f}\" y=\"{}\" font-size=\"11\" text-anchor=\"middle\" fill=\"#555\">{:g}</text>\n", x,
        top + plot_h + 16, t);
  }
  for (double t : ticks(loss.lo, loss.hi, svg::tick_step(loss.hi - loss.lo, 8))) {
    const double y = y_loss(t);
    out += fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#e4e4e4\"/>\n", left,
                       y, left + plot_w, y);
    out += fmt::format(
        "<text x=\"{}\" y=\"{:.1f}\" font-size=\"11\" text-anchor=\"end\" fill=\"#555\">{:g}</text>\n",
        left - 6, y + 4, t);
  }
  if (has_lr)
    for (double t : ticks(0, lr_hi, svg::tick_step(lr_hi, 6)))
      out += fmt::format(
          "<text x=\"{}\" y=\"{:.1f}\" font-size=\"11\" text-anchor=\"start\" fill=\"{}\">{:g}</text>\n",
          left + plot_w + 6, y_lr(t) + 4, kLrColour, t);
  out += fmt::format("<text x=\"{:.1f}\" y=\"{}\" font-size=\"12\" text-anchor=\"middle\">step</text>\n",
                     left + plot_w / 2, top + plot_h + 36);
  out += fmt::format(
      "<text x=\"20\" y=\"{:.1f}\" font-size=\"12\" text-anchor=\"middle\" transform=\"rotate(-90 20 "
      "{:.1f})\">"
      "loss</text>\n",
      top + plot_h / 2, top + plot_h / 2);
  if (has_lr)
    out += fmt::format(
        "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"12\" text-anchor=\"middle\" fill=\"{}\" "
        "transform=\"rotate(90 {:.1f} {:.1f})\">learning rate</text>\n",
        width - 18, top + plot_h / 2, kLrColour, width - 18, top + plot_h / 2);

  // The curves, thinned to at most 2000 points each (the last one kept).
  const std::size_t every = std::max<std::size_t>(1, (rows.size() + 1999) / 2000);
  auto polyline = [&](auto&& y_of, auto&& has, const char* colour, const char* extra) {
    std::string points;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      if ((i % every != 0 && i + 1 != rows.size()) || !has(rows[i])) continue;
      const double y = y_of(rows[i]);
      if (!std::isfinite(y)) continue;
      points += fmt::format("{:.1f},{:.1f} ", x_of(static_cast<double>(rows[i].step)), y);
    }
    if (!points.empty())
      out += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\"{}/>\n",
                         points, colour, extra);
  };
  if (has_lr)
    polyline([&](const MetricsRow& r) { return y_lr(*r.lr); },
             [](const MetricsRow& r) { return r.lr.has_value(); }, kLrColour, " stroke-dasharray=\"5,3\"");
  polyline([&](const MetricsRow& r) { return y_loss(r.loss); }, [](const MetricsRow&) { return true; },
           kLossColour, "");
  bool has_val = false;
  std::string val_points;
  for (const MetricsRow& r : rows)
    if (r.val_loss && std::isfinite(*r.val_loss)) {
      has_val = true;
      const double x = x_of(static_cast<double>(r.step)), y = y_loss(*r.val_loss);
      val_points += fmt::format("{:.1f},{:.1f} ", x, y);
      out += fmt::format(
          "<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.5\" fill=\"{}\"><title>step {}: val_loss {:g}"
          "</title></circle>\n",
          x, y, kValColour, r.step, *r.val_loss);
    }
  if (!val_points.empty())
    out += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\"/>\n",
                       val_points, kValColour);

  // Legend.
  double x = left;
  const double y = height - 18;
  auto item = [&](const char* colour, const char* name, const char* dash) {
    out += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" "
        "stroke-width=\"2\"{}/>\n",
        x, y - 4, x + 22, y - 4, colour, dash);
    out += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"12\">{}</text>\n", x + 28, y, name);
    x += 40 + 7.2 * std::string_view(name).size();
  };
  item(kLossColour, "loss (training batch)", "");
  if (has_val) item(kValColour, "val_loss (held-out)", "");
  if (has_lr) item(kLrColour, "learning rate (right axis)", " stroke-dasharray=\"5,3\"");
  out += "</svg>\n";
  return out;
}

}  // namespace ndmesh::train
