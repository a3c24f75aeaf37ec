#include "deploy/local_cluster.h"

#include <signal.h>
#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"

namespace ps {

LocalCluster::LocalCluster(std::string bin_dir, std::string run_dir, ClusterSecurity security)
    : bin_dir_(std::move(bin_dir)), run_dir_(std::move(run_dir)), security_(std::move(security)) {
  mkdir(run_dir_.c_str(), 0755);
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

absl::Status LocalCluster::StartShards(int count, const std::string& model, int num_workers,
                                       const std::vector<std::string>& flags) {
  for (int i = 0; i < count; ++i) {
    std::vector<std::string> argv = {
        bin_dir_ + "/ps",
        absl::StrCat("--shard_index=", i),
        absl::StrCat("--num_shards=", count),
        "--model=" + model,
        absl::StrCat("--num_workers=", num_workers),
        "--host=127.0.0.1",
        "--port=0",
        "--port_file=" + PortFile(i),
        absl::StrCat("--staleness_csv=", run_dir_, "/staleness-shard-", i, ".csv"),
        absl::StrCat("--stats_json=", run_dir_, "/stats-shard-", i, ".json")};
    AppendShardSecurityFlags(&argv);
    argv.insert(argv.end(), flags.begin(), flags.end());
    shard_argv_.push_back(argv);
    ports_.push_back(0);
    shards_.emplace_back();
    if (absl::Status s = LaunchShard(i); !s.ok()) return s;
  }
  for (int i = 0; i < count; ++i) {
    if (absl::Status s = AwaitPort(i); !s.ok()) return s;
  }
  return absl::OkStatus();
}

std::string LocalCluster::PortFile(int shard) const {
  return absl::StrCat(run_dir_, "/ps-", shard, ".port");
}

absl::Status LocalCluster::LaunchShard(int shard) {
  std::remove(PortFile(shard).c_str());
  absl::StatusOr<Subprocess> p =
      Subprocess::Start(shard_argv_[shard], absl::StrCat(run_dir_, "/ps-", shard, ".log"));
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
      return absl::UnavailableError(
          absl::StrCat("shard ", shard, " exited at start; see ", run_dir_, "/ps-", shard, ".log"));
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat("shard ", shard, " did not start in 30 s"));
    }
    absl::SleepFor(absl::Milliseconds(20));  // polling a file another process writes
  }
  ports_[shard] = port;
  return absl::OkStatus();
}

absl::Status LocalCluster::RestartShard(int shard) {
  if (shards_[shard].running()) {
    return absl::FailedPreconditionError(absl::StrCat("shard ", shard, " is still running"));
  }
  for (std::string& arg : shard_argv_[shard]) {
    if (absl::StartsWith(arg, "--port=")) arg = absl::StrCat("--port=", ports_[shard]);
  }
  if (absl::Status s = LaunchShard(shard); !s.ok()) return s;
  return AwaitPort(shard);
}

std::string LocalCluster::ShardAddress(int shard) const {
  return absl::StrCat("127.0.0.1:", ports_[shard]);
}

std::string LocalCluster::ShardAddresses() const {
  std::vector<std::string> a;
  for (size_t i = 0; i < ports_.size(); ++i) a.push_back(ShardAddress(static_cast<int>(i)));
  return absl::StrJoin(a, ",");
}

absl::Status LocalCluster::StartWorker(int rank, int num_workers,
                                       const std::vector<std::string>& flags) {
  std::string base = absl::StrCat(run_dir_, "/worker-", rank);
  std::vector<std::string> argv = {
      bin_dir_ + "/worker", "--ps=" + ShardAddresses(), absl::StrCat("--rank=", rank),
      absl::StrCat("--num_workers=", num_workers), "--csv=" + base + ".csv"};
  AppendClientSecurityFlags(security_.token_file, &argv);
  argv.insert(argv.end(), flags.begin(), flags.end());
  absl::StatusOr<Subprocess> p = Subprocess::Start(argv, base + ".log");
  if (!p.ok()) return p.status();
  workers_.erase(rank);
  workers_.emplace(rank, *std::move(p));
  return absl::OkStatus();
}

absl::Status LocalCluster::StartEvaluator(const std::vector<std::string>& flags) {
  std::vector<std::string> argv = {bin_dir_ + "/evaluator", "--ps=" + ShardAddresses(),
                                   "--csv=" + run_dir_ + "/evaluator.csv"};
  AppendClientSecurityFlags(
      security_.read_token_file.empty() ? security_.token_file : security_.read_token_file, &argv);
  argv.insert(argv.end(), flags.begin(), flags.end());
  absl::StatusOr<Subprocess> p = Subprocess::Start(argv, run_dir_ + "/evaluator.log");
  if (!p.ok()) return p.status();
  evaluator_ = std::make_unique<Subprocess>(*std::move(p));
  return absl::OkStatus();
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
  auto stop = [&](Subprocess& p, const std::string& label) {
    check(p.Stop(absl::Seconds(15)), label);
  };
  // All workers at once (one signal each: a second means "exit now"), then wait for each.
  for (auto& [rank, w] : workers_) w.Signal(SIGTERM);
  for (auto& [rank, w] : workers_) {
    check(w.WaitOrKill(absl::Seconds(15)), absl::StrCat("worker ", rank));
  }
  workers_.clear();
  if (evaluator_ != nullptr) stop(*evaluator_, "evaluator");
  evaluator_.reset();
  for (size_t i = 0; i < shards_.size(); ++i) stop(shards_[i], absl::StrCat("shard ", i));
  shards_.clear();
  ports_.clear();
  return absl::StrJoin(bad, "; ");
}

std::string LastLine(const std::string& path) {
  std::ifstream in(path, std::ios::ate);
  if (!in) return "";
  std::streamoff size = in.tellg();
  std::streamoff from = std::max<std::streamoff>(0, size - 4096);
  in.seekg(from);
  std::string tail((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!tail.empty() && tail.back() == '\n') tail.pop_back();
  size_t nl = tail.rfind('\n');
  return nl == std::string::npos ? (from == 0 ? tail : "") : tail.substr(nl + 1);
}

}  // namespace ps
