// Run directories for multi-process tests: a fresh temporary directory per call, removed when the
// test that made it passes and kept (its path printed) when it fails, so failures can be read and
// passing runs leave nothing behind. Also what those tests read from them and from the shards.
#pragma once

#include <grpcpp/support/status.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/model_identity.h"
#include "proto/ps.pb.h"

namespace ps {

class LocalCluster;

// Creates <TempDir>/<prefix>-XXXXXX and returns its path.
std::string NewRunDir(const std::string& prefix = "run");

// The whole file ("" if it cannot be read).
std::string ReadFile(const std::string& path);
// Field `column` of a CSV line as a number; NaN if absent.
double Column(const std::string& csv_line, int column);
// Waits until the last step in a worker's CSV reaches `step` (polled every 10 ms: a fast worker
// may be a few steps past it). Tests that act "mid-run" after it also bound the run's rate
// (worker --push_delay) so that the run is still going on a machine many times faster.
bool WaitForStep(const std::string& csv, int64_t step, absl::Duration timeout);
// The longest gap between a worker's consecutive steps, from the wall-clock column of its CSV:
// the stall a failover or a restart caused.
double LongestGapSeconds(const std::string& csv);
// GetStats of the plaintext shard at `address` (a failed call is a test failure).
v1::StatsResponse Stats(const std::string& address);
// A unary call of `method` ("/ps.v1.ParameterServer/GetStats") to the plaintext server at
// `address`, carrying `bytes` as its request and `token` ("": none) as its bearer token.
grpc::Status RawUnaryCall(const std::string& address, const std::string& method,
                          const std::string& bytes, const std::string& token = "");
// Waits until the shard at `address` reaches `version`.
bool WaitForVersion(const std::string& address, int64_t version, absl::Duration timeout);
// Waits until the replica at `address` has `role` ("primary", "backup", ...).
bool WaitForRole(const std::string& address, const std::string& role, absl::Duration timeout);
// Starts one plaintext shard of `fingerprint` for `workers` workers, replicated (`flags` to both
// replicas), in `cluster`, and waits for its backup (process 1) to follow; a fatal test failure
// if either does not happen.
void StartReplicated(LocalCluster& cluster, const std::string& fingerprint,
                     const std::vector<std::string>& flags, int workers = 2);
// A raw AttachDataPlane to the plaintext shard at `address` as `worker` of `model`, carrying
// `token` ("": none) as its bearer token, with a 10 s deadline. The shard's answer.
grpc::Status RawAttachDataPlane(const std::string& address, int worker, const ModelIdentity& model,
                                const std::string& token, v1::AttachDataPlaneResponse* response,
                                int64_t incarnation = 0);
// Makes throw-away TLS material in `dir` with deploy/make_test_certs.sh (ca.pem, server.pem/.key,
// client.pem/.key, other-ca.pem, other-client.pem/.key); false, with the script's output as a
// test failure, if it failed.
bool MakeTestCertificates(const std::string& dir);

}  // namespace ps
