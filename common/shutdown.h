// Clean shutdown on SIGTERM/SIGINT: a signal handler wakes a watcher thread (through a pipe),
// which sets a notification that the process's loops poll or wait on.
#pragma once

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace ps {

// Call once from main(). A second SIGTERM/SIGINT while shutting down exits at once with 130.
void InstallShutdownHandler();

// True once SIGTERM or SIGINT arrived (or RequestShutdown was called). Thread-safe.
bool ShutdownRequested();

// Waits up to `timeout`; returns true if shutdown was requested.
bool WaitForShutdown(absl::Duration timeout);

// Asks this process to shut down, as a signal would.
void RequestShutdown();

}  // namespace ps
