// A shard's Prometheus metrics (ps --metrics_port). Most are read from ParameterShard::Stats at
// each scrape by a collector, so the data path pays nothing for them: versions, updates, pulls,
// rejections and drops by reason, workers registered and active, the staleness histogram, and
// each worker's clock, pushes and seconds since last seen. The service measures what only it
// sees: push and pull latency and payload bytes, and calls refused for want of a place
// (ServiceMetrics). With a checkpointer, its
// failures and its newest checkpoint's time and version.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/histogram.h>

#include "transport/metrics.h"
#include "server/state/parameter_shard.h"

namespace ps {

class Checkpointer;

// Owned by the endpoint's registry; null pointers (no --metrics_port) measure nothing.
struct ServiceMetrics {
  prometheus::Histogram* push_seconds = nullptr;  // a whole push: first byte to the answer
  prometheus::Histogram* pull_seconds = nullptr;  // a whole pull, waiting included
  prometheus::Counter* push_bytes = nullptr;      // payload received (on the wire)
  prometheus::Counter* pull_bytes = nullptr;      // payload sent
  // Calls refused for want of a place, by kind (CallLimit: "pulls", "streams").
  prometheus::Family<prometheus::Counter>* refused = nullptr;
};

// Registers the shard's metrics on `endpoint` (labelled shard="i"); `shard` and `checkpointer`
// (null: no checkpoint metrics) must outlive it.
ServiceMetrics AddShardMetrics(MetricsEndpoint* endpoint, const ParameterShard* shard,
                               const Checkpointer* checkpointer = nullptr);

}  // namespace ps
