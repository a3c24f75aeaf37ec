#include "client/sharded_client.h"

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/grpc_path.h"
#include "client/pull_fill.h"
#include "client/sharded_client_impl.h"
#include "common/cluster.h"
#include "common/partition.h"

namespace ps {

void ShardedClient::FillFrom(PushFill& fill, Call& call, int64_t from) {
  for (int shard : fill.From(from)) call.Send(shard);
}
void ShardedClient::FillFinal(PushFill* fill, int shard) {
  if (fill != nullptr) fill->Final(shard);
}
void ShardedClient::FillStop(PushFill* fill) {
  if (fill != nullptr) fill->Stop();
}

absl::Status ShardedClient::Await(Call& call) { return call.Wait(); }
bool ShardedClient::Ended(Call& call, absl::Duration timeout) { return call.Ended(timeout); }
std::optional<absl::Status> ShardedClient::AwaitPart(Call& call, int shard,
                                                     absl::Duration timeout) {
  return call.WaitFor(shard, timeout);
}
std::optional<absl::Status> ShardedClient::AwaitValues(Call& call, PullFill& fill, int64_t begin,
                                                       int64_t end, absl::Duration timeout) {
  const int64_t total = fill.ranges().empty() ? 0 : fill.ranges().back().end;
  if (begin < 0 || begin > end || end > total) {
    return absl::InvalidArgumentError(
        absl::StrCat("values [", begin, ", ", end, ") are not within the pull's ", total));
  }
  if (begin == end) return absl::OkStatus();
  const absl::Time deadline = absl::Now() + timeout;
  for (int shard = 0; shard < static_cast<int>(fill.ranges().size()); ++shard) {
    const Range& r = fill.ranges()[shard];
    if (r.end <= begin || end <= r.begin) continue;
    // A part comes from its start: values up to min(end, r.end) of it.
    if (fill.WaitFor(shard, std::min(end, r.end) - r.begin, deadline - absl::Now()) ==
        PullFill::Found::kInPlace) {
      continue;
    }
    std::optional<absl::Status> part = call.WaitFor(shard, deadline - absl::Now());
    if (!part.has_value() || !part->ok()) return part;
  }
  return absl::OkStatus();
}
void ShardedClient::SendPart(Call& call, int shard) { call.Send(shard); }
void ShardedClient::SendRest(Call& call) { call.SendAll(); }
void ShardedClient::Abandon(Call& call) {
  call.Abandon(absl::CancelledError("the call was dropped before this shard's part was sent"));
}

ShardedClient::ShardedClient(std::vector<std::string> addresses, ModelIdentity model, int worker_id,
                             ClientOptions options)
    : impl_(std::make_unique<Impl>(std::move(addresses), std::move(model), worker_id,
                                   std::move(options))) {}

ShardedClient::~ShardedClient() { Close(); }

int ShardedClient::num_shards() const { return impl_->num_shards(); }
const ModelIdentity& ShardedClient::model() const { return impl_->model_; }
int ShardedClient::worker_id() const { return impl_->worker_id_; }
Range ShardedClient::shard_range(int shard) const { return impl_->ranges_[shard]; }
const std::string& ShardedClient::consistency() const { return impl_->consistency_; }

ShardedClient::Impl::Impl(std::vector<std::string> addresses, ModelIdentity model, int worker_id,
                          ClientOptions options)
    : model_(std::move(model)),
      worker_id_(worker_id),
      options_(std::move(options)),
      attempts_(&sessions_, &options_, [this] {
        if (worker_id_ < 0) return int64_t{-1};
        absl::MutexLock lock(&steps_->mu);
        return steps_->Resume();
      }) {
  const int shards = static_cast<int>(addresses.size());
  for (int i = 0; i < shards; ++i) {
    ranges_.push_back(PartRange(model_.total_params, i, shards));
    sessions_.push_back(std::make_unique<ShardSession>(
        i, addresses[i], ranges_[i],
        ShardSession::Client{worker_id_, ModelProto(), model_.layout, &options_, &threads_}));
  }
  // Shards on this machine's own loopback address (a local cluster) share no link, nor do any
  // this client reaches through shared memory (BeginPull).
  next_on_host_.assign(addresses.size(), -1);
  std::map<std::string, int> last_on_host;
  for (size_t i = 0; i < addresses.size(); ++i) {
    std::string host, port;
    const std::string& address = sessions_[i]->replica(0).address;
    if (!SplitHostPort(address, &host, &port)) host = address;
    if (host == "127.0.0.1" || host == "localhost" || host == "::1") continue;
    auto [it, first] = last_on_host.try_emplace(host, static_cast<int>(i));
    if (!first) {
      next_on_host_[it->second] = static_cast<int>(i);
      it->second = static_cast<int>(i);
      hosts_shared_ = true;
    }
  }
  absl::MutexLock lock(&steps_->mu);
  steps_->last_pull.version.assign(addresses.size(), 0);
  steps_->last_pull.shard_incarnation.assign(addresses.size(), 0);
}

v1::ParameterServer::Stub* ShardedClient::Impl::Stub(int shard) const {
  return sessions_[shard]->current_replica().rpc->stub();
}

std::string ShardedClient::Impl::Address(int shard) const {
  return sessions_[shard]->current_replica().address;
}

int64_t ShardedClient::Versions::Min() const {
  return version.empty() ? 0 : *std::min_element(version.begin(), version.end());
}

v1::ModelIdentity ShardedClient::Impl::ModelProto() const {
  v1::ModelIdentity m;
  m.set_fingerprint(model_.fingerprint);
  m.set_total_params(model_.total_params);
  m.set_num_shards(model_.num_shards);
  return m;
}

std::shared_ptr<ShardedClient::Call> ShardedClient::Impl::Start(
    ShardFn fn, bool retry, absl::Duration timeout, std::function<void()> on_end, Launch launch,
    std::function<void(int)> on_part, std::function<absl::Time(int)> budget_from) {
  auto call = std::make_shared<Call>(num_shards(), std::move(on_end), std::move(on_part));
  const int64_t generation = attempts_.generation();
  auto shared_fn = std::make_shared<const ShardFn>(std::move(fn));
  auto shared_budget =
      std::make_shared<const std::function<absl::Time(int)>>(std::move(budget_from));
  const int here = launch == Launch::kLastHere ? num_shards() - 1 : -1;
  // Holds only a weak reference to the call: a held start must not keep its own call alive.
  std::weak_ptr<Call> weak = call;
  for (int shard = 0; shard < num_shards(); ++shard) {
    if (shard == here) continue;
    auto start = [this, shared_fn, shared_budget, shard, retry, timeout, generation, weak] {
      auto result = std::make_shared<absl::Status>();
      threads_.Run(
          [this, shared_fn, shared_budget, shard, retry, timeout, generation, result] {
            *result =
                attempts_.Retry(shard, *shared_fn, retry, timeout, generation, *shared_budget);
          },
          [call = weak.lock(), shard, result] { call->Done(shard, std::move(*result)); });
    };
    if (launch == Launch::kHeld) {
      call->Hold(shard, std::move(start));
    } else {
      start();
    }
  }
  // Known to CancelPending once its parts are held (after a CancelPending meanwhile, its parts, of
  // an older generation, end CANCELLED as they start).
  if (launch == Launch::kHeld) {
    absl::MutexLock lock(&mu_);
    holding_.erase(std::remove_if(holding_.begin(), holding_.end(),
                                  [](const std::weak_ptr<Call>& c) {
                                    std::shared_ptr<Call> held = c.lock();
                                    return held == nullptr || !held->Holding();
                                  }),
                   holding_.end());
    holding_.push_back(call);
  }
  if (here >= 0) {
    call->Done(here, attempts_.Retry(here, *shared_fn, retry, timeout, generation, *shared_budget));
  }
  return call;
}

AttemptEnd ShardedClient::Impl::PullFrom(int shard, grpc::ClientContext* context,
                                         absl::Span<float> params, int64_t after_sequence,
                                         Versions* versions, ValuesSeen seen) {
  const Range& r = ranges_[shard];
  ShardSession::Served served;
  AttemptEnd end =
      sessions_[shard]->Pull(context, params.subspan(r.begin, r.size()), after_sequence, seen,
                             attempts_.AttempterFor(shard, attempts_.generation()), &served);
  if (end.ok()) {
    versions->version[shard] = served.version;
    versions->shard_incarnation[shard] = served.shard_incarnation;
  }
  return end;
}

ShardedClient::Pending<ShardedClient::Versions> ShardedClient::StartPull(absl::Span<float> params,
                                                                         bool prefetch) {
  return BeginPull(params, prefetch, Launch::kNow);
}

absl::StatusOr<ShardedClient::Versions> ShardedClient::Pull(absl::Span<float> params) {
  return BeginPull(params, /*prefetch=*/false, Launch::kLastHere).Wait();
}

ShardedClient::Pending<ShardedClient::Versions> ShardedClient::BeginPull(absl::Span<float> params,
                                                                         bool prefetch,
                                                                         Launch launch) {
  auto versions = std::make_shared<Versions>();
  versions->version.assign(num_shards(), 0);
  versions->shard_incarnation.assign(num_shards(), 0);
  Impl* impl = impl_.get();
  std::shared_ptr<Impl::Steps> steps = impl->steps_;
  int64_t after_sequence = -1;
  if (prefetch) {
    absl::MutexLock lock(&steps->mu);
    after_sequence = steps->pushed_since_pull ? steps->last_started : steps->next;
  }
  auto fill = std::make_shared<PullFill>(impl->ranges_);
  // A pull started to be used as it arrives, where hosts hold several shards: each host's parts
  // go one after another in the flat order (the others held until the one before ends), so that
  // the first values come first at every host's full rate. Otherwise every part starts at once,
  // a prefetch too: it runs while this step's push goes out on the same links, and in order its
  // later parts came too late (steps 1.4-1.5x as long: bench/RESULTS.md "Shards spread over
  // hosts").
  bool in_order = launch == Launch::kNow && !prefetch && impl->hosts_shared_;
  for (int shard = 0; in_order && shard < num_shards(); ++shard) {
    // Shared memory: this machine, no link.
    in_order = !impl->sessions_[shard]->state().shared_memory;
  }
  struct Started {  // the call, once Start returned (a part may end on another thread before)
    absl::Mutex mu;
    std::weak_ptr<Call> call ABSL_GUARDED_BY(mu);
  };
  auto started = std::make_shared<Started>();
  std::shared_ptr<Call> call = impl->Start(
      [impl, params, after_sequence, versions, fill](int shard, grpc::ClientContext* context) {
        if (!fill->Attempt(shard)) return AttemptEnd::ValuesUsed();
        const float* part = params.data() + impl->ranges_[shard].begin;
        auto in_place = [&](absl::Span<const float> run) {
          fill->InPlace(shard, run.data() - part, static_cast<int64_t>(run.size()));
        };
        AttemptEnd end =
            impl->PullFrom(shard, context, params, after_sequence, versions.get(), in_place);
        if (!end.ok()) fill->Failed(shard);
        return end;
      },
      /*retry=*/true, impl->options_.rpc_timeout, nullptr, in_order ? Launch::kHeld : launch,
      [fill, started, next = impl->next_on_host_](int shard) {
        fill->Ended(shard);
        std::shared_ptr<Call> c;
        {
          absl::MutexLock lock(&started->mu);
          c = started->call.lock();
        }
        if (c != nullptr) c->Send(next[shard]);
      });
  if (in_order) {
    {
      absl::MutexLock lock(&started->mu);
      started->call = call;
    }
    std::vector<bool> later(num_shards(), false);
    for (int next : impl->next_on_host_) {
      if (next >= 0) later[next] = true;
    }
    for (int shard = 0; shard < num_shards(); ++shard) {
      if (!later[shard]) call->Send(shard);
    }
  }
  return Pending<Versions>(
      std::move(call),
      [versions, steps] {
        absl::MutexLock lock(&steps->mu);
        steps->last_pull = *versions;
        steps->pushed_since_pull = false;
        return *versions;
      },
      nullptr, std::move(fill));
}

ShardedClient::Versions ShardedClient::last_pull() const {
  absl::MutexLock lock(&impl_->steps_->mu);
  return impl_->steps_->last_pull;
}

bool ShardedClient::Impl::StreamsPush(int shard) const {
  return options_.push_type == WireType::kFloat32 && sessions_[shard]->StreamsPush();
}

AttemptEnd ShardedClient::Impl::PushTo(int shard, grpc::ClientContext* context,
                                       absl::Span<const float> gradient,
                                       std::shared_ptr<const CompressedTensor>* compressed_once,
                                       int64_t sequence, const Versions& base, PushDone* done,
                                       PushFill* fill) {
  const Range& r = ranges_[shard];
  return sessions_[shard]->Push(context, gradient.subspan(r.begin, r.size()), sequence,
                                {base.version[shard], base.shard_incarnation[shard]},
                                fill != nullptr ? &fill->progress(shard) : nullptr, compressed_once,
                                attempts_.AttempterFor(shard, attempts_.generation()), done);
}

ShardedClient::Pending<ShardedClient::PushSummary> ShardedClient::StartPush(
    absl::Span<const float> gradient, int64_t sequence, Parts parts) {
  return BeginPush(gradient, sequence, parts == Parts::kHeld ? Launch::kHeld : Launch::kNow);
}

absl::StatusOr<ShardedClient::PushSummary> ShardedClient::Push(absl::Span<const float> gradient,
                                                               int64_t sequence) {
  return BeginPush(gradient, sequence, Launch::kLastHere).Wait();
}

ShardedClient::Pending<ShardedClient::PushSummary> ShardedClient::BeginPush(
    absl::Span<const float> gradient, int64_t sequence, Launch launch) {
  Impl* impl = impl_.get();
  std::shared_ptr<Impl::Steps> steps = impl->steps_;
  struct Answers {
    std::vector<PushDone> done;  // by shard
    Versions base;
    // By shard, the part's compressed bytes, once made (client/compressed_path.h).
    std::vector<std::shared_ptr<const CompressedTensor>> compressed;
  };
  auto answers = std::make_shared<Answers>(
      Answers{std::vector<PushDone>(num_shards()),
              {},
              std::vector<std::shared_ptr<const CompressedTensor>>(num_shards())});
  {
    absl::MutexLock lock(&steps->mu);
    if (sequence == kNextSequence) sequence = steps->next;
    steps->next = std::max(steps->next, sequence + 1);
    steps->last_started = sequence;
    steps->pushing.insert(sequence);
    steps->pushed_since_pull = true;
    answers->base = steps->last_pull;
  }
  // A held push may be told how far its gradient is final (Pending::Filled); CancelPending stops
  // the parts waiting for more of it.
  std::shared_ptr<PushFill> fill;
  if (launch == Launch::kHeld) {
    fill = std::make_shared<PushFill>(impl->ranges_,
                                      [impl](int shard) { return impl->StreamsPush(shard); });
    absl::MutexLock lock(&impl->mu_);
    impl->fills_.erase(std::remove_if(impl->fills_.begin(), impl->fills_.end(),
                                      [](const std::weak_ptr<PushFill>& f) { return f.expired(); }),
                       impl->fills_.end());
    impl->fills_.push_back(fill);
  }
  std::shared_ptr<Call> call = impl->Start(
      [impl, gradient, sequence, answers, fill](int shard, grpc::ClientContext* context) {
        if (fill != nullptr && fill->Dropped(shard)) return AttemptEnd::DroppedHere();
        return impl->PushTo(shard, context, gradient, &answers->compressed[shard], sequence,
                            answers->base, &answers->done[shard], fill.get());
      },
      /*retry=*/true, impl->options_.rpc_timeout,
      [steps, sequence] {
        absl::MutexLock lock(&steps->mu);
        steps->pushing.erase(steps->pushing.find(sequence));
      },
      launch, nullptr,
      // A part sent as backward makes it was busy until backward finished: its retries count
      // from there, as a part sent once final does.
      fill == nullptr ? nullptr : std::function<absl::Time(int)>([fill](int shard) {
        return fill->FinalAt(shard);
      }));
  return Pending<PushSummary>(
      std::move(call),
      [answers, sequence] {
        PushSummary summary;
        summary.sequence = sequence;
        for (const PushDone& done : answers->done) {
          const v1::PushResponse& r = done.response;
          summary.saturated += done.saturated;
          summary.max_staleness = std::max(summary.max_staleness, r.staleness());
          summary.duplicates += r.duplicate();
          summary.dropped += r.dropped();
        }
        return summary;
      },
      fill);
}

int64_t ShardedClient::incarnation(int shard) const {
  return impl_->sessions_[shard]->state().incarnation;
}

int ShardedClient::reregistrations() const {
  int n = 0;
  for (const auto& session : impl_->sessions_) n += session->reregistrations();
  return n;
}

void ShardedClient::LimitCallsTo(absl::Duration timeout) {
  impl_->options_.rpc_timeout = timeout;
  impl_->options_.retry_for = absl::ZeroDuration();
}

void ShardedClient::CancelPending() {
  std::vector<std::weak_ptr<Call>> holding;
  std::vector<std::weak_ptr<PushFill>> fills;
  {
    impl_->attempts_.CancelAll();
    absl::MutexLock lock(&impl_->mu_);
    holding.swap(impl_->holding_);
    fills.swap(impl_->fills_);
  }
  // Calls made on a data-plane connection wait on it, not on a context: it ends, and they fail
  // at once (later calls go over gRPC).
  for (const auto& session : impl_->sessions_) session->EndData();
  for (const std::weak_ptr<Call>& c : holding) {
    if (std::shared_ptr<Call> call = c.lock()) {
      call->Abandon(absl::CancelledError("cancelled before this shard's part was sent"));
    }
  }
  for (const std::weak_ptr<PushFill>& f : fills) {  // parts waiting for more of their values
    if (std::shared_ptr<PushFill> fill = f.lock()) fill->Stop();
  }
}

void ShardedClient::Close() {
  impl_->attempts_.Close();  // no call started later gets through
  CancelPending();
}

}  // namespace ps
