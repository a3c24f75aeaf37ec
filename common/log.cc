#include "common/log.h"

#include <unistd.h>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ps {
namespace {
std::string& Tag() {
  static std::string tag = "ps";
  return tag;
}

// Lines are handed to the sink under a reader lock, so that SetLogSink (the writer) returns only
// once no call of the sink it replaced is in progress.
absl::Mutex& SinkMutex() {
  static absl::Mutex* mu = new absl::Mutex;
  return *mu;
}
LogSink& Sink() {
  static LogSink* sink = new LogSink;
  return *sink;
}
}  // namespace

void SetLogTag(std::string tag) { Tag() = std::move(tag); }

void SetLogSink(LogSink sink) {
  absl::WriterMutexLock lock(&SinkMutex());
  Sink() = std::move(sink);
}

LogMessage::~LogMessage() {
  {
    absl::ReaderMutexLock lock(&SinkMutex());
    if (Sink()) {
      Sink()(level_, stream_.str());
      return;
    }
  }
  static const char* kNames[] = {"I", "W", "E"};
  std::string line = absl::FormatTime("%H:%M:%E3S", absl::Now(), absl::LocalTimeZone()) + " " +
                     kNames[static_cast<int>(level_)] + " " + Tag() + "] " + stream_.str() + "\n";
  // One write(2) per line keeps lines from different threads whole.
  [[maybe_unused]] ssize_t n = write(STDERR_FILENO, line.data(), line.size());
}

bool LogLimiter::Allow(int64_t* held_back) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  if (now - last_ < interval_) {
    ++held_back_;
    return false;
  }
  last_ = now;
  *held_back = held_back_;
  held_back_ = 0;
  return true;
}

}  // namespace ps

namespace ps {
int FailMain(const std::string& program, const std::string& reason) {
  std::string line = program + ": " + reason + "\n";
  [[maybe_unused]] ssize_t n = write(STDERR_FILENO, line.data(), line.size());
  return 1;
}
}  // namespace ps
