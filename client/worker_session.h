// A worker's membership in the job: registered with every shard, kept in their active set by
// heartbeats from a thread of its own, and left at the end, so that barriers and SSP bounds need
// not wait out its lease. The C++ worker and the Python client (capi/) both use it.
//
// Thread-safe. Borrows the client, which must outlive the session.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "client/sharded_client.h"

namespace ps {

class WorkerSession {
 public:
  // Registers `client` (ShardedClient::Register: fails as it does) and, for a worker (not an
  // observer) with `heartbeat` > 0, starts sending a heartbeat every `heartbeat`, each one attempt
  // with a deadline of max(heartbeat, 0.5 s) (a failed one is logged, the next one tried).
  static absl::StatusOr<std::unique_ptr<WorkerSession>> Start(ShardedClient* client,
                                                              absl::Duration heartbeat);
  // Leave(2 s) unless done.
  ~WorkerSession();

  // The step to start (or resume) at: Register's answer.
  int64_t first_step() const { return first_step_; }

  // Stops the heartbeats (the last one would rejoin) and tells every shard the worker leaves, one
  // attempt each within `timeout`; only the first call does. Call after the last push.
  absl::Status Leave(absl::Duration timeout);

 private:
  WorkerSession(ShardedClient* client, int64_t first_step)
      : client_(client), first_step_(first_step) {}
  ShardedClient* const client_;
  const int64_t first_step_;
  absl::Notification stop_;
  std::thread heartbeats_;
  std::once_flag left_;
  absl::Status leave_status_;
};

}  // namespace ps
