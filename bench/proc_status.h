// A process's memory as Linux reports it, for benchmarks that watch a daemon.
#pragma once

#include <sys/types.h>

#include <fstream>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"

namespace ps {

// A "VmRSS:  12345 kB" style field of /proc/<pid>/status, in MiB; -1 if unreadable.
inline double ProcStatusMiB(pid_t pid, const std::string& field) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string key;
  while (in >> key) {
    if (key == field + ":") {
      double kb = -1;
      in >> kb;
      return kb / 1024;
    }
    in.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return -1;
}

}  // namespace ps
