#include "ndmesh/core/svg.hpp"

#include <cmath>

#include <fmt/core.h>

namespace ndmesh::svg {

std::string escape(std::string_view s) {
  std::string out;
  for (char ch : s) {
    if (ch == '<')
      out += "&lt;";
    else if (ch == '>')
      out += "&gt;";
    else if (ch == '&')
      out += "&amp;";
    else
      out += ch;
  }
  return out;
}

std::string open(double width, double height) {
  return fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" viewBox=\"0 0 {:.0f} "
      "{:.0f}\" "
      "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      width, height, width, height);
}

double tick_step(double range, int max_ticks, double min_step) {
  if (!(range > 0) || max_ticks < 1) return min_step > 0 ? min_step : 1;
  double base = min_step > 0 ? min_step : std::pow(10.0, std::floor(std::log10(range / max_ticks)));
  for (;; base *= 10)
    for (double f : {1.0, 2.0, 5.0})
      if (range / (base * f) <= max_ticks) return base * f;
}

}  // namespace ndmesh::svg
