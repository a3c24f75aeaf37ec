// The primary's side of forwarding (server/replication/replica.h, "Forwarding"): pushes that
// come in on the data plane cross to the backup as *stages* while they still come in, on the
// stage connections the backup gave its primary; the bookkeeping of which stage the backup holds,
// which one a change names, and which ones it drops. The shard sees a stage only as the opaque
// forward tag of a push (PushSlot::set_forward_tag, ShardChange::forward_tag): a stage's tag is
// its id.
//
// Thread-safe. Its lock may be taken under the shard's (never the other way round).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/fill_progress.h"
#include "transport/data_connection.h"

namespace ps {

class StageForwarder {
 public:
  // The stages a backup with `connections` stage connections holds at most: those being sent,
  // and two more (one for one connection) whose bytes came and whose changes have not yet; the
  // smallest gradient worth forwarding (a smaller one takes about as long to forward as to send
  // after it was applied).
  static int StageRoom(int connections) { return connections + std::min(connections, 2); }
  static constexpr uint64_t kMinForwardBytes = 4 << 20;

  // `shard_index` is for messages.
  explicit StageForwarder(int shard_index) : shard_index_(shard_index) {}
  StageForwarder(const StageForwarder&) = delete;
  StageForwarder& operator=(const StageForwarder&) = delete;

  // A push's gradient being forwarded as it comes in. Thread-compatible: the push's reading
  // thread feeds it. Destroying it pads the stage if Finish was not called, and drops it on the
  // backup unless the push's change named it.
  class Forward {
   public:
    ~Forward();
    Forward(const Forward&) = delete;
    Forward& operator=(const Forward&) = delete;
    // A run of the buffer's values is in place (a ValuesSeen: each value once; the runs of a
    // striped tensor's parts from their lanes' threads at once). Sent once every value before it
    // is in place too.
    void Seen(absl::Span<const float> run);
    // The buffer was read, whole or not (what was not seen then goes as it is, so that the
    // connection stays usable). Waits until the backup holds the stage or refused it, and
    // returns its forward tag if it holds it and every value was seen (for
    // PushSlot::set_forward_tag), 0 otherwise. The buffer may change once this returned.
    uint64_t Finish();
    // The push's change carried the tag (PushOutcome::forward_tag_kept): the backup keeps the
    // stage for that change.
    void Named() { named_ = true; }

   private:
    friend class StageForwarder;
    Forward(StageForwarder* forwarder, int64_t id, absl::Span<const float> buffer)
        : forwarder_(forwarder), id_(id), buffer_(buffer), progress_(buffer.size()) {}
    StageForwarder* const forwarder_;
    const int64_t id_;
    const absl::Span<const float> buffer_;
    FillProgress progress_;
    absl::Mutex mu_;
    int64_t prefix_ ABSL_GUARDED_BY(mu_) = 0;                // values in place from the start
    std::map<int64_t, int64_t> ahead_ ABSL_GUARDED_BY(mu_);  // runs past it: offset -> end
    bool whole_ = false, held_ = false, named_ = false;
    std::thread thread_;  // sends the stage; joined by Finish
  };
  // Starts forwarding `buffer`, which a push's values are read into, if stages go to a backup
  // (ForwardTo), one of their connections sends no other stage, the backup has room, and
  // `buffer` is large enough; null otherwise (the push is replicated as before). `buffer` must
  // stay as it is until Finish returned.
  std::unique_ptr<Forward> Start(absl::Span<const float> buffer);

  // Stages go on `planes` from now on, at `epoch`, for the backup of log attachment `attachment`
  // (not if a newer one's go already); the stages of an earlier one are forgotten.
  void ForwardTo(std::vector<std::shared_ptr<DataConnection>> planes, int64_t epoch,
                 int64_t attachment);
  // None go, if they went to `attachment`'s backup.
  void Stop(int64_t attachment);

  // Whether the backup of `attachment` holds the stage of `tag` (a change carrying it then need
  // not keep its values).
  bool Holds(uint64_t tag, int64_t attachment) const;
  // Whether the backup of `attachment` holds the stage of `tag`, for the change about to name
  // it; false: the change carries its values. The stage counts as held until Used (once that
  // change was answered, `applied` or not).
  bool Name(uint64_t tag, int64_t attachment);
  void Used(uint64_t tag, bool applied);

  // Changes made on the backup naming a stage, so far; the stages being sent now.
  int64_t changes_forwarded() const;
  int stages_sending() const;

 private:
  // Sends `f`'s stage (message `stage`, dropping `dropped` there) on `plane`: Forward's thread.
  void Send(Forward* f, std::shared_ptr<DataConnection> plane, const std::string& stage,
            const std::vector<int64_t>& dropped);
  // Start's part under mu_: the stage message and the connection, or null (not forwarded).
  std::shared_ptr<DataConnection> ClaimLocked(int64_t length, std::string* stage,
                                              std::vector<int64_t>* dropped, int64_t* id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int shard_index_;
  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<DataConnection>> planes_ ABSL_GUARDED_BY(mu_);
  int64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t attachment_ ABSL_GUARDED_BY(mu_) = 0;  // the newest forwarded to
  int64_t next_stage_ ABSL_GUARDED_BY(mu_) = 1;
  // The stages the backup may hold (one being sent on planes_[plane], held, named by a change,
  // or being dropped by a stage sent since), and those of them no change names, dropped with the
  // next stage.
  enum class StageState { kSending, kHeld, kNamed, kDropping };
  struct Staged {
    StageState state = StageState::kHeld;
    int plane = -1;  // while kSending
  };
  std::map<int64_t, Staged> staged_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> drops_ ABSL_GUARDED_BY(mu_);
  int64_t changes_forwarded_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ps
