// compute_bench: worker compute throughput, i.e. one training step exactly as a worker runs it
// (Network::GradientOfExamples on a training set held in backend memory: the batch's indices and
// the parameters uploaded from the backend's host buffers (pinned on a GPU), forward, backward, the
// gradient downloaded into a host buffer), against a ceiling measured in the same run: the
// backend's own Gemm on a square matrix product (1024^3 on the CPU, 4096^3 on a GPU).
//
//   build/bin/compute_bench --device=cpu --threads=2
//   PS_CUDA_MATH=tf32 build/bin/compute_bench --device=cuda --csv=results.csv
//   PS_CUDA_GRAPHS=0 build/bin/compute_bench --device=cuda   # kernels launched one by one
//
// Timing. Each step is timed with the wall clock. That is valid on a GPU too, because a step
// ends by waiting for the backend's stream. The ceiling's Gemm calls return before the GPU has
// run them, so each timed sample is N Gemm calls followed by a 4-byte CopyToHost, which waits.
//
// FLOPs. Counted as 2*m*n*k per GEMM, over the GEMMs the network issues: per dense or conv layer
// one forward GEMM (batch x out x in; a convolution's rows are batch x output pixels and its
// inputs K*K*C_in), one weight-gradient GEMM and, for every layer but the first, one
// input-gradient GEMM of the same size. Im2col, pooling, bias, ReLU, softmax and copies are not
// counted, so achieved/ceiling also shows what they and the transfers cost.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/csv_writer.h"
#include "common/log.h"
#include "common/network_spec.h"
#include "kernels/backend.h"
#include "trainer/batch_sampler.h"
#include "trainer/network.h"

ABSL_FLAG(std::string, device, "cpu", "Backend: cpu | cuda | cuda:N | auto.");
ABSL_FLAG(int, threads, 1, "BLAS threads of the CPU backend.");
ABSL_FLAG(int, iters, 20, "Timed steps per config, at most (see --budget_seconds).");
ABSL_FLAG(int, warmup, 2, "Untimed steps per config before timing.");
ABSL_FLAG(double, budget_seconds, 10,
          "Time each config for about this long: fewer than --iters steps when a step is slow "
          "(at least 3).");
ABSL_FLAG(std::vector<std::string>, configs,
          std::vector<std::string>({"784-256-128-10:256", "784-4096-4096-10:1024", "cnn-small:64",
                                    "cnn-large:64"}),
          "Models and batch sizes, each MODEL:BATCH with MODEL = inputs-hidden...-classes (an "
          "MLP), a spec or a preset (common/network_spec.h).");
ABSL_FLAG(std::string, csv, "",
          "Append one row per config here (bench,device,config,batch,ms,samples_per_s,gflops,"
          "ceiling_gflops,ratio).");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the weights, inputs and labels.");

namespace ps {
namespace {

struct Config {
  std::string name;  // the model as given, e.g. "784-256-128-10" or "cnn-small"
  NetworkSpec network;
  int batch = 0;
};

absl::StatusOr<Config> ParseConfig(const std::string& text) {
  const size_t colon = text.rfind(':');
  Config c;
  if (colon == std::string::npos || !absl::SimpleAtoi(text.substr(colon + 1), &c.batch) ||
      c.batch <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad --configs entry '", text, "': expected MODEL:BATCH like 784-256-10:256"));
  }
  c.name = text.substr(0, colon);
  // Bare layer sizes are an MLP; anything else a spec or preset (common/network_spec.h).
  const bool layers = c.name.find_first_not_of("0123456789-") == std::string::npos;
  absl::StatusOr<NetworkSpec> network = ResolveModel(layers ? "mlp:" + c.name : c.name, "");
  if (!network.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--configs entry '", text, "': ", network.status().message()));
  }
  c.network = *std::move(network);
  return c;
}

// FLOPs of the GEMMs of one Network::Gradient call (see the file comment).
double StepFlops(const NetworkSpec& network, int batch) {
  double flops = 0;
  for (size_t l = 0; l < network.layers.size(); ++l) {
    const LayerSpec& layer = network.layers[l];
    double product = 0;  // 2 m n k of the forward GEMM
    if (layer.kind == LayerSpec::Kind::kDense) {
      product = 2.0 * batch * layer.in_size() * layer.size;
    } else if (layer.kind == LayerSpec::Kind::kConv) {
      product = 2.0 * batch * layer.out_height * layer.out_width * layer.kernel * layer.kernel *
                layer.in_channels * layer.size;
    }
    flops += (l == 0 ? 2 : 3) * product;
  }
  return flops;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<float> RandomFloats(size_t n, std::mt19937_64& rng, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// GFLOP/s of the backend's Gemm on an n x n x n product of random matrices: the median of
// `samples` samples of `calls` calls each, every sample ended by a 4-byte CopyToHost that waits
// for the queued Gemms on an asynchronous (GPU) backend.
double GemmCeiling(Backend* backend, int n, int calls, int samples, uint64_t seed) {
  std::mt19937_64 rng(seed);
  size_t elems = static_cast<size_t>(n) * n;
  DeviceBuffer<float> a(backend, elems), b(backend, elems), c(backend, elems);
  a.Upload(RandomFloats(elems, rng, -1, 1).data(), elems);
  b.Upload(RandomFloats(elems, rng, -1, 1).data(), elems);
  float sink = 0;
  auto run = [&](int k) {
    for (int i = 0; i < k; ++i) {
      backend->Gemm(false, false, n, n, n, 1.0f, a.data(), b.data(), 0.0f, c.data());
    }
    backend->CopyToHost(&sink, c.data(), sizeof(float));  // synchronises a GPU stream
  };
  run(2);  // warm-up: library initialisation, kernel selection, clocks
  std::vector<double> gflops;
  for (int s = 0; s < samples; ++s) {
    absl::Time start = absl::Now();
    run(calls);
    double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    gflops.push_back(2.0 * n * n * static_cast<double>(n) * calls / seconds / 1e9);
  }
  return Median(gflops);
}

struct Result {
  int steps = 0;
  double ms = 0;
  double samples_per_s = 0;
  double gflops = 0;
  double copy_ms = 0;  // params upload + gradient download alone
  int64_t params = 0;
};

Result RunConfig(Backend* backend, const Config& config, uint64_t seed) {
  Network mlp(config.network, config.batch, backend);
  std::mt19937_64 rng(seed);
  // A training set of 8 batches (at least 4096 examples), held in backend memory.
  const int64_t count = std::max<int64_t>(4096, 8 * config.batch);
  {
    std::vector<float> features =
        RandomFloats(static_cast<size_t>(count) * mlp.num_inputs(), rng, 0, 1);
    std::vector<int32_t> labels(count);
    std::uniform_int_distribution<int32_t> label(0, mlp.num_classes() - 1);
    for (int32_t& y : labels) y = label(rng);
    mlp.SetTrainingSet(features.data(), labels.data(), count);
  }
  BatchSampler sampler(count, config.batch, seed);
  HostBuffer<float> params(backend, mlp.num_params()), grad(backend, mlp.num_params());
  std::vector<float> initial = mlp.InitialParams(seed);
  std::copy(initial.begin(), initial.end(), params.data());
  std::vector<int32_t> indices;
  int64_t step_index = 0;

  auto step = [&] {
    sampler.Indices(step_index++, &indices);
    absl::Time start = absl::Now();
    float loss = mlp.GradientOfExamples(params.span(), indices.data(), config.batch, grad.span());
    double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    if (!std::isfinite(loss)) {
      PS_LOG(ERROR) << "non-finite loss " << loss << " on " << config.name;
      std::exit(1);
    }
    return seconds;
  };
  double last = 0;
  for (int i = 0; i < std::max(1, absl::GetFlag(FLAGS_warmup)); ++i) last = step();
  int steps = std::clamp(static_cast<int>(absl::GetFlag(FLAGS_budget_seconds) / last), 3,
                         std::max(3, absl::GetFlag(FLAGS_iters)));
  std::vector<double> times;
  for (int i = 0; i < steps; ++i) times.push_back(step());

  // The transfers every step makes, timed alone: they bound a GPU step from below.
  DeviceBuffer<float> scratch(backend, mlp.num_params());
  std::vector<double> copies;
  for (int i = 0; i < std::min(steps, 10); ++i) {
    absl::Time start = absl::Now();
    scratch.UploadAsync(params.data(), params.size());
    scratch.DownloadAsync(grad.data(), grad.size());
    backend->Synchronize();
    copies.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }

  Result r;
  r.steps = steps;
  double seconds = Median(times);
  r.ms = seconds * 1e3;
  r.samples_per_s = config.batch / seconds;
  r.gflops = StepFlops(config.network, config.batch) / seconds / 1e9;
  r.copy_ms = Median(copies) * 1e3;
  r.params = mlp.num_params();
  return r;
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "A worker's training step throughput on each backend.\n"
      "  compute_bench");
  absl::ParseCommandLine(argc, argv);
  std::vector<Config> configs;
  for (const std::string& text : absl::GetFlag(FLAGS_configs)) {
    absl::StatusOr<Config> c = ParseConfig(text);
    if (!c.ok()) return FailMain("compute_bench", std::string(c.status().message()));
    configs.push_back(*std::move(c));
  }
  const int threads = absl::GetFlag(FLAGS_threads);
  absl::StatusOr<std::unique_ptr<Backend>> made = MakeBackend(absl::GetFlag(FLAGS_device), threads);
  if (!made.ok()) return FailMain("compute_bench", std::string(made.status().message()));
  Backend* backend = made->get();
  const bool gpu = backend->Name().rfind("cuda", 0) == 0;
  // The device column says what the numbers depend on: GEMM math on a GPU, BLAS threads on a CPU.
  std::string device = backend->Name();
  if (gpu) {
    const char* math = std::getenv("PS_CUDA_MATH");
    absl::StrAppend(&device, "/", math != nullptr && *math != '\0' ? math : "fp32");
  } else {
    absl::StrAppend(&device, "/", threads, "thr");
  }

  const int ceiling_n = gpu ? 4096 : 1024;
  const int ceiling_calls = gpu ? 20 : 3;
  // Measured before and after the configs: on a shared machine either can be disturbed, and a
  // ceiling that is too low would flatter the ratios, so the higher of the two is used.
  double ceiling_before =
      GemmCeiling(backend, ceiling_n, ceiling_calls, 5, absl::GetFlag(FLAGS_seed));
  std::cout << absl::StrFormat(
      "compute_bench on %s: one step = the worker's (Network::GradientOfExamples: indices + params "
      "up from host buffers, batch gathered on the device, forward, backward, gradient down)\n",
      device);

  std::unique_ptr<CsvWriter> csv;
  if (!absl::GetFlag(FLAGS_csv).empty()) {
    absl::StatusOr<CsvWriter> w = CsvWriter::Open(
        absl::GetFlag(FLAGS_csv), {"bench", "device", "config", "batch", "ms", "samples_per_s",
                                   "gflops", "ceiling_gflops", "ratio"});
    if (!w.ok()) return FailMain("compute_bench", std::string(w.status().message()));
    csv = std::make_unique<CsvWriter>(*std::move(w));
  }

  std::vector<Result> results;
  for (const Config& config : configs) {
    results.push_back(RunConfig(backend, config, absl::GetFlag(FLAGS_seed)));
  }
  double ceiling_after =
      GemmCeiling(backend, ceiling_n, ceiling_calls, 5, absl::GetFlag(FLAGS_seed));
  double ceiling = std::max(ceiling_before, ceiling_after);
  std::cout << absl::StrFormat(
      "ceiling: backend Gemm %d^3 = %.1f GFLOP/s (median of 5 samples of %d calls, each sample "
      "ended by a 4-byte CopyToHost; %.1f before the configs, %.1f after, the higher is used)\n",
      ceiling_n, ceiling, ceiling_calls, ceiling_before, ceiling_after);
  std::cout << absl::StrFormat("%-20s %6s %10s %6s %10s %12s %10s %10s %7s\n", "config", "batch",
                               "params", "steps", "ms/step", "samples/s", "GFLOP/s", "ceiling",
                               "ratio");
  std::vector<std::string> notes;
  for (size_t i = 0; i < configs.size(); ++i) {
    const Config& config = configs[i];
    const Result& r = results[i];
    double ratio = r.gflops / ceiling;
    std::cout << absl::StrFormat("%-20s %6d %10d %6d %10.3f %12.1f %10.1f %10.1f %7.3f\n",
                                 config.name, config.batch, r.params, r.steps, r.ms,
                                 r.samples_per_s, r.gflops, ceiling, ratio);
    notes.push_back(absl::StrFormat(
        "  %s: params upload + gradient download alone %.3f ms (%.1f GB/s), %.0f%% of the step; "
        "%.3f GFLOP/step",
        config.name, r.copy_ms, 2.0 * 4 * r.params / (r.copy_ms * 1e-3) / 1e9,
        100 * r.copy_ms / r.ms, StepFlops(config.network, config.batch) / 1e9));
    if (csv) {
      csv->Row({"compute_bench", device, config.name, absl::StrCat(config.batch),
                absl::StrFormat("%.4f", r.ms), absl::StrFormat("%.1f", r.samples_per_s),
                absl::StrFormat("%.2f", r.gflops), absl::StrFormat("%.2f", ceiling),
                absl::StrFormat("%.4f", ratio)});
    }
  }
  std::cout << absl::StrJoin(notes, "\n") << "\n";
  return 0;
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) { return ps::Main(argc, argv); }
