// The client's settings (client/client_settings.h): each one read, bad values named, unknown names
// refused, a cluster spec filling in, and the flags' and the JSON's adapters agreeing.
#include "client/client_settings.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"
#include "client/client_flags.h"
#include "tests/run_dir.h"
#include "tests/scoped_env.h"

ABSL_DECLARE_FLAG(std::string, ps);
ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, hidden);
ABSL_DECLARE_FLAG(std::string, tls_ca);
ABSL_DECLARE_FLAG(std::string, tls_cert);
ABSL_DECLARE_FLAG(std::string, tls_key);
ABSL_DECLARE_FLAG(std::string, token_file);
ABSL_DECLARE_FLAG(std::string, pull_dtype);
ABSL_DECLARE_FLAG(double, retry_seconds);
ABSL_DECLARE_FLAG(bool, shared_memory);
ABSL_DECLARE_FLAG(bool, data_plane);

namespace ps {
namespace {

constexpr char kToken[] = "settings-test-token-0123456789";

void WriteFile(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// The message of `settings`' failure ("" if they checked out).
std::string Why(const SettingTexts& settings, const SettingsUse& use = {}) {
  absl::StatusOr<ClientConnection> c = ClientConnectionFromSettings(settings, use);
  return c.ok() ? "" : std::string(c.status().message());
}

SettingsUse Flags(bool needs_shards, ClientKind kind = ClientKind::kDaemon) {
  SettingsUse use;
  use.as_flags = true;
  use.needs_shards = needs_shards;
  use.needs_model = false;
  use.kind = kind;
  return use;
}

TEST(ClientSettings, NamesAreSortedAndDistinct) {
  const std::vector<std::string>& names = ClientSettingNames();
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  EXPECT_EQ(std::adjacent_find(names.begin(), names.end()), names.end());
}

TEST(ClientSettings, ReadsEachSetting) {
  ScopedEnv no_job_token("PS_TOKEN", "");
  unsetenv("PS_TOKEN");
  const std::string dir = NewRunDir("settings");
  WriteFile(dir + "/token", std::string(kToken) + "\n");
  absl::StatusOr<ClientConnection> c =
      ClientConnectionFromSettings({{"ps", "127.0.0.1:1,127.0.0.1:2/127.0.0.1:3"},
                                    {"model", "flat:10"},
                                    {"rank", "1"},
                                    {"num_workers", "4"},
                                    {"token_file", dir + "/token"},
                                    {"push_dtype", "bf16"},
                                    {"pull_dtype", "fp16"},
                                    {"compress", "topk:0.5"},
                                    {"error_feedback", "false"},
                                    {"pull_compress", "int8"},
                                    {"shared_memory", "false"},
                                    {"data_plane", "0"},
                                    {"rpc_timeout_seconds", "2.5"},
                                    {"retry_seconds", "7"},
                                    {"heartbeat_seconds", "0.25"}},
                                   {});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->addresses, (std::vector<std::string>{"127.0.0.1:1", "127.0.0.1:2/127.0.0.1:3"}));
  EXPECT_EQ(c->model, "flat:10");
  EXPECT_EQ(c->identity.fingerprint, "flat:10");
  EXPECT_EQ(c->identity.total_params, 10);
  EXPECT_EQ(c->identity.num_shards, 2);
  EXPECT_EQ(c->rank, 1);
  EXPECT_EQ(c->heartbeat, absl::Milliseconds(250));
  const ClientOptions& o = c->options;
  EXPECT_EQ(o.num_workers, 4);
  EXPECT_EQ(o.security.token, kToken);
  EXPECT_EQ(o.security.credentials, nullptr);  // no tls_ca: plaintext
  EXPECT_EQ(o.push_type, WireType::kBFloat16);
  EXPECT_EQ(o.pull_type, WireType::kFloat16);
  EXPECT_EQ(o.compression.compressor, Compressor::kTopK);
  EXPECT_EQ(o.compression.topk_fraction, 0.5);
  EXPECT_FALSE(o.error_feedback);
  EXPECT_EQ(o.pull_compression.compressor, Compressor::kInt8);
  EXPECT_FALSE(o.shared_memory);
  EXPECT_FALSE(o.data_plane);
  EXPECT_EQ(o.rpc_timeout, absl::Milliseconds(2500));
  EXPECT_EQ(o.retry_for, absl::Seconds(7));
  EXPECT_EQ(o.connect_for, absl::Seconds(7));

  absl::StatusOr<ClientConnection> mlp =
      ClientConnectionFromSettings({{"ps", "127.0.0.1:1"}, {"hidden", "8,4"}}, {});
  ASSERT_TRUE(mlp.ok()) << mlp.status();
  EXPECT_EQ(mlp->model, "mlp:784-8-4-10");
  EXPECT_EQ(mlp->rank, -1);  // an observer
  // Unset: ClientOptions' defaults, a daemon's minute of retries.
  EXPECT_EQ(mlp->options.retry_for, absl::Seconds(60));
  EXPECT_EQ(mlp->options.connect_for, absl::Seconds(60));
  EXPECT_EQ(mlp->options.rpc_timeout, ClientOptions{}.rpc_timeout);
  EXPECT_TRUE(mlp->options.shared_memory && mlp->options.data_plane);
  EXPECT_EQ(mlp->heartbeat, absl::Seconds(1));
}

TEST(ClientSettings, ReadsTheTlsFiles) {
  const std::string dir = NewRunDir("settings");
  ASSERT_TRUE(MakeTestCertificates(dir));
  absl::StatusOr<ClientConnection> c =
      ClientConnectionFromSettings({{"ps", "127.0.0.1:1"},
                                    {"model", "flat:4"},
                                    {"tls_ca", dir + "/ca.pem"},
                                    {"tls_cert", dir + "/client.pem"},
                                    {"tls_key", dir + "/client.key"}},
                                   {});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NE(c->options.security.credentials, nullptr);
  EXPECT_EQ(c->options.security.tls.ca, dir + "/ca.pem");
  EXPECT_EQ(c->options.security.tls.cert, dir + "/client.pem");
  EXPECT_EQ(c->options.security.tls.key, dir + "/client.key");
  EXPECT_NE(Why({{"ps", "127.0.0.1:1"}, {"model", "flat:4"}, {"tls_ca", dir + "/missing.pem"}})
                .find("missing.pem"),
            std::string::npos);
}

TEST(ClientSettings, NamesTheSettingAtFault) {
  const SettingTexts base = {{"ps", "127.0.0.1:1"}, {"model", "flat:4"}};
  const auto with = [&](const std::string& name, const std::string& text) {
    SettingTexts s = base;
    s[name] = text;
    return s;
  };
  EXPECT_EQ(Why(with("rank", "x")), "setting \"rank\" must be a number, not \"x\"");
  EXPECT_EQ(Why(with("retry_seconds", "soon")),
            "setting \"retry_seconds\" must be a number, not \"soon\"");
  EXPECT_EQ(Why(with("retry_seconds", "-1")), "retry_seconds must be >= 0");
  EXPECT_EQ(Why(with("heartbeat_seconds", "-0.5")), "heartbeat_seconds must be >= 0");
  EXPECT_EQ(Why(with("rpc_timeout_seconds", "0")), "rpc_timeout_seconds must be > 0");
  EXPECT_EQ(Why(with("num_workers", "-2")), "num_workers must be >= 0");
  EXPECT_EQ(Why(with("num_workers", "1.5")),
            "setting \"num_workers\" must be a number, not \"1.5\"");
  EXPECT_EQ(Why(with("shared_memory", "maybe")), "setting \"shared_memory\" must be true or false");
  EXPECT_EQ(Why(with("error_feedback", "2")), "setting \"error_feedback\" must be true or false");
  EXPECT_EQ(Why(with("push_dtype", "float8")).rfind("push_dtype: unknown wire type", 0), 0u);
  EXPECT_EQ(Why(with("pull_dtype", "fp8")).rfind("pull_dtype: unknown wire type", 0), 0u);
  EXPECT_EQ(Why(with("compress", "int4")).rfind("compress: unknown compression", 0), 0u);
  EXPECT_EQ(Why(with("pull_compress", "int4")).rfind("pull_compress: unknown compression", 0), 0u);
  EXPECT_EQ(Why(with("ps", "nowhere")).rfind("bad shard address 'nowhere'", 0), 0u);
  // The flags' adapter: named as flags.
  EXPECT_EQ(Why(with("retry_seconds", "-2"), Flags(true)), "--retry_seconds must be >= 0");
  EXPECT_EQ(Why(with("pull_dtype", "fp8"), Flags(true)).rfind("--pull_dtype: unknown wire type", 0),
            0u);
  // An empty text is an unset setting.
  EXPECT_EQ(Why(with("retry_seconds", "")), "");
  EXPECT_EQ(Why(with("shared_memory", "")), "");
}

TEST(ClientSettings, RefusesAnUnknownName) {
  const std::string why = Why({{"ps", "127.0.0.1:1"}, {"model", "flat:4"}, {"batch_size", "3"}});
  EXPECT_EQ(why.rfind("unknown setting \"batch_size\" (known: cluster, compress, ", 0), 0u) << why;
}

TEST(ClientSettings, NeedsShardsAndAModelWhereAsked) {
  EXPECT_EQ(Why({{"model", "flat:4"}}), "no shards: set \"ps\" (host:port,...) or \"cluster\"");
  EXPECT_EQ(Why({{"ps", "127.0.0.1:1"}}).rfind("no model: ", 0), 0u);
  // The flags: --ps only where needed, and the --hidden MLP even when empty (784-10).
  EXPECT_EQ(Why({{"hidden", "8"}}, Flags(true)), "no shard addresses given (--ps=host:port,...)");
  absl::StatusOr<ClientConnection> offline =
      ClientConnectionFromSettings({{"hidden", ""}}, Flags(false, ClientKind::kTool));
  ASSERT_TRUE(offline.ok()) << offline.status();
  EXPECT_TRUE(offline->addresses.empty());
  EXPECT_EQ(offline->model, "mlp:784-10");
  EXPECT_EQ(offline->options.retry_for, absl::Seconds(5));  // a tool's wait
}

// An interactive client (the C API's) gives up on a wrong address within seconds, and waits out
// a restart of a shard it reached, unless "retry_seconds" says how long for both.
TEST(ClientSettings, AnInteractiveClientGivesUpSoonerOnAShardItNeverReached) {
  SettingsUse use;
  use.kind = ClientKind::kInteractive;
  absl::StatusOr<ClientConnection> c =
      ClientConnectionFromSettings({{"ps", "127.0.0.1:1"}, {"model", "flat:4"}}, use);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->options.retry_for, absl::Seconds(60));
  EXPECT_EQ(c->options.connect_for, absl::Seconds(10));
  c = ClientConnectionFromSettings(
      {{"ps", "127.0.0.1:1"}, {"model", "flat:4"}, {"retry_seconds", "30"}}, use);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->options.retry_for, absl::Seconds(30));
  EXPECT_EQ(c->options.connect_for, absl::Seconds(30));
}

TEST(ClientSettings, AClusterSpecFillsInWhatTheSettingsLeaveUnset) {
  ScopedEnv no_job_token("PS_TOKEN", "");
  unsetenv("PS_TOKEN");
  const std::string dir = NewRunDir("settings");
  WriteFile(dir + "/token", std::string(kToken) + "\n");
  WriteFile(dir + "/worker-1", WorkerToken(kToken, 1) + "\n");
  WriteFile(dir + "/job.json", absl::StrCat(R"({"shards": ["127.0.0.1:1", "127.0.0.1:2"],
      "workers": 3, "model": "flat:12",
      "worker": {"pull_dtype": "bf16", "retry_seconds": 9},
      "security": {"token_file": ")",
                                            dir, R"(/token"}})"));
  absl::StatusOr<ClientConnection> worker = ClientConnectionFromSettings(
      {{"cluster", dir + "/job.json"}, {"rank", "2"}, {"retry_seconds", "3"}}, {});
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_EQ(worker->addresses, (std::vector<std::string>{"127.0.0.1:1", "127.0.0.1:2"}));
  EXPECT_EQ(worker->model, "flat:12");
  EXPECT_EQ(worker->rank, 2);
  EXPECT_EQ(worker->options.num_workers, 3);
  EXPECT_EQ(worker->options.pull_type, WireType::kBFloat16);  // the spec's worker section
  EXPECT_EQ(worker->options.retry_for, absl::Seconds(3));     // the settings win
  EXPECT_EQ(worker->options.security.token, kToken);
  // No rank: the evaluator's part (no worker section).
  absl::StatusOr<ClientConnection> evaluator =
      ClientConnectionFromSettings({{"cluster", dir + "/job.json"}}, {});
  ASSERT_TRUE(evaluator.ok()) << evaluator.status();
  EXPECT_EQ(evaluator->rank, -1);
  EXPECT_EQ(evaluator->options.pull_type, WireType::kFloat32);
  EXPECT_NE(Why({{"cluster", dir + "/job.json"}, {"rank", "5"}}), "");  // not in the spec
  EXPECT_NE(Why({{"cluster", dir + "/missing.json"}}).find("cluster spec"), std::string::npos);
  // A worker's own token names its rank.
  EXPECT_EQ(Why({{"cluster", dir + "/job.json"}, {"rank", "2"}, {"token_file", dir + "/worker-1"}}),
            "the token is worker 1's own, not rank 2's");
}

TEST(ClientSettings, JsonBecomesTexts) {
  absl::StatusOr<SettingTexts> s = SettingsFromJson(
      R"({"ps": "h:1", "rank": 3, "retry_seconds": 0.5, "shared_memory": false, "model": null})");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, (SettingTexts{{"ps", "h:1"},
                              {"rank", "3"},
                              {"retry_seconds", "0.5"},
                              {"shared_memory", "false"},
                              {"model", ""}}));
  EXPECT_EQ(SettingsFromJson("[1]").status().message(), "settings must be a JSON object");
  EXPECT_EQ(SettingsFromJson("{").status().message(), "settings must be a JSON object");
  EXPECT_EQ(SettingsFromJson(R"({"ps": ["h:1"]})").status().message(),
            "setting \"ps\" must be a string, number or boolean");
}

TEST(ClientSettings, TheFlagsAndTheJsonGiveTheSameConnection) {
  ScopedEnv no_job_token("PS_TOKEN", "");
  unsetenv("PS_TOKEN");
  const std::string dir = NewRunDir("settings");
  ASSERT_TRUE(MakeTestCertificates(dir));
  WriteFile(dir + "/token", std::string(kToken) + "\n");
  absl::FlagSaver restore_flags;
  absl::SetFlag(&FLAGS_ps, "127.0.0.1:1,127.0.0.1:2");
  absl::SetFlag(&FLAGS_model, "mlp:784-16-10");
  absl::SetFlag(&FLAGS_tls_ca, dir + "/ca.pem");
  absl::SetFlag(&FLAGS_tls_cert, dir + "/client.pem");
  absl::SetFlag(&FLAGS_tls_key, dir + "/client.key");
  absl::SetFlag(&FLAGS_token_file, dir + "/token");
  absl::SetFlag(&FLAGS_pull_dtype, "bf16");
  absl::SetFlag(&FLAGS_retry_seconds, 7.25);
  absl::SetFlag(&FLAGS_shared_memory, false);
  absl::SetFlag(&FLAGS_data_plane, false);
  absl::StatusOr<ClientConnection> flags = ClientConnectionFromFlags(true, ClientKind::kDaemon);
  ASSERT_TRUE(flags.ok()) << flags.status();
  absl::StatusOr<SettingTexts> texts = SettingsFromJson(
      absl::StrCat(R"({"ps": "127.0.0.1:1,127.0.0.1:2", "model": "mlp:784-16-10", "tls_ca": ")",
                   dir, R"(/ca.pem", "tls_cert": ")", dir, R"(/client.pem", "tls_key": ")", dir,
                   R"(/client.key", "token_file": ")", dir,
                   R"(/token", "pull_dtype": "bf16", "retry_seconds": 7.25, "shared_memory": false,
          "data_plane": false})"));
  ASSERT_TRUE(texts.ok()) << texts.status();
  absl::StatusOr<ClientConnection> json = ClientConnectionFromSettings(*texts, {});
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(flags->addresses, json->addresses);
  EXPECT_EQ(flags->model, json->model);
  EXPECT_EQ(flags->identity.fingerprint, json->identity.fingerprint);
  EXPECT_EQ(flags->identity.total_params, json->identity.total_params);
  EXPECT_EQ(flags->identity.num_shards, json->identity.num_shards);
  const ClientOptions& f = flags->options;
  const ClientOptions& j = json->options;
  EXPECT_EQ(f.rpc_timeout, j.rpc_timeout);
  EXPECT_EQ(f.retry_for, j.retry_for);
  EXPECT_EQ(f.retry_for, absl::Milliseconds(7250));
  EXPECT_EQ(f.push_type, j.push_type);
  EXPECT_EQ(f.pull_type, j.pull_type);
  EXPECT_EQ(f.pull_type, WireType::kBFloat16);
  EXPECT_EQ(f.compression.compressor, j.compression.compressor);
  EXPECT_EQ(f.error_feedback, j.error_feedback);
  EXPECT_EQ(f.pull_compression.compressor, j.pull_compression.compressor);
  EXPECT_EQ(f.shared_memory, j.shared_memory);
  EXPECT_FALSE(f.shared_memory);
  EXPECT_EQ(f.data_plane, j.data_plane);
  EXPECT_EQ(f.num_workers, j.num_workers);
  EXPECT_EQ(f.security.token, j.security.token);
  EXPECT_EQ(f.security.token, kToken);
  EXPECT_NE(f.security.credentials, nullptr);
  EXPECT_NE(j.security.credentials, nullptr);
  EXPECT_EQ(f.security.plane_tls != nullptr, j.security.plane_tls != nullptr);
  EXPECT_EQ(f.security.tls.ca, j.security.tls.ca);
  EXPECT_EQ(f.security.tls.cert, j.security.tls.cert);
  EXPECT_EQ(f.security.tls.key, j.security.tls.key);
  EXPECT_EQ(flags->heartbeat, json->heartbeat);
  EXPECT_EQ(flags->rank, json->rank);
}

}  // namespace
}  // namespace ps
