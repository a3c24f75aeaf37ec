#include "deploy/local_cluster.h"

#include <signal.h>
#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
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
    std::string port_file = absl::StrCat(run_dir_, "/ps-", i, ".port");
    std::remove(port_file.c_str());
    std::vector<std::string> argv = {
        bin_dir_ + "/ps",
        absl::StrCat("--shard_index=", i),
        absl::StrCat("--num_shards=", count),
        "--model=" + model,
        absl::StrCat("--num_workers=", num_workers),
        "--host=127.0.0.1",
        "--port=0",
        "--port_file=" + port_file,
        absl::StrCat("--staleness_csv=", run_dir_, "/staleness-shard-", i, ".csv"),
        absl::StrCat("--stats_json=", run_dir_, "/stats-shard-", i, ".json")};
    AppendShardSecurityFlags(&argv);
    argv.insert(argv.end(), flags.begin(), flags.end());
    absl::StatusOr<Subprocess> p =
        Subprocess::Start(argv, absl::StrCat(run_dir_, "/ps-", i, ".log"));
    if (!p.ok()) return p.status();
    shards_.push_back(*std::move(p));
  }
  // The port file appears (atomically) once the shard is serving.
  absl::Time deadline = absl::Now() + absl::Seconds(30);
  for (int i = 0; i < count; ++i) {
    int port = 0;
    while (!(std::ifstream(absl::StrCat(run_dir_, "/ps-", i, ".port")) >> port)) {
      if (!shards_[i].running()) {
        return absl::UnavailableError(
            absl::StrCat("shard ", i, " exited at start; see ", run_dir_, "/ps-", i, ".log"));
      }
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(absl::StrCat("shard ", i, " did not start in 30 s"));
      }
      absl::SleepFor(absl::Milliseconds(20));  // polling a file another process writes
    }
    ports_.push_back(port);
  }
  return absl::OkStatus();
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
