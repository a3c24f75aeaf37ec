#include "client/sharded_client.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/compressed_pulls.h"
#include "client/connection_probe.h"
#include "client/data_plane_path.h"
#include "client/grpc_path.h"
#include "client/pull_fill.h"
#include "client/push_compressor.h"
#include "client/retry_policy.h"
#include "client/shard_attempts.h"
#include "client/shard_call.h"
#include "client/shard_session.h"
#include "client/shared_memory_path.h"
#include "client/tensor_path.h"
#include "common/cluster.h"
#include "common/consistency_spec.h"
#include "common/log.h"
#include "common/partition.h"
#include "common/shutdown.h"
#include "proto/ps.grpc.pb.h"
#include "transport/channel_options.h"
#include "transport/data_connection.h"
#include "transport/grpc_status.h"
#include "transport/shared_memory.h"

namespace ps {
namespace {

// How to get a job whose shard lost its model going again.
constexpr char kLostModelFix[] =
    "Restart it with the --checkpoint_dir it wrote checkpoints to, or start the whole job again";

}  // namespace

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

// Everything the client knows and holds: channels, sessions, the retry loop, the threads.
class ShardedClient::Impl {
 public:
  using ShardFn = ShardAttempts::ShardFn;
  Impl(std::vector<std::string> addresses, ModelIdentity model, int worker_id,
       ClientOptions options);

  int num_shards() const { return static_cast<int>(sessions_.size()); }

  // Starts fn(shard) for every shard, each on a CallThreads thread, retrying transient failures
  // (the one retry loop); the call reports the first error, prefixed with the shard's address.
  // `on_end`: see Call. kHeld: each shard starts at the call's Send (CancelPending and Close
  // abandon those not sent). kLastHere: returns once the last shard's part, run on this thread,
  // ended.
  // `budget_from(shard)`, if given: a time from which shard's retry budget counts when later
  // than its first attempt (a part sent as backward makes it: once backward finished it).
  std::shared_ptr<Call> Start(ShardFn fn, bool retry, absl::Duration timeout,
                              std::function<void()> on_end = nullptr, Launch launch = Launch::kNow,
                              std::function<void(int)> on_part = nullptr,
                              std::function<absl::Time(int)> budget_from = nullptr);
  absl::Status ForEachShard(ShardFn fn, bool retry, absl::Duration timeout) {
    return Start(std::move(fn), retry, timeout, nullptr, Launch::kLastHere)->Wait();
  }
  absl::Status ForEachShard(ShardFn fn) {
    return ForEachShard(std::move(fn), /*retry=*/true, options_.rpc_timeout);
  }
  v1::ModelIdentity ModelProto() const;

  // The shard's replica calls go to now: its stub and its address.
  v1::ParameterServer::Stub* Stub(int shard) const;
  std::string Address(int shard) const;
  // Register, Initialize and Stats of the class.
  absl::StatusOr<int64_t> Register();
  absl::StatusOr<int> Initialize(absl::Span<const float> params);
  absl::StatusOr<std::vector<v1::StatsResponse>> Stats();
  // One unary `call` with `request` to every shard, retried like the others; the answers by shard.
  template <typename Request, typename Response>
  absl::StatusOr<std::vector<Response>> CallEachShard(
      grpc::Status (v1::ParameterServer::Stub::*call)(grpc::ClientContext*, const Request&,
                                                      Response*),
      const Request& request) {
    std::vector<Response> out(num_shards());
    absl::Status s = ForEachShard([&](int shard, grpc::ClientContext* context) {
      return AttemptEnd::FromShard((Stub(shard)->*call)(context, request, &out[shard]));
    });
    if (!s.ok()) return s;
    return out;
  }
  // Sends every shard `call` (Heartbeat, Leave) with this worker's identity: one attempt each.
  template <typename Request, typename Response>
  absl::Status TellEachShard(absl::Duration timeout,
                             grpc::Status (v1::ParameterServer::Stub::*call)(grpc::ClientContext*,
                                                                             const Request&,
                                                                             Response*)) {
    return ForEachShard(
        [&](int shard, grpc::ClientContext* context) {
          Request request;
          const ShardSession::State session = sessions_[shard]->state();
          request.set_worker_id(worker_id_);
          request.set_incarnation(session.incarnation);
          request.set_shard_incarnation(session.shard_incarnation);
          Response response;
          return AttemptEnd::FromShard((Stub(shard)->*call)(context, request, &response));
        },
        /*retry=*/false, timeout);
  }
  // One attempt at pulling shard `shard`'s range into `params`, recording what it served.
  // `seen`: told of each run of values as it is in place, where they come as a stream (over the
  // data plane or gRPC's; a run is a part of `params`).
  AttemptEnd PullFrom(int shard, grpc::ClientContext* context, absl::Span<float> params,
                      int64_t after_sequence, Versions* versions, ValuesSeen seen);
  // One attempt at pushing shard `shard`'s part of `gradient`, or `compressed` (that part
  // compressed) when not null. With `fill` (a held push's), the part's values may still be
  // coming: sent as they come where a path takes that, else once all of them are in.
  AttemptEnd PushTo(int shard, grpc::ClientContext* context, absl::Span<const float> gradient,
                    const std::shared_ptr<const CompressedTensor>& compressed, int64_t sequence,
                    const Versions& base, PushDone* done, PushFill* fill);
  // Whether shard `shard`'s part of a push may go as its values come (Pending::Filled): on a
  // path that sends them so, as float32, uncompressed.
  bool StreamsPush(int shard) const;

  ModelIdentity model_;
  int worker_id_;
  ClientOptions options_;
  std::vector<Range> ranges_;                   // shard i's range of the flat vector
  // By shard: the next shard listed on the same host (its first replica's), -1: none. A
  // started pull's parts on one host go one after another, in this order.
  std::vector<int> next_on_host_;
  bool hosts_shared_ = false;                   // whether a host holds several shards
  std::unique_ptr<PushCompressor> compressor_;  // null: pushes are not compressed
  std::unique_ptr<CompressedPulls> compressed_pulls_;  // null: pulls are whole
  std::string consistency_;

  std::vector<std::unique_ptr<ShardSession>> sessions_;  // by shard
  ShardAttempts attempts_;
  // The worker's pushes and pulls as the client numbers them. Shared with the calls' results,
  // which may outlive the client.
  struct Steps {
    absl::Mutex mu;
    int64_t next ABSL_GUARDED_BY(mu) = 0;                // the next push's sequence
    int64_t last_started ABSL_GUARDED_BY(mu) = -1;       // the last push's
    std::multiset<int64_t> pushing ABSL_GUARDED_BY(mu);  // pushes in progress
    // Whether a push started since the last pull was waited for: a prefetch is then ahead of
    // that push, else of the next one.
    bool pushed_since_pull ABSL_GUARDED_BY(mu) = false;
    Versions last_pull ABSL_GUARDED_BY(mu);
    // For registering again: the push in progress (the lowest), else the next.
    int64_t Resume() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return pushing.empty() ? next : *pushing.begin();
    }
  };
  const std::shared_ptr<Steps> steps_ = std::make_shared<Steps>();

  absl::Mutex mu_;
  std::vector<std::weak_ptr<Call>> holding_ ABSL_GUARDED_BY(mu_);  // calls started kHeld
  std::vector<std::weak_ptr<PushFill>> fills_ ABSL_GUARDED_BY(mu_);  // their pushes' fills

  // Last: destroyed (its threads joined) before the state they use.
  CallThreads threads_;
};

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
        i, addresses[i], ranges_[i].size(),
        ShardSession::Client{worker_id_, ModelProto(), &options_, &threads_}));
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
  if (options_.compression.compressor != Compressor::kNone) {
    std::vector<int64_t> sizes;
    for (const Range& r : ranges_) sizes.push_back(r.size());
    compressor_ = std::make_unique<PushCompressor>(options_.compression, options_.error_feedback,
                                                   std::move(sizes));
  }
  if (options_.pull_compression.compressor != Compressor::kNone && worker_id_ >= 0) {
    compressed_pulls_ =
        std::make_unique<CompressedPulls>(num_shards(), options_.pull_compression);
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
            *result = attempts_.Retry(shard, *shared_fn, retry, timeout, generation, *shared_budget);
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
    call->Done(here,
              attempts_.Retry(here, *shared_fn, retry, timeout, generation, *shared_budget));
  }
  return call;
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

AttemptEnd ShardedClient::Impl::PullFrom(int shard, grpc::ClientContext* context,
                                         absl::Span<float> params, int64_t after_sequence,
                                         Versions* versions, ValuesSeen seen) {
  const Range& r = ranges_[shard];
  ShardSession& session = *sessions_[shard];
  session.RetryData(attempts_.AttempterFor(shard, attempts_.generation()));
  PullPart part{{}, params.subspan(r.begin, r.size()), options_.pull_type, seen};
  v1::PullRequest& request = part.request;
  request.set_offset(r.begin);
  request.set_length(r.size());
  request.set_worker_id(worker_id_);
  if (after_sequence >= 0) request.set_after_sequence(after_sequence);
  request.set_shard_incarnation(session.state().shard_incarnation);
  request.set_dtype(static_cast<v1::DType>(options_.pull_type));
  *request.mutable_model() = ModelProto();
  v1::PullChunk answer;
  AttemptEnd end =
      compressed_pulls_ != nullptr
          ? compressed_pulls_->Pull(shard, part, *session.current_replica().rpc, context, &answer)
          : session.OnPaths(
                context,
                [&](TensorPath& path, const PathCall& call) {
                  return path.Pull(part, call, &answer);
                },
                attempts_.AttempterFor(shard, attempts_.generation()));
  if (!end.ok()) return end;
  versions->version[shard] = answer.version();
  versions->shard_incarnation[shard] = request.shard_incarnation();
  session.Pulled(request, answer);
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
  return compressor_ == nullptr && options_.push_type == WireType::kFloat32 &&
         sessions_[shard]->StreamsPush();
}

AttemptEnd ShardedClient::Impl::PushTo(int shard, grpc::ClientContext* context,
                                       absl::Span<const float> gradient,
                                       const std::shared_ptr<const CompressedTensor>& compressed,
                                       int64_t sequence, const Versions& base, PushDone* done,
                                       PushFill* fill) {
  const Range& r = ranges_[shard];
  ShardSession& shard_session = *sessions_[shard];
  shard_session.RetryData(attempts_.AttempterFor(shard, attempts_.generation()));
  const ShardSession::State session = shard_session.state();
  int64_t base_version = base.version[shard];
  if (base.shard_incarnation[shard] != 0 &&
      base.shard_incarnation[shard] != session.shard_incarnation) {
    // Computed from an earlier process of this shard, whose updates since its checkpoint are
    // lost: the gradient is taken as computed from the version the shard came back at.
    base_version = std::min(base_version, session.registered_version);
  }
  PushPart part{{}, gradient.subspan(r.begin, r.size()), options_.push_type, compressed,
                fill != nullptr ? &fill->progress(shard) : nullptr};
  v1::PushHeader& header = part.header;
  header.set_worker_id(worker_id_);
  header.set_incarnation(session.incarnation);
  header.set_shard_incarnation(session.shard_incarnation);
  header.set_sequence(sequence);
  header.set_base_version(base_version);
  header.set_offset(r.begin);
  header.set_length(r.size());
  header.set_dtype(static_cast<v1::DType>(options_.push_type));
  if (compressed != nullptr) {
    header.set_dtype(static_cast<v1::DType>(compressed->compressor));
    header.set_topk_pairs(compressed->pairs);
  }
  return shard_session.OnPaths(
      context, [&](TensorPath& path, const PathCall& call) { return path.Push(part, call, done); },
      attempts_.AttempterFor(shard, attempts_.generation()));
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
    std::vector<std::shared_ptr<const CompressedTensor>> compressed;  // by shard, once sent
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
        // Compressed once, at the part's first attempt (its range is final then, also when
        // held): a retry resends the same bytes, and the residual moves once.
        std::shared_ptr<const CompressedTensor>& compressed = answers->compressed[shard];
        if (impl->compressor_ != nullptr && compressed == nullptr) {
          const Range& r = impl->ranges_[shard];
          PushPart whole{{}, gradient.subspan(r.begin, r.size())};
          if (fill != nullptr) whole.filling = &fill->progress(shard);
          if (std::optional<AttemptEnd> end = AwaitFinal(whole, *context)) return *end;
          absl::StatusOr<std::shared_ptr<const CompressedTensor>> c =
              impl->compressor_->Compress(shard, whole.values);
          if (!c.ok()) return AttemptEnd::Answered(c.status());
          compressed = *std::move(c);
        }
        return impl->PushTo(shard, context, gradient, compressed, sequence, answers->base,
                            &answers->done[shard], fill.get());
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

absl::StatusOr<std::vector<v1::StatsResponse>> ShardedClient::Impl::Stats() {
  std::vector<v1::StatsResponse> stats(num_shards());
  std::vector<int> last(num_shards(), -1);  // by shard: the highest worker id taken so far
  // One request serves every shard; shards know different workers, so a page goes on from the
  // lowest id where some shard's page ended, and each shard's workers already taken are skipped.
  for (int first = 0; first >= 0;) {
    v1::StatsRequest request;
    request.set_first_worker(first);
    absl::StatusOr<std::vector<v1::StatsResponse>> pages =
        CallEachShard(&v1::ParameterServer::Stub::GetStats, request);
    if (!pages.ok()) return pages.status();
    int next = -1;
    for (int shard = 0; shard < num_shards(); ++shard) {
      v1::StatsResponse& page = (*pages)[shard];
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

int64_t ShardedClient::incarnation(int shard) const {
  return impl_->sessions_[shard]->state().incarnation;
}

int ShardedClient::reregistrations() const {
  int n = 0;
  for (const auto& session : impl_->sessions_) n += session->reregistrations();
  return n;
}

absl::Status ShardedClient::Heartbeat(absl::Duration timeout) {
  return impl_->TellEachShard(timeout, &v1::ParameterServer::Stub::Heartbeat);
}

absl::Status ShardedClient::Leave(absl::Duration timeout) {
  return impl_->TellEachShard(timeout, &v1::ParameterServer::Stub::Leave);
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

