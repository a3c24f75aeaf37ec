#include "server/rpc/shard_metrics.h"

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "server/state/staleness_histogram.h"
#include "server/checkpoints/checkpointer.h"

namespace ps {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

// Reads the shard's statistics at each scrape.
class ShardCollector : public prometheus::Collectable {
 public:
  ShardCollector(const ParameterShard* shard, const Checkpointer* checkpointer)
      : shard_(shard), checkpointer_(checkpointer) {}

  std::vector<MetricFamily> Collect() const override {
    const ShardStats s = shard_->AllStats();
    const std::string shard = std::to_string(s.shard_index);
    std::vector<MetricFamily> out;
    auto one = [&](const char* name, const char* help, MetricType type, double value,
                   std::vector<ClientMetric::Label> labels = {}) {
      ClientMetric m;
      m.label = {{"shard", shard}};
      m.label.insert(m.label.end(), labels.begin(), labels.end());
      (type == MetricType::Counter ? m.counter.value : m.gauge.value) = value;
      for (MetricFamily& f : out) {
        if (f.name == name) {
          f.metric.push_back(std::move(m));
          return;
        }
      }
      out.push_back({name, help, type, {std::move(m)}});
    };
    one("ps_version", "The shard's version (updates applied since the model began).",
        MetricType::Gauge, s.version);
    one("ps_initialized", "1 once the shard holds the model.", MetricType::Gauge, s.initialized);
    one("ps_pushes_applied_total", "Pushes applied (in this process).", MetricType::Counter,
        s.pushes_applied);
    one("ps_pulls_total", "Pulls answered.", MetricType::Counter, s.pulls);
    one("ps_pulls_waiting", "Pulls held back by the consistency model right now.",
        MetricType::Gauge, s.pulls_waiting);
    for (auto [reason, count] :
         {std::pair{"rejected", s.pushes_rejected}, std::pair{"duplicate", s.pushes_duplicate},
          std::pair{"late", s.pushes_dropped_late}, std::pair{"stale", s.pushes_dropped_stale},
          std::pair{"norm", s.pushes_dropped_norm}}) {
      one("ps_pushes_not_applied_total",
          "Pushes not applied, by reason: rejected (bad input, non-finite), duplicate (applied "
          "before), late (sync: for a closed round), stale (beyond --max_staleness).",
          MetricType::Counter, count, {{"reason", reason}});
    }
    one("ps_updates_nonfinite_total",
        "Updates refused because they would have made a weight or state non-finite.",
        MetricType::Counter, s.updates_nonfinite);
    one("ps_pushes_clipped_total", "Gradients scaled down to --clip_norm.", MetricType::Counter,
        s.pushes_clipped);
    one("ps_registered_workers", "Workers that registered.", MetricType::Gauge,
        s.registered_workers);
    one("ps_active_workers", "Workers heard from within their lease.", MetricType::Gauge,
        s.active_workers);
    one("ps_learning_rate", "The learning rate the next update uses.", MetricType::Gauge,
        s.learning_rate);
    for (const WorkerSnapshot& w : s.workers) {
      const std::vector<ClientMetric::Label> worker = {{"worker", std::to_string(w.worker_id)}};
      one("ps_worker_clock", "Each worker's clock (its pushes applied, as SSP counts them).",
          MetricType::Gauge, w.clock, worker);
      one("ps_worker_pushes_applied_total", "Each worker's pushes applied.", MetricType::Counter,
          w.pushes_applied, worker);
      one("ps_worker_seconds_since_seen", "Seconds since each worker was last heard from.",
          MetricType::Gauge, w.seconds_since_seen, worker);
    }
    if (checkpointer_ != nullptr) {
      const Checkpointer::Health h = checkpointer_->health();
      one("ps_checkpoint_failures_total",
          "Checkpoints that could not be written (the last error is in GetStats and the log).",
          MetricType::Counter, h.failures);
      one("ps_checkpoint_last_success_timestamp_seconds",
          "When the newest checkpoint this process wrote was written (Unix time; 0: none yet).",
          MetricType::Gauge,
          h.last_written_time == absl::InfinitePast()
              ? 0
              : absl::ToDoubleSeconds(h.last_written_time - absl::UnixEpoch()));
      one("ps_checkpoint_last_success_version",
          "The version of the newest checkpoint this process wrote (-1: none yet).",
          MetricType::Gauge, h.last_written_version);
    }
    out.push_back(StalenessFamily(s, shard));
    return out;
  }

 private:
  // The staleness of applied pushes as a Prometheus histogram with power-of-two bounds.
  static MetricFamily StalenessFamily(const ShardStats& s, const std::string& shard) {
    ClientMetric m;
    m.label = {{"shard", shard}};
    const std::vector<int64_t>& counts = s.staleness_counts;
    double sum = 0;
    uint64_t total = 0;
    for (size_t k = 0; k < counts.size(); ++k) {
      sum +=
          static_cast<double>(std::min<int64_t>(k, StalenessHistogram::kMaxExact + 1)) * counts[k];
      total += counts[k];
    }
    for (int64_t bound : {0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1023}) {
      uint64_t cumulative = 0;
      for (size_t k = 0; k < counts.size() && static_cast<int64_t>(k) <= bound; ++k) {
        cumulative += counts[k];
      }
      m.histogram.bucket.push_back({cumulative, static_cast<double>(bound)});
    }
    m.histogram.bucket.push_back({total, std::numeric_limits<double>::infinity()});
    m.histogram.sample_count = total;
    m.histogram.sample_sum = sum;
    return {"ps_staleness",
            "Staleness of applied pushes (versions behind).",
            MetricType::Histogram,
            {std::move(m)}};
  }

  const ParameterShard* shard_;
  const Checkpointer* checkpointer_;
};

}  // namespace

ServiceMetrics AddShardMetrics(MetricsEndpoint* endpoint, const ParameterShard* shard,
                               const Checkpointer* checkpointer) {
  endpoint->Add(std::make_shared<ShardCollector>(shard, checkpointer));
  const std::string index = std::to_string(shard->Stats(0, 0).shard_index);
  prometheus::Registry& r = endpoint->registry();
  auto& seconds = prometheus::BuildHistogram()
                      .Name("ps_call_seconds")
                      .Help("Push and pull calls, first byte to answer (a pull's wait included).")
                      .Register(r);
  auto& bytes = prometheus::BuildCounter()
                    .Name("ps_payload_bytes_total")
                    .Help("Tensor bytes received by pushes (in) and sent by pulls (out).")
                    .Register(r);
  auto& refused = prometheus::BuildCounter()
                      .Name("ps_calls_refused_total")
                      .Help("Calls refused for want of a place (--max_pulls, --max_streams, "
                            "--max_calls_per_worker), by kind, over gRPC and the data plane.")
                      .Register(r);
  ServiceMetrics m;
  for (const char* kind : {"pulls", "streams"}) refused.Add({{"shard", index}, {"kind", kind}});
  m.refused = &refused;
  m.push_seconds = &seconds.Add({{"shard", index}, {"call", "push"}}, LatencyBuckets());
  m.pull_seconds = &seconds.Add({{"shard", index}, {"call", "pull"}}, LatencyBuckets());
  m.push_bytes = &bytes.Add({{"shard", index}, {"direction", "in"}});
  m.pull_bytes = &bytes.Add({{"shard", index}, {"direction", "out"}});
  return m;
}

}  // namespace ps
