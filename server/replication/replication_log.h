// The primary's side of replication without the network: a copy of each change of the shard made
// since its backup started joining, kept until the backup acknowledges it, and the waits of the
// calls (pushes, initialisation) that may be acknowledged only once their change is on the backup.
//
// At most one backup is attached at a time; attaching another detaches the first. The log holds
// the changes not yet acknowledged, so its length is bounded by the pushes in progress (each one
// waits for its change to be acknowledged before its worker sends another).
// Thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/state/buffer_pool.h"
#include "server/state/parameter_shard.h"

namespace ps {

class ReplicationLog {
 public:
  // A change as kept: ShardChange's fields, its values copied, unless the backup holds them
  // already as the stage its forward tag names (a push forwarded as it came: stage_forwarder.h).
  struct Entry {
    ShardChange change;  // change.values points into `values`; empty when not kept
    BufferPool::Lease values;
    int64_t length = 0;  // the change's values, kept or not
  };

  // For the shard's change listener (under the shard's lock): copies `change` while a backup is
  // attached, its values unless `held(attachment)` says that backup holds them (change.forward_tag)
  // (called under this log's lock). Without a backup, only counts it.
  void Append(const ShardChange& change, absl::FunctionRef<bool(int64_t attachment)> held);

  // A backup starts joining: changes are kept from now on. Returns its attachment id.
  int64_t Attach();
  // The joining backup's state reflects changes up to `index` (a snapshot taken after Attach):
  // those are dropped. They count as replicated once it acknowledges `index`.
  void Start(int64_t attachment, int64_t index);
  // The next change after `after` for `attachment`, waiting up to `timeout`: nullopt if none came;
  // CANCELLED once the attachment ended (Detach, another Attach, Close).
  absl::StatusOr<std::optional<std::shared_ptr<const Entry>>> Next(int64_t attachment,
                                                                   int64_t after,
                                                                   absl::Duration timeout);
  // The backup applied every change up to `index`.
  void Acknowledge(int64_t attachment, int64_t index);
  // The backup went away: calls waiting for it fail, and nothing is kept until another attaches.
  void Detach(int64_t attachment);
  // Whether a backup is attached (joining or following).
  bool attached() const;

  // Waits until every change appended so far is acknowledged, or `deadline`: UNAVAILABLE then,
  // and at once if no backup is attached (the change may be lost with this process).
  absl::Status WaitReplicated(absl::Time deadline);

  // Ends every attachment and wait for good (shutdown, or this primary was superseded).
  void Close();

 private:
  BufferPool buffers_{8};
  mutable absl::Mutex mu_;
  int64_t attachment_ ABSL_GUARDED_BY(mu_) = 0;  // the current one's id; 0: none
  int64_t next_attachment_ ABSL_GUARDED_BY(mu_) = 1;
  bool started_ ABSL_GUARDED_BY(mu_) = false;  // the current backup has its snapshot
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  int64_t appended_ ABSL_GUARDED_BY(mu_) = 0;  // index of the last change appended
  int64_t acknowledged_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<std::shared_ptr<const Entry>> entries_ ABSL_GUARDED_BY(mu_);  // by index
};

}  // namespace ps
