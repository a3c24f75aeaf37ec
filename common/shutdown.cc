#include "common/shutdown.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "common/log.h"

namespace ps {
namespace {

absl::Notification& Requested() {
  static absl::Notification* n = new absl::Notification;
  return *n;
}

int signal_pipe[2] = {-1, -1};
volatile sig_atomic_t signalled = 0;

// A handler, not a blocked mask plus sigwait: libraries such as OpenBLAS start threads before
// main(), and a signal delivered to one of those would otherwise take its default action.
void OnSignal(int sig) {
  if (signalled) _exit(130);  // a second Ctrl-C: the user wants out now
  signalled = 1;
  unsigned char byte = static_cast<unsigned char>(sig);
  [[maybe_unused]] ssize_t n = write(signal_pipe[1], &byte, 1);
}

}  // namespace

void InstallShutdownHandler() {
  if (pipe(signal_pipe) != 0) return;
  std::thread([] {
    unsigned char sig = 0;
    while (read(signal_pipe[0], &sig, 1) != 1) {
    }
    PS_LOG(INFO) << "received " << (sig == SIGTERM ? "SIGTERM" : "SIGINT") << ", shutting down";
    RequestShutdown();
  }).detach();
  struct sigaction action = {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
}

bool ShutdownRequested() { return Requested().HasBeenNotified(); }

bool WaitForShutdown(absl::Duration timeout) {
  return Requested().WaitForNotificationWithTimeout(timeout);
}

void RequestShutdown() {
  // Several threads may ask at once (the signal watcher, a thread finishing its work), and
  // Notify must be called exactly once.
  static std::atomic<bool> claimed{false};
  if (!claimed.exchange(true)) Requested().Notify();
}

}  // namespace ps
