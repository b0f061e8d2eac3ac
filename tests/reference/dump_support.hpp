// What the reference dumps (llama_block_dump.cpp, moe_dump.cpp) share: random inputs and the
// JSON lists the PyTorch scripts read back, with every digit a double carries.
#pragma once

#include <cstdint>
#include <string>

#include <fmt/format.h>

#include "ndmesh/tensor/rng.hpp"

namespace reference_dump {

inline void fill(double* p, std::int64_t n, ndmesh::Rng& rng, double scale) {
  for (std::int64_t i = 0; i < n; ++i) p[i] = rng.normal() * scale;
}

inline std::string list(const double* p, std::int64_t n) {
  std::string s = "[";
  for (std::int64_t i = 0; i < n; ++i) s += fmt::format("{}{:.17g}", i > 0 ? "," : "", p[i]);
  return s + "]";
}

}  // namespace reference_dump
