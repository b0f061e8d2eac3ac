// Small text helpers shared by the parsers of layouts, orders and flag lists.
#pragma once

#include <string_view>
#include <vector>

namespace ndmesh {

/// `s` without leading and trailing spaces and tabs.
std::string_view trim(std::string_view s);

/// Splits `s` at any character of `separators`, trimming each part. Empty parts are kept
/// (so callers can reject "dp,,tp"); an empty `s` gives one empty part.
std::vector<std::string_view> split_list(std::string_view s, std::string_view separators);

}  // namespace ndmesh
