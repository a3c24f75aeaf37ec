// ps: a parameter-server shard daemon. Serves one contiguous range of the model's flat parameter
// vector over gRPC (ps.v1.ParameterServer plus grpc.health.v1.Health) until SIGTERM/SIGINT.
#include <memory>
#include <optional>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/cluster_spec.h"
#include "common/consistency_spec.h"
#include "common/log.h"
#include "transport/metrics.h"
#include "transport/reflection.h"
#include "transport/security.h"
#include "common/shutdown.h"
#include "transport/data_plane.h"
#include "server/shard_server.h"

ABSL_FLAG(
    std::string, host, "127.0.0.1",
    "Address to listen on. Anything but loopback needs a token or mutual TLS (or --insecure).");
ABSL_FLAG(int, port, 50051, "Port to listen on; 0 picks a free one (see --port_file).");
ABSL_FLAG(std::string, port_file, "", "If set, write the bound port here once serving.");
ABSL_FLAG(int, shard_index, 0, "This shard's index i in [0, num_shards).");
ABSL_FLAG(int, num_shards, 1, "Number of shards S; shard i owns [i*N/S, (i+1)*N/S).");
ABSL_FLAG(std::string, model, "",
          "Required: the job's model, mlp:IN-H1-...-OUT (e.g. mlp:784-256-128-10), cnn:... or a "
          "preset (cnn-small), flat:N, or named tensors (a PyTorch module's): a layout file "
          "F.json or inline JSON {\"tensors\": [{\"name\": ..., \"shape\": [...]}, ...]}. "
          "Clients of another model are refused.");
ABSL_FLAG(int, num_workers, 0, "Required: the job's number of workers W; worker ids are [0, W).");
ABSL_FLAG(std::string, consistency, "async",
          "async (apply at once) | sync (average all active workers' gradients per version) | "
          "ssp:S (bounded staleness: clocks at most S apart) | easgd:T[,A] (elastic averaging: "
          "workers train local models and exchange A*(x_i - centre) every T steps; A defaults to "
          "0.9/W) | local:H (local SGD: workers train H steps, then their models are averaged). "
          "Under easgd and local, workers push changes of their models, which the shard adds as "
          "they are: its --optimizer and --lr play no part (workers run SGD with momentum, "
          "worker --local_lr and --local_momentum).");
ABSL_FLAG(int, backup_workers, 0,
          "sync, local: close a round after (active workers - this) pushes.");
ABSL_FLAG(double, lease_seconds, 10,
          "A worker silent this long leaves the active set (sync barrier, SSP clock minimum).");
ABSL_FLAG(std::string, optimizer, "momentum", "sgd | momentum | nesterov | adam | adagrad.");
ABSL_FLAG(double, lr, 0.01, "Base learning rate.");
ABSL_FLAG(std::string, lr_schedule, "constant", "constant | step | cosine.");
ABSL_FLAG(int64_t, warmup_updates, 0, "Linear learning-rate warm-up over this many updates.");
ABSL_FLAG(int64_t, lr_step_updates, 1000, "step schedule: decay every this many updates.");
ABSL_FLAG(double, lr_gamma, 0.5, "step schedule: decay factor.");
ABSL_FLAG(int64_t, lr_total_updates, 10000, "cosine schedule: updates until the rate reaches 0.");
ABSL_FLAG(bool, lr_scale_by_workers, false, "Multiply the rate by the number of active workers.");
ABSL_FLAG(bool, staleness_lr, false, "Staleness-aware rate: lr / max(1, staleness) per push.");
ABSL_FLAG(int64_t, max_staleness, -1, "Drop (and count) pushes staler than this; -1: off.");
ABSL_FLAG(double, dc_lambda, 0, "DC-ASGD delay compensation lambda; 0: off.");
ABSL_FLAG(double, clip_norm, 0,
          "Scale each push's gradient (this shard's part) down to this L2 norm; 0: off.");
ABSL_FLAG(
    double, max_norm_ratio, 1000,
    "Drop a push (counted: pushes_dropped_norm; logged) whose L2 norm is more than this many "
    "times the reference: each worker's median over its own last 16 pushes applied, and the "
    "middle one of those (judged from the 16th push on; no worker can move it alone). A guard "
    "against absurd, finite gradients. async, ssp and easgd (not sync/local rounds). 0: off.");
ABSL_FLAG(double, clip_norm_ratio, 3,
          "Scale a push's gradient down to this many times the same reference where its L2 norm "
          "is above it (counted: pushes_clipped), for the same pushes as --max_norm_ratio: one "
          "worker's, or one token's, pushes weigh at most this much more than the others' "
          "however large they are. 0: off.");
ABSL_FLAG(int32_t, apply_threads, 0,
          "Threads that apply one push together, each to a part of the shard (1..64); parts are "
          "at least 64k parameters, so small shards use fewer. 0: half the CPUs this process may "
          "use, 1 to 8 (set it lower where several shards share a host's cores).");
ABSL_FLAG(double, progress_timeout_seconds, 60,
          "sync/ssp/local: a worker the others wait for that has not pushed for this long leaves "
          "the active set until it pushes again (under local:H, keep it above H steps' time); "
          "0: off.");
ABSL_FLAG(double, momentum, 0.9, "Momentum coefficient (momentum, nesterov).");
ABSL_FLAG(double, beta1, 0.9, "Adam beta1.");
ABSL_FLAG(double, beta2, 0.999, "Adam beta2.");
ABSL_FLAG(double, epsilon, 1e-8, "Adam / AdaGrad epsilon.");
ABSL_FLAG(int, max_streams, 0,
          "Push and Initialize calls in progress at once; more are refused (RESOURCE_EXHAUSTED). "
          "0: 2 * num_workers + 4.");
ABSL_FLAG(int, max_pulls, 0,
          "Pull calls in progress at once, held ones included; more are refused. "
          "0: 4 * num_workers + 16.");
ABSL_FLAG(int, shm_clients, 16,
          "Clients on this host that may move tensors through shared memory at once (each up to "
          "2 x the shard's bytes); 0: off, every tensor goes over gRPC.");
ABSL_FLAG(int, data_plane_port, 0,
          "Port of the bulk data plane, where remote clients' tensors travel beside their gRPC "
          "calls (on --host); 0 picks a free one (clients learn it over gRPC), -1 turns it off. "
          "Speaks TLS with the --tls_* files when they are set.");
ABSL_FLAG(int, data_plane_clients, 64, "Clients that may hold a data-plane connection at once.");
ABSL_FLAG(int, data_plane_lanes, 0,
          "TCP connections each data-plane client opens, a tensor of 8 MiB or more striped over "
          "them so that several threads move its bytes on each end (1..8). 0: one per 4 CPUs "
          "this process may use, 1 to 4.");
ABSL_FLAG(int, pull_views, 64,
          "Workers whose compressed pulls (worker --pull_compress) this shard follows at once, "
          "each costing a copy of its values; beyond that the least recent one's next pull is "
          "whole. 0: every pull is whole.");
ABSL_FLAG(double, stream_idle_seconds, 30,
          "A Push, Initialize or Pull stream that moves no message this long is cancelled.");
ABSL_FLAG(double, stream_max_seconds, 600, "No Push or Initialize stream lasts longer than this.");
ABSL_FLAG(
    std::string, checkpoint_dir, "",
    "Write checkpoints here (and on SIGTERM), and resume from the newest valid one at start.");
ABSL_FLAG(double, checkpoint_seconds, 60, "With --checkpoint_dir: checkpoint this often; 0: off.");
ABSL_FLAG(int64_t, checkpoint_updates, 0,
          "With --checkpoint_dir: also checkpoint every this many updates; 0: off.");
ABSL_FLAG(int, checkpoint_keep, 3, "With --checkpoint_dir: keep this many newest checkpoints.");
ABSL_FLAG(std::string, peer, "",
          "Replication: the address of this shard's other replica (its backup or its primary). "
          "A push is acknowledged once both have applied it; when the primary dies, the backup "
          "takes over. Takes async and ssp:S.");
ABSL_FLAG(int, replica, 0,
          "With --peer: 0 or 1. Replica 0 starts as the primary when its peer has no model to "
          "give; otherwise a replica joins its peer as the backup.");
ABSL_FLAG(double, failover_seconds, 1,
          "With --peer: a backup takes over once its primary has been silent this long.");
ABSL_FLAG(bool, forward_pushes, true,
          "With --peer: a primary forwards a push of 4 MiB or more to its backup while it still "
          "arrives on the data plane, so its bytes cross once rather than twice in turn (false: "
          "only once it was applied, as replication did before; to compare).");
ABSL_FLAG(int, forward_at_once, 2,
          "With --peer: as a backup, how many pushes arriving at once its primary may forward to "
          "it (a data-plane connection each, 1 to 16); set it to the workers that push to a "
          "shard at once. The backup holds up to this + 2 stages, each a buffer of the shard's "
          "size, while pushes are forwarded (idle ones are freed after 5 s).");
ABSL_FLAG(std::string, epoch_file, "",
          "With --peer: keep here the highest epoch this replica took part in, so that restarted "
          "it never joins a primary older than one it knew (whose state misses pushes "
          "acknowledged since). Recommended; remove the file when the whole shard starts over.");
ABSL_FLAG(std::string, staleness_csv, "",
          "If set, write the staleness histogram (staleness,count) here at shutdown.");
ABSL_FLAG(std::string, stats_json, "", "If set, write the shard's statistics here at shutdown.");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate (chain) to serve TLS with; needs --tls_key.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA certificate(s): clients must present a certificate chaining to it (mutual TLS).");
ABSL_FLAG(
    std::string, token_file, "",
    "File holding the write token every call must carry (else $PS_TOKEN; neither: no token).");
ABSL_FLAG(std::string, read_token_file, "",
          "File holding a read-only token (else $PS_READ_TOKEN): Pull, GetStats and Register as an "
          "observer only. Needs a write token.");
ABSL_FLAG(std::string, replication_token_file, "",
          "With --peer: file holding the replication token (else $PS_REPLICATION_TOKEN), the same "
          "on both replicas of a shard and distinct from the job's tokens. Only a caller holding "
          "it may use ps.v1.Replication (join, epoch claims, takeover), and this replica sends it "
          "to its peer. Required with --peer when callers must authenticate (a token or mutual "
          "TLS); without any token or TLS, replication is as open as the rest.");
ABSL_FLAG(bool, dry_run, false,
          "Check the flags and the files they name (credentials, model, cluster spec) as a start "
          "would, then exit: 0 if it would start, 1 with the reason. Binds no port, writes "
          "nothing (launch checks every daemon this way before it starts any).");
ABSL_FLAG(bool, worker_identity, false,
          "Bind each worker to a token of its own (needs the write token): worker R calls with "
          "the token `psctl worker-token --rank=R` makes from the write token, which acts as "
          "worker R only; the write token itself then acts as no worker (it stays the "
          "operator's: Checkpoint, Initialize, reads). See also --max_calls_per_worker.");
ABSL_FLAG(int, max_calls_per_worker, 4,
          "With --worker_identity: the most Push/Initialize streams, and the most pulls, that one "
          "worker's token may have in progress at this shard (each), so that one worker cannot "
          "take every place of --max_streams/--max_pulls; 0: no such cap.");
ABSL_FLAG(bool, insecure, false,
          "Allow a non-loopback --host without a token or mutual TLS (logs a warning).");

namespace ps {
namespace {

int Fail(const std::string& reason) { return FailMain("ps", reason); }

absl::StatusOr<ShardConfig> ConfigFromFlags() {
  ShardConfig c;
  c.shard_index = absl::GetFlag(FLAGS_shard_index);
  c.num_shards = absl::GetFlag(FLAGS_num_shards);
  c.model = absl::GetFlag(FLAGS_model);
  if (c.model.empty())
    return absl::InvalidArgumentError("--model is required (e.g. mlp:784-256-128-10)");
  c.num_workers = absl::GetFlag(FLAGS_num_workers);
  if (c.num_workers < 1) return absl::InvalidArgumentError("--num_workers is required (>= 1)");
  c.consistency = absl::GetFlag(FLAGS_consistency);
  c.backup_workers = absl::GetFlag(FLAGS_backup_workers);
  c.lease = absl::Seconds(absl::GetFlag(FLAGS_lease_seconds));
  c.optimizer.name = absl::GetFlag(FLAGS_optimizer);
  c.optimizer.momentum = static_cast<float>(absl::GetFlag(FLAGS_momentum));
  c.optimizer.beta1 = static_cast<float>(absl::GetFlag(FLAGS_beta1));
  c.optimizer.beta2 = static_cast<float>(absl::GetFlag(FLAGS_beta2));
  c.optimizer.epsilon = static_cast<float>(absl::GetFlag(FLAGS_epsilon));
  c.learning_rate.base = static_cast<float>(absl::GetFlag(FLAGS_lr));
  c.learning_rate.schedule = absl::GetFlag(FLAGS_lr_schedule);
  c.learning_rate.warmup_updates = absl::GetFlag(FLAGS_warmup_updates);
  c.learning_rate.step_updates = absl::GetFlag(FLAGS_lr_step_updates);
  c.learning_rate.gamma = static_cast<float>(absl::GetFlag(FLAGS_lr_gamma));
  c.learning_rate.total_updates = absl::GetFlag(FLAGS_lr_total_updates);
  c.scale_lr_by_workers = absl::GetFlag(FLAGS_lr_scale_by_workers);
  c.staleness_aware_lr = absl::GetFlag(FLAGS_staleness_lr);
  c.max_staleness = absl::GetFlag(FLAGS_max_staleness);
  c.dc_lambda = static_cast<float>(absl::GetFlag(FLAGS_dc_lambda));
  c.clip_norm = static_cast<float>(absl::GetFlag(FLAGS_clip_norm));
  c.max_norm_ratio = absl::GetFlag(FLAGS_max_norm_ratio);
  c.clip_norm_ratio = absl::GetFlag(FLAGS_clip_norm_ratio);
  c.apply_threads = absl::GetFlag(FLAGS_apply_threads);
  if (c.apply_threads == 0) c.apply_threads = ApplyThreads::Auto();
  c.progress_timeout = absl::Seconds(absl::GetFlag(FLAGS_progress_timeout_seconds));
  return c;
}

// Replication's settings (--peer and what goes with it), or nullopt without --peer. `security` is
// this shard's: where callers must authenticate, the replicas need their own replication token
// (the job's write token, which every worker holds, must not be able to fence or take over a
// replica).
absl::StatusOr<std::optional<Replica::Options>> ReplicaFromFlags(const ShardConfig& config,
                                                                 const ServerSecurity& security) {
  Replica::Options o;
  o.peer = absl::GetFlag(FLAGS_peer);
  if (o.peer.empty()) return std::nullopt;
  if (absl::StatusOr<ConsistencySpec> spec = ParseConsistencySpec(config.consistency);
      spec.ok() && spec->rounds()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--peer (replication) takes --consistency=async, ssp:S or easgd; rounds (",
                     config.consistency, ") are not replicated"));
  }
  o.replica = absl::GetFlag(FLAGS_replica);
  if (o.replica != 0 && o.replica != 1) {
    return absl::InvalidArgumentError("--replica must be 0 or 1");
  }
  o.forward = absl::GetFlag(FLAGS_forward_pushes);
  o.forward_at_once = absl::GetFlag(FLAGS_forward_at_once);
  if (absl::Status s = Replica::CheckOptions(o); !s.ok()) return s;
  o.failover = absl::Seconds(absl::GetFlag(FLAGS_failover_seconds));
  if (o.failover <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--failover_seconds must be > 0");
  }
  const TlsFiles tls{absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
                     absl::GetFlag(FLAGS_tls_ca)};
  if (!tls.cert.empty() && tls.ca.empty()) {
    return absl::InvalidArgumentError(
        "--peer over TLS needs --tls_ca: the replicas check each other's certificates");
  }
  if (security.authenticates_callers() && security.replication_token.empty()) {
    return absl::InvalidArgumentError(
        "--peer with a token or mutual TLS needs --replication_token_file (or "
        "$PS_REPLICATION_TOKEN), the same on both replicas: only its holder may replicate, and "
        "the job's tokens do not allow it");
  }
  absl::StatusOr<ClientSecurity> client = LoadClientSecurity(tls, "");
  if (!client.ok()) return client.status();
  o.security = *std::move(client);
  o.security.token = security.replication_token;  // never the job's write token
  o.epoch_file = absl::GetFlag(FLAGS_epoch_file);
  return o;
}

ServiceLimits LimitsFromFlags(int num_workers) {
  ServiceLimits l;
  l.max_streams = absl::GetFlag(FLAGS_max_streams);
  if (l.max_streams <= 0) l.max_streams = 2 * num_workers + 4;
  l.max_pulls = absl::GetFlag(FLAGS_max_pulls);
  if (l.max_pulls <= 0) l.max_pulls = 4 * num_workers + 16;
  l.max_calls_per_worker = absl::GetFlag(FLAGS_max_calls_per_worker);
  l.shm_clients = absl::GetFlag(FLAGS_shm_clients);
  l.data_plane_clients = absl::GetFlag(FLAGS_data_plane_clients);
  l.pull_views = absl::GetFlag(FLAGS_pull_views);
  l.stream_idle = absl::Seconds(absl::GetFlag(FLAGS_stream_idle_seconds));
  l.stream_total = absl::Seconds(absl::GetFlag(FLAGS_stream_max_seconds));
  return l;
}

// The whole server's configuration from the flags; fails naming the flag at fault.
absl::StatusOr<ShardServerConfig> ServerConfigFromFlags() {
  ShardServerConfig c;
  absl::StatusOr<ShardConfig> shard = ConfigFromFlags();
  if (!shard.ok()) return shard.status();
  c.shard = *std::move(shard);
  absl::StatusOr<ServerSecurity> security = LoadServerSecurity(
      {absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key), absl::GetFlag(FLAGS_tls_ca)},
      absl::GetFlag(FLAGS_token_file), absl::GetFlag(FLAGS_read_token_file),
      absl::GetFlag(FLAGS_replication_token_file), absl::GetFlag(FLAGS_worker_identity));
  if (!security.ok()) return security.status();
  c.security = *std::move(security);
  absl::StatusOr<std::optional<Replica::Options>> replica = ReplicaFromFlags(c.shard, c.security);
  if (!replica.ok()) return replica.status();
  c.replica = *std::move(replica);
  c.limits = LimitsFromFlags(c.shard.num_workers);
  c.host = absl::GetFlag(FLAGS_host);
  c.port = absl::GetFlag(FLAGS_port);
  c.data_plane_port = absl::GetFlag(FLAGS_data_plane_port);
  c.data_plane_lanes = absl::GetFlag(FLAGS_data_plane_lanes);
  if (c.data_plane_lanes == 0) c.data_plane_lanes = DataPlane::AutoLanes();
  c.insecure = absl::GetFlag(FLAGS_insecure);
  if (std::string dir = absl::GetFlag(FLAGS_checkpoint_dir); !dir.empty()) {
    c.checkpoints = Checkpointer::Options{std::move(dir), absl::GetFlag(FLAGS_checkpoint_keep),
                                          absl::Seconds(absl::GetFlag(FLAGS_checkpoint_seconds)),
                                          absl::GetFlag(FLAGS_checkpoint_updates)};
  }
  c.metrics = MetricsOptionsFromFlags();
  c.port_file = absl::GetFlag(FLAGS_port_file);
  c.staleness_csv = absl::GetFlag(FLAGS_staleness_csv);
  c.stats_json = absl::GetFlag(FLAGS_stats_json);
  return c;
}

int Main(int argc, char** argv) {
  EnableServerReflection();
  absl::StatusOr<ParsedCommandLine> parsed = ParseDaemonFlags(
      argc, argv, "ps",
      "Parameter-server shard.\nExample: ps --shard_index=0 --num_shards=2 --port=50051 "
      "--model=mlp:784-256-128-10 --num_workers=4 --consistency=ssp:2");
  if (!parsed.ok()) return Fail(std::string(parsed.status().message()));
  if (!parsed->positional.empty()) {
    return Fail("unexpected argument '" + parsed->positional[0] + "' (flags are --name=value)");
  }
  absl::StatusOr<ShardServerConfig> config = ServerConfigFromFlags();
  if (!config.ok()) return Fail(std::string(config.status().message()));
  SetLogTag(absl::StrCat("ps[", config->shard.shard_index, "]"));
  if (!parsed->spec_summary.empty()) {
    PS_LOG(INFO) << "from the cluster spec: " << parsed->spec_summary;
  }
  absl::StatusOr<std::unique_ptr<ShardServer>> server = ShardServer::Create(*std::move(config));
  if (!server.ok()) return Fail(std::string(server.status().message()));
  if (absl::GetFlag(FLAGS_dry_run)) return 0;
  InstallShutdownHandler();
  if (absl::Status s = (*server)->Start(); !s.ok()) return Fail(std::string(s.message()));
  (*server)->Wait(WaitForShutdown);
  absl::Status stopped = (*server)->Stop();
  return stopped.ok() ? 0 : Fail(std::string(stopped.message()));
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) { return ps::Main(argc, argv); }
