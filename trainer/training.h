// A worker's training run, what `worker` does once its flags checked out: loads its slice of
// Fashion-MNIST, builds the network, registers with the shards (WorkerSession: heartbeats, leave),
// initialises the model (rank 0), then trains, pulling weights and pushing gradients (async, sync,
// ssp) or exchanging a local model every few steps (easgd, local), until the step limit, the time
// limit or SIGTERM; a CSV row per step, Prometheus metrics, a progress line every 10 s.
//
// Train runs on the calling thread (plus the client's and the session's threads) and uses the
// process's shutdown notification (common/shutdown.h): call it once per process.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "trainer/client_start.h"
#include "trainer/delay.h"

namespace ps {

struct TrainingOptions {
  int rank = 0;         // worker id in [0, num_workers); rank 0 initialises the model
  int num_workers = 1;  // worker r trains on slice r of num_workers of the training set
  int batch_size = 64;
  int64_t steps = 0;                                     // in total, restarts included; 0: no limit
  absl::Duration time_limit = absl::InfiniteDuration();  // ends the run, even mid-wait
  uint64_t seed = 1;  // of the initial weights and of the batch order
  double slowdown = 1;           // straggler injection: compute takes this many times longer
  Delay pull_delay, push_delay;  // before each pull and push
  bool prefetch = false;         // pull the next step's weights while computing (not easgd, local)
  bool overlap = false;          // communicate layer by layer during compute (not easgd, local)
  // easgd, local: the worker's own model's SGD: rate, momentum, cosine schedule over `steps`.
  float local_lr = 0.01f;
  float local_momentum = 0.9f;
  bool local_cosine = false;
};

// What a --dry_run checks beyond the flags: the training data can be read (its first example)
// and the network takes `batch_size`. INVALID_ARGUMENT or the reader's error otherwise.
absl::Status CheckTrainingData(const ClientStart& start, int batch_size);

// Trains as `options` say with what `start` set up (StartClient with checks_only false). OK once
// the run ended (limits, SIGTERM; also SIGTERM before it began); otherwise a one-line reason: the
// data or the CSV cannot be read or written, the shards refuse or cannot be reached, they run a
// consistency model the options do not fit, or training diverged.
absl::Status Train(const TrainingOptions& options, ClientStart& start);

}  // namespace ps
