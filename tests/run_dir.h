// Run directories for multi-process tests: a fresh temporary directory per call, removed when the
// test that made it passes and kept (its path printed) when it fails, so failures can be read and
// passing runs leave nothing behind.
#pragma once

#include <string>

namespace ps {

// Creates <TempDir>/<prefix>-XXXXXX and returns its path.
std::string NewRunDir(const std::string& prefix = "run");

}  // namespace ps
