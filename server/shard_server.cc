#include "server/shard_server.h"

#include <google/protobuf/util/json_util.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <limits>
#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "transport/channel_options.h"
#include "transport/listen.h"
#include "common/log.h"
#include "server/rpc/shard_metrics.h"
#include "server/state/membership.h"

namespace ps {
namespace {

// Writes `text` to `path` atomically, so a reader never sees a partial file.
bool WriteFileAtomically(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << text;
    if (!out.flush()) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

// Transport limits gRPC enforces itself: streams per connection, threads of the synchronous
// methods (Push, Initialize: one each while in progress, beside a few pollers), and keepalive
// pings that close connections whose peer vanished.
void ConfigureTransport(const ServiceLimits& limits, grpc::ServerBuilder* builder) {
  grpc::ResourceQuota quota("ps");
  quota.SetMaxThreads(2 * limits.max_streams + 8);
  builder->SetResourceQuota(quota);
  builder->AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                              std::max(limits.max_streams, limits.max_pulls) + 8);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 30'000);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10'000);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  AllowClientKeepalive(builder);
  ListenExclusively(builder);
  builder->AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, 10 * 60'000);
}

absl::Status CheckLimits(const ServiceLimits& limits) {
  if (limits.stream_idle <= absl::ZeroDuration() || limits.stream_total <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--stream_idle_seconds and --stream_max_seconds must be > 0");
  }
  if (limits.shm_clients < 0) {
    return absl::InvalidArgumentError("--shm_clients must be >= 0 (0: no shared memory)");
  }
  if (limits.max_calls_per_worker < 0) {
    return absl::InvalidArgumentError("--max_calls_per_worker must be >= 0 (0: no cap)");
  }
  if (limits.pull_views < 0) {
    return absl::InvalidArgumentError("--pull_views must be >= 0 (0: every pull is whole)");
  }
  if (limits.data_plane_clients < 1) {
    return absl::InvalidArgumentError(
        "--data_plane_clients must be >= 1 (--data_plane_port=-1 turns the data plane off)");
  }
  return absl::OkStatus();
}

}  // namespace

ShardServer::ShardServer(ShardServerConfig config) : config_(std::move(config)) {
  // Random, not the start time: a shard's two replicas start in the same microsecond often enough
  // on a busy machine, and clients must tell them apart.
  absl::BitGen random;
  process_.incarnation = absl::Uniform<int64_t>(random, 1, std::numeric_limits<int64_t>::max());
}

absl::StatusOr<std::unique_ptr<ShardServer>> ShardServer::Create(ShardServerConfig config) {
  std::unique_ptr<ShardServer> server(new ShardServer(std::move(config)));
  absl::StatusOr<std::unique_ptr<ParameterShard>> created =
      ParameterShard::Create(server->config_.shard);
  if (!created.ok()) return created.status();
  server->shard_ = *std::move(created);
  const ShardServerConfig& c = server->config_;
  if (absl::Status st = CheckListenHost("--host", c.host, c.security, c.insecure); !st.ok()) {
    return st;
  }
  if (absl::Status st = CheckLimits(c.limits); !st.ok()) return st;
  return server;
}

ShardServer::~ShardServer() { ShutDown(); }

absl::Status ShardServer::Start() {
  const ShardServerConfig& c = config_;
  if (c.checkpoints.has_value()) {
    absl::StatusOr<std::unique_ptr<Checkpointer>> opened =
        Checkpointer::Open(*c.checkpoints, c.shard.shard_index);
    if (!opened.ok()) return opened.status();
    checkpointer_ = *std::move(opened);
    absl::StatusOr<Checkpointer::Resumed> resumed = checkpointer_->Start(shard_.get());
    if (!resumed.ok()) return resumed.status();
    process_.resumed_version = resumed->version;
    process_.updates_lost = resumed->updates_lost;
  }
  if (absl::Status s = StartDataPlane(); !s.ok()) return s;
  if (c.replica.has_value()) {
    replica_ = std::make_unique<Replica>(shard_.get(), process_.incarnation, *c.replica,
                                         data_plane_.get());
  }
  // Every change from here on reaches the parts that keep it (a checkpoint's restore above
  // needed no copy); both outlive the shard's use of them (Stop ends the shard first). Health
  // hears of the initialisation in the same step, before any pull sees it.
  shard_->SetChangeListener([this](const ShardChange& change) {
    if (checkpointer_ != nullptr) checkpointer_->OnUpdate(change.version);
    if (replica_ != nullptr) replica_->OnChange(change);
    if (change.kind == ShardChange::Kind::kInitialize) UpdateHealth(true);
  });
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> metrics = StartMetrics(c.metrics);
  if (!metrics.ok()) return metrics.status();
  metrics_ = *std::move(metrics);
  ServiceMetrics service_metrics;
  if (metrics_ != nullptr) {
    service_metrics = AddShardMetrics(metrics_.get(), shard_.get(), checkpointer_.get());
  }
  service_ = std::make_unique<ShardService>(shard_.get(), process_, c.limits, c.security.tokens,
                                            replica_.get(), service_metrics, checkpointer_.get(),
                                            data_plane_.get());
  if (replica_ != nullptr) {
    replication_service_ = std::make_unique<ReplicationService>(replica_.get(), c.security.tokens);
  }
  grpc::EnableDefaultHealthCheckService(true);  // open to all callers, for probes
  grpc::ServerBuilder builder;
  ConfigureTransport(c.limits, &builder);
  const std::string address = absl::StrCat(c.host, ":", c.port);
  builder.AddListeningPort(address,
                           c.security.credentials != nullptr ? c.security.credentials
                                                             : grpc::InsecureServerCredentials(),
                           &port_);
  builder.RegisterService(service_.get());
  if (replication_service_ != nullptr) builder.RegisterService(replication_service_.get());
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port_ == 0) {
    port_ = 0;
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", address, ": ", CannotListenReason(c.host, c.port)));
  }
  // Health says SERVING only while the shard can serve: once initialised, until shutdown (gRPC
  // starts it SERVING).
  {
    absl::MutexLock lock(&health_mu_);
    (health_ = server_->GetHealthCheckService())->SetServingStatus(false);
  }
  const Range& range = shard_->range();
  PS_LOG(INFO) << "shard " << c.shard.shard_index << "/" << c.shard.num_shards << " of "
               << shard_->model().fingerprint << " (" << shard_->model().total_params
               << " parameters; owns [" << range.begin << ", " << range.end << ")) for "
               << c.shard.num_workers << " workers, serving on port " << port_ << ": "
               << shard_->consistency().Name() << ", " << c.shard.optimizer.name << ", lr "
               << c.shard.learning_rate.base << " (" << c.shard.learning_rate.schedule << "), "
               << "applied on " << c.shard.apply_threads << " thread(s); "
               << c.security.Describe();
  if (replica_ != nullptr) {
    PS_LOG(INFO) << "replica " << c.replica->replica << " of shard " << c.shard.shard_index
                 << "; its peer is " << c.replica->peer;
    if (absl::Status s = replica_->Start(); !s.ok()) return s;
  }
  UpdateHealth(shard_->initialized());  // resumed from a checkpoint: serving at once
  if (!c.port_file.empty() && !WriteFileAtomically(c.port_file, absl::StrCat(port_, "\n"))) {
    return absl::UnavailableError("cannot write --port_file " + c.port_file);
  }
  return absl::OkStatus();
}

absl::Status ShardServer::StartDataPlane() {
  const ShardServerConfig& c = config_;
  if (c.data_plane_port < 0) return absl::OkStatus();
  if (c.data_plane_lanes < 1 || c.data_plane_lanes > DataPlane::kMaxLanes) {
    return absl::InvalidArgumentError(absl::StrCat("--data_plane_lanes must be in [1, ",
                                                   DataPlane::kMaxLanes, "] (0: automatic)"));
  }
  DataPlane::Options o;
  o.host = c.host;
  o.port = c.data_plane_port;
  o.max_connections = c.limits.data_plane_clients;
  o.lanes = c.data_plane_lanes;
  o.max_frame_bytes = static_cast<uint64_t>(shard_->range().size()) * sizeof(float);
  o.tls = c.security.plane_tls;
  if (c.replica.has_value()) o.owner_kinds = Replica::PlaneOwners();
  absl::StatusOr<std::unique_ptr<DataPlane>> plane = DataPlane::Start(o);
  if (plane.ok() && o.port == 0 && c.port != 0 && (*plane)->port() == c.port) {
    // The system handed out the port the gRPC server is about to listen on (free until then):
    // take another while holding this one, then let it go.
    plane = DataPlane::Start(o);
  }
  if (!plane.ok()) {
    return absl::UnavailableError(absl::StrCat("data plane (--data_plane_port): ",
                                               plane.status().message()));
  }
  data_plane_ = *std::move(plane);
  PS_LOG(INFO) << "data plane on port " << data_plane_->port() << " (tensors of remote clients, "
               << o.lanes << (o.lanes == 1 ? " lane" : " lanes") << " each)";
  return absl::OkStatus();
}

void ShardServer::UpdateHealth(bool initialized) {
  absl::MutexLock lock(&health_mu_);
  initialized_ |= initialized;
  const bool primary = replica_ == nullptr || replica_->role() == Replica::Role::kPrimary;
  const bool serving = initialized_ && primary && !health_closed_;
  if (health_ == nullptr || serving == serving_) return;
  serving_ = serving;
  health_->SetServingStatus(serving);
  PS_LOG(INFO) << (serving ? "serving clients" : "not serving clients");
}

void ShardServer::Wait(absl::FunctionRef<bool(absl::Duration)> stop_requested) {
  absl::Time next_status = absl::Now() + absl::Seconds(30);
  bool serving = false;
  // Checked every 100 ms until the shard serves, then every second. The initialisation shows in
  // health at once (UpdateHealth from the change listener); a change of role shows here.
  while (!stop_requested(serving ? absl::Seconds(1) : absl::Milliseconds(100))) {
    if (replica_ != nullptr && replica_->role() == Replica::Role::kFenced) {
      fenced_ = replica_->fenced_reason();
      return;
    }
    const bool primary = replica_ == nullptr || replica_->role() == Replica::Role::kPrimary;
    const bool initialized = shard_->initialized();
    UpdateHealth(initialized);
    serving = initialized && primary;
    // A backup hears no heartbeats: leases are the primary's business.
    std::vector<int> expired = primary ? shard_->ExpireLeases(MonotonicNow()) : std::vector<int>();
    if (!expired.empty()) {
      PS_LOG(WARNING) << "worker(s) " << absl::StrJoin(expired, ",")
                      << " left the active set (lease expired, or no push while others waited): "
                         "no longer waited for, their resources here freed";
    }
    for (int worker : expired) {
      service_->ReleaseWorker(worker, "the worker left the active set (lease expired, or no push "
                                      "while others waited)");
    }
    service_->TrimSharedMemory(absl::Now());
    if (absl::Now() >= next_status) {
      ShardStats s = shard_->Stats();
      PS_LOG(INFO) << "version " << s.version << ", " << s.active_workers << "/"
                   << s.registered_workers << " workers active, " << s.pushes_rejected
                   << " pushes rejected";
      next_status += absl::Seconds(30);
    }
  }
}

void ShardServer::ShutDown() {
  if (shut_down_) return;
  shut_down_ = true;
  {
    absl::MutexLock lock(&health_mu_);
    health_closed_ = true;
  }
  UpdateHealth(false);
  if (replica_ != nullptr) replica_->Stop();
  if (shard_ != nullptr) shard_->Shutdown();  // null when Create failed
  if (data_plane_ != nullptr) data_plane_->Stop();  // calls waiting on it end
  // Calls in progress get a second to finish (a stalled client's stream is cancelled then), so
  // that the shard stops within 2 s of SIGTERM, its last checkpoint included.
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }
  if (checkpointer_ != nullptr) checkpointer_->Stop();  // a last checkpoint
}

absl::Status ShardServer::Stop() {
  ShutDown();
  // A shard that cannot save its state must not exit as if it had: whoever restarts it would
  // lose what it holds without a word.
  const absl::Status last_checkpoint =
      checkpointer_ != nullptr ? checkpointer_->final_status() : absl::OkStatus();
  ShardStats s = shard_->AllStats();
  WriteOutputs(s);
  PS_LOG(INFO) << "stopped at version " << s.version << ": " << s.pushes_applied << " applied, "
               << s.pushes_dropped_late + s.pushes_dropped_stale + s.pushes_dropped_norm
               << " dropped, " << s.pushes_duplicate << " duplicate, " << s.pushes_rejected
               << " rejected, " << s.pulls << " pulls";
  if (!fenced_.empty()) return absl::FailedPreconditionError(fenced_);
  return last_checkpoint;
}

void ShardServer::WriteOutputs(const ShardStats& stats) const {
  if (const std::string& path = config_.staleness_csv; !path.empty()) {
    std::string text = "staleness,count\n";
    for (size_t k = 0; k < stats.staleness_counts.size(); ++k) {
      absl::StrAppend(&text, k, ",", stats.staleness_counts[k], "\n");
    }
    if (!WriteFileAtomically(path, text)) PS_LOG(WARNING) << "cannot write " << path;
  }
  if (const std::string& path = config_.stats_json; !path.empty() && service_ != nullptr) {
    std::string json;
    google::protobuf::util::JsonPrintOptions options;
    options.add_whitespace = true;
    options.always_print_primitive_fields = true;
    (void)google::protobuf::util::MessageToJsonString(service_->StatsProto(stats), &json, options);
    if (!WriteFileAtomically(path, json)) PS_LOG(WARNING) << "cannot write " << path;
  }
}

}  // namespace ps
