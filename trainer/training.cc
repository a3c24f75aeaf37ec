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
#include "trainer/network.h"
#include "trainer/overlapped_step.h"
#include "client/local_exchange.h"
#include "client/local_model.h"
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

// What both training loops share: the run's bounds, the straggler and delay injections, how a
// step ends the run, and each step's record (CSV row, metrics, a progress line every 10 s).
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
  // The delay injected before a pull or a push; false if stopped.
  static bool Wait(Delay& delay) { return !(delay.enabled() && WaitForShutdown(delay.Next())); }
  // The straggler injection after a compute that took `compute`; false if stopped.
  bool SlowDown(absl::Duration compute) const {
    return !(slowdown > 1 && WaitForShutdown((slowdown - 1) * compute));
  }
  // After `call` failed at `step`: false (stop) when the process is stopping, which cancels
  // calls; else the run's end, UNAVAILABLE with the reason (the client closed).
  absl::StatusOr<bool> StopOrFail(absl::string_view call, int64_t step, const absl::Status& s) {
    if (ShutdownRequested()) return false;
    client.Close();
    return absl::UnavailableError(absl::StrCat(call, " failed at step ", step, ": ", s.message()));
  }
  // OK for a finite loss; else the run's end (the client closed), suggesting `remedy`.
  absl::Status CheckLoss(float loss, int64_t step, absl::string_view remedy) {
    if (std::isfinite(loss)) return absl::OkStatus();
    client.Close();
    return absl::InternalError(absl::StrCat("training diverged: loss is ", loss, " at step ", step,
                                            " (lower ", remedy, ")"));
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

// The step loop of both kinds of training: `steps.Step(step)` from `step` on while the run's
// bounds allow it; Step returns true to go on, false when the process is stopping, or the error
// that ends the run. Returns the step the run stopped at.
template <typename Steps>
absl::StatusOr<int64_t> RunSteps(Run& run, int64_t step, Steps& steps) {
  for (; run.More(step); ++step) {
    absl::StatusOr<bool> more = steps.Step(step);
    if (!more.ok()) return more.status();
    if (!*more) break;
  }
  return step;
}

// async, sync, ssp: each step pulls the weights, computes a minibatch's gradient and pushes it.
// With `prefetch`, the next step's pull is in flight while this step computes; with `overlap`,
// the step's own pull and push are, layer by layer (trainer/overlapped_step.h).
class GradientSteps {
 public:
  GradientSteps(Run& run, bool prefetch, bool overlap)
      : run_(run),
        prefetch_(prefetch),
        overlap_(overlap),
        params_a_(run.backend, run.net.num_params()),
        params_b_(run.backend, run.net.num_params()),
        grad_(run.backend, run.net.num_params()) {}

  // As RunSteps says.
  absl::StatusOr<bool> Step(int64_t step) {
    if (!Run::Wait(run_.pull_delay)) return false;
    const absl::Time pull_start = absl::Now();
    ShardedClient::Pending<ShardedClient::Versions> pull =
        prefetched_.valid() ? std::move(prefetched_) : run_.client.StartPull(params_->span());
    run_.sampler.Indices(step, &indices_);
    Gradient g;
    absl::StatusOr<bool> computed = overlap_
                                        ? ComputeOverlapped(step, std::move(pull), pull_start, g)
                                        : Compute(step, std::move(pull), pull_start, g);
    if (!computed.ok() || !*computed) return computed;
    run_.metrics.Observe(StepMetrics::kPull, g.pull_time);
    run_.metrics.Observe(StepMetrics::kCompute, g.compute_time);
    if (absl::Status s = run_.CheckLoss(g.loss, step, "the learning rate"); !s.ok()) return s;
    if (!run_.SlowDown(g.compute_time)) return false;
    return Push(step, g);
  }

 private:
  // A step's gradient (in grad_) and how it was computed.
  struct Gradient {
    float loss = 0;
    ShardedClient::Versions versions;  // of the weights it was computed on
    absl::Duration pull_time, compute_time;
    ShardedClient::Pending<ShardedClient::PushSummary> push;  // started by an overlapped step
  };

  // Waits for `pull`, starts the prefetch, computes. True when computed; else as RunSteps says.
  absl::StatusOr<bool> Compute(int64_t step, ShardedClient::Pending<ShardedClient::Versions> pull,
                               absl::Time pull_start, Gradient& g) {
    absl::StatusOr<ShardedClient::Versions> pulled = pull.Wait();
    g.pull_time = absl::Now() - pull_start;
    if (!pulled.ok()) return run_.StopOrFail("pull", step, pulled.status());
    g.versions = *std::move(pulled);
    StartPrefetch(step);
    const absl::Time compute_start = absl::Now();
    g.loss =
        run_.net.GradientOfExamples(params_->span(), indices_.data(), run_.batch, grad_.span());
    g.compute_time = absl::Now() - compute_start;
    return true;
  }

  // The pull's values feed the forward pass, and backward starts the push's. A pull that failed
  // under values the forward pass used: the step is computed once more, on a new pull.
  absl::StatusOr<bool> ComputeOverlapped(int64_t step,
                                         ShardedClient::Pending<ShardedClient::Versions> pull,
                                         absl::Time pull_start, Gradient& g) {
    {
      OverlappedStep exchange(&run_.client, std::move(pull), grad_.span(),
                              {.pulled = [this, step] { StartPrefetch(step); },
                               .before_push =
                                   [this] {
                                     return Run::Wait(run_.push_delay)
                                                ? absl::OkStatus()
                                                : absl::CancelledError("stopping");
                                   }});
      absl::StatusOr<float> computed = run_.net.GradientOfExamples(
          params_->span(), indices_.data(), run_.batch, grad_.span(), exchange.Hooks());
      if (computed.ok()) {
        g.loss = *computed;
        g.pull_time = exchange.pull_wait();
        g.compute_time = absl::Now() - pull_start - g.pull_time;
        g.versions = exchange.versions();
        g.push = exchange.TakePush();
        return true;
      }
      if (ShutdownRequested() || !absl::IsAborted(computed.status()) ||
          absl::string_view(exchange.failed_call()) != "pull") {
        return run_.StopOrFail(exchange.failed_call(), step, computed.status());
      }
      PS_LOG(WARNING) << "step " << step << ": " << computed.status().message()
                      << "; computing the step again on a new pull";
    }  // (the step's pull has ended here: nothing writes into the weights any more)
    return Compute(step, run_.client.StartPull(params_->span()), pull_start, g);
  }

  // Pushes the gradient (or waits for the push the overlapped step started) and records the step.
  absl::StatusOr<bool> Push(int64_t step, Gradient& g) {
    if (!g.push.valid()) {
      if (!Run::Wait(run_.push_delay)) return false;
      g.push = run_.client.StartPush(grad_.span());
    }
    const absl::Time push_start = absl::Now();
    absl::StatusOr<ShardedClient::PushSummary> pushed = g.push.Wait();
    if (!pushed.ok()) return run_.StopOrFail("push", step, pushed.status());
    const absl::Duration push_time = absl::Now() - push_start;
    run_.metrics.Observe(StepMetrics::kPush, push_time);
    run_.Pushed(step, *pushed);
    run_.Record(step, g.loss, g.versions.Min(), *pushed, g.pull_time, g.compute_time, push_time);
    if (prefetched_.valid()) std::swap(params_, next_params_);
    return true;
  }

  // With prefetch, the pull of the next step's weights into next_params_, while this one computes.
  void StartPrefetch(int64_t step) {
    if (prefetch_ && (run_.steps == 0 || step + 1 < run_.steps)) {
      prefetched_ = run_.client.StartPull(next_params_->span(), /*prefetch=*/true);
    }
  }

  Run& run_;
  const bool prefetch_, overlap_;
  // Two weight buffers: with prefetch, one is filled for the next step while the other is used.
  HostBuffer<float> params_a_, params_b_, grad_;
  HostBuffer<float>*params_ = &params_a_, *next_params_ = &params_b_;
  std::vector<int32_t> indices_;
  // The prefetch in flight. Declared after the buffers it writes into, so destroyed (waiting for
  // it) before them; after a failure the client is closed first, which cancels it.
  ShardedClient::Pending<ShardedClient::Versions> prefetched_;
};

// easgd and local: the worker trains its own model (LocalModel) with SGD and trades it with the
// shards' centre as LocalExchange (client/local_exchange.h) says; the delays, metrics and CSV rows
// around the exchange are the run's.
class LocalModelSteps {
 public:
  LocalModelSteps(Run& run, float lr, float momentum, bool cosine)
      : run_(run),
        lr_(lr),
        cosine_(cosine),
        x_(run.backend, run.net.num_params()),
        grad_(run.backend, run.net.num_params()),
        model_(x_.span(), momentum) {}

  // The exchange with the shards, before the first Step: FAILED_PRECONDITION as
  // LocalExchange::Create says.
  absl::Status Connect() {
    auto delay = [](Delay& d) {
      return [&d] { return Run::Wait(d) ? absl::OkStatus() : absl::CancelledError("stopping"); };
    };
    absl::StatusOr<std::unique_ptr<LocalExchange>> exchange = LocalExchange::Create(
        &run_.client, &model_, {delay(run_.pull_delay), delay(run_.push_delay)});
    if (!exchange.ok()) return exchange.status();
    exchange_ = *std::move(exchange);
    return absl::OkStatus();
  }

  // As RunSteps says.
  absl::StatusOr<bool> Step(int64_t step) {
    Exchanged exchanged;
    absl::StatusOr<bool> more = Exchange(step, exchange_->BeforeStep(step), exchanged);
    if (!more.ok() || !*more) return more;
    run_.sampler.Indices(step, &indices_);
    const absl::Time compute_start = absl::Now();
    float loss = run_.net.GradientOfExamples(x_.span(), indices_.data(), run_.batch, grad_.span());
    model_.Step(grad_.span(), Rate(step));
    const absl::Duration compute_time = absl::Now() - compute_start;
    run_.metrics.Observe(StepMetrics::kCompute, compute_time);
    if (absl::Status s = run_.CheckLoss(loss, step, "--local_lr"); !s.ok()) return s;
    if (!run_.SlowDown(compute_time)) return false;
    more = Exchange(step, exchange_->AfterStep(step, step + 1 == run_.steps), exchanged);
    if (!more.ok() || !*more) return more;
    run_.Record(step, loss, run_.client.last_pull().Min(), exchanged.push, exchanged.pull_time,
                compute_time, exchanged.push_time);
    return true;
  }

 private:
  // What a step exchanged with the shards (nothing, most steps).
  struct Exchanged {
    absl::Duration pull_time, push_time;
    ShardedClient::PushSummary push;
  };

  // Notes what the exchange that ended with `s` did. True when it succeeded; else as RunSteps
  // says.
  absl::StatusOr<bool> Exchange(int64_t step, const absl::Status& s, Exchanged& exchanged) {
    const LocalExchange::Exchanged& done = exchange_->exchanged();
    if (done.pulled) {
      exchanged.pull_time = done.pull_time;
      run_.metrics.Observe(StepMetrics::kPull, done.pull_time);
    }
    if (done.pushed) {
      exchanged.push_time = done.push_time;
      run_.metrics.Observe(StepMetrics::kPush, done.push_time);
    }
    if (!s.ok()) return run_.StopOrFail(exchange_->failed_call(), step, s);
    if (done.pushed) {
      run_.Pushed(step, done.push);
      exchanged.push = done.push;
    }
    return true;
  }

  // The local SGD's rate at `step`: lr, or with the cosine schedule decaying over the run's steps.
  float Rate(int64_t step) const {
    return cosine_ && run_.steps > 0
               ? lr_ * 0.5f * (1 + std::cos(3.14159265f * static_cast<float>(step) / run_.steps))
               : lr_;
  }

  Run& run_;
  const float lr_;
  const bool cosine_;
  HostBuffer<float> x_, grad_;
  LocalModel model_;
  std::unique_ptr<LocalExchange> exchange_;
  std::vector<int32_t> indices_;
};

// The shards' consistency model, which the options must fit (a local model pulls every few
// steps, and pushes no gradient: no prefetch, no overlap).
absl::StatusOr<ConsistencySpec> ShardConsistency(const ShardedClient& client,
                                                 const TrainingOptions& options) {
  absl::StatusOr<ConsistencySpec> consistency = ParseConsistencySpec(client.consistency());
  if (!consistency.ok()) {
    return absl::FailedPreconditionError("the shards run " +
                                         std::string(consistency.status().message()));
  }
  if ((options.prefetch || options.overlap) && consistency->local_models()) {
    return absl::InvalidArgumentError(absl::StrCat(options.prefetch ? "--prefetch" : "--overlap",
                                                   " needs async, ssp:S or sync shards; these run ",
                                                   client.consistency()));
  }
  return consistency;
}

// The time limit ends the run even in the middle of a wait on a shard: at `limit` a thread
// requests the process's shutdown. Destroying it requests shutdown too (the run is over).
class Deadline {
 public:
  explicit Deadline(absl::Time limit)
      : thread_([limit] {
          if (!WaitForShutdown(limit - absl::Now())) {
            PS_LOG(INFO) << "--max_seconds reached: stopping";
            RequestShutdown();
          }
        }) {}
  ~Deadline() {
    RequestShutdown();
    thread_.join();
  }

 private:
  std::thread thread_;
};

// Rank 0's initialisation of the shards with the seed's weights.
absl::Status InitializeShards(ShardedClient& client, Network& net, uint64_t seed) {
  absl::StatusOr<int> applied = client.Initialize(net.InitialParams(seed));
  if (!applied.ok()) return applied.status();
  PS_LOG(INFO) << "initialised " << *applied << " of " << client.num_shards()
               << " shards (the others already held the model)";
  return absl::OkStatus();
}

// The worker's CSV, a row per step (Run::Record); "": none.
absl::StatusOr<CsvWriter> OpenStepCsv(const std::string& path) {
  return CsvWriter::Open(path.empty() ? "/dev/null" : path,
                         {"step", "wall_time", "loss", "base_version", "staleness", "epoch",
                          "dropped", "pull_ms", "compute_ms", "push_ms"});
}

// Trains from the run's first step as the shards' consistency model says. Returns the step it
// stopped at, or the error that ended the run.
absl::StatusOr<int64_t> TrainFrom(Run& run, const ConsistencySpec& consistency,
                                  const TrainingOptions& options) {
  if (consistency.local_models()) {
    LocalModelSteps steps(run, options.local_lr, options.local_momentum, options.local_cosine);
    if (absl::Status s = steps.Connect(); !s.ok()) return s;
    return RunSteps(run, run.first_step, steps);
  }
  GradientSteps steps(run, options.prefetch, options.overlap);
  return RunSteps(run, run.first_step, steps);
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
  ModelIdentity model{mlp.Fingerprint(), mlp.num_params(),
                      static_cast<int>(shards.addresses.size())};
  ShardedClient client(shards.addresses, model, rank, shards.options);
  CancelOnShutdown cancel_on_shutdown(&client);
  // Heartbeats keep this worker in the shards' active set while it computes or waits at a
  // barrier; each has a deadline of one interval, so a stalled shard does not delay the others.
  absl::StatusOr<std::unique_ptr<WorkerSession>> session =
      WorkerSession::Start(&client, shards.heartbeat);
  if (!session.ok() && ShutdownRequested()) return absl::OkStatus();
  if (!session.ok()) return session.status();
  const int64_t first_step = (*session)->first_step();
  absl::StatusOr<ConsistencySpec> consistency = ShardConsistency(client, options);
  if (!consistency.ok()) return consistency.status();
  const absl::Time start_time = absl::Now();
  const absl::Time time_limit = start_time + options.time_limit;
  Deadline deadline(time_limit);
  if (rank == 0) {
    absl::Status s = InitializeShards(client, mlp, options.seed);
    if (!s.ok()) return ShutdownRequested() ? absl::OkStatus() : s;
  }
  PS_LOG(INFO) << mlp.Fingerprint() << " (" << mlp.num_params() << " parameters) on "
               << backend->Name() << ", examples [" << slice.begin << ", " << slice.end
               << "), starting at step " << first_step;

  absl::StatusOr<CsvWriter> csv = OpenStepCsv(start.csv);
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
  absl::StatusOr<int64_t> stopped = TrainFrom(run, *consistency, options);
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
