#include "trainer/training.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>

#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/consistency_spec.h"
#include "common/csv_writer.h"
#include "common/log.h"
#include "transport/metrics.h"
#include "common/partition.h"
#include "common/shutdown.h"
#include "kernels/backend.h"
#include "trainer/batch_sampler.h"
#include "trainer/idx_dataset.h"
#include "trainer/local_model.h"
#include "trainer/network.h"
#include "trainer/overlapped_step.h"
#include "client/sharded_client.h"
#include "client/worker_session.h"

namespace ps {
namespace {

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
  // The straggler injection after a compute that took `compute`; false if stopped.
  bool SlowDown(absl::Duration compute) const {
    return !(slowdown > 1 && WaitForShutdown((slowdown - 1) * compute));
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
// With `prefetch`, the next step's pull is in flight while this step computes; with `overlap`,
// the step's own pull and push are, layer by layer (trainer/overlapped_step.h). Returns the step
// it stopped at.
absl::StatusOr<int64_t> TrainOnGradients(Run& run, int64_t step, bool prefetch, bool overlap) {
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
  auto failed = [&](absl::string_view call, const absl::Status& s) {
    return fail(
        absl::UnavailableError(absl::StrCat(call, " failed at step ", step, ": ", s.message())));
  };
  auto start_prefetch = [&] {
    if (prefetch && (run.steps == 0 || step + 1 < run.steps)) {
      prefetched = run.client.StartPull(next_params->span(), /*prefetch=*/true);
    }
  };
  auto push_delay = [&] {
    return run.push_delay.enabled() && WaitForShutdown(run.push_delay.Next())
               ? absl::CancelledError("stopping")
               : absl::OkStatus();
  };
  std::vector<int32_t> indices;
  for (; run.More(step); ++step) {
    if (run.pull_delay.enabled() && WaitForShutdown(run.pull_delay.Next())) break;
    const absl::Time pull_start = absl::Now();
    ShardedClient::Pending<ShardedClient::Versions> pull =
        prefetched.valid() ? std::move(prefetched) : run.client.StartPull(params->span());
    run.sampler.Indices(step, &indices);
    ShardedClient::Versions versions;
    ShardedClient::Pending<ShardedClient::PushSummary> push;
    absl::Duration pull_time, compute_time;
    float loss = 0;
    bool overlapped = false;
    if (overlap) {  // the pull's values feed the forward pass, and backward starts the push's
      OverlappedStep exchange(&run.client, std::move(pull), grad.span(),
                              {.pulled = start_prefetch, .before_push = push_delay});
      absl::StatusOr<float> computed = run.net.GradientOfExamples(
          params->span(), indices.data(), run.batch, grad.span(), exchange.Hooks());
      if (computed.ok()) {
        overlapped = true;
        loss = *computed;
        pull_time = exchange.pull_wait();
        compute_time = absl::Now() - pull_start - pull_time;
        versions = exchange.versions();
        push = exchange.TakePush();
      } else if (ShutdownRequested()) {
        break;
      } else if (!absl::IsAborted(computed.status()) ||
                 absl::string_view(exchange.failed_call()) != "pull") {
        return failed(exchange.failed_call(), computed.status());
      } else {  // the pull failed under values the forward pass used: once more, on a new one
        PS_LOG(WARNING) << "step " << step << ": " << computed.status().message()
                        << "; computing the step again on a new pull";
      }
    }  // (the step's pull has ended here: nothing writes into the weights any more)
    if (!overlapped && overlap) pull = run.client.StartPull(params->span());
    if (!overlapped) {
      absl::StatusOr<ShardedClient::Versions> pulled = pull.Wait();
      pull_time = absl::Now() - pull_start;
      if (!pulled.ok()) {
        if (ShutdownRequested()) break;
        return failed("pull", pulled.status());
      }
      versions = *std::move(pulled);
      start_prefetch();
      const absl::Time compute_start = absl::Now();
      loss = run.net.GradientOfExamples(params->span(), indices.data(), run.batch, grad.span());
      compute_time = absl::Now() - compute_start;
    }
    run.metrics.Observe(StepMetrics::kPull, pull_time);
    run.metrics.Observe(StepMetrics::kCompute, compute_time);
    if (!std::isfinite(loss)) {
      return fail(absl::InternalError(absl::StrCat("training diverged: loss is ", loss, " at step ",
                                                   step, " (lower the learning rate)")));
    }
    if (!run.SlowDown(compute_time)) break;
    if (!push.valid()) {
      if (!push_delay().ok()) break;
      push = run.client.StartPush(grad.span());
    }
    const absl::Time push_start = absl::Now();
    absl::StatusOr<ShardedClient::PushSummary> pushed = push.Wait();
    if (!pushed.ok()) {
      if (ShutdownRequested()) break;
      return failed("push", pushed.status());
    }
    const absl::Duration push_time = absl::Now() - push_start;
    run.metrics.Observe(StepMetrics::kPush, push_time);
    run.Pushed(step, *pushed);
    run.Record(step, loss, versions.Min(), *pushed, pull_time, compute_time, push_time);
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
    if (!run.SlowDown(compute_time)) break;
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

}  // namespace

absl::Status CheckTrainingData(const ClientStart& start, int batch_size) {
  Range first{0, 1};  // the first example: the files are there and readable
  absl::Status s = LoadFashionMnist(start.data_dir, "train", &first).status();
  if (s.ok()) s = start.network.FitsBatch(batch_size);
  return s;
}

absl::Status Train(const TrainingOptions& options, ClientStart& start) {
  const ClientConnection& shards = start.connection;
  const int rank = options.rank, batch = options.batch_size;
  Range slice = PartRange(60000, rank, options.num_workers);
  absl::StatusOr<Examples> data = LoadFashionMnist(start.data_dir, "train", &slice);
  if (!data.ok()) return data.status();
  Backend* backend = start.backend.get();
  if (absl::Status s = start.network.FitsBatch(batch); !s.ok()) return s;
  Network mlp(start.network, batch, backend);

  ClientOptions client_options = shards.options;
  client_options.push_type = options.push_type;
  client_options.compression = options.compression;
  client_options.error_feedback = options.error_feedback;
  client_options.pull_compression = options.pull_compression;
  client_options.rpc_timeout = options.rpc_timeout;
  client_options.num_workers = options.num_workers;
  ModelIdentity model{mlp.Fingerprint(), mlp.num_params(),
                      static_cast<int>(shards.addresses.size())};
  ShardedClient client(shards.addresses, model, rank, client_options);
  CancelOnShutdown cancel_on_shutdown(&client);
  // Heartbeats keep this worker in the shards' active set while it computes or waits at a
  // barrier; each has a deadline of one interval, so a stalled shard does not delay the others.
  absl::StatusOr<std::unique_ptr<WorkerSession>> session =
      WorkerSession::Start(&client, options.heartbeat);
  if (!session.ok() && ShutdownRequested()) return absl::OkStatus();
  if (!session.ok()) return session.status();
  const int64_t first_step = (*session)->first_step();
  absl::StatusOr<ConsistencySpec> consistency = ParseConsistencySpec(client.consistency());
  if (!consistency.ok()) {
    return absl::FailedPreconditionError("the shards run " +
                                         std::string(consistency.status().message()));
  }
  if ((options.prefetch || options.overlap) && consistency->local_models()) {
    // A local model pulls every few steps, and pushes no gradient.
    return absl::InvalidArgumentError(absl::StrCat(options.prefetch ? "--prefetch" : "--overlap",
                                                   " needs async, ssp:S or sync shards; these run ",
                                                   client.consistency()));
  }
  // The time limit ends the run even in the middle of a wait on a shard.
  const absl::Time start_time = absl::Now();
  const absl::Time time_limit = start_time + options.time_limit;
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
    absl::StatusOr<int> applied = client.Initialize(mlp.InitialParams(options.seed));
    if (!applied.ok() && ShutdownRequested()) return absl::OkStatus();
    if (!applied.ok()) return applied.status();
    PS_LOG(INFO) << "initialised " << *applied << " of " << client.num_shards()
                 << " shards (the others already held the model)";
  }
  PS_LOG(INFO) << mlp.Fingerprint() << " (" << mlp.num_params() << " parameters) on "
               << backend->Name() << ", examples [" << slice.begin << ", " << slice.end
               << "), starting at step " << first_step;

  absl::StatusOr<CsvWriter> csv =
      CsvWriter::Open(start.csv.empty() ? "/dev/null" : start.csv,
                      {"step", "wall_time", "loss", "base_version", "staleness", "epoch", "dropped",
                       "pull_ms", "compute_ms", "push_ms"});
  if (!csv.ok()) return csv.status();

  // The data shard lives in backend memory (the GPU's, with CUDA); each step sends indices only.
  mlp.SetTrainingSet(data->features.data(), data->labels.data(), data->count);
  BatchSampler sampler(data->count, batch, options.seed * 1000003 + rank);
  StepMetrics metrics(start.metrics.get(), rank);
  *data = Examples();  // the backend has its own copy
  Delay pull_delay = options.pull_delay, push_delay = options.push_delay;
  Run run{client,        mlp,        backend,    sampler,          metrics,
          *csv,          pull_delay, push_delay, options.slowdown, batch,
          options.steps, start_time, time_limit, first_step};
  absl::StatusOr<int64_t> stopped =
      consistency->local_models()
          ? TrainLocalModel(run, first_step, *consistency, options.local_lr, options.local_momentum,
                            options.local_cosine)
          : TrainOnGradients(run, first_step, options.prefetch, options.overlap);
  if (!stopped.ok()) return stopped.status();
  PS_LOG(INFO) << "done at step " << *stopped << " after "
               << absl::ToDoubleSeconds(absl::Now() - start_time) << " s; " << run.duplicate_pushes
               << " duplicate push(es), registered again with " << client.reregistrations()
               << " restarted shard(s)";
  // Leave the active set now (after the last heartbeat, which would rejoin), so that sync rounds
  // need not wait out this worker's lease.
  cancel_on_shutdown.Join();  // or it could cancel the Leave
  if (absl::Status s = (*session)->Leave(absl::Seconds(2)); !s.ok()) {
    PS_LOG(WARNING) << "leave: " << s;
  }
  if (start.health != nullptr) start.health->Shutdown();
  return absl::OkStatus();
}

}  // namespace ps
