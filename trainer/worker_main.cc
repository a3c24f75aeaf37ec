// worker: a stateless training process. Loop: pull the weights from every shard, compute the
// gradient of a minibatch of its own data shard, push it to every shard. Killed and restarted, it
// asks the shards where it stopped and carries on; it never re-initialises a trained model.
#include <cmath>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/marshalling.h"
#include "absl/strings/str_cat.h"
#include "common/cluster_spec.h"
#include "common/log.h"
#include "transport/reflection.h"
#include "trainer/client_start.h"
#include "trainer/training.h"

ABSL_FLAG(int, rank, 0, "This worker's rank r in [0, num_workers); rank 0 initialises the model.");
ABSL_FLAG(int, num_workers, 1, "Number of workers W; worker r trains on slice r of W of the data.");
ABSL_FLAG(int, batch_size, 64, "Minibatch size.");
ABSL_FLAG(bool, dry_run, false,
          "Check the flags and the files they name (credentials, model, data, cluster spec) as a "
          "start would, then exit: 0 if it would start, 1 with the reason; contacts nothing.");
ABSL_FLAG(int64_t, steps, 0,
          "Stop after this many steps in total (restarts included); 0: no limit.");
ABSL_FLAG(double, max_seconds, 0, "Stop after this many seconds; 0: no limit.");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the initial weights and of the batch order.");
ABSL_FLAG(double, rpc_timeout_seconds, 10, "Deadline of each RPC attempt.");
ABSL_FLAG(std::string, push_dtype, "fp32",
          "What gradients travel as: fp32 | bf16 | fp16 (half the bytes; values beyond fp16's "
          "range are sent as +-65504, and counted).");
ABSL_FLAG(std::string, compress, "none",
          "Compress pushed gradients instead of --push_dtype (pulls: --pull_compress): none | "
          "onebit (a sign bit per value and a scale per 256 values: ~28x fewer bytes) | topk:F "
          "(the fraction F of values largest in magnitude as (index, value) pairs: 8 bytes "
          "each, so topk:0.01 sends 50x fewer) | int8 (8 bits per value and a scale per 256: "
          "~3.9x fewer).");
ABSL_FLAG(bool, error_feedback, true,
          "With --compress: keep what compression left out of each push (one float per "
          "parameter) and add it to the next push, so nothing is lost, only delayed.");
ABSL_FLAG(std::string, pull_compress, "none",
          "Compress pulls too, as --compress: each shard sends the change since this worker's "
          "last pull, compressed, and carries what compression left out to later pulls (it "
          "keeps a copy of its values per such worker: ps --pull_views). Over gRPC; a first "
          "pull comes whole as --pull_dtype.");
ABSL_FLAG(double, heartbeat_seconds, 1, "Seconds between heartbeats (keep below the ps lease).");
ABSL_FLAG(double, slowdown, 1, "Straggler injection: compute takes this many times longer.");
ABSL_FLAG(std::string, pull_delay, "", "Delay before each pull: fixed:S | uniform:A,B | exp:MEAN.");
ABSL_FLAG(std::string, push_delay, "", "Delay before each push: fixed:S | uniform:A,B | exp:MEAN.");
ABSL_FLAG(bool, prefetch, false,
          "Pull the next step's weights while computing this one (overlaps communication "
          "with compute). async/ssp: the gradient is one step staler; sync: the shard holds "
          "the pull until the round closes (no staleness, one round trip less).");
ABSL_FLAG(bool, overlap, false,
          "Overlap each step's communication with its compute, layer by layer: the forward pass "
          "starts on the first shards' weights while the others arrive, and each shard's part of "
          "the gradient is pushed as soon as backward has finished it (last layer first). Same "
          "updates and staleness as without; with --prefetch too, the next step's pull overlaps "
          "the backward pass and the push.");
ABSL_FLAG(double, local_lr, 0.01,
          "easgd, local: learning rate of the worker's own model (SGD with --local_momentum).");
ABSL_FLAG(double, local_momentum, 0.9, "easgd, local: momentum of the worker's own model.");
ABSL_FLAG(std::string, local_lr_schedule, "constant",
          "easgd, local: constant | cosine (to 0 over --steps).");

namespace ps {
namespace {

int Fail(const std::string& reason) { return FailMain("worker", reason); }

// The run's options from the flags; fails naming the flag at fault.
absl::StatusOr<TrainingOptions> OptionsFromFlags() {
  TrainingOptions o;
  o.rank = absl::GetFlag(FLAGS_rank);
  o.num_workers = absl::GetFlag(FLAGS_num_workers);
  if (o.num_workers < 1 || o.rank < 0 || o.rank >= o.num_workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rank=", o.rank, " must be in [0, --num_workers=", o.num_workers, ")"));
  }
  o.batch_size = absl::GetFlag(FLAGS_batch_size);
  if (o.batch_size < 1) return absl::InvalidArgumentError("--batch_size must be positive");
  o.slowdown = absl::GetFlag(FLAGS_slowdown);
  if (!(o.slowdown >= 1)) return absl::InvalidArgumentError("--slowdown must be >= 1");
  o.local_lr = static_cast<float>(absl::GetFlag(FLAGS_local_lr));
  if (!(o.local_lr > 0) || !std::isfinite(o.local_lr)) {
    return absl::InvalidArgumentError("--local_lr must be > 0");
  }
  const double local_momentum = absl::GetFlag(FLAGS_local_momentum);
  if (!(local_momentum >= 0 && local_momentum < 1)) {
    return absl::InvalidArgumentError("--local_momentum must be in [0, 1)");
  }
  o.local_momentum = static_cast<float>(local_momentum);
  const std::string local_schedule = absl::GetFlag(FLAGS_local_lr_schedule);
  if (local_schedule != "constant" && local_schedule != "cosine") {
    return absl::InvalidArgumentError("--local_lr_schedule must be constant or cosine");
  }
  o.steps = absl::GetFlag(FLAGS_steps);
  o.local_cosine = local_schedule == "cosine";
  if (o.local_cosine && o.steps <= 0) {
    return absl::InvalidArgumentError("--local_lr_schedule=cosine needs --steps");
  }
  o.seed = absl::GetFlag(FLAGS_seed);
  absl::StatusOr<Delay> pull_delay =
      Delay::Parse(absl::GetFlag(FLAGS_pull_delay), o.seed * 31 + o.rank);
  if (!pull_delay.ok()) return pull_delay.status();
  o.pull_delay = *std::move(pull_delay);
  absl::StatusOr<Delay> push_delay =
      Delay::Parse(absl::GetFlag(FLAGS_push_delay), o.seed * 37 + o.rank);
  if (!push_delay.ok()) return push_delay.status();
  o.push_delay = *std::move(push_delay);
  o.prefetch = absl::GetFlag(FLAGS_prefetch);
  o.overlap = absl::GetFlag(FLAGS_overlap);
  if (const double max_seconds = absl::GetFlag(FLAGS_max_seconds); max_seconds > 0) {
    o.time_limit = absl::Seconds(max_seconds);
  }
  return o;
}

// The worker's flags that are client settings, as their texts: client/client_settings.h reads
// and checks them (naming the flag at fault), as it does the C API's and Python's.
SettingTexts ClientSettingFlags() {
  return {
      {"rank", absl::UnparseFlag(absl::GetFlag(FLAGS_rank))},
      {"num_workers", absl::UnparseFlag(absl::GetFlag(FLAGS_num_workers))},
      {"rpc_timeout_seconds", absl::UnparseFlag(absl::GetFlag(FLAGS_rpc_timeout_seconds))},
      {"heartbeat_seconds", absl::UnparseFlag(absl::GetFlag(FLAGS_heartbeat_seconds))},
      {"push_dtype", absl::GetFlag(FLAGS_push_dtype)},
      {"compress", absl::GetFlag(FLAGS_compress)},
      {"error_feedback", absl::UnparseFlag(absl::GetFlag(FLAGS_error_feedback))},
      {"pull_compress", absl::GetFlag(FLAGS_pull_compress)},
  };
}

// What a worker asks of its client beyond what any client's settings allow.
absl::Status CheckWorkerClient(const ClientConnection& c) {
  // Shards answer a held-back pull 0.25 s before its deadline; shorter deadlines would spin.
  if (c.options.rpc_timeout < absl::Milliseconds(500)) {
    return absl::InvalidArgumentError("--rpc_timeout_seconds must be >= 0.5");
  }
  if (c.heartbeat <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--heartbeat_seconds must be > 0");
  }
  if (c.options.compression.compressor != Compressor::kNone &&
      c.options.push_type != WireType::kFloat32) {
    return absl::InvalidArgumentError(
        "--compress sends its own format: leave --push_dtype at fp32 with it");
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  EnableServerReflection();
  absl::StatusOr<ParsedCommandLine> parsed = ParseDaemonFlags(
      argc, argv, "worker",
      "Training worker.\nExample: worker --ps=host1:50051,host2:50051 --rank=0 --num_workers=4");
  if (!parsed.ok()) return Fail(std::string(parsed.status().message()));
  if (!parsed->positional.empty()) {
    return Fail("unexpected argument '" + parsed->positional[0] + "' (flags are --name=value)");
  }
  absl::StatusOr<TrainingOptions> options = OptionsFromFlags();
  if (!options.ok()) return Fail(std::string(options.status().message()));
  const bool dry_run = absl::GetFlag(FLAGS_dry_run);
  absl::StatusOr<ClientStart> started =
      StartClient(absl::StrCat("worker[", options->rank, "]"), options->rank,
                  /*needs_shards=*/true, dry_run, ClientSettingFlags());
  if (!started.ok()) return Fail(std::string(started.status().message()));
  if (absl::Status s = CheckWorkerClient(started->connection); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  if (dry_run) {
    absl::Status s = CheckTrainingData(*started, options->batch_size);
    return s.ok() ? 0 : Fail(std::string(s.message()));
  }
  if (!parsed->spec_summary.empty()) {
    PS_LOG(INFO) << "from the cluster spec: " << parsed->spec_summary;
  }
  absl::Status trained = Train(*options, *started);
  return trained.ok() ? 0 : Fail(std::string(trained.message()));
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) { return ps::Main(argc, argv); }
