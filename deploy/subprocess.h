// A child process started from an argv, its stdout and stderr appended to a log file. Children
// sit in their own process group (a terminal's Ctrl-C reaches only the launcher, which stops them
// in order) and get SIGTERM if the launcher dies, so no orphan outlives it. Not thread-safe.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ps {

class Subprocess {
 public:
  // Starts argv[0] (a path) with `argv` and this process's environment less the variables named
  // in `drop_env`, with `set_env` added (replacing variables of the same names); output goes to
  // `log_path` (appended).
  static absl::StatusOr<Subprocess> Start(const std::vector<std::string>& argv,
                                          const std::string& log_path,
                                          const std::vector<std::string>& drop_env = {},
                                          const std::map<std::string, std::string>& set_env = {});
  Subprocess() = default;  // no process: never running, exit code -1
  Subprocess(Subprocess&& o) noexcept;
  Subprocess& operator=(Subprocess&& o) noexcept;
  // Kills (SIGKILL) and reaps a child still running, so tests never leak processes.
  ~Subprocess();

  pid_t pid() const { return pid_; }
  const std::string& name() const { return name_; }
  bool running();
  // Sends a signal (SIGTERM, SIGKILL, ...) if the child is still running; SIGSTOP returns once
  // the child stopped (at most 10 s later), since kill returns before its threads are stopped.
  void Signal(int sig);
  // Waits up to `timeout` for the child to exit; returns its exit code (128+signal when killed by
  // one), or DEADLINE_EXCEEDED.
  absl::StatusOr<int> Wait(absl::Duration timeout);
  // SIGTERM, then WaitOrKill(grace). Returns the exit code.
  int Stop(absl::Duration grace);
  // Waits up to `grace` for the child to exit, then SIGKILLs it. Returns the exit code.
  int WaitOrKill(absl::Duration grace);

 private:
  Subprocess(pid_t pid, std::string name) : pid_(pid), name_(std::move(name)) {}
  bool Reap(bool block);

  pid_t pid_ = -1;
  std::string name_;
  int exit_code_ = -1;
};

// A shell command's exit code (-1 if it did not exit) and its output, stderr included.
struct CommandResult {
  int exit_code = -1;
  std::string output;
};
CommandResult RunCommand(const std::string& command);

// Directory of the running executable, to find sibling binaries (ps, worker, evaluator).
std::string ExecutableDir();

// The last line of a text file ("" if it has none), read from its tail.
std::string LastLine(const std::string& path);

// Runs `argv` to its end (at most `timeout`), its output in a temporary file: OK if it exits 0,
// else INVALID_ARGUMENT with its last line (a daemon's one-line reason).
absl::Status RunToSuccess(const std::vector<std::string>& argv, absl::Duration timeout);

}  // namespace ps
