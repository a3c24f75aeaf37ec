#include "server/replication/stage_forwarder.h"

#include <string>
#include <system_error>
#include <utility>

#include "common/log.h"
#include "proto/ps.pb.h"
#include "transport/grpc_status.h"

namespace ps {
namespace {

// A stage goes as its push comes in: that push's own time (its call's deadline, a minute at
// most) and then the change's.
constexpr absl::Duration kStageTimeout = absl::Seconds(90);

}  // namespace

std::shared_ptr<DataConnection> StageForwarder::ClaimLocked(int64_t length, std::string* stage,
                                                            std::vector<int64_t>* dropped,
                                                            int64_t* id) {
  std::vector<bool> free(planes_.size(), true);
  for (const std::shared_ptr<DataConnection>& p : planes_) {
    if (p->ended()) return nullptr;  // a stage failed: none until a backup joins again
  }
  for (const auto& [staged_id, staged] : staged_) {
    if (staged.state == StageState::kSending) free[staged.plane] = false;
  }
  const auto first_free = std::find(free.begin(), free.end(), true);
  if (first_free == free.end()) return nullptr;
  // What the backup may hold once this stage's drops are done there (the drops of a stage still
  // being sent count: this one may come before it).
  const size_t room = StageRoom(static_cast<int>(planes_.size()));
  if (staged_.size() - drops_.size() >= room) return nullptr;
  const int index = static_cast<int>(first_free - free.begin());
  v1::ReplicationMessage m;
  m.set_epoch(epoch_);
  v1::Stage* s = m.mutable_stage();
  *id = next_stage_++;
  s->set_id(*id);
  s->set_length(length);
  for (int64_t drop : drops_) {
    s->add_drop(drop);
    staged_[drop].state = StageState::kDropping;
  }
  *dropped = std::move(drops_);
  drops_.clear();
  staged_[*id] = {StageState::kSending, index};
  *stage = m.SerializeAsString();
  return planes_[index];
}

std::unique_ptr<StageForwarder::Forward> StageForwarder::Start(absl::Span<const float> buffer) {
  if (buffer.size() * sizeof(float) < kMinForwardBytes) return nullptr;
  std::shared_ptr<DataConnection> plane;
  std::string stage;
  std::vector<int64_t> dropped;
  std::unique_ptr<Forward> forward;
  {
    absl::MutexLock lock(&mu_);
    int64_t id = 0;
    plane = ClaimLocked(static_cast<int64_t>(buffer.size()), &stage, &dropped, &id);
    if (plane == nullptr) return nullptr;
    forward.reset(new Forward(this, id, buffer));
  }
  Forward* f = forward.get();
  try {
    f->thread_ = std::thread(
        [this, f, plane, stage = std::move(stage), dropped] { Send(f, plane, stage, dropped); });
  } catch (const std::system_error&) {  // no thread: as if not forwarded
    absl::MutexLock lock(&mu_);
    staged_.erase(f->id_);
    for (int64_t id : dropped) {  // still held there, to drop with the next stage
      auto it = staged_.find(id);
      if (it == staged_.end()) continue;  // forgotten with that backup meanwhile
      it->second.state = StageState::kHeld;
      drops_.push_back(id);
    }
    return nullptr;
  }
  return forward;
}

void StageForwarder::Send(Forward* f, std::shared_ptr<DataConnection> plane,
                          const std::string& stage, const std::vector<int64_t>& dropped) {
  absl::StatusOr<DataConnection::Answered> answered =
      plane->PushCall(plane->NextTransfer(), stage, f->buffer_, WireType::kFloat32,
                      absl::Now() + kStageTimeout, FrameKind::kChangeCall, &f->progress_);
  const absl::Status status = answered.ok() ? FromGrpcStatus(answered->status) : answered.status();
  absl::MutexLock lock(&mu_);
  auto it = staged_.find(f->id_);
  if (it == staged_.end()) return;               // forwarded to an earlier backup
  for (int64_t id : dropped) staged_.erase(id);  // (or given up with the connections below)
  if (status.ok()) {
    it->second.state = StageState::kHeld;
    f->held_ = true;
    return;
  }
  // Whether the backup holds it is not known (an answer that did not come): every stage
  // connection is given up (stages held are still named; those no change names stay on the
  // backup until it joins again, StageRoom at most).
  staged_.erase(it);
  if (std::any_of(planes_.begin(), planes_.end(),
                  [](const auto& p) { return !p->ended(); })) {  // (else said already)
    PS_LOG(WARNING) << "shard " << shard_index_ << ": the backup did not take a forwarded "
                    << "push (" << status.message() << "); pushes are replicated once "
                    << "applied until a backup joins again";
  }
  for (const std::shared_ptr<DataConnection>& p : planes_) p->End();
}

void StageForwarder::Forward::Seen(absl::Span<const float> run) {
  const int64_t offset = run.data() - buffer_.data();
  absl::MutexLock lock(&mu_);
  if (offset != prefix_) {
    ahead_.emplace(offset, offset + static_cast<int64_t>(run.size()));
    return;
  }
  const int64_t before = prefix_;
  prefix_ += static_cast<int64_t>(run.size());
  for (auto it = ahead_.begin(); it != ahead_.end() && it->first == prefix_;) {
    prefix_ = it->second;
    it = ahead_.erase(it);
  }
  progress_.Add(prefix_ - before);
}

uint64_t StageForwarder::Forward::Finish() {
  if (thread_.joinable()) {
    {
      absl::MutexLock lock(&mu_);
      whole_ = prefix_ == progress_.total();
      progress_.Add(progress_.total() - prefix_);  // what did not come goes as it is
    }
    thread_.join();
  }
  return held_ && whole_ ? static_cast<uint64_t>(id_) : 0;
}

StageForwarder::Forward::~Forward() {
  Finish();
  if (!held_ || named_) return;  // (one not whole is never named)
  absl::MutexLock lock(&forwarder_->mu_);
  if (forwarder_->staged_.count(id_) != 0) forwarder_->drops_.push_back(id_);
}

void StageForwarder::ForwardTo(std::vector<std::shared_ptr<DataConnection>> planes, int64_t epoch,
                               int64_t attachment) {
  absl::MutexLock lock(&mu_);
  if (attachment < attachment_) return;  // an older backup's that ended late
  planes_ = std::move(planes);
  epoch_ = epoch;
  attachment_ = attachment;
  staged_.clear();
  drops_.clear();
}

void StageForwarder::Stop(int64_t attachment) {
  absl::MutexLock lock(&mu_);
  if (attachment != attachment_) return;  // another backup's
  planes_.clear();
  staged_.clear();
  drops_.clear();
}

bool StageForwarder::Holds(uint64_t tag, int64_t attachment) const {
  absl::MutexLock lock(&mu_);
  auto it = staged_.find(static_cast<int64_t>(tag));
  return attachment == attachment_ && it != staged_.end() && it->second.state == StageState::kHeld;
}

bool StageForwarder::Name(uint64_t tag, int64_t attachment) {
  absl::MutexLock lock(&mu_);
  auto it = staged_.find(static_cast<int64_t>(tag));
  if (attachment != attachment_ || it == staged_.end() || it->second.state != StageState::kHeld) {
    return false;
  }
  it->second.state = StageState::kNamed;
  return true;
}

void StageForwarder::Used(uint64_t tag, bool applied) {
  absl::MutexLock lock(&mu_);
  staged_.erase(static_cast<int64_t>(tag));
  changes_forwarded_ += applied;
}

int64_t StageForwarder::changes_forwarded() const {
  absl::MutexLock lock(&mu_);
  return changes_forwarded_;
}

int StageForwarder::stages_sending() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(std::count_if(staged_.begin(), staged_.end(), [](const auto& s) {
    return s.second.state == StageState::kSending;
  }));
}

}  // namespace ps
