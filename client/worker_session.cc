#include "client/worker_session.h"

#include <algorithm>

#include "common/log.h"

namespace ps {

absl::StatusOr<std::unique_ptr<WorkerSession>> WorkerSession::Start(ShardedClient* client,
                                                                    absl::Duration heartbeat) {
  absl::StatusOr<int64_t> first_step = client->Register();
  if (!first_step.ok()) return first_step.status();
  std::unique_ptr<WorkerSession> session(new WorkerSession(client, *first_step));
  if (client->worker_id() >= 0 && heartbeat > absl::ZeroDuration()) {
    WorkerSession* s = session.get();
    session->heartbeats_ = std::thread([s, heartbeat] {
      while (!s->stop_.WaitForNotificationWithTimeout(heartbeat)) {
        if (absl::Status status =
                s->client_->Heartbeat(std::max(heartbeat, absl::Milliseconds(500)));
            !status.ok()) {
          PS_LOG(WARNING) << "heartbeat: " << status;
        }
      }
    });
  }
  return session;
}

WorkerSession::~WorkerSession() { Leave(absl::Seconds(2)).IgnoreError(); }

absl::Status WorkerSession::Leave(absl::Duration timeout) {
  std::call_once(left_, [&] {
    stop_.Notify();
    if (heartbeats_.joinable()) heartbeats_.join();
    if (client_->worker_id() >= 0) leave_status_ = client_->Leave(timeout);
  });
  return leave_status_;
}

}  // namespace ps
