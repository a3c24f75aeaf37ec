#include "server/checkpoints/checkpointer.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace ps {

absl::StatusOr<std::unique_ptr<Checkpointer>> Checkpointer::Open(const Options& options,
                                                                 int shard_index) {
  std::error_code error;
  std::filesystem::create_directories(options.dir, error);
  if (error)
    return absl::InternalError(absl::StrCat("cannot create ", options.dir, ": ", error.message()));
  absl::StatusOr<std::unique_ptr<ProgressFile>> progress =
      ProgressFile::Open(absl::StrCat(options.dir, "/shard-", shard_index, ".progress"));
  if (!progress.ok()) return progress.status();
  return std::unique_ptr<Checkpointer>(
      new Checkpointer(options, shard_index, *std::move(progress)));
}

Checkpointer::Checkpointer(const Options& options, int shard_index,
                           std::unique_ptr<ProgressFile> progress)
    : options_(options),
      store_(options.dir, shard_index, options.keep),
      progress_(std::move(progress)) {}

void Checkpointer::OnUpdate(int64_t version) {
  progress_->Set(version);
  absl::MutexLock lock(&mu_);
  latest_ = version;
  changed_ = true;
}

absl::StatusOr<Checkpointer::Resumed> Checkpointer::Start(ParameterShard* shard) {
  shard_ = shard;
  const int64_t reached = progress_->previous();
  absl::StatusOr<std::optional<ShardState>> newest = store_.LoadNewest();
  if (!newest.ok()) return newest.status();
  Resumed resumed;
  if (!newest->has_value()) {
    if (reached > 0) {
      PS_LOG(WARNING) << "the previous process of this shard reached version " << reached
                      << " but left no valid checkpoint in " << options_.dir
                      << ": starting empty. Workers of a job whose other shards are trained "
                         "will refuse this shard.";
    }
  } else {
    if (absl::Status s = shard->Restore(**newest); !s.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot resume from ", options_.dir, ": ", s.message()));
    }
    resumed.version = (*newest)->header.version();
    if (reached >= resumed.version) {
      resumed.updates_lost = reached - resumed.version;
      PS_LOG(INFO) << "resumed from the checkpoint at version " << resumed.version << " in "
                   << options_.dir << "; the previous process had reached version " << reached
                   << ": " << resumed.updates_lost << " update(s) lost";
    } else {
      PS_LOG(WARNING) << "resumed from the checkpoint at version " << resumed.version << " in "
                      << options_.dir << "; updates lost unknown (the progress file says "
                      << reached << ", older than the checkpoint: did the host go down?)";
    }
  }
  // The progress file keeps the previous process's version until this one applies an update:
  // if it dies before that, the same updates are still lost.
  {
    absl::MutexLock lock(&mu_);
    latest_ = std::max<int64_t>(resumed.version, 0);
    written_ = resumed.version;
  }
  writer_ = std::thread([this] { WriterLoop(); });
  return resumed;
}

void Checkpointer::WriterLoop() {
  absl::Time next = absl::Now() + options_.every;
  absl::MutexLock lock(&mu_);
  for (;;) {
    // Due: the first state of a shard that started empty, or `updates` more updates.
    auto due = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ ||
             (changed_ &&
              (written_ < 0 || (options_.updates > 0 && latest_ >= written_ + options_.updates)));
    };
    mu_.AwaitWithDeadline(absl::Condition(&due),
                          options_.every > absl::ZeroDuration() ? next : absl::InfiniteFuture());
    if (stopping_) return;
    changed_ = false;
    mu_.Unlock();
    absl::StatusOr<Written> written = Write();
    // Not initialised: nothing to keep yet, not a failure.
    const bool failed =
        !written.ok() && written.status().code() != absl::StatusCode::kFailedPrecondition;
    mu_.Lock();
    // After a failure (logged), wait a second rather than retry at once.
    if (failed) mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Seconds(1));
    next = absl::Now() + options_.every;
  }
}

absl::StatusOr<Checkpointer::Written> Checkpointer::WriteNow() {
  if (shard_ == nullptr) return absl::FailedPreconditionError("the checkpointer has not started");
  return Write();
}

absl::StatusOr<Checkpointer::Written> Checkpointer::Write() {
  absl::MutexLock writing(&write_mu_);
  absl::Time start = absl::Now();
  const int64_t version = shard_->version();  // not under mu_: OnUpdate takes mu_ under the
  {                                           // shard's lock
    absl::MutexLock lock(&mu_);
    if (version == written_) return Written{version, ""};
  }
  if (absl::Status s = shard_->Checkpoint(&buffer_); !s.ok()) return s;  // not initialised
  absl::Duration copy = absl::Now() - start;
  absl::StatusOr<std::string> path = store_.Write(buffer_);  // outside the shard's lock
  if (!path.ok()) {
    PS_LOG(ERROR) << "checkpoint failed: " << path.status().message();
    absl::MutexLock lock(&mu_);
    ++health_.failures;
    health_.last_error = std::string(path.status().message());
    return path.status();
  }
  PS_LOG(INFO) << "checkpoint at version " << buffer_.header.version() << " written to " << *path
               << " in " << absl::Now() - start << " (" << copy << " of it copying under the lock)";
  absl::MutexLock lock(&mu_);
  written_ = buffer_.header.version();
  health_.last_written_version = buffer_.header.version();
  health_.last_written_time = absl::Now();
  return Written{buffer_.header.version(), *path};
}

void Checkpointer::Stop() {
  if (!writer_.joinable()) return;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  writer_.join();
  absl::StatusOr<Written> last = Write();  // a failure is logged and counted
  if (!last.ok() && last.status().code() != absl::StatusCode::kFailedPrecondition) {
    absl::MutexLock lock(&mu_);
    final_status_ = absl::FailedPreconditionError(
        absl::StrCat("the last checkpoint (version ", latest_, ") could not be written to ",
                     options_.dir, ": ", last.status().message(),
                     written_ >= 0 ? absl::StrCat("; the newest valid one holds version ", written_)
                                   : std::string("; no valid checkpoint holds this shard")));
  }
}

absl::Status Checkpointer::final_status() const {
  absl::MutexLock lock(&mu_);
  return final_status_;
}

Checkpointer::Health Checkpointer::health() const {
  absl::MutexLock lock(&mu_);
  return health_;
}

}  // namespace ps
