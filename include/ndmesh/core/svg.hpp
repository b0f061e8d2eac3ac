// The pieces of a standalone SVG picture that ndmesh's pictures share: the pipeline
// timelines (`ndmesh schedule --svg`, parallel/pp/render.hpp) and the training curves
// (`ndmesh plot`, train/plot.hpp). Drawing is fmt text; these are the parts both need alike.
#pragma once

#include <string>
#include <string_view>

namespace ndmesh::svg {

/// `text` with <, > and & escaped for SVG text and attributes.
std::string escape(std::string_view text);

/// The opening <svg> element of a width x height picture (DejaVu Sans, as rsvg-convert
/// renders it on Debian) and its white background.
std::string open(double width, double height);

/// The tick spacing of an axis over `range` units with at most `max_ticks` ticks: 1, 2 or 5
/// times a power of ten, and at least `min_step` when it is > 0 (whole units, e.g. steps).
double tick_step(double range, int max_ticks, double min_step = 0);

}  // namespace ndmesh::svg
