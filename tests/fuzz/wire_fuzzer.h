// A fuzzer of the wire contract: sends malformed requests of every ps.v1.ParameterServer method to
// one live, initialised shard and records how it answers. The contract: the shard answers every
// request before the call's deadline, never with UNKNOWN or INTERNAL (a malformed request is the
// client's fault: INVALID_ARGUMENT, FAILED_PRECONDITION, RESOURCE_EXHAUSTED, ...), stays up, and
// changes no weight.
//
// Requests come two ways. Structured-but-wrong messages go through the generated stub: boundary
// values in every field (negative and huge ids, INT64_MIN/MAX offsets and lengths, sequence 2^62,
// base versions out of range, unknown dtypes), wrong model identities, and chunk streams that are
// empty, cut short by a cancelling client, endless, oversized, or with the header missing, late or
// repeated. Raw bytes go through grpc::GenericStub: random bytes, mutated serialisations, invalid
// UTF-8 in string fields, empty streams, several messages to a unary method, unknown methods.
//
// Every push it sends is invalid by construction: no prefix of its chunks (a shard may see only a
// prefix, e.g. when a later message fails to parse) is a push the shard could apply, judged
// conservatively from the shard's documented checks against the ids the fuzzer (or anyone before
// it) registered. So the shard must end with the weights it started with. Deterministic for a seed,
// up to where a cancelled stream is cut. Not thread-safe.
#pragma once

#include <grpcpp/support/status.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/model_identity.h"
#include "deploy/local_cluster.h"

namespace ps {

struct FuzzTarget {
  std::vector<std::string> addresses;  // every shard, in order (the weights check pulls them all)
  int shard = 0;                       // the shard the requests go to
  ModelIdentity model;
};

struct FuzzOptions {
  int64_t requests = 2000;
  uint64_t seed = 1;
  absl::Duration deadline = absl::Seconds(10);  // of every call
  // A call still running at deadline + slack is a hang: it is counted and cancelled.
  absl::Duration slack = absl::Seconds(10);
};

struct FuzzReport {
  // Calls by row ("<Method> stub", "<Method> raw", "unknown method raw") and status code.
  std::map<std::string, std::map<grpc::StatusCode, int64_t>> counts;
  int64_t requests = 0;
  int64_t hangs = 0;  // calls that had not returned by deadline + slack
  // Pushes built invalid that came back OK, or initialisations of the initialised shard that
  // applied: a check the shard lacks.
  int64_t accepted_writes = 0;
  absl::Duration elapsed;
  absl::Duration slowest_call;
  // The first calls that broke the contract (INTERNAL, UNKNOWN, DEADLINE_EXCEEDED, hang,
  // accepted push), with how they were built.
  std::vector<std::string> breaches;
  // Whether a full pull, every shard's version and applied-push count after the run equal those
  // before it; weights_detail says what differed (or why the second snapshot failed).
  bool weights_identical = false;
  std::string weights_detail;

  // Calls answered with `code`, over all rows.
  int64_t Count(grpc::StatusCode code) const;
  // Whether the contract held: no INTERNAL, UNKNOWN or DEADLINE_EXCEEDED answer, no hang, no
  // accepted write, weights identical. (Whether the shard process survived is the caller's to see.)
  bool Held() const;
  // Rows by status code, a line per row.
  std::string Table() const;
  // Duration, rate, slowest call, each property and the first breaches, a line each.
  std::string Summary() const;
};

// Starts two shards in `cluster` (async, SGD), registers worker 0 and initialises a model of
// `total_params` parameters with distinct values. The target is shard 1, whose range does not
// start at 0.
absl::StatusOr<FuzzTarget> StartFuzzCluster(LocalCluster& cluster, int64_t total_params);

// Sends options.requests malformed requests to target.shard, one at a time. Fails only if the
// target cannot be read before the run (unreachable, not initialised); breaches of the contract,
// the target's death included, are in the report.
absl::StatusOr<FuzzReport> RunWireFuzz(const FuzzTarget& target, const FuzzOptions& options);

}  // namespace ps
