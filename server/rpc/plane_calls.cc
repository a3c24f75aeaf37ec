#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "server/rpc/payload.h"
#include "server/rpc/service_helpers.h"
#include "transport/grpc_status.h"

// The data plane's calls (transport/data_plane.h): a push or a pull made on a plane connection,
// answered on it. They are let in by the same admission as gRPC's calls (ShardService::Admit, the
// caller's identity from the connection's credential) and share the shard's push-apply
// (ApplyPush) and pull-read (ParameterShard::StartRead) with them.
namespace ps {
namespace {

// What heads the answer to a pull whose values went on the data plane.
inline v1::PullChunk PlanePullHead(const ParameterShard::Snapshot& snapshot, WireType type) {
  v1::PullChunk head;
  head.set_version(snapshot.version);
  head.set_offset(snapshot.offset);
  head.set_dtype(static_cast<v1::DType>(type));
  head.set_data_values(static_cast<int64_t>(snapshot.values.span().size()));
  return head;
}

}  // namespace

// The values of a pull going out on the data plane while the shard copies them (DataPlane::Send
// with a FillProgress), and the shard's answer: they come in either order, from either thread,
// and `done` runs once both did, with the values saturated, or why they did not go ("data plane
// lost": the client pulls over gRPC). The snapshot's buffer must stay alive until then.
class ShardService::PlaneSend {
 public:
  using Done = absl::AnyInvocable<void(grpc::Status lost, int64_t saturated)>;
  // The values must be out kLateGrace after `deadline`, the client's (DataPlane::Send): a pull
  // released at a barrier just before it still goes out (the client drops it) rather than
  // cutting the connection, and a client reading a trickle holds the lane that long at most.
  PlaneSend(DataPlane* plane, uint64_t connection, int owner, uint64_t transfer, WireType type,
            absl::Time deadline)
      : plane_(plane),
        connection_(connection),
        owner_(owner),
        transfer_(transfer),
        type_(type),
        deadline_(deadline + kLateGrace) {}
  static constexpr absl::Duration kLateGrace = absl::Seconds(30);
  // Queues `buffer` as the shard starts copying into it (under the values' lock: it only queues),
  // so that each piece goes out once copied. Returns what the copy tells of its progress; null if
  // the connection is gone. Runs on the thread that then calls Answered, as filling_ and lost_ are
  // written here and read there.
  FillProgress* Start(absl::Span<const float> buffer) {
    filling_ = std::make_shared<FillProgress>(static_cast<int64_t>(buffer.size()));
    absl::Status queued = plane_->Send(
        connection_, owner_, transfer_, filling_, buffer, type_,
        [this](absl::StatusOr<int64_t> sent) {
          {
            absl::MutexLock lock(&mu_);
            sent_ = std::move(sent);
          }
          Event();
        },
        deadline_, filling_.get());
    if (!queued.ok()) {
      lost_ = DataPlaneLostStatus(std::string(queued.message()));
      return nullptr;
    }
    return filling_.get();
  }
  // The shard answered with `values`, its snapshot's: sent now unless they went as copied; `done`
  // runs once they are sent (and may destroy this).
  void Answered(absl::Span<const float> values, Done done) {
    done_ = std::move(done);
    if (filling_ == nullptr && lost_.ok()) {
      if (FillProgress* progress = Start(values)) progress->Add(progress->total());
    }
    Event();
  }

 private:
  // Called once the shard answered and once the plane sent the values: the second runs `done`.
  void Event() {
    absl::StatusOr<int64_t> sent;
    {
      absl::MutexLock lock(&mu_);
      if (++events_ != (lost_.ok() ? 2 : 1)) return;
      sent = sent_;
    }
    Done done = std::move(done_);
    if (!lost_.ok()) {
      done(lost_, 0);
    } else if (!sent.ok()) {
      done(DataPlaneLostStatus(std::string(sent.status().message())), 0);
    } else {
      done(grpc::Status::OK, *sent);
    }
  }

  DataPlane* const plane_;
  const uint64_t connection_;
  const int owner_;
  const uint64_t transfer_;
  const WireType type_;
  const absl::Time deadline_;
  std::shared_ptr<FillProgress> filling_;  // null until the send starts
  grpc::Status lost_;                      // why it could not be queued
  Done done_;
  absl::Mutex mu_;
  int events_ ABSL_GUARDED_BY(mu_) = 0;
  absl::StatusOr<int64_t> sent_ ABSL_GUARDED_BY(mu_) = absl::UnknownError("unsent");
};

grpc::Status ShardService::CheckPlaneCall(const DataPlane::Call& call, uint64_t connection,
                                          uint64_t transfer) {
  if (DataPlane::ReservedOwner(call.owner)) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        "a client's call on a connection of the server's own (a replica peer's)");
  }
  if (connection != call.connection || transfer != call.transfer) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "a call made on the data plane must name its connection and transfer");
  }
  return grpc::Status::OK;
}

DataPlane::CallAnswer ShardService::PushOnPlane(const DataPlane::Call& call,
                                                DataPlane::ReadValues read_values) {
  const absl::Time start = absl::Now();
  DataPlane::CallAnswer answer;
  v1::PushHeader h;
  // As Push: the token (refused before the request is looked at), the replica serves, a place
  // among the streams; then what the header claims.
  Admission admission(call.credential, call.owner);
  answer.status =
      Admit(nullptr, CallNeeds("Push", Access::kWrite).Serving().Limit(&streams_), &admission);
  if (!answer.status.ok()) return answer;
  if (!h.ParseFromString(call.request)) {
    answer.status = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "cannot parse Push header");
  } else if (h.path().shm_segment() != 0 || h.topk_pairs() != 0) {
    answer.status = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 "a push made on the data plane carries its tensor there, "
                                 "uncompressed");
  } else if (h.path().last_piece_first() &&
             (h.dtype() != v1::FLOAT32 || (replica_ != nullptr && replica_->forwards()))) {
    answer.status = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 "a push sent last piece first is float32, to a shard that "
                                 "said it takes one");
  } else {
    answer.status = CheckPlaneCall(call, h.path().data_connection(), h.path().data_transfer());
  }
  if (!answer.status.ok()) {
    shard_->RecordRejectedPush();
    return answer;
  }
  answer.status = Admit(
      nullptr,
      CallNeeds("Push", Access::kWrite).ActsAs(h.worker_id()).ShardIncarnation(h.shard_incarnation()),
      &admission);
  if (!answer.status.ok()) {
    if (!IsShardRestarted(answer.status)) shard_->RecordRejectedPush();
    return answer;
  }
  v1::PushResponse response;
  answer.status = ApplyPush(
      h,
      std::make_unique<PlaneCallPayload>(
          read_values, h.path().last_piece_first() ? ValuesOrder::kLastPieceFirst : ValuesOrder::kInOrder),
      start, &response);
  if (answer.status.ok()) answer.status = WaitReplicated(call.deadline);
  if (answer.status.ok()) answer.response = response.SerializeAsString();
  return answer;
}

// A Pull made on the data plane (DataPlane::Call), once checked: waits (without a thread) for
// the shard to admit it, sends the values on the plane as they are copied, then answers with what
// heads a gRPC Pull's answer. Deletes itself once it answered.
class ShardService::PlanePull {
 public:
  PlanePull(ShardService* service, const DataPlane::Call& call, WireType type,
            Admission admission, DataPlane::Answer answer)
      : service_(service),
        id_(service->HoldPlanePull(call.connection)),
        type_(type),
        admission_(std::move(admission)),
        answer_(std::move(answer)),
        plane_(service->data_plane_, call.connection, call.owner, call.transfer, type,
               call.deadline) {}

  void Start(const v1::PullRequest& r, absl::Time deadline) {
    ParameterShard::ReadRequest read = ReadOf(r, deadline);
    read.filling = [this](absl::Span<const float> buffer) { return plane_.Start(buffer); };
    // `this` may be gone once StartRead returned (answered at once, or meanwhile).
    ShardService* const service = service_;
    const int64_t id = id_;
    const int64_t ticket = service->shard_->StartRead(
        std::move(read),
        [this](absl::StatusOr<ParameterShard::Snapshot> s) { OnAnswer(std::move(s)); });
    if (ticket != 0) service->PlanePullWaits(id, ticket);
  }

 private:
  void OnAnswer(absl::StatusOr<ParameterShard::Snapshot> answer) {
    if (!answer.ok()) {
      Finish({ToGrpcStatus(answer.status()), ""});
      return;
    }
    snapshot_.emplace(*std::move(answer));
    plane_.Answered(snapshot_->values.span(), [this](grpc::Status lost, int64_t saturated) {
      if (!lost.ok()) {
        Finish({lost, ""});
        return;
      }
      service_->NoteSaturated(saturated, type_);
      service_->data_plane_pulls_.fetch_add(1, std::memory_order_relaxed);
      service_->RecordPull(static_cast<int64_t>(snapshot_->values.span().size()) * WireBytes(type_),
                           start_);
      Finish({grpc::Status::OK, PlanePullHead(*snapshot_, type_).SerializeAsString()});
    });
  }
  void Finish(DataPlane::CallAnswer a) {
    service_->ForgetPlanePull(id_);
    DataPlane::Answer answer = std::move(answer_);
    delete this;
    answer(std::move(a));
  }

  ShardService* const service_;
  const int64_t id_;  // among the service's plane pulls
  const WireType type_;
  const absl::Time start_ = absl::Now();
  const Admission admission_;  // its place among the shard's pulls in progress
  DataPlane::Answer answer_;
  std::optional<ParameterShard::Snapshot> snapshot_;
  PlaneSend plane_;
};

void ShardService::PullOnPlane(const DataPlane::Call& call, DataPlane::Answer answer) {
  // As Pull: the token and a place among the pulls (a worker's own token, and the observers and
  // operator together, under their cap), then what the request claims. A connection's calls are
  // read one at a time, but a held pull's answer comes later, holding its place until then.
  Admission admission(call.credential, call.owner);
  v1::PullRequest r;
  WireType type = WireType::kFloat32;
  grpc::Status checked =
      Admit(nullptr, CallNeeds("Pull", Access::kRead).Limit(&pulls_), &admission);
  if (checked.ok() && !r.ParseFromString(call.request)) {
    checked = InvalidArgument("cannot parse Pull request");
  }
  if (checked.ok()) {
    checked = CheckPlaneCall(call, r.path().data_connection(), r.path().data_transfer());
  }
  if (checked.ok()) {
    checked = Admit(nullptr, CallNeeds("Pull", Access::kRead).ActsAs(r.worker_id()), &admission);
  }
  if (checked.ok() && r.dtype() != v1::DTYPE_UNSPECIFIED) {
    absl::StatusOr<WireType> t = WireTypeOfDType(r.dtype());
    checked = ToGrpcStatus(t.status());
    if (t.ok()) type = *t;
  }
  if (checked.ok()) {
    checked = Admit(
        nullptr,
        CallNeeds("Pull", Access::kRead).Serving().ShardIncarnation(r.shard_incarnation()),
        &admission);
  }
  if (checked.ok() && (r.compress() != v1::DTYPE_UNSPECIFIED || r.path().shm_segment() != 0)) {
    checked = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                           "a pull made on the data plane takes its values there, uncompressed");
  }
  if (!checked.ok()) {
    answer({checked, ""});
    return;
  }
  (new PlanePull(this, call, type, std::move(admission), std::move(answer)))
      ->Start(r, AnswerBy(call.deadline));
}

int64_t ShardService::HoldPlanePull(uint64_t connection) {
  absl::MutexLock lock(&plane_pulls_mu_);
  const int64_t id = next_plane_pull_++;
  plane_pulls_[id].connection = connection;
  return id;
}

void ShardService::PlanePullWaits(int64_t id, int64_t ticket) {
  {
    absl::MutexLock lock(&plane_pulls_mu_);
    auto it = plane_pulls_.find(id);
    if (it == plane_pulls_.end()) return;  // answered already
    it->second.ticket = ticket;
    if (!it->second.ended) return;
  }
  shard_->CancelRead(ticket);  // its connection ended before its ticket was known
}

void ShardService::ForgetPlanePull(int64_t id) {
  absl::MutexLock lock(&plane_pulls_mu_);
  plane_pulls_.erase(id);
}

void ShardService::PlanePullEnded(uint64_t connection) {
  std::vector<int64_t> held;
  {
    absl::MutexLock lock(&plane_pulls_mu_);
    for (auto& [id, pull] : plane_pulls_) {
      if (pull.connection != connection) continue;
      pull.ended = true;
      if (pull.ticket != 0) held.push_back(pull.ticket);
    }
  }
  // Each answered CANCELLED (an answer no one reads now); a ticket answered meanwhile is no
  // longer the shard's to cancel.
  for (int64_t ticket : held) shard_->CancelRead(ticket);
}

}  // namespace ps
