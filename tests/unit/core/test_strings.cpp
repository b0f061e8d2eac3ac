#include <gtest/gtest.h>

#include "ndmesh/core/strings.hpp"

namespace ndmesh {

using Parts = std::vector<std::string_view>;

TEST(Strings, SplitTrimsAndKeepsEmptyParts) {
  EXPECT_EQ(split_list(" dp , tp-cp ", ","), (Parts{"dp", "tp-cp"}));
  EXPECT_EQ(split_list("tp-cp,dp", "-,"), (Parts{"tp", "cp", "dp"}));
  EXPECT_EQ(split_list("dp,,tp", ","), (Parts{"dp", "", "tp"}));
  EXPECT_EQ(split_list("", ","), (Parts{""}));
  EXPECT_EQ(split_list("tp-", "-"), (Parts{"tp", ""}));
  EXPECT_EQ(trim("\t a b "), "a b");
}

}  // namespace ndmesh
