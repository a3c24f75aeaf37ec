// A tiny logger (Debian's Abseil predates absl/log): PS_LOG(INFO) << "..." writes one line to
// stderr with the wall time, the process tag and the level, or hands it to the process's sink
// (SetLogSink: the C API's caller routes them into its own logging). Thread-safe: each line is
// one write, or one call of the sink.
#pragma once

#include <cstdint>
#include <functional>
#include <sstream>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ps {

enum class LogLevel { kINFO, kWARNING, kERROR };

// Names this process in every line, e.g. "ps[0]" or "worker[3]".
void SetLogTag(std::string tag);

// Where lines go instead of stderr: sink(level, message), the message alone (no time, tag or
// level), called on the thread that logs; the sink must not log itself. An empty sink: stderr
// again. Returns once the calls of the sink it replaces have returned, so that what that sink
// uses may go then.
using LogSink = std::function<void(LogLevel level, const std::string& message)>;
void SetLogSink(LogSink sink);

class LogMessage {
 public:
  explicit LogMessage(LogLevel level) : level_(level) {}
  ~LogMessage();
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

// Lets through one line per `interval` of something a stranger can cause at will (a port
// scanner's failed TLS handshakes), so that it cannot fill the log: Allow() says whether to log
// this one, and how many were held back since the last line. Thread-safe.
class LogLimiter {
 public:
  explicit LogLimiter(absl::Duration interval) : interval_(interval) {}
  bool Allow(int64_t* held_back);

 private:
  const absl::Duration interval_;
  absl::Mutex mu_;
  absl::Time last_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int64_t held_back_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ps

#define PS_LOG(level) ::ps::LogMessage(::ps::LogLevel::k##level).stream()

namespace ps {
// Prints "<program>: <reason>" as the one-line failure reason on stderr and returns exit status 1.
int FailMain(const std::string& program, const std::string& reason);
}  // namespace ps
