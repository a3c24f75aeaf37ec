// A shard's durability: at start it resumes the shard from the newest valid checkpoint in its
// directory and says how many updates the previous process applied after it (from the progress
// file beside the checkpoints); then it writes checkpoints on its own thread: one as soon as a
// shard that started empty is initialised, then every `every` and/or as soon as `updates`
// updates were applied since the last one, and a last one at Stop(). A checkpoint copies the
// shard under its lock and writes outside it.
// Thread-safe; OnUpdate is meant for the shard's change listener (with the change's version).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/checkpoints/checkpoint_store.h"
#include "server/checkpoints/progress_file.h"
#include "server/state/parameter_shard.h"

namespace ps {

class Checkpointer {
 public:
  struct Options {
    std::string dir;
    int keep = 3;                                 // newest checkpoints kept
    absl::Duration every = absl::ZeroDuration();  // zero: no timed checkpoints
    int64_t updates = 0;                          // 0: none by update count
  };
  // Where a shard resumed from.
  struct Resumed {
    int64_t version = -1;       // of the checkpoint; -1: none (the shard starts empty)
    int64_t updates_lost = -1;  // applied after it by the previous process; -1: unknown
  };

  // Creates the directory if missing and opens the shard's progress file there; fails naming
  // the problem.
  static absl::StatusOr<std::unique_ptr<Checkpointer>> Open(const Options& options,
                                                            int shard_index);
  ~Checkpointer() { Stop(); }

  // Records a new version, or the initialisation (version 0): progress file; wakes the writer
  // when a checkpoint is due. Cheap.
  void OnUpdate(int64_t version);
  // Resumes `shard` (not initialised yet) from the newest valid checkpoint, if any, logging what
  // it found, then starts writing checkpoints of it. `shard` must outlive Stop(). Call once.
  absl::StatusOr<Resumed> Start(ParameterShard* shard);
  // Stops the writer and writes a last checkpoint (if the shard changed since the last one).
  // Idempotent; final_status() says whether that last checkpoint was written.
  void Stop();
  // After Stop(): OK if its last checkpoint was written or none was needed (the shard unchanged
  // since the last one written, or never initialised); else FAILED_PRECONDITION with one line
  // naming the version, the directory and the store's error. OK before Stop().
  absl::Status final_status() const ABSL_LOCKS_EXCLUDED(mu_);

  // What became of the checkpoints this process tried to write (GetStats, metrics): failures are
  // otherwise only log lines, and a shard could run for hours saving nothing.
  struct Health {
    int64_t failures = 0;    // checkpoints that could not be written (every cause, every caller)
    std::string last_error;  // the last failure's; "" if none
    int64_t last_written_version = -1;  // the newest this process wrote; -1: none yet
    absl::Time last_written_time = absl::InfinitePast();
  };
  Health health() const ABSL_LOCKS_EXCLUDED(mu_);
  const std::string& dir() const { return options_.dir; }

  // A checkpoint written now, unless the newest one written already holds the shard's version
  // (psctl checkpoint): its version and file ("" when none was written). FAILED_PRECONDITION
  // before Start or while the shard is not initialised; the store's error when writing fails.
  // Calls wait for each other and for the writer thread, and must end before Stop() (the shard
  // may be gone after it).
  struct Written {
    int64_t version = 0;
    std::string path;
  };
  absl::StatusOr<Written> WriteNow();

 private:
  Checkpointer(const Options& options, int shard_index, std::unique_ptr<ProgressFile> progress);
  void WriterLoop();
  // Writes a checkpoint unless the shard is unchanged since the last one (WriteNow's contract;
  // failures are logged too). One at a time.
  absl::StatusOr<Written> Write() ABSL_LOCKS_EXCLUDED(write_mu_, mu_);

  const Options options_;
  CheckpointStore store_;
  const std::unique_ptr<ProgressFile> progress_;
  ParameterShard* shard_ = nullptr;
  absl::Mutex write_mu_;  // held while a checkpoint is written (the writer thread, WriteNow)
  // Reused: after the first, a checkpoint copies into mapped memory.
  ShardState buffer_ ABSL_GUARDED_BY(write_mu_);
  mutable absl::Mutex mu_;
  int64_t latest_ ABSL_GUARDED_BY(mu_) = 0;    // the shard's version, from OnUpdate
  int64_t written_ ABSL_GUARDED_BY(mu_) = -1;  // of the last checkpoint written or resumed from
  bool changed_ ABSL_GUARDED_BY(mu_) = false;  // an OnUpdate since the writer last looked
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  Health health_ ABSL_GUARDED_BY(mu_);
  absl::Status final_status_ ABSL_GUARDED_BY(mu_);
  std::thread writer_;
};

}  // namespace ps
