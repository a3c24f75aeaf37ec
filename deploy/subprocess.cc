#include "deploy/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string_view>

#include "absl/strings/str_cat.h"

namespace ps {

absl::StatusOr<Subprocess> Subprocess::Start(const std::vector<std::string>& argv,
                                             const std::string& log_path,
                                             const std::vector<std::string>& drop_env,
                                             const std::map<std::string, std::string>& set_env) {
  if (access(argv[0].c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("cannot execute ", argv[0], ": ", strerror(errno)));
  }
  int log = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log < 0)
    return absl::NotFoundError(absl::StrCat("cannot open ", log_path, ": ", strerror(errno)));
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<char*> env;
  auto named = [](std::string_view entry, const std::string& name) {
    return entry.size() > name.size() && entry.substr(0, name.size()) == name &&
           entry[name.size()] == '=';
  };
  for (char** e = environ; *e != nullptr; ++e) {
    bool dropped = false;
    for (const std::string& name : drop_env) dropped = dropped || named(*e, name);
    for (const auto& [name, value] : set_env) dropped = dropped || named(*e, name);
    if (!dropped) env.push_back(*e);
  }
  std::vector<std::string> added;
  for (const auto& [name, value] : set_env) added.push_back(name + "=" + value);
  for (std::string& entry : added) env.push_back(entry.data());
  env.push_back(nullptr);
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    close(log);
    return absl::ResourceExhaustedError(absl::StrCat("fork failed: ", strerror(errno)));
  }
  if (pid == 0) {
    // Child: only async-signal-safe calls until exec.
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127);  // the launcher died before prctl took effect
    dup2(log, STDOUT_FILENO);
    dup2(log, STDERR_FILENO);
    execve(args[0], args.data(), env.data());
    _exit(127);
  }
  close(log);
  std::string name = argv[0].substr(argv[0].rfind('/') + 1);
  return Subprocess(pid, name);
}

Subprocess::Subprocess(Subprocess&& o) noexcept { *this = std::move(o); }

Subprocess& Subprocess::operator=(Subprocess&& o) noexcept {
  std::swap(pid_, o.pid_);
  std::swap(name_, o.name_);
  std::swap(exit_code_, o.exit_code_);
  return *this;
}

Subprocess::~Subprocess() {
  if (pid_ > 0 && running()) {
    kill(pid_, SIGKILL);
    Reap(/*block=*/true);
  }
}

bool Subprocess::Reap(bool block) {
  if (exit_code_ >= 0 || pid_ <= 0) return true;
  int status = 0;
  pid_t r = waitpid(pid_, &status, block ? 0 : WNOHANG);
  if (r != pid_) return false;
  exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return true;
}

bool Subprocess::running() { return pid_ > 0 && !Reap(/*block=*/false); }

namespace {
// Whether process `pid` is stopped: the state in /proc/<pid>/stat, the field after the name's
// closing parenthesis.
bool Stopped(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  const std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t name_end = stat.rfind(')');
  return name_end != std::string::npos && name_end + 2 < stat.size() &&
         (stat[name_end + 2] == 'T' || stat[name_end + 2] == 't');
}
}  // namespace

void Subprocess::Signal(int sig) {
  if (!running()) return;
  kill(pid_, sig);
  // kill only asks: the child's threads run on until each is scheduled and stops, which on a
  // busy machine is a while. Return once it stopped (or after 10 s).
  for (absl::Time end = absl::Now() + absl::Seconds(10);
       sig == SIGSTOP && !Stopped(pid_) && absl::Now() < end;) {
    absl::SleepFor(absl::Milliseconds(1));
  }
}

absl::StatusOr<int> Subprocess::Wait(absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  while (!Reap(/*block=*/false)) {
    // waitpid has no timeout; poll a child's exit at a short interval.
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(name_, " (pid ", pid_, ") still running"));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return exit_code_;
}

int Subprocess::Stop(absl::Duration grace) {
  Signal(SIGTERM);
  return WaitOrKill(grace);
}

int Subprocess::WaitOrKill(absl::Duration grace) {
  if (absl::StatusOr<int> code = Wait(grace); code.ok()) return *code;
  Signal(SIGKILL);
  Reap(/*block=*/true);
  return exit_code_;
}

std::string ExecutableDir() {
  char path[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) return ".";
  std::string p(path, n);
  return p.substr(0, p.rfind('/'));
}

CommandResult RunCommand(const std::string& command) {
  CommandResult result;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) result.output.append(buffer, n);
  const int status = pclose(pipe);
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  return result;
}

std::string LastLine(const std::string& path) {
  std::ifstream in(path, std::ios::ate);
  if (!in) return "";
  std::streamoff size = in.tellg();
  std::streamoff from = std::max<std::streamoff>(0, size - 4096);
  in.seekg(from);
  std::string tail((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!tail.empty() && tail.back() == '\n') tail.pop_back();
  size_t nl = tail.rfind('\n');
  return nl == std::string::npos ? (from == 0 ? tail : "") : tail.substr(nl + 1);
}

absl::Status RunToSuccess(const std::vector<std::string>& argv, absl::Duration timeout) {
  char log[] = "/tmp/ps-run-XXXXXX";
  const int fd = mkstemp(log);
  if (fd < 0) return absl::UnavailableError("cannot make a temporary file for " + argv[0]);
  close(fd);
  absl::StatusOr<Subprocess> p = Subprocess::Start(argv, log);
  absl::StatusOr<int> code = p.ok() ? p->Wait(timeout) : p.status();
  const std::string reason = LastLine(log);
  std::remove(log);
  if (!code.ok()) return code.status();
  if (*code == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      reason.empty() ? absl::StrCat(argv[0], " exited with status ", *code) : reason);
}

}  // namespace ps
