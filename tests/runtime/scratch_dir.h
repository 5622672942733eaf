#pragma once
// A fresh directory for one test, named after the process and the running test (so that
// tests run in parallel by ctest never share one) and removed with everything in it when
// the test ends.

#include <unistd.h>

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

namespace dhelix::test {

class ScratchDir {
 public:
  /// <temp>/<prefix><pid>-<test name>, emptied and created.
  explicit ScratchDir(const std::string& prefix) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = (std::filesystem::temp_directory_path() /
             (prefix + std::to_string(::getpid()) + "-" + info->name()))
                .string();
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ignored;  // a destructor must not throw
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace dhelix::test
