// Timeline rendering: the ASCII chart of a small 1F1B written out by hand from its
// timing, and the SVG's rectangles and well-formedness.
#include <string>

#include <gtest/gtest.h>

#include "ndmesh/parallel/pp/render.hpp"
#include "ndmesh/parallel/pp/schedule.hpp"
#include "ndmesh/parallel/pp/simulate.hpp"

namespace ndmesh::pp {
namespace {

int count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (auto pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + 1)) ++n;
  return n;
}

TEST(PpRender, AsciiOneFOneBTwoStages) {
  // Stage 0: F0 [0,1] F1 [1,2] idle B0 [4,6] idle B1 [7,9]; stage 1: F0 [1,2] B0 [2,4]
  // F1 [4,5] B1 [5,7] idle to 9. One cell per time unit, backwards two cells.
  auto s = make_schedule({.schedule = Schedule::k1F1B, .stages = 2, .microbatches = 2});
  auto text = ascii_timeline(s, simulate(s));
  EXPECT_EQ(text,
            "stage 0 |F0 F1 .  .  B0 -- .  B1 --| in flight 2\n"
            "stage 1 |.  F0 B0 -- F1 B1 -- .  . | in flight 1\n"
            "        1 cell = 1 time units; F forward, B backward, . idle\n");
}

TEST(PpRender, AsciiZbH1ShowsWeightGradients) {
  auto s = make_schedule({.schedule = Schedule::kZbH1, .stages = 3, .microbatches = 4});
  auto text = ascii_timeline(s, simulate(s));
  EXPECT_EQ(count(text, "W"), 3 * 4 + 1);  // every W cell, plus the legend's "W weight gradient"
  EXPECT_EQ(text.find('\x1b'), std::string::npos);
  auto colored = ascii_timeline(s, simulate(s), {.color = true});
  EXPECT_EQ(count(colored, "\x1b[45;97m"), 3 * 4);  // one magenta block per W
}

TEST(PpRender, AsciiScalesDownLongSchedules) {
  auto s = make_schedule({.schedule = Schedule::kGpipe, .stages = 2, .microbatches = 100});
  auto text = ascii_timeline(s, simulate(s), {.max_columns = 50});
  EXPECT_NE(text.find("1 cell = 6.06 time units"), std::string::npos) << text;  // 303 / 50
}

// A send a trillion times longer than a forward: the cell count does not fit an int, and
// converting it used to be undefined (ndmesh schedule --cost-p2p 1e12 ended in "internal
// error" after printing half its output).
TEST(PpRender, AsciiHugeCostRatioStaysWithinColumns) {
  auto s = make_schedule({.schedule = Schedule::k1F1B, .stages = 4, .microbatches = 8});
  auto sim = simulate(s, {.forward = 1, .backward_input = 1, .backward_weight = 1, .p2p = 1e12});
  auto text = ascii_timeline(s, sim, {.max_columns = 80});
  EXPECT_NE(text.find("1 cell = "), std::string::npos) << text;
  EXPECT_LT(text.size(), 4u * 400u) << text;
}

TEST(PpRender, SvgHasOneRectanglePerComputeAction) {
  auto s = make_schedule({.schedule = Schedule::kInterleaved, .stages = 2, .microbatches = 4, .chunks = 2});
  auto svg = svg_timeline(s, simulate(s));
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_EQ(count(svg, "><title>forward"), 2 * 4 * 2);
  EXPECT_EQ(count(svg, "><title>backward"), 2 * 4 * 2);
  EXPECT_EQ(count(svg, "<title>recv"), 0);  // receives only wait; nothing to draw
  EXPECT_NE(svg.find("interleaved: pp=2 microbatches=4 vpp=2"), std::string::npos);
}

TEST(PpRender, SvgDrawsSendsOnlyWhenTheyCostTime) {
  auto s = make_schedule({.schedule = Schedule::kGpipe, .stages = 2, .microbatches = 2});
  EXPECT_EQ(count(svg_timeline(s, simulate(s)), "<title>send"), 0);
  EXPECT_EQ(count(svg_timeline(s, simulate(s, {.p2p = 0.5})), "<title>send"), 4);
}

}  // namespace
}  // namespace ndmesh::pp
