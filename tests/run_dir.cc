#include "tests/run_dir.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <iostream>
#include <vector>

namespace ps {
namespace {

// The directories made during the current test; cleaned up when it ends.
std::vector<std::string>& Made() {
  static std::vector<std::string>* dirs = new std::vector<std::string>;
  return *dirs;
}

class RunDirCleaner : public ::testing::EmptyTestEventListener {
  void OnTestEnd(const ::testing::TestInfo& test) override {
    for (const std::string& dir : Made()) {
      if (test.result()->Passed()) {
        std::error_code ignored;
        std::filesystem::remove_all(dir, ignored);
      } else {
        std::cout << "run directory kept: " << dir << std::endl;
      }
    }
    Made().clear();
  }
};

// Registered before main(): the tests link gtest_main.
const bool kRegistered = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new RunDirCleaner);
  return true;
}();

}  // namespace

std::string NewRunDir(const std::string& prefix) {
  std::string pattern = ::testing::TempDir() + "/" + prefix + "-XXXXXX";
  std::string dir = mkdtemp(pattern.data());
  Made().push_back(dir);
  return dir;
}

}  // namespace ps
