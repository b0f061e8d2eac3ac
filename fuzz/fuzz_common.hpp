// Helpers shared by the fuzz targets. Each target feeds bytes to one parser of user input
// and accepts only the documented failures (ConfigError for bad input, IoError for bad
// files). Anything else (a crash, a sanitizer report, InternalError or another exception
// escaping, a hang) is a finding.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace ndmesh::fuzz {

/// The input as text.
inline std::string_view text(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

/// Writes the input to a file private to this process and returns its path.
inline std::string write_temp(const std::uint8_t* data, std::size_t size, const char* suffix) {
  std::string path = "/tmp/ndmesh-fuzz-" + std::to_string(::getpid()) + suffix;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) __builtin_trap();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) __builtin_trap();
  std::fclose(f);
  return path;
}

/// Splits the input at the first '\n' (or returns the whole and an empty rest).
inline std::pair<std::string_view, std::string_view> first_line(std::string_view s) {
  auto nl = s.find('\n');
  if (nl == std::string_view::npos) return {s, {}};
  return {s.substr(0, nl), s.substr(nl + 1)};
}

}  // namespace ndmesh::fuzz
