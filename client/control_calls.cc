#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/sharded_client_impl.h"
#include "common/consistency_spec.h"
#include "common/shutdown.h"
#include "common/version.h"

namespace ps {
absl::StatusOr<int64_t> ShardedClient::Impl::Register() {
  if (model_.num_shards != num_shards()) {
    return absl::InvalidArgumentError(absl::StrCat("model expects ", model_.num_shards, " shards, ",
                                                   num_shards(), " addresses given"));
  }
  std::vector<bool> ask(num_shards(), true);
  for (int pass = 0;; ++pass) {
    absl::Status s = ForEachShard([&](int shard, grpc::ClientContext* context) {
      if (!ask[shard]) return AttemptEnd();
      return AttemptEnd::FromShard(sessions_[shard]->Register(
          context, /*resume_sequence=*/-1, attempts_.AttempterFor(shard, attempts_.generation())));
    });
    if (!s.ok()) return s;
    // Shards without the model beside trained ones: some shard lost its state (a restart without
    // its checkpoints). Initialising it would silently reset part of the model. Or this client
    // asked them before the job's first worker initialised them, and the others once it had
    // trained: those are asked once more (one that lost its model still has none).
    int64_t trained = 0;
    std::vector<int> empty;
    for (int i = 0; i < num_shards(); ++i) {
      const ShardSession::State state = sessions_[i]->state();
      if (!state.initialized) empty.push_back(i);
      trained = std::max(trained, state.version);
      ask[i] = !state.initialized;
    }
    if (empty.empty() || trained == 0) break;
    if (pass > 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("shard(s) ", absl::StrJoin(empty, ","),
                       " hold no model while the others are trained (up "
                       "to version ",
                       trained, "): a shard restarted without its checkpoints. ", kLostModelFix));
    }
  }
  consistency_ = sessions_[0]->state().consistency;
  std::vector<int64_t> last;
  for (const auto& session : sessions_) last.push_back(session->state().last_sequence);
  // In rounds (sync, local) a step that reached only some shards is not sent again: its round has
  // closed (the others would drop it as late), and a duplicate on one shard with a contribution
  // on another would put this worker in different rounds on different shards, which deadlocks the
  // barrier.
  absl::StatusOr<ConsistencySpec> spec = ParseConsistencySpec(consistency_);
  const bool rounds = spec.ok() && spec->rounds();
  const int64_t next = (rounds ? *std::max_element(last.begin(), last.end())
                               : *std::min_element(last.begin(), last.end())) +
                       1;
  absl::MutexLock steps_lock(&steps_->mu);
  steps_->next = next;
  return next;
}

absl::StatusOr<int> ShardedClient::Impl::Initialize(absl::Span<const float> params) {
  std::vector<int> applied(num_shards(), 0);
  absl::Status s = ForEachShard([&](int shard, grpc::ClientContext* context) {
    const Range& r = ranges_[shard];
    v1::InitializeHeader header;
    *header.mutable_model() = ModelProto();
    header.set_offset(r.begin);
    header.set_length(r.size());
    header.set_dtype(v1::FLOAT32);
    v1::InitializeResponse response;
    grpc::Status status = sessions_[shard]->current_replica().rpc->Initialize(
        header, params.subspan(r.begin, r.size()), context, &response);
    applied[shard] = response.applied();
    return AttemptEnd::FromShard(status);
  });
  if (!s.ok()) return s;
  return static_cast<int>(std::count(applied.begin(), applied.end(), 1));
}

absl::StatusOr<std::vector<v1::StatsResponse>> ShardedClient::Impl::Stats() {
  std::vector<v1::StatsResponse> stats(num_shards());
  std::vector<int> last(num_shards(), -1);  // by shard: the highest worker id taken so far
  // One request serves every shard; shards know different workers, so a page goes on from the
  // lowest id where some shard's page ended, and each shard's workers already taken are skipped.
  for (int first = 0; first >= 0;) {
    v1::StatsRequest request;
    request.set_first_worker(first);
    StampRelease(&request);
    absl::StatusOr<std::vector<v1::StatsResponse>> pages =
        CallEachShard(&v1::ParameterServer::Stub::GetStats, request);
    if (!pages.ok()) return pages.status();
    int next = -1;
    for (int shard = 0; shard < num_shards(); ++shard) {
      v1::StatsResponse& page = (*pages)[shard];
      if (absl::Status s = CheckRelease(page, "shard", "client"); !s.ok()) return s;
      if (first == 0) {
        stats[shard] = page;
        stats[shard].clear_workers();
      }
      for (const v1::WorkerStats& w : page.workers()) {
        if (w.worker_id() <= last[shard]) continue;
        *stats[shard].add_workers() = w;
        last[shard] = w.worker_id();
      }
      if (page.next_worker() > first && (next < 0 || page.next_worker() < next)) {
        next = page.next_worker();
      }
    }
    first = next;
  }
  for (v1::StatsResponse& s : stats) s.set_next_worker(-1);
  return stats;
}

absl::StatusOr<int64_t> ShardedClient::Register() { return impl_->Register(); }

absl::StatusOr<int> ShardedClient::Initialize(absl::Span<const float> params) {
  return impl_->Initialize(params);
}

absl::StatusOr<std::vector<v1::StatsResponse>> ShardedClient::Stats() { return impl_->Stats(); }

absl::StatusOr<std::vector<v1::CheckpointResponse>> ShardedClient::Checkpoint() {
  return impl_->CallEachShard(&v1::ParameterServer::Stub::Checkpoint, v1::CheckpointRequest());
}

absl::Status ShardedClient::Heartbeat(absl::Duration timeout) {
  return impl_->TellEachShard(timeout, &v1::ParameterServer::Stub::Heartbeat);
}

absl::Status ShardedClient::Leave(absl::Duration timeout) {
  return impl_->TellEachShard(timeout, &v1::ParameterServer::Stub::Leave);
}

CancelOnShutdown::CancelOnShutdown(ShardedClient* client)
    : thread_([client] {
        WaitForShutdown(absl::InfiniteDuration());
        client->CancelPending();
      }) {}

void CancelOnShutdown::Join() {
  if (!thread_.joinable()) return;
  RequestShutdown();
  thread_.join();
}

}  // namespace ps
