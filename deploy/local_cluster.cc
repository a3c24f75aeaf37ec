#include "deploy/local_cluster.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "transport/grpc_status.h"
#include "transport/security.h"

namespace ps {

ClusterSecurity ClusterSecurity::MutualTls(const std::string& dir) {
  ClusterSecurity s;
  s.ca = dir + "/ca.pem";
  s.server_cert = dir + "/server.pem";
  s.server_key = dir + "/server.key";
  s.client_cert = dir + "/client.pem";
  s.client_key = dir + "/client.key";
  return s;
}

LocalCluster::LocalCluster(std::string bin_dir, std::string run_dir, ClusterSecurity security)
    : bin_dir_(std::move(bin_dir)), run_dir_(std::move(run_dir)), security_(std::move(security)) {}

absl::Status LocalCluster::MakeRunDir() const {
  std::error_code error;
  std::filesystem::create_directories(run_dir_, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create the run directory ", run_dir_, ": ", error.message()));
  }
  return absl::OkStatus();
}

absl::Status LocalCluster::CheckFlags(int shards, const std::string& model, int num_workers,
                                      const std::vector<std::string>& ps_flags,
                                      const std::optional<std::vector<std::string>>& worker_flags)
    const {
  std::vector<std::string> ps = {bin_dir_ + "/ps", "--shard_index=0",
                                 absl::StrCat("--num_shards=", shards), "--model=" + model,
                                 absl::StrCat("--num_workers=", num_workers), "--port=0"};
  AppendShardSecurityFlags(&ps);
  if (security_.worker_identity && security_.token_file.empty() &&
      std::getenv("PS_TOKEN") == nullptr) {
    // StartShards makes the write token first (EnsureJobToken); this check has none yet.
    ps.erase(std::remove(ps.begin(), ps.end(), "--worker_identity"), ps.end());
  }
  ps.insert(ps.end(), ps_flags.begin(), ps_flags.end());
  ps.push_back("--dry_run");
  if (absl::Status s = RunToSuccess(ps, absl::Minutes(1)); !s.ok()) return s;
  if (!worker_flags.has_value()) return absl::OkStatus();
  std::vector<std::string> addresses(shards, "127.0.0.1:1");  // contacted by no dry run
  std::vector<std::string> worker = {bin_dir_ + "/worker", "--ps=" + absl::StrJoin(addresses, ","),
                                     "--rank=0", absl::StrCat("--num_workers=", num_workers)};
  AppendClientSecurityFlags(security_.worker_identity ? "" : security_.token_file, &worker);
  worker.insert(worker.end(), worker_flags->begin(), worker_flags->end());
  worker.push_back("--dry_run");
  return RunToSuccess(worker, absl::Minutes(1));
}

LocalCluster::~LocalCluster() { Stop(); }

void LocalCluster::AppendShardSecurityFlags(std::vector<std::string>* argv) const {
  const ClusterSecurity& s = security_;
  if (!s.server_cert.empty()) {
    argv->push_back("--tls_cert=" + s.server_cert);
    argv->push_back("--tls_key=" + s.server_key);
    if (!s.client_cert.empty()) argv->push_back("--tls_ca=" + s.ca);
  }
  if (!s.token_file.empty()) argv->push_back("--token_file=" + s.token_file);
  if (!s.read_token_file.empty()) argv->push_back("--read_token_file=" + s.read_token_file);
  if (replicas_ > 1 && !s.replication_token_file.empty()) {
    argv->push_back("--replication_token_file=" + s.replication_token_file);
  }
  if (s.worker_identity) argv->push_back("--worker_identity");
}

namespace {

// Writes `token` to `path`, readable by this user only.
absl::Status WriteSecret(const std::string& path, const std::string& token) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  const bool written =
      fd >= 0 && write(fd, token.data(), token.size()) == static_cast<ssize_t>(token.size());
  if (fd >= 0) close(fd);
  if (!written) return absl::UnavailableError("cannot write " + path);
  return absl::OkStatus();
}

// Writes a fresh random token (64 hex digits) to `path`.
absl::Status WriteFreshToken(const std::string& path) {
  unsigned char secret[32];
  int random = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  const bool read_ok =
      random >= 0 && read(random, secret, sizeof secret) == static_cast<ssize_t>(sizeof secret);
  if (random >= 0) close(random);
  if (!read_ok) return absl::UnavailableError("cannot read /dev/urandom for " + path);
  std::string token;
  for (unsigned char byte : secret) absl::StrAppend(&token, absl::Hex(byte, absl::kZeroPad2));
  return WriteSecret(path, token);
}

}  // namespace

absl::Status LocalCluster::EnsureReplicationToken() {
  ClusterSecurity& s = security_;
  const bool authenticated =
      !s.token_file.empty() || (!s.server_cert.empty() && !s.client_cert.empty());
  if (!s.replication_token_file.empty() || !authenticated) return absl::OkStatus();
  const std::string path = run_dir_ + "/replication-token";
  if (absl::Status written = WriteFreshToken(path); !written.ok()) return written;
  s.replication_token_file = path;
  return absl::OkStatus();
}

absl::Status LocalCluster::EnsureJobToken() {
  ClusterSecurity& s = security_;
  if (!s.token_file.empty()) return absl::OkStatus();
  const std::string path = run_dir_ + "/token";
  const char* from_environment = std::getenv("PS_TOKEN");
  absl::Status written = from_environment != nullptr ? WriteSecret(path, from_environment)
                                                     : WriteFreshToken(path);
  if (!written.ok()) return written;
  s.token_file = path;
  return absl::OkStatus();
}

absl::StatusOr<std::string> LocalCluster::WorkerTokenFile(int rank) {
  const std::string path = absl::StrCat(run_dir_, "/worker-", rank, ".token");
  absl::StatusOr<ClientSecurity> job = LoadClientSecurity({}, security_.token_file);
  if (!job.ok()) return job.status();
  if (absl::Status written = WriteSecret(path, WorkerToken(job->token, rank)); !written.ok()) {
    return written;
  }
  return path;
}

void LocalCluster::AppendClientSecurityFlags(const std::string& token_file,
                                             std::vector<std::string>* argv) const {
  const ClusterSecurity& s = security_;
  if (!s.server_cert.empty()) {
    argv->push_back("--tls_ca=" + s.ca);
    if (!s.client_cert.empty()) {
      argv->push_back("--tls_cert=" + s.client_cert);
      argv->push_back("--tls_key=" + s.client_key);
    }
  }
  if (!token_file.empty()) argv->push_back("--token_file=" + token_file);
}

absl::StatusOr<int> FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  const bool ok = fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&address), length) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  if (fd >= 0) close(fd);
  if (!ok) return absl::UnavailableError("cannot find a free port on 127.0.0.1");
  return ntohs(address.sin_port);
}

absl::Status LocalCluster::StartShards(int count, const std::string& model, int num_workers,
                                       const std::vector<std::string>& flags, int replicas) {
  replicas_ = replicas;
  stubs_.clear();
  if (absl::Status s = MakeRunDir(); !s.ok()) return s;
  if (replicas > 1) {
    if (absl::Status s = EnsureReplicationToken(); !s.ok()) return s;
  }
  if (security_.worker_identity) {
    if (absl::Status s = EnsureJobToken(); !s.ok()) return s;
  }
  const int processes = count * replicas;
  shard_argv_.clear();
  shards_.clear();
  ports_.assign(processes, 0);
  if (replicas > 1) {
    for (int& port : ports_) {
      absl::StatusOr<int> free = FreePort();
      if (!free.ok()) return free.status();
      port = *free;
    }
  }
  for (int p = 0; p < processes; ++p) {
    const int shard = p / replicas;
    const std::string name = ProcessName(p);
    std::vector<std::string> argv = {
        bin_dir_ + "/ps",
        absl::StrCat("--shard_index=", shard),
        absl::StrCat("--num_shards=", count),
        "--model=" + model,
        absl::StrCat("--num_workers=", num_workers),
        "--host=127.0.0.1",
        absl::StrCat("--port=", ports_[p]),
        "--port_file=" + PortFile(p),
        absl::StrCat("--staleness_csv=", run_dir_, "/staleness-shard-", name.substr(3), ".csv"),
        absl::StrCat("--stats_json=", run_dir_, "/stats-shard-", name.substr(3), ".json")};
    if (replicas > 1) {
      const int replica = p % replicas;
      const int peer = shard * replicas + (replica + 1) % replicas;
      argv.push_back("--peer=" + ProcessAddress(peer));
      argv.push_back(absl::StrCat("--replica=", replica));
      // A new job: no epoch from an earlier one in this directory (a restart keeps it).
      const std::string epoch_file = absl::StrCat(run_dir_, "/", name, ".epoch");
      std::remove(epoch_file.c_str());
      argv.push_back("--epoch_file=" + epoch_file);
    }
    AppendShardSecurityFlags(&argv);
    argv.insert(argv.end(), flags.begin(), flags.end());
    shard_argv_.push_back(argv);
    shards_.emplace_back();
    if (absl::Status s = LaunchShard(p); !s.ok()) return s;
  }
  for (int p = 0; p < processes; ++p) {
    if (absl::Status s = AwaitPort(p); !s.ok()) return s;
  }
  return absl::OkStatus();
}

std::string LocalCluster::ProcessName(int process) const {
  if (replicas_ == 1) return absl::StrCat("ps-", process);
  return absl::StrCat("ps-", process / replicas_, "-", process % replicas_);
}

std::string LocalCluster::PortFile(int process) const {
  return absl::StrCat(run_dir_, "/", ProcessName(process), ".port");
}

absl::Status LocalCluster::LaunchShard(int shard) {
  std::remove(PortFile(shard).c_str());
  absl::StatusOr<Subprocess> p = Subprocess::Start(
      shard_argv_[shard], absl::StrCat(run_dir_, "/", ProcessName(shard), ".log"));
  if (!p.ok()) return p.status();
  shards_[shard] = *std::move(p);
  return absl::OkStatus();
}

absl::Status LocalCluster::AwaitPort(int shard) {
  // The port file appears (atomically) once the shard is serving.
  absl::Time deadline = absl::Now() + absl::Seconds(30);
  int port = 0;
  while (!(std::ifstream(PortFile(shard)) >> port)) {
    if (!shards_[shard].running()) {
      return absl::UnavailableError(absl::StrCat(ProcessName(shard), " exited at start; see ",
                                                 run_dir_, "/", ProcessName(shard), ".log"));
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(ProcessName(shard) + " did not start in 30 s");
    }
    absl::SleepFor(absl::Milliseconds(20));  // polling a file another process writes
  }
  ports_[shard] = port;
  return absl::OkStatus();
}

absl::Status LocalCluster::RestartShard(int shard) {
  if (shards_[shard].running()) {
    return absl::FailedPreconditionError(ProcessName(shard) + " is still running");
  }
  for (std::string& arg : shard_argv_[shard]) {
    if (absl::StartsWith(arg, "--port=")) arg = absl::StrCat("--port=", ports_[shard]);
  }
  if (absl::Status s = LaunchShard(shard); !s.ok()) return s;
  return AwaitPort(shard);
}

std::string LocalCluster::ProcessAddress(int process) const {
  return absl::StrCat("127.0.0.1:", ports_[process]);
}

std::string LocalCluster::ShardAddress(int shard) const {
  std::vector<std::string> replicas;
  for (int r = 0; r < replicas_; ++r) replicas.push_back(ProcessAddress(shard * replicas_ + r));
  return absl::StrJoin(replicas, "/");
}

std::string LocalCluster::ShardAddresses() const {
  std::vector<std::string> a;
  for (size_t i = 0; i < ports_.size() / replicas_; ++i) {
    a.push_back(ShardAddress(static_cast<int>(i)));
  }
  return absl::StrJoin(a, ",");
}

absl::Status LocalCluster::StartWorker(int rank, int num_workers,
                                       const std::vector<std::string>& flags,
                                       const std::string& command) {
  if (absl::Status s = MakeRunDir(); !s.ok()) return s;
  std::string base = absl::StrCat(run_dir_, "/worker-", rank);
  std::vector<std::string> argv = {
      bin_dir_ + "/worker", "--ps=" + ShardAddresses(), absl::StrCat("--rank=", rank),
      absl::StrCat("--num_workers=", num_workers), "--csv=" + base + ".csv"};
  std::string token_file = security_.token_file;
  if (security_.worker_identity) {
    absl::StatusOr<std::string> own = WorkerTokenFile(rank);
    if (!own.ok()) return own.status();
    token_file = *std::move(own);
  }
  AppendClientSecurityFlags(token_file, &argv);
  argv.insert(argv.end(), flags.begin(), flags.end());
  std::map<std::string, std::string> env;
  if (!gpus_.empty()) {
    env["CUDA_VISIBLE_DEVICES"] = gpus_[rank % gpus_.size()];
    env["LOCAL_RANK"] = "0";
  }
  // With per-worker identity a worker holds its own token only, not the job's from $PS_TOKEN.
  absl::StatusOr<Subprocess> p = StartClient(
      argv, command, base + ".log",
      security_.worker_identity ? std::vector<std::string>{"PS_TOKEN"} : std::vector<std::string>{},
      std::move(env));
  if (!p.ok()) return p.status();
  workers_.erase(rank);
  workers_.emplace(rank, *std::move(p));
  return absl::OkStatus();
}

absl::Status LocalCluster::UseGpus(int count) {
  if (count < 0) return absl::InvalidArgumentError(absl::StrCat("--gpus=", count, " is negative"));
  std::vector<std::string> gpus;
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (visible != nullptr) {
    gpus = absl::StrSplit(visible, ',', absl::SkipWhitespace());
    if (static_cast<int>(gpus.size()) < count) {
      return absl::InvalidArgumentError(
          absl::StrCat("--gpus=", count, " but CUDA_VISIBLE_DEVICES=", visible, " lists ",
                       gpus.size(), ": give at most that many, or widen CUDA_VISIBLE_DEVICES"));
    }
    gpus.resize(count);
  } else {
    for (int g = 0; g < count; ++g) gpus.push_back(absl::StrCat(g));
  }
  gpus_ = std::move(gpus);
  return absl::OkStatus();
}

absl::Status LocalCluster::StartEvaluator(const std::vector<std::string>& flags,
                                          const std::string& command) {
  if (absl::Status s = MakeRunDir(); !s.ok()) return s;
  std::vector<std::string> argv = {bin_dir_ + "/evaluator", "--ps=" + ShardAddresses(),
                                   "--csv=" + run_dir_ + "/evaluator.csv"};
  AppendClientSecurityFlags(
      security_.read_token_file.empty() ? security_.token_file : security_.read_token_file, &argv);
  argv.insert(argv.end(), flags.begin(), flags.end());
  absl::StatusOr<Subprocess> p = StartClient(argv, command, run_dir_ + "/evaluator.log", {});
  if (!p.ok()) return p.status();
  evaluator_ = std::make_unique<Subprocess>(*std::move(p));
  return absl::OkStatus();
}

absl::StatusOr<Subprocess> LocalCluster::StartClient(const std::vector<std::string>& argv,
                                                     const std::string& command,
                                                     const std::string& log,
                                                     const std::vector<std::string>& drop_env,
                                                     std::map<std::string, std::string> env) const {
  if (command.empty()) return Subprocess::Start(argv, log, drop_env, env);
  for (size_t i = 1; i < argv.size(); ++i) {
    const size_t eq = argv[i].find('=');
    if (argv[i].rfind("--", 0) != 0 || eq == std::string::npos) continue;
    env["PS_" + absl::AsciiStrToUpper(argv[i].substr(2, eq - 2))] = argv[i].substr(eq + 1);
  }
  // The Python package of this build (build/python beside build/bin) comes first.
  const char* path = std::getenv("PYTHONPATH");
  env["PYTHONPATH"] = bin_dir_ + "/../python" + (path != nullptr && *path ? std::string(":") + path : "");
  return Subprocess::Start({"/bin/sh", "-c", "exec " + command}, log, drop_env, env);
}

absl::StatusOr<v1::StatsResponse> LocalCluster::ProcessStats(int process, absl::Duration deadline) {
  stubs_.resize(shards_.size());
  if (stubs_[process] == nullptr) {
    const ClusterSecurity& s = security_;
    absl::StatusOr<ClientSecurity> security = LoadClientSecurity(
        s.server_cert.empty() ? TlsFiles{} : TlsFiles{s.client_cert, s.client_key, s.ca},
        s.read_token_file.empty() ? s.token_file : s.read_token_file);
    if (!security.ok()) return security.status();
    stubs_[process] = v1::ParameterServer::NewStub(
        grpc::CreateChannel(ProcessAddress(process), security->credentials != nullptr
                                                         ? security->credentials
                                                         : grpc::InsecureChannelCredentials()));
    token_ = security->token;
  }
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  if (!token_.empty()) context.AddMetadata(kAuthorizationMetadata, BearerValue(token_));
  v1::StatsRequest request;
  request.set_max_workers(1);  // the shard's own counters are what is wanted
  v1::StatsResponse response;
  grpc::Status status = stubs_[process]->GetStats(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

int64_t LocalCluster::UpdatesApplied(absl::Duration deadline) {
  int64_t total = 0;
  for (size_t shard = 0; shard < shards_.size() / replicas_; ++shard) {
    int64_t version = 0;
    for (int r = 0; r < replicas_; ++r) {
      absl::StatusOr<v1::StatsResponse> stats =
          ProcessStats(static_cast<int>(shard) * replicas_ + r, deadline);
      if (stats.ok()) version = std::max(version, stats->version());
    }
    total += version;
  }
  return total;
}

Subprocess* LocalCluster::worker(int rank) {
  auto it = workers_.find(rank);
  return it == workers_.end() ? nullptr : &it->second;
}

std::string LocalCluster::Stop() {
  std::vector<std::string> bad;
  auto check = [&](int code, const std::string& label) {
    if (code != 0) bad.push_back(absl::StrCat(label, " exited with status ", code));
  };
  auto stop = [&](Subprocess& p, const std::string& label, absl::Duration grace) {
    check(p.Stop(grace), label);
  };
  // All workers at once (one signal each: a second means "exit now"), then wait for each.
  for (auto& [rank, w] : workers_) w.Signal(SIGTERM);
  for (auto& [rank, w] : workers_) {
    check(w.WaitOrKill(absl::Seconds(15)), absl::StrCat("worker ", rank));
  }
  workers_.clear();
  // The evaluator scores the final weights first: a CNN's 10,000 test images take a while.
  if (evaluator_ != nullptr) stop(*evaluator_, "evaluator", absl::Seconds(120));
  evaluator_.reset();
  for (size_t i = 0; i < shards_.size(); ++i) {
    stop(shards_[i], ProcessName(static_cast<int>(i)), absl::Seconds(15));
  }
  shards_.clear();
  ports_.clear();
  stubs_.clear();
  return absl::StrJoin(bad, "; ");
}

}  // namespace ps
