// psctl: a running job at a glance and at hand.
//   status      every shard process, each replica of a replicated shard on a row of its own
//               (address, role, version, updates/s, workers, staleness, drops), and
//               every worker (clock, last seen) as a table; --watch=S refreshes it every S
//               seconds until SIGINT/SIGTERM.
//   checkpoint  every shard writes a checkpoint now (ps --checkpoint_dir; the write token).
//   export      the live model as one safetensors file (--out), as export_model --ps does.
//   spec        what the cluster spec (--cluster) makes each role, contacting nothing.
//   worker-token  worker --rank's own token (ps --worker_identity), made from the job's write
//               token (--token_file or PS_TOKEN), contacting nothing.
#include <unistd.h>

#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/cluster.h"
#include "common/cluster_spec.h"
#include "common/log.h"
#include "common/model_spec.h"
#include "transport/security.h"
#include "common/shutdown.h"
#include "deploy/subprocess.h"
#include "proto/ps.pb.h"
#include "tools/job_status.h"
#include "tools/model_export.h"
#include "client/client_flags.h"
#include "proto/ps.pb.h"

ABSL_DECLARE_FLAG(std::string, cluster);  // common/cluster_spec.cc

ABSL_FLAG(double, watch, 0, "status: refresh every this many seconds until interrupted; 0: once.");
ABSL_FLAG(double, interval, 1, "status: seconds between the two readings updates/s comes from.");
ABSL_FLAG(std::string, out, "", "export: the model file to write (safetensors).");
ABSL_FLAG(int, rank, -1, "worker-token: the worker whose own token to print.");

namespace ps {
namespace {

int Fail(const std::string& reason) { return FailMain("psctl", reason); }

// Each kind of role of the spec as its daemon takes it (--version: the flags parsed, nothing
// started), so that a key no daemon has is refused here too; OK or the daemon's reason.
absl::Status CheckWithDaemons(const std::string& path, const ClusterSpec& spec) {
  std::vector<std::pair<std::string, std::string>> roles = {{"ps", "ps:0"}, {"evaluator", "evaluator"}};
  if (spec.shards.front().find('/') != std::string::npos) roles.front().second = "ps:0/0";
  roles.emplace_back("worker", "worker:0");
  for (const auto& [program, role] : roles) {
    const std::string binary = ExecutableDir() + "/" + program;
    if (access(binary.c_str(), X_OK) != 0) {
      PS_LOG(WARNING) << program << " is not beside psctl: the spec's " << program
                      << " section is not checked by it";
      continue;
    }
    if (absl::Status s = RunToSuccess(
            {binary, "--cluster=" + path, "--role=" + role, "--version"}, absl::Minutes(1));
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

int Spec() {
  const std::string path = absl::GetFlag(FLAGS_cluster);
  if (path.empty()) return Fail("psctl spec needs --cluster=FILE");
  absl::StatusOr<ClusterSpec> spec = ReadClusterSpec(path);
  absl::StatusOr<std::string> roles =
      spec.ok() ? DescribeRoles(*spec) : absl::StatusOr<std::string>(spec.status());
  if (!roles.ok()) return Fail(std::string(roles.status().message()));
  if (absl::Status s = CheckWithDaemons(path, *spec); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  std::printf("%s", roles->c_str());
  return 0;
}

int PrintWorkerToken() {
  const int rank = absl::GetFlag(FLAGS_rank);
  if (rank < 0) return Fail("psctl worker-token needs --rank=R (R >= 0)");
  absl::StatusOr<ClientSecurity> job = ClientSecurityFromFlags();
  if (!job.ok()) return Fail(std::string(job.status().message()));
  if (job->token.empty()) {
    return Fail("psctl worker-token needs the job's write token (--token_file=FILE or PS_TOKEN)");
  }
  if (WorkerTokenRank(job->token).has_value()) {
    return Fail("--token_file holds a worker's own token; give the job's write token");
  }
  std::printf("%s\n", WorkerToken(job->token, rank).c_str());
  return 0;
}

// One process of a shard (each replica of a replicated shard), with a client of its own so that
// each answers for itself: a backup is shown as one, beside its primary.
struct ShardProcessClient {
  int shard;
  std::string address;
  std::unique_ptr<ShardedClient> client;
};

// Every process's statistics; a process that does not answer is a "down" row, its reason added
// to *notes. Unless `tolerate_down`, fails when no process of some shard answers.
absl::StatusOr<std::vector<v1::StatsResponse>> FetchEach(
    std::vector<ShardProcessClient>& processes, bool tolerate_down,
    std::vector<std::string>* notes) {
  std::vector<v1::StatsResponse> rows;
  std::map<int, absl::Status> unanswered;  // by shard, while none of its processes answered
  std::set<int> answered;
  notes->clear();
  for (ShardProcessClient& p : processes) {
    absl::StatusOr<std::vector<v1::StatsResponse>> stats = p.client->Stats();
    if (stats.ok()) {
      rows.push_back(stats->front());
      answered.insert(p.shard);
      continue;
    }
    v1::StatsResponse& down = rows.emplace_back();
    down.set_shard_index(p.shard);
    down.set_replica_role("down");
    // The client knows the process as its only shard, 0: name it as the job does.
    std::string why(stats.status().message());
    if (const size_t own = why.find("): "); own != std::string::npos) why = why.substr(own + 3);
    const std::string note = absl::StrCat("shard ", p.shard, " (", p.address, "): ", why);
    notes->push_back(note);
    unanswered.emplace(p.shard, absl::Status(stats.status().code(), note));
  }
  for (const auto& [shard, status] : unanswered) {
    if (!tolerate_down && answered.count(shard) == 0) return status;
  }
  return rows;
}

int Status(const ClientConnection& shards) {
  const double watch = absl::GetFlag(FLAGS_watch), interval = absl::GetFlag(FLAGS_interval);
  if (!(watch >= 0) || !(interval > 0)) return Fail("--watch must be >= 0 and --interval > 0");
  std::vector<ShardProcessClient> processes;
  std::vector<std::string> addresses;
  std::vector<std::unique_ptr<CancelOnShutdown>> cancel_on_shutdown;
  for (size_t s = 0; s < shards.addresses.size(); ++s) {
    for (const std::string& address : ShardReplicas(shards.addresses[s])) {
      auto client = std::make_unique<ShardedClient>(
          std::vector<std::string>{address}, ModelIdentity{shards.identity.fingerprint, 0, 1},
          /*worker_id=*/-1, shards.options);
      cancel_on_shutdown.push_back(std::make_unique<CancelOnShutdown>(client.get()));
      processes.push_back({static_cast<int>(s), address, std::move(client)});
      addresses.push_back(address);
    }
  }
  std::vector<std::string> notes;
  // Watching rides out a shard that is down (a restart); a single look fails on it.
  const bool tolerate_down = watch > 0;
  absl::StatusOr<std::vector<v1::StatsResponse>> before =
      FetchEach(processes, tolerate_down, &notes);
  if (!before.ok()) return Fail(std::string(before.status().message()));
  absl::Time before_at = absl::Now();
  for (;;) {
    if (WaitForShutdown(absl::Seconds(watch > 0 ? watch : interval))) return 0;
    absl::StatusOr<std::vector<v1::StatsResponse>> now =
        FetchEach(processes, tolerate_down, &notes);
    if (!now.ok()) {
      if (ShutdownRequested()) return 0;
      return Fail(std::string(now.status().message()));
    }
    const absl::Time now_at = absl::Now();
    if (watch > 0) std::printf("\033[H\033[2J");  // clear the terminal between refreshes
    std::printf(
        "%s",
        StatusTable(addresses, *now, &*before, absl::ToDoubleSeconds(now_at - before_at)).c_str());
    for (const std::string& note : notes) std::printf("down: %s\n", note.c_str());
    std::fflush(stdout);
    if (watch == 0) return 0;
    before = std::move(now);
    before_at = now_at;
  }
}

int Checkpoint(ShardedClient& client, const std::vector<std::string>& addresses) {
  // One attempt per shard, with time for a large file: a write that failed is not retried.
  client.LimitCallsTo(absl::Minutes(10));
  absl::StatusOr<std::vector<v1::CheckpointResponse>> answers = client.Checkpoint();
  if (answers.status().code() == absl::StatusCode::kPermissionDenied) {
    return Fail(absl::StrCat(answers.status().message(),
                             " (give psctl the write token: --token_file=FILE)"));
  }
  if (!answers.ok()) return Fail(std::string(answers.status().message()));
  for (size_t i = 0; i < answers->size(); ++i) {
    const v1::CheckpointResponse& r = (*answers)[i];
    std::printf("shard %zu (%s): checkpoint at version %lld%s\n", i, addresses[i].c_str(),
                static_cast<long long>(r.version()),
                r.path().empty() ? " (already written)" : (" in " + r.path()).c_str());
  }
  return 0;
}

int Export(const ClientConnection& shards) {
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) return Fail("psctl export needs --out=FILE");
  const absl::Time start = absl::Now();
  absl::StatusOr<ModelFile> file =
      ModelFromShards(shards.addresses, shards.model, shards.options);
  if (!file.ok()) return Fail(std::string(file.status().message()));
  absl::StatusOr<std::string> wrote = WriteExport(out, *file, start);
  if (!wrote.ok()) return Fail(std::string(wrote.status().message()));
  std::printf("%s\n", wrote->c_str());
  return 0;
}

int Main(int argc, char** argv) {
  absl::StatusOr<ParsedCommandLine> parsed = ParseDaemonFlags(
      argc, argv, "psctl",
      "A running job at a glance and at hand.\n"
      "Examples: psctl status --cluster=cluster.json [--watch=2]\n"
      "          psctl status --ps=host1:50051,host2:50051 --token_file=read-token\n"
      "          psctl checkpoint --cluster=cluster.json --token_file=token\n"
      "          psctl export --cluster=cluster.json --out=model.safetensors\n"
      "          psctl spec --cluster=cluster.json   (each role's flags, from the spec)\n"
      "          psctl worker-token --rank=3 --token_file=token > worker-3.token\n"
      "                      (worker 3's own token, for ps --worker_identity)");
  if (!parsed.ok()) return Fail(std::string(parsed.status().message()));
  const std::string command = parsed->positional.size() == 1 ? parsed->positional[0] : "";
  if (command == "spec") return Spec();
  if (command == "worker-token") return PrintWorkerToken();
  if (command != "status" && command != "checkpoint" && command != "export") {
    return Fail(
        "expected one command: status, checkpoint, export, spec or worker-token (see --help)");
  }
  SetLogTag("psctl");
  absl::StatusOr<ClientConnection> shards = ClientConnectionFromFlags(/*needs_shards=*/true, ClientKind::kTool);
  if (!shards.ok()) return Fail(std::string(shards.status().message()));
  if (command == "export") return Export(*shards);
  InstallShutdownHandler();
  if (command == "status") return Status(*shards);
  ShardedClient client(shards->addresses,
                       {shards->identity.fingerprint, 0, static_cast<int>(shards->addresses.size())},
                       /*worker_id=*/-1, shards->options);
  CancelOnShutdown cancel_on_shutdown(&client);
  return Checkpoint(client, shards->addresses);
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) { return ps::Main(argc, argv); }
