// A folder of its own for a test: under the system's temporary folder, named after the process
// and the running test (so parallel ctest runs never share one), empty at the start and removed
// with everything in it at the end.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

namespace ndmesh::testing_support {

struct TempDir {
  std::filesystem::path path;
  /// `prefix` tells the folders of different test files apart.
  explicit TempDir(const std::string& prefix = "ndmesh_test") {
    path = std::filesystem::temp_directory_path() /
           (prefix + "_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

}  // namespace ndmesh::testing_support
