// worker: a stateless training process. Loop: pull the weights from every shard, compute the
// gradient of a minibatch of its own data shard, push it to every shard. Killed and restarted, it
// asks the shards where it stopped and carries on; it never re-initialises a trained model.
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>

#include <cmath>
#include <memory>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/cluster.h"
#include "common/cluster_spec.h"
#include "common/consistency_spec.h"
#include "common/csv_writer.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/reflection.h"
#include "common/shutdown.h"
#include "kernels/backend.h"
#include "worker/batch_sampler.h"
#include "worker/client_start.h"
#include "worker/delay.h"
#include "worker/idx_dataset.h"
#include "worker/local_model.h"
#include "worker/network.h"
#include "worker/sharded_client.h"
#include "worker/worker_session.h"

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
ABSL_FLAG(double, heartbeat_seconds, 1, "Seconds between heartbeats (keep below the ps lease).");
ABSL_FLAG(double, slowdown, 1, "Straggler injection: compute takes this many times longer.");
ABSL_FLAG(std::string, pull_delay, "", "Delay before each pull: fixed:S | uniform:A,B | exp:MEAN.");
ABSL_FLAG(std::string, push_delay, "", "Delay before each push: fixed:S | uniform:A,B | exp:MEAN.");
ABSL_FLAG(bool, prefetch, false,
          "Pull the next step's weights while computing this one (overlaps communication "
          "with compute). async/ssp: the gradient is one step staler; sync: the shard holds "
          "the pull until the round closes (no staleness, one round trip less).");
ABSL_FLAG(double, local_lr, 0.01,
          "easgd, local: learning rate of the worker's own model (SGD with --local_momentum).");
ABSL_FLAG(double, local_momentum, 0.9, "easgd, local: momentum of the worker's own model.");
ABSL_FLAG(std::string, local_lr_schedule, "constant",
          "easgd, local: constant | cosine (to 0 over --steps).");

namespace ps {
namespace {

int Fail(const std::string& reason) { return FailMain("worker", reason); }

// A duration as a CSV field, in milliseconds.
std::string Milliseconds(absl::Duration d) {
  return absl::StrFormat("%.3f", absl::ToDoubleMilliseconds(d));
}

// The worker's Prometheus metrics (--metrics_port), labelled worker="rank": each step's time by
// phase, steps, loss and the staleness the shards reported. Without an endpoint, nothing.
class StepMetrics {
 public:
  StepMetrics(MetricsEndpoint* endpoint, int rank) {
    if (endpoint == nullptr) return;
    prometheus::Registry& r = endpoint->registry();
    const std::string worker = std::to_string(rank);
    auto& seconds = prometheus::BuildHistogram()
                        .Name("worker_step_seconds")
                        .Help(
                            "Time of each step's phases: pull (waiting for it, with --prefetch), "
                            "compute, push.")
                        .Register(r);
    for (int p = 0; p < kPhases; ++p) {
      phase_[p] = &seconds.Add({{"worker", worker}, {"phase", kPhaseNames[p]}}, LatencyBuckets());
    }
    steps_ = &prometheus::BuildCounter()
                  .Name("worker_steps_total")
                  .Help("Steps done (gradients pushed) by this process.")
                  .Register(r)
                  .Add({{"worker", worker}});
    loss_ = &prometheus::BuildGauge()
                 .Name("worker_loss")
                 .Help("Training loss of the last step's minibatch.")
                 .Register(r)
                 .Add({{"worker", worker}});
    staleness_ = &prometheus::BuildGauge()
                      .Name("worker_staleness")
                      .Help("Largest staleness the shards reported for the last push.")
                      .Register(r)
                      .Add({{"worker", worker}});
  }
  enum Phase { kPull, kCompute, kPush, kPhases };
  void Observe(Phase phase, absl::Duration d) {
    if (phase_[phase] != nullptr) phase_[phase]->Observe(absl::ToDoubleSeconds(d));
  }
  void Step(float loss, int64_t staleness) {
    if (steps_ == nullptr) return;
    steps_->Increment();
    loss_->Set(loss);
    staleness_->Set(static_cast<double>(staleness));
  }

 private:
  static constexpr const char* kPhaseNames[kPhases] = {"pull", "compute", "push"};
  prometheus::Histogram* phase_[kPhases] = {};
  prometheus::Counter* steps_ = nullptr;
  prometheus::Gauge* loss_ = nullptr;
  prometheus::Gauge* staleness_ = nullptr;
};

// What both training loops share: the run's bounds, the straggler and delay injections, and each
// step's record (CSV row, metrics, a progress line every 10 s).
struct Run {
  ShardedClient& client;
  Network& net;
  Backend* backend;
  BatchSampler& sampler;
  StepMetrics& metrics;
  CsvWriter& csv;
  Delay& pull_delay;
  Delay& push_delay;
  double slowdown;
  int batch;
  int64_t steps;
  absl::Time start, time_limit;
  int64_t first_step;
  absl::Time next_log = start + absl::Seconds(10);
  int64_t duplicate_pushes = 0;  // shards that answered a push "already applied"
  int64_t saturated_pushes = 0;  // pushes with values beyond the wire type's range

  // Whether to do `step`.
  bool More(int64_t step) const {
    return (steps == 0 || step < steps) && !ShutdownRequested() && absl::Now() < time_limit;
  }
  // The straggler injection after a compute that began at `compute_start`; false if stopped.
  bool SlowDown(absl::Time compute_start) const {
    return !(slowdown > 1 && WaitForShutdown((slowdown - 1) * (absl::Now() - compute_start)));
  }
  // Notes what a push's shards said.
  void Pushed(int64_t step, const ShardedClient::PushSummary& push) {
    if (push.saturated > 0 && saturated_pushes++ == 0) {
      PS_LOG(WARNING) << "step " << step << ": " << push.saturated << " value(s) beyond the wire "
                      << "type's range sent as its largest (logged once)";
    }
    if (push.duplicates > 0) {
      duplicate_pushes += push.duplicates;
      PS_LOG(WARNING) << "step " << step << " had already been applied on " << push.duplicates
                      << " shard(s): a retried or resumed push, applied once";
    }
  }
  void Record(int64_t step, float loss, int64_t base, const ShardedClient::PushSummary& push,
              absl::Duration pull, absl::Duration compute, absl::Duration push_time) {
    metrics.Step(loss, push.max_staleness);
    csv.Row({absl::StrCat(step), WallTimeField(), absl::StrFormat("%.5f", loss), absl::StrCat(base),
             absl::StrCat(push.max_staleness), absl::StrFormat("%.3f", sampler.Epoch(step)),
             absl::StrCat(push.dropped), Milliseconds(pull), Milliseconds(compute),
             Milliseconds(push_time)});
    if (absl::Now() >= next_log) {
      double rate = (step + 1 - first_step) / absl::ToDoubleSeconds(absl::Now() - start);
      PS_LOG(INFO) << absl::StrFormat("step %d (epoch %.2f), %.1f steps/s, loss %.4f", step,
                                      sampler.Epoch(step), rate, loss);
      next_log += absl::Seconds(10);
    }
  }
};

// async, sync, ssp: each step pulls the weights, computes a minibatch's gradient and pushes it.
// With `prefetch`, the next step's pull is in flight while this step computes. Returns the step
// it stopped at.
absl::StatusOr<int64_t> TrainOnGradients(Run& run, int64_t step, bool prefetch) {
  const int64_t n = run.net.num_params();
  // Two weight buffers: with prefetch, one is filled for the next step while the other is used.
  HostBuffer<float> params_a(run.backend, n), params_b(run.backend, n), grad(run.backend, n);
  HostBuffer<float>*params = &params_a, *next_params = &params_b;
  // With prefetch, the pull of the next step's weights into next_params, in flight while this
  // step computes. Destroyed (waiting for it) before the buffers it writes into; a failure
  // cancels it first (it could otherwise wait on a shard for a long time).
  ShardedClient::Pending<ShardedClient::Versions> prefetched;
  auto fail = [&](absl::Status status) {
    run.client.Close();
    prefetched = {};
    return status;
  };
  std::vector<int32_t> indices;
  for (; run.More(step); ++step) {
    if (run.pull_delay.enabled() && WaitForShutdown(run.pull_delay.Next())) break;
    const absl::Time pull_start = absl::Now();
    absl::StatusOr<ShardedClient::Versions> versions =
        prefetched.valid() ? prefetched.Wait() : run.client.Pull(params->span());
    const absl::Duration pull_time = absl::Now() - pull_start;
    run.metrics.Observe(StepMetrics::kPull, pull_time);
    if (!versions.ok()) {
      if (ShutdownRequested()) break;
      return fail(absl::UnavailableError(
          absl::StrCat("pull failed at step ", step, ": ", versions.status().message())));
    }
    if (prefetch && (run.steps == 0 || step + 1 < run.steps)) {
      prefetched = run.client.StartPull(next_params->span(), /*prefetch=*/true);
    }
    run.sampler.Indices(step, &indices);
    const absl::Time compute_start = absl::Now();
    float loss = run.net.GradientOfExamples(params->span(), indices.data(), run.batch, grad.span());
    const absl::Duration compute_time = absl::Now() - compute_start;
    run.metrics.Observe(StepMetrics::kCompute, compute_time);
    if (!std::isfinite(loss)) {
      return fail(absl::InternalError(absl::StrCat("training diverged: loss is ", loss, " at step ",
                                                   step, " (lower the learning rate)")));
    }
    if (!run.SlowDown(compute_start)) break;
    if (run.push_delay.enabled() && WaitForShutdown(run.push_delay.Next())) break;
    const absl::Time push_start = absl::Now();
    absl::StatusOr<ShardedClient::PushSummary> push = run.client.Push(grad.span());
    if (!push.ok()) {
      if (ShutdownRequested()) break;
      return fail(absl::UnavailableError(
          absl::StrCat("push failed at step ", step, ": ", push.status().message())));
    }
    const absl::Duration push_time = absl::Now() - push_start;
    run.metrics.Observe(StepMetrics::kPush, push_time);
    run.Pushed(step, *push);
    run.Record(step, loss, versions->Min(), *push, pull_time, compute_time, push_time);
    if (prefetched.valid()) std::swap(params, next_params);
  }
  prefetched = {};  // waits for a pull in flight: it writes into buffers that die with this scope
  return step;
}

// easgd and local: the worker trains its own model (LocalModel) with SGD and exchanges it with
// the shards every spec.period steps. easgd: pulls the centre and pushes the elastic difference;
// local: pulls the centre to start each period from, and at its end pushes the model's change
// (the shards average a round of them). Starting (or restarted), it pulls the centre first.
absl::StatusOr<int64_t> TrainLocalModel(Run& run, int64_t step, const ConsistencySpec& spec,
                                        float lr, float momentum, bool cosine) {
  const int64_t n = run.net.num_params();
  HostBuffer<float> x(run.backend, n), centre(run.backend, n), vec(run.backend, n);
  LocalModel model(x.span(), momentum);
  const bool easgd = spec.kind == ConsistencySpec::Kind::kEasgd;
  bool started = false;
  ShardedClient::Versions versions;
  std::vector<int32_t> indices;
  auto failed = [&](absl::string_view what, const absl::Status& s) {
    run.client.Close();
    return absl::UnavailableError(absl::StrCat(what, " failed at step ", step, ": ", s.message()));
  };
  for (; run.More(step); ++step) {
    absl::Duration pull_time, push_time;
    ShardedClient::PushSummary push;
    auto push_to_shards = [&](absl::Span<const float> values) -> absl::Status {
      if (run.push_delay.enabled() && WaitForShutdown(run.push_delay.Next())) {
        return absl::CancelledError("stopping");
      }
      const absl::Time push_start = absl::Now();
      absl::StatusOr<ShardedClient::PushSummary> pushed =
          run.client.Push(values, /*sequence=*/step);
      if (!pushed.ok()) return pushed.status();
      push_time = absl::Now() - push_start;
      run.metrics.Observe(StepMetrics::kPush, push_time);
      run.Pushed(step, *pushed);
      push = *pushed;
      return absl::OkStatus();
    };
    if (!started || step % spec.period == 0) {
      if (run.pull_delay.enabled() && WaitForShutdown(run.pull_delay.Next())) break;
      const absl::Time pull_start = absl::Now();
      const bool elastic = easgd && started;
      absl::StatusOr<ShardedClient::Versions> pulled =
          run.client.Pull(elastic ? centre.span() : x.span());
      pull_time = absl::Now() - pull_start;
      run.metrics.Observe(StepMetrics::kPull, pull_time);
      if (!pulled.ok()) {
        if (ShutdownRequested()) break;
        return failed("pull", pulled.status());
      }
      versions = *std::move(pulled);
      if (elastic) {
        model.Elastic(centre.span(), static_cast<float>(spec.alpha), vec.span());
        if (absl::Status s = push_to_shards(vec.span()); !s.ok()) {
          if (ShutdownRequested()) break;
          return failed("push", s);
        }
      } else {
        model.Restart();
      }
      started = true;
    }
    run.sampler.Indices(step, &indices);
    const absl::Time compute_start = absl::Now();
    float loss = run.net.GradientOfExamples(x.span(), indices.data(), run.batch, vec.span());
    const float rate =
        cosine && run.steps > 0
            ? lr * 0.5f * (1 + std::cos(3.14159265f * static_cast<float>(step) / run.steps))
            : lr;
    model.Step(vec.span(), rate);
    const absl::Duration compute_time = absl::Now() - compute_start;
    run.metrics.Observe(StepMetrics::kCompute, compute_time);
    if (!std::isfinite(loss)) {
      run.client.Close();
      return absl::InternalError(absl::StrCat("training diverged: loss is ", loss, " at step ",
                                              step, " (lower --local_lr)"));
    }
    if (!run.SlowDown(compute_start)) break;
    if (!easgd && ((step + 1) % spec.period == 0 || step + 1 == run.steps)) {
      model.Change(vec.span());
      if (absl::Status s = push_to_shards(vec.span()); !s.ok()) {
        if (ShutdownRequested()) break;
        return failed("push", s);
      }
    }
    run.Record(step, loss, versions.Min(), push, pull_time, compute_time, push_time);
  }
  return step;
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
  const int rank = absl::GetFlag(FLAGS_rank), workers = absl::GetFlag(FLAGS_num_workers);
  const int batch = absl::GetFlag(FLAGS_batch_size);
  if (workers < 1 || rank < 0 || rank >= workers) {
    return Fail(absl::StrCat("--rank=", rank, " must be in [0, --num_workers=", workers, ")"));
  }
  if (batch < 1) return Fail("--batch_size must be positive");
  const double slowdown = absl::GetFlag(FLAGS_slowdown);
  if (!(slowdown >= 1)) return Fail("--slowdown must be >= 1");
  // Shards answer a held-back pull 0.25 s before its deadline; shorter deadlines would spin.
  if (!(absl::GetFlag(FLAGS_rpc_timeout_seconds) >= 0.5)) {
    return Fail("--rpc_timeout_seconds must be >= 0.5");
  }
  if (!(absl::GetFlag(FLAGS_heartbeat_seconds) > 0)) return Fail("--heartbeat_seconds must be > 0");
  const float local_lr = static_cast<float>(absl::GetFlag(FLAGS_local_lr));
  if (!(local_lr > 0) || !std::isfinite(local_lr)) return Fail("--local_lr must be > 0");
  const double local_momentum = absl::GetFlag(FLAGS_local_momentum);
  if (!(local_momentum >= 0 && local_momentum < 1))
    return Fail("--local_momentum must be in [0, 1)");
  const std::string local_schedule = absl::GetFlag(FLAGS_local_lr_schedule);
  if (local_schedule != "constant" && local_schedule != "cosine") {
    return Fail("--local_lr_schedule must be constant or cosine");
  }
  if (local_schedule == "cosine" && absl::GetFlag(FLAGS_steps) <= 0) {
    return Fail("--local_lr_schedule=cosine needs --steps");
  }
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  absl::StatusOr<Delay> pull_delay =
      Delay::Parse(absl::GetFlag(FLAGS_pull_delay), seed * 31 + rank);
  if (!pull_delay.ok()) return Fail(std::string(pull_delay.status().message()));
  absl::StatusOr<Delay> push_delay =
      Delay::Parse(absl::GetFlag(FLAGS_push_delay), seed * 37 + rank);
  if (!push_delay.ok()) return Fail(std::string(push_delay.status().message()));
  absl::StatusOr<WireType> push_type = ParseWireType(absl::GetFlag(FLAGS_push_dtype));
  if (!push_type.ok()) return Fail("--push_dtype: " + std::string(push_type.status().message()));
  absl::StatusOr<ClientStart> started = StartClient(absl::StrCat("worker[", rank, "]"), rank,
                                                    /*needs_shards=*/true, absl::GetFlag(FLAGS_dry_run));
  if (!started.ok()) return Fail(std::string(started.status().message()));
  if (absl::GetFlag(FLAGS_dry_run)) {
    // The data (its first example: the files are there and readable) and the batch.
    Range first{0, 1};
    absl::Status s = LoadFashionMnist(started->data_dir, "train", &first).status();
    if (s.ok()) s = started->network.FitsBatch(batch);
    return s.ok() ? 0 : Fail(std::string(s.message()));
  }
  if (!parsed->spec_summary.empty()) {
    PS_LOG(INFO) << "from the cluster spec: " << parsed->spec_summary;
  }
  const ClientConnection& shards = started->connection;

  Range slice = PartRange(60000, rank, workers);
  absl::StatusOr<Examples> data = LoadFashionMnist(started->data_dir, "train", &slice);
  if (!data.ok()) return Fail(std::string(data.status().message()));
  Backend* backend = started->backend.get();
  if (absl::Status s = started->network.FitsBatch(batch); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  Network mlp(started->network, batch, backend);

  ClientOptions options = shards.options;
  options.push_type = *push_type;
  options.rpc_timeout = absl::Seconds(absl::GetFlag(FLAGS_rpc_timeout_seconds));
  options.num_workers = workers;
  ModelIdentity model{mlp.Fingerprint(), mlp.num_params(),
                      static_cast<int>(shards.addresses.size())};
  ShardedClient client(shards.addresses, model, rank, options);
  CancelOnShutdown cancel_on_shutdown(&client);
  // Heartbeats keep this worker in the shards' active set while it computes or waits at a
  // barrier; each has a deadline of one interval, so a stalled shard does not delay the others.
  const absl::Duration heartbeat = absl::Seconds(absl::GetFlag(FLAGS_heartbeat_seconds));
  absl::StatusOr<std::unique_ptr<WorkerSession>> session = WorkerSession::Start(&client, heartbeat);
  if (!session.ok() && ShutdownRequested()) return 0;
  if (!session.ok()) return Fail(std::string(session.status().message()));
  const int64_t first_step = (*session)->first_step();
  absl::StatusOr<ConsistencySpec> consistency = ParseConsistencySpec(client.consistency());
  if (!consistency.ok()) {
    return Fail("the shards run " + std::string(consistency.status().message()));
  }
  const bool prefetch = absl::GetFlag(FLAGS_prefetch);
  if (prefetch && consistency->local_models()) {  // a local model pulls only every few steps
    return Fail("--prefetch needs async, ssp:S or sync shards; these run " +
                client.consistency());
  }
  // --max_seconds ends the run even in the middle of a wait on a shard.
  const double max_seconds = absl::GetFlag(FLAGS_max_seconds);
  const absl::Time start = absl::Now();
  const absl::Time time_limit =
      max_seconds > 0 ? start + absl::Seconds(max_seconds) : absl::InfiniteFuture();
  struct Deadline {
    std::thread thread;
    ~Deadline() {
      RequestShutdown();
      thread.join();
    }
  } deadline{std::thread([time_limit] {
    if (!WaitForShutdown(time_limit - absl::Now())) {
      PS_LOG(INFO) << "--max_seconds reached: stopping";
      RequestShutdown();
    }
  })};
  if (rank == 0) {
    absl::StatusOr<int> applied = client.Initialize(mlp.InitialParams(seed));
    if (!applied.ok() && ShutdownRequested()) return 0;
    if (!applied.ok()) return Fail(std::string(applied.status().message()));
    PS_LOG(INFO) << "initialised " << *applied << " of " << client.num_shards()
                 << " shards (the others already held the model)";
  }
  PS_LOG(INFO) << mlp.Fingerprint() << " (" << mlp.num_params() << " parameters) on "
               << backend->Name() << ", examples [" << slice.begin << ", " << slice.end
               << "), starting at step " << first_step;

  absl::StatusOr<CsvWriter> csv =
      CsvWriter::Open(started->csv.empty() ? "/dev/null" : started->csv,
                      {"step", "wall_time", "loss", "base_version", "staleness", "epoch", "dropped",
                       "pull_ms", "compute_ms", "push_ms"});
  if (!csv.ok()) return Fail(std::string(csv.status().message()));

  // The data shard lives in backend memory (the GPU's, with CUDA); each step sends indices only.
  mlp.SetTrainingSet(data->features.data(), data->labels.data(), data->count);
  BatchSampler sampler(data->count, batch, seed * 1000003 + rank);
  StepMetrics metrics(started->metrics.get(), rank);
  *data = Examples();  // the backend has its own copy
  Run run{client,
          mlp,
          backend,
          sampler,
          metrics,
          *csv,
          *pull_delay,
          *push_delay,
          slowdown,
          batch,
          absl::GetFlag(FLAGS_steps),
          start,
          time_limit,
          first_step};
  absl::StatusOr<int64_t> stopped =
      consistency->local_models()
          ? TrainLocalModel(run, first_step, *consistency, local_lr,
                            static_cast<float>(local_momentum), local_schedule == "cosine")
          : TrainOnGradients(run, first_step, prefetch);
  if (!stopped.ok()) return Fail(std::string(stopped.status().message()));
  const int64_t step = *stopped;
  PS_LOG(INFO) << "done at step " << step << " after " << absl::ToDoubleSeconds(absl::Now() - start)
               << " s; " << run.duplicate_pushes << " duplicate push(es), registered again with "
               << client.reregistrations() << " restarted shard(s)";
  // Leave the active set now (after the last heartbeat, which would rejoin), so that sync rounds
  // need not wait out this worker's lease.
  cancel_on_shutdown.Join();  // or it could cancel the Leave
  if (absl::Status s = (*session)->Leave(absl::Seconds(2)); !s.ok()) {
    PS_LOG(WARNING) << "leave: " << s;
  }
  if (started->health != nullptr) started->health->Shutdown();
  return 0;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) { return ps::Main(argc, argv); }
