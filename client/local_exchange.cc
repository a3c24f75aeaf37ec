#include "client/local_exchange.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace ps {

absl::StatusOr<std::unique_ptr<LocalExchange>> LocalExchange::Create(ShardedClient* client,
                                                                     LocalModel* model,
                                                                     Hooks hooks) {
  absl::StatusOr<ConsistencySpec> spec = ParseConsistencySpec(client->consistency());
  if (!spec.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the shards run ", spec.status().message(), " (registered?)"));
  }
  if (!spec->local_models()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the shards run ", client->consistency(), ": workers train no local model to exchange"));
  }
  if (spec->kind == ConsistencySpec::Kind::kEasgd && !(spec->alpha > 0)) {
    return absl::FailedPreconditionError(
        absl::StrCat("the shards run ", client->consistency(), " and name no alpha"));
  }
  const int64_t n = client->model().total_params;
  if (static_cast<int64_t>(model->values().size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat("the local model has ", model->values().size(),
                                                   " values; the shards' has ", n));
  }
  return std::unique_ptr<LocalExchange>(
      new LocalExchange(client, model, *std::move(spec), std::move(hooks)));
}

LocalExchange::LocalExchange(ShardedClient* client, LocalModel* model, ConsistencySpec spec,
                             Hooks hooks)
    : client_(client),
      model_(model),
      spec_(spec),
      hooks_(std::move(hooks)),
      centre_(spec.kind == ConsistencySpec::Kind::kEasgd ? model->values().size() : 0),
      out_(model->values().size()) {}

absl::Status LocalExchange::StartBeforeStep(int64_t step) {
  if (absl::Status s = CheckIdle(); !s.ok()) return s;
  exchanged_ = Exchanged();
  step_ = step;
  if (!started_) return StartPull(/*elastic=*/false);
  if (step % spec_.period != 0) return absl::OkStatus();
  return StartPull(/*elastic=*/spec_.kind == ConsistencySpec::Kind::kEasgd);
}

absl::Status LocalExchange::StartAfterStep(int64_t step, bool last) {
  if (absl::Status s = CheckIdle(); !s.ok()) return s;
  exchanged_ = Exchanged();
  step_ = step;
  if (spec_.kind != ConsistencySpec::Kind::kLocalSgd || !((step + 1) % spec_.period == 0 || last)) {
    return absl::OkStatus();
  }
  model_->Change(absl::MakeSpan(out_));
  return StartPush();
}

absl::Status LocalExchange::CheckIdle() const {
  if (pull_.valid() || push_.valid()) {
    return absl::FailedPreconditionError("an exchange is in progress: wait for it first");
  }
  return absl::OkStatus();
}

absl::Status LocalExchange::StartPull(bool elastic) {
  failed_call_ = "pull";
  if (hooks_.before_pull) {
    if (absl::Status s = hooks_.before_pull(); !s.ok()) return s;
  }
  elastic_ = elastic;
  call_start_ = absl::Now();
  pull_ = client_->StartPull(elastic ? absl::MakeSpan(centre_) : model_->values());
  pull_.SendAll();  // waited for whole: every shard's part at once, as ShardedClient::Pull
  return absl::OkStatus();
}

absl::Status LocalExchange::StartPush() {
  failed_call_ = "push";
  if (hooks_.before_push) {
    if (absl::Status s = hooks_.before_push(); !s.ok()) return s;
  }
  call_start_ = absl::Now();
  push_ = client_->StartPush(out_, /*sequence=*/step_);
  return absl::OkStatus();
}

std::optional<absl::Status> LocalExchange::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  if (pull_.valid()) {
    if (!pull_.Done(timeout)) return std::nullopt;
    absl::StatusOr<ShardedClient::Versions> pulled = pull_.Wait();
    exchanged_.pulled = true;
    exchanged_.pull_time = absl::Now() - call_start_;
    if (!pulled.ok()) return Failed("pull", pulled.status());
    if (absl::Status s = Pulled(); !s.ok()) return s;
  }
  if (push_.valid()) {
    if (!push_.Done(deadline - absl::Now())) return std::nullopt;
    absl::StatusOr<ShardedClient::PushSummary> pushed = push_.Wait();
    exchanged_.pushed = true;
    exchanged_.push_time = absl::Now() - call_start_;
    if (!pushed.ok()) return Failed("push", pushed.status());
    exchanged_.push = *pushed;
  }
  return absl::OkStatus();
}

absl::Status LocalExchange::Pulled() {
  if (!elastic_) {
    model_->Restart();
    started_ = true;
    return absl::OkStatus();
  }
  model_->Elastic(centre_, static_cast<float>(spec_.alpha), absl::MakeSpan(out_));
  return StartPush();
}

absl::Status LocalExchange::Failed(const char* call, absl::Status status) {
  failed_call_ = call;
  return status;
}

absl::Status LocalExchange::BeforeStep(int64_t step) {
  if (absl::Status s = StartBeforeStep(step); !s.ok()) return s;
  return *Wait(absl::InfiniteDuration());
}

absl::Status LocalExchange::AfterStep(int64_t step, bool last) {
  if (absl::Status s = StartAfterStep(step, last); !s.ok()) return s;
  return *Wait(absl::InfiniteDuration());
}

}  // namespace ps
