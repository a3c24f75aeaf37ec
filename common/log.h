// A tiny logger (Debian's Abseil predates absl/log): PS_LOG(INFO) << "..." writes one line to
// stderr with the wall time, the process tag and the level. Thread-safe: each line is one write.
#pragma once

#include <sstream>
#include <string>

namespace ps {

enum class LogLevel { kINFO, kWARNING, kERROR };

// Names this process in every line, e.g. "ps[0]" or "worker[3]".
void SetLogTag(std::string tag);

class LogMessage {
 public:
  explicit LogMessage(LogLevel level) : level_(level) {}
  ~LogMessage();
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

}  // namespace ps

#define PS_LOG(level) ::ps::LogMessage(::ps::LogLevel::k##level).stream()

namespace ps {
// Prints "<program>: <reason>" as the one-line failure reason on stderr and returns exit status 1.
int FailMain(const std::string& program, const std::string& reason);
}  // namespace ps
